"""The one layer of the client that owns sockets.

A :class:`BrokerConnection` is an asyncio protocol speaking the MetaQ text protocol through
the sans-IO :class:`notify.protocol.frames.ResponseParser`. Requests are pipelined: each carries
an ``opaque`` from a per-connection counter and its reply is matched by that opaque, so
replies may arrive in any order. A :class:`ConnectionPool` keeps one connection per broker
address, reused by every producer and consumer of a session, and reconnects with
exponential backoff after a failure.

The broker may also send unsolicited ``check`` frames (check-back of a half message) on a
connection that registered a producer group: they are never matched against pending
requests but handed to the connection's ``check_handler`` (see ``_transaction``).

Foreign errors (``OSError``, ``asyncio.TimeoutError``) are translated here into
:class:`~notify.errors.ConnectionLostError` and :class:`~notify.errors.RequestTimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable, Sequence

from notify.errors import ClientError, ConnectionLostError, ProtocolError, RequestTimeoutError
from notify.protocol.frames import Response, ResponseParser

log = logging.getLogger("notify.client")

_OPAQUE_MAX = 2**31 - 1


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``meta://`` prefix allowed) -> ``(host, port)``."""
    addr = address.removeprefix("meta://")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClientError(f"invalid broker address {address!r}: expected host:port")
    return host, int(port)


class BrokerConnection(asyncio.Protocol):
    """One TCP connection to a broker with pipelined, opaque-matched requests."""

    def __init__(self, address: str, loop: asyncio.AbstractEventLoop):
        self.address = address
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = ResponseParser()
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._opaque = 0
        self._closed = False
        self._lost_exc: BaseException | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.closed_future: asyncio.Future[None] = loop.create_future()
        #: The producer group this connection registered (``register``), if any.
        self.producer_group: str | None = None
        #: Called on the loop with each broker-initiated ``check`` frame (must not block).
        self.check_handler: Callable[[BrokerConnection, Response], None] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            replies = self._parser.feed(data)
        except ProtocolError as e:
            log.error("broker %s sent garbage: %s", self.address, e)
            self._fail_all(ConnectionLostError(f"{self.address}: {e}"))
            if self._transport is not None:
                self._transport.abort()
            return
        pending = self._pending
        for r in replies:
            if r.kind == "check":  # broker-initiated: not a reply to any request
                self._on_check(r)
                continue
            fut = pending.pop(r.opaque, None)
            if fut is None:
                log.debug("%s: reply for unknown opaque %d dropped", self.address, r.opaque)
            elif not fut.done():
                fut.set_result(r)

    def _on_check(self, r: Response) -> None:
        handler = self.check_handler
        if handler is None:
            log.warning("%s: check-back of %s with no handler: ignored", self.address, r.tx_key)
            return
        try:
            handler(self, r)
        except Exception:  # a handler bug must not kill the connection
            log.exception("%s: check-back handler failed for %s", self.address, r.tx_key)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        reason = f": {exc}" if exc else ""
        self._fail_all(ConnectionLostError(f"connection to {self.address} lost{reason}"))
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()
        if not self.closed_future.done():
            self.closed_future.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    # -- API

    @property
    def is_open(self) -> bool:
        return not self._closed and self._transport is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def next_opaque(self) -> int:
        """A fresh opaque (positive int32, wrapping) not in use on this connection."""
        o = self._opaque
        while True:
            o = o + 1 if o < _OPAQUE_MAX else 1
            if o not in self._pending:
                self._opaque = o
                return o

    def send(self, frame: bytes, opaque: int) -> asyncio.Future[Response]:
        """Write ``frame`` (built with ``opaque``) and return the future of its reply."""
        if self._closed or self._transport is None:
            raise ConnectionLostError(f"connection to {self.address} is closed")
        fut: asyncio.Future[Response] = self._loop.create_future()
        self._pending[opaque] = fut
        self._transport.write(frame)
        return fut

    def send_many(
        self, frames: Sequence[tuple[bytes, int]], timeout_s: float | None = None
    ) -> list[asyncio.Future[Response]]:
        """Write several ``(frame, opaque)`` with one write; the futures of their replies.

        With ``timeout_s`` each future fails with :class:`RequestTimeoutError` when its
        reply does not come in time (no need to :meth:`wait` on it)."""
        if self._closed or self._transport is None:
            raise ConnectionLostError(f"connection to {self.address} is closed")
        loop = self._loop
        futs: list[asyncio.Future[Response]] = []
        for _, opaque in frames:
            fut: asyncio.Future[Response] = loop.create_future()
            self._pending[opaque] = fut
            if timeout_s is not None:
                handle = loop.call_later(timeout_s, self._expire, opaque, timeout_s)
                fut.add_done_callback(functools.partial(_cancel_timer, handle))
            futs.append(fut)
        self._transport.write(b"".join([f for f, _ in frames]))
        return futs

    async def request(self, build: Callable[[int], bytes], timeout_s: float) -> Response:
        """Send the frame ``build(opaque)`` and wait for its reply.

        Raises :class:`ConnectionLostError` or :class:`RequestTimeoutError`.
        """
        opaque = self.next_opaque()
        fut = self.send(build(opaque), opaque)
        if self._write_paused:
            await self._drain()
        return await self.wait(fut, opaque, timeout_s)

    async def wait(self, fut: asyncio.Future[Response], opaque: int, timeout_s: float) -> Response:
        """Wait for a reply future returned by :meth:`send`."""
        if fut.done():
            return fut.result()
        handle = self._loop.call_later(timeout_s, self._expire, opaque, timeout_s)
        try:
            return await fut
        finally:
            handle.cancel()

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if self._write_paused:
            await self._drain()

    async def _drain(self) -> None:
        if self._closed:
            return
        w: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(w)
        await w

    def _expire(self, opaque: int, timeout_s: float) -> None:
        fut = self._pending.pop(opaque, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                RequestTimeoutError(f"{self.address}: no reply within {timeout_s:g} s")
            )

    def _fail_all(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)

    def close(self) -> None:
        """Close the connection; requests in flight fail with ConnectionLostError."""
        if self._transport is not None and not self._closed:
            self._transport.close()
        self._closed = True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._closed = True


def _cancel_timer(handle: asyncio.TimerHandle, _fut: asyncio.Future[Response]) -> None:
    handle.cancel()


class ConnectionPool:
    """One reused connection per broker address, reconnecting with exponential backoff.

    :meth:`get` returns an open connection or raises :class:`ConnectionLostError`; after a
    failed attempt the next one to the same address waits out the backoff (growing from
    ``backoff_min_s`` to ``backoff_max_s``, reset by a successful connect), so retry loops do
    not hammer a dead broker.
    """

    def __init__(
        self,
        connect_timeout_s: float,
        backoff_min_s: float,
        backoff_max_s: float,
    ):
        self._connect_timeout_s = connect_timeout_s
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._conns: dict[str, BrokerConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._backoff: dict[str, float] = {}
        self._next_attempt: dict[str, float] = {}
        self._closed = False
        self.connects = 0

    def cached(self, address: str) -> BrokerConnection | None:
        """The open connection to ``address`` if there is one (no I/O)."""
        c = self._conns.get(address)
        return c if c is not None and c.is_open else None

    async def get(self, address: str) -> BrokerConnection:
        c = self._conns.get(address)
        if c is not None and c.is_open:
            return c
        if self._closed:
            raise ClientError("session is closed")
        lock = self._locks.setdefault(address, asyncio.Lock())
        async with lock:
            c = self._conns.get(address)
            if c is not None and c.is_open:
                return c
            delay = self._next_attempt.get(address, 0.0) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self._closed:
                raise ClientError("session is closed")
            try:
                c = await self._connect(address)
            except ConnectionLostError:
                b = self._backoff.get(address, self._backoff_min_s / 2) * 2
                b = min(self._backoff_max_s, max(self._backoff_min_s, b))
                self._backoff[address] = b
                self._next_attempt[address] = time.monotonic() + b
                raise
            self._backoff.pop(address, None)
            self._next_attempt.pop(address, None)
            self._conns[address] = c
            self.connects += 1
            return c

    async def _connect(self, address: str) -> BrokerConnection:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, proto = await loop.create_connection(
                    lambda: BrokerConnection(address, loop), host, port
                )
        except (OSError, TimeoutError) as e:
            raise ConnectionLostError(f"cannot connect to {address}: {e or 'timeout'}") from e
        sock = proto._transport.get_extra_info("socket") if proto._transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        log.debug("connected to %s", address)
        return proto

    def discard(self, conn: BrokerConnection) -> None:
        """Forget a connection that failed (the next :meth:`get` reconnects)."""
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
        conn.abort()

    async def close(self) -> None:
        """Close every connection and wait for their transports to finish."""
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for c in conns:
            c.close()
        for c in conns:
            try:
                async with asyncio.timeout(1.0):
                    await asyncio.shield(c.closed_future)
            except TimeoutError:  # pragma: no cover
                c.abort()
