"""The one client transport of notify: a connection to a broker speaking the MetaQ protocol.

Everything in notify that talks to a broker over the wire goes through here: the client
library (:mod:`notify.client`), the XA broker participant, the admin CLI and the replication
links between brokers. Two implementations of the same contract:

* :class:`AsyncConnection` (asyncio protocol; :func:`open_connection`) and
* :class:`BlockingConnection` (a plain socket driving the sans-IO
  :class:`~notify.protocol.frames.ResponseParser`).

The contract:

* every request carries an ``opaque`` from a per-connection counter (positive int32,
  wrapping) and its reply is matched by that opaque, so requests may be pipelined and replies
  may come in any order; replies to nobody (a request that timed out) are dropped;
* broker-initiated ``check`` frames (half-message check-back) are never taken for replies:
  they go to the connection's ``check_handler`` (asyncio) or are dropped (blocking); pushed
  queue messages (``qmsg``, ``qbatch``) go to its ``push_handler`` likewise;
* on every (re)connect, when a shared secret is configured, ``auth <secret>`` is the first
  request and its reply is awaited: a refusal raises :class:`AuthenticationError`;
* TLS when :attr:`TransportOptions.ssl` is set (build it with :func:`tls_context` from a
  CA file / verify flag / client certificate);
* foreign errors are translated here: ``OSError`` -> :class:`~notify.errors.ConnectionLostError`,
  no reply in time -> :class:`~notify.errors.RequestTimeoutError`, a garbage stream ->
  :class:`~notify.errors.ConnectionLostError` (the connection is dropped), an untrusted TLS
  certificate -> :class:`TLSError`.
* keep-alive: brokers close a connection silent for ``idleTimeout`` (default 5 minutes), so
  an :class:`AsyncConnection` sends ``version`` when no request went out for
  :attr:`TransportOptions.heartbeat_s` (checked every ``heartbeat_s``: a connection is never
  silent for more than twice that, 60 s by default); a :class:`BlockingConnection` (no thread
  of its own) checks, when unused for :data:`REUSE_CHECK_S`, that the broker has not closed
  it, and reconnects if it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from notify.errors import (
    BrokerError,
    ClientError,
    ConnectionLostError,
    ProtocolError,
    RequestTimeoutError,
)
from notify.protocol.frames import FrameBuilder, Response, ResponseParser, encode_line

log = logging.getLogger("notify.client.transport")

DEFAULT_PORT: Final = 8123
DEFAULT_CONNECT_TIMEOUT_S: Final = 5.0
DEFAULT_REQUEST_TIMEOUT_S: Final = 30.0
#: Environment variable holding the shared secret (``authSecret``) for clients and the CLI.
SECRET_ENV: Final = "NOTIFY_SECRET"
OPAQUE_MAX: Final = 2**31 - 1
#: Seconds without a request after which an :class:`AsyncConnection` sends ``version`` (the
#: broker's ``idleTimeout`` is 300 s by default; MetaQ's Java client beats after 10 s idle).
DEFAULT_HEARTBEAT_S: Final = 30.0
#: A :class:`BlockingConnection` unused this long checks that the broker kept it open.
REUSE_CHECK_S: Final = 1.0
#: a blocking exchange may answer its timeout this share of it late (at most 1 s) rather
#: than re-arm the socket's kernel timeout after every partial reply
REARM_SLACK: Final = 0.05
_RECV_BYTES: Final = 1 << 18


class AuthenticationError(BrokerError):
    """The broker refused the shared secret (``auth`` answered 403). Not retriable."""


class TLSError(ClientError):
    """The TLS handshake failed (untrusted certificate, wrong host name, bad client
    certificate): retrying will not help until the configuration changes."""


def split_address(address: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` (``meta://``/``notify://`` prefixes and a trailing ``/`` allowed) ->
    ``(host, port)``; a bare ``host`` takes ``default_port`` when given."""
    addr = address.split("://", 1)[1] if "://" in address else address
    addr = addr.rstrip("/")
    host, sep, port = addr.rpartition(":")
    if not sep and default_port is not None and addr:
        return addr, default_port
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClientError(f"invalid broker address {address!r}: expected host:port")
    return host, int(port)


def tls_context(
    ca_file: str | Path | None = None,
    verify: bool = True,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
) -> ssl.SSLContext:
    """A client-side TLS context: trust ``ca_file`` (the system store when None), check the
    broker's certificate and host name unless ``verify`` is False, and present
    ``cert_file``/``key_file`` as client certificate when given. Raises :class:`TLSError`
    when a file cannot be loaded."""
    try:
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(ca_file) if ca_file else None
        )
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert_file:
            ctx.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        elif key_file:
            raise TLSError("a TLS key file needs its certificate file (tls_cert_file)")
    except (OSError, ssl.SSLError) as e:
        raise TLSError(f"cannot set up TLS: {e}") from e
    return ctx


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """How to open a connection: shared secret, TLS context, connect timeout, and the
    keep-alive of asyncio connections (``heartbeat_s``; 0 = none)."""

    secret: str | None = None
    ssl: ssl.SSLContext | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    heartbeat_s: float = DEFAULT_HEARTBEAT_S

    def __post_init__(self) -> None:
        if self.secret is not None and (not self.secret or any(c.isspace() for c in self.secret)):
            raise ClientError("the shared secret must be non-empty and contain no whitespace")
        if not self.heartbeat_s >= 0:  # also refuses NaN
            raise ClientError(f"heartbeat_s must be >= 0 (0 = none), not {self.heartbeat_s}")

    @classmethod
    def build(
        cls,
        secret: str | None = None,
        *,
        tls: bool = False,
        tls_ca_file: str | Path | None = None,
        tls_verify: bool = True,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    ) -> TransportOptions:
        """Options from plain settings; TLS is on when ``tls`` is set or a CA / client
        certificate file is given. An empty ``secret`` means none."""
        use_tls = tls or bool(tls_ca_file) or bool(tls_cert_file)
        ctx = tls_context(tls_ca_file, tls_verify, tls_cert_file, tls_key_file) if use_tls else None
        return cls(secret or None, ctx, connect_timeout_s, heartbeat_s)


def _auth_error(address: str, r: Response) -> AuthenticationError:
    text = r.body.decode("utf-8", "replace")
    return AuthenticationError(r.code, f"{address} refused the shared secret: {text}")


def _connect_error(address: str, e: BaseException) -> ClientError:
    if isinstance(e, ssl.SSLCertVerificationError):
        return TLSError(f"TLS certificate of {address} not accepted: {e.verify_message or e}")
    if isinstance(e, ssl.SSLError):
        return TLSError(f"TLS handshake with {address} failed: {e}")
    return ConnectionLostError(f"cannot connect to {address}: {e or 'timeout'}")


# --------------------------------------------------------------------------- asyncio


class AsyncConnection(asyncio.Protocol):
    """One connection to a broker with pipelined, opaque-matched requests (asyncio).

    Open with :func:`open_connection`. The hot path (:meth:`send`, :meth:`send_many`) does
    one dict insert and one transport write per request; no per-message timers unless asked.
    """

    def __init__(self, address: str, loop: asyncio.AbstractEventLoop):
        self.address = address
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = ResponseParser()
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._opaque = 0
        self._closed = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.closed_future: asyncio.Future[None] = loop.create_future()
        #: The producer group this connection registered (``register``), if any.
        self.producer_group: str | None = None
        #: Called on the loop with each broker-initiated ``check`` frame (must not block).
        self.check_handler: Callable[[AsyncConnection, Response], None] | None = None
        #: Called on the loop with each pushed ``qmsg`` or ``qbatch`` frame (must not block).
        self.push_handler: Callable[[AsyncConnection, Response], None] | None = None
        #: keep-alive (:meth:`start_heartbeat`): its timer, the opaque counter at the last
        #: check (unchanged = no request since), the last ``version`` sent and their number
        self._beat: asyncio.TimerHandle | None = None
        self._beat_mark = -1
        self._beat_opaque = 0
        self.heartbeats = 0

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:  # requests are small and answered one by one: no Nagle delay
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

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
            if r.kind == "qmsg" or r.kind == "qbatch":  # pushed queue message(s): README "Queues"
                if self.push_handler is not None:
                    self.push_handler(self, r)
                continue
            fut = pending.pop(r.opaque, None)
            if fut is None:
                if r.opaque == self._beat_opaque:
                    continue  # the answer to a heartbeat
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
        self._stop_heartbeat()
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
            o = o + 1 if o < OPAQUE_MAX else 1
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

    def submit(self, build: FrameBuilder) -> asyncio.Future[Response]:
        """Write the frame ``build(opaque)`` now; the future gets its reply (no timeout:
        the caller bounds the wait)."""
        opaque = self.next_opaque()
        return self.send(build(opaque), opaque)

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

    async def request(
        self, build: FrameBuilder, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> Response:
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

    def start_heartbeat(self, interval_s: float) -> None:
        """Send ``version`` whenever no request went out for ``interval_s`` (checked every
        ``interval_s``, so the broker never sees more than twice that of silence and does not
        close the connection for ``idleTimeout``). No cost per request: the check compares
        the opaque counter with its value at the previous check."""
        self._stop_heartbeat()
        if interval_s > 0 and not self._closed:
            self._beat_mark = self._opaque
            self._beat = self._loop.call_later(interval_s, self._heartbeat, interval_s)

    def _heartbeat(self, interval_s: float) -> None:
        self._beat = None
        t = self._transport
        if self._closed or t is None:
            return
        if self._opaque == self._beat_mark:  # nothing sent since the last check
            o = self._beat_opaque = self.next_opaque()
            t.write(encode_line("version", o))  # the reply is dropped in data_received
            self.heartbeats += 1
        self._beat_mark = self._opaque
        self._beat = self._loop.call_later(interval_s, self._heartbeat, interval_s)

    def _stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

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
        self._stop_heartbeat()
        if self._transport is not None and not self._closed:
            self._transport.close()
        self._closed = True

    def abort(self) -> None:
        self._stop_heartbeat()
        if self._transport is not None:
            self._transport.abort()
        self._closed = True


def _cancel_timer(handle: asyncio.TimerHandle, _fut: asyncio.Future[Response]) -> None:
    handle.cancel()


async def open_connection(
    address: str, options: TransportOptions | None = None
) -> AsyncConnection:
    """Connect to ``address`` (TLS when ``options.ssl``), then authenticate when
    ``options.secret``; the whole within ``options.connect_timeout_s``.

    Raises :class:`ConnectionLostError` (unreachable, timeout), :class:`TLSError` or
    :class:`AuthenticationError`."""
    opts = options or TransportOptions()
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(opts.connect_timeout_s):
            _, conn = await loop.create_connection(
                lambda: AsyncConnection(address, loop),
                host,
                port,
                ssl=opts.ssl,
                server_hostname=host if opts.ssl is not None else None,
            )
    except (OSError, TimeoutError) as e:
        raise _connect_error(address, e) from e
    if opts.secret:
        secret = opts.secret
        try:
            r = await conn.request(lambda o: encode_line("auth", secret, o), opts.connect_timeout_s)
        except ClientError:
            conn.abort()
            raise
        if r.code != 200:
            conn.abort()
            raise _auth_error(address, r)
    conn.start_heartbeat(opts.heartbeat_s)
    log.debug("connected to %s", address)
    return conn


# --------------------------------------------------------------------------- blocking

#: Plain blocking sockets time out in the kernel (SO_RCVTIMEO/SO_SNDTIMEO, POSIX timeval).
_KERNEL_TIMEOUTS: Final = sys.platform != "win32" and hasattr(socket, "SO_RCVTIMEO")


class BlockingConnection:
    """One connection to a broker over a plain (or TLS) socket, for code without an event
    loop (the XA participant, the CLI). Connects lazily and again after a failure.

    :meth:`exchange` pipelines several requests in one write and returns their replies in
    request order, matched by opaque. After a failure or a timeout the socket is dropped
    (the next call reconnects, and authenticates again). A connection unused for
    :data:`REUSE_CHECK_S` is first checked (:meth:`peer_closed`, no round trip): one the
    broker closed meanwhile (``idleTimeout``, a restart) is replaced before the request.
    """

    def __init__(
        self,
        address: str,
        options: TransportOptions | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ):
        self.address = address
        self.options = options or TransportOptions()
        self.host, self.port = split_address(address, DEFAULT_PORT)
        self.request_timeout_s = request_timeout_s
        self._sock: socket.socket | None = None
        self._parser = ResponseParser()
        self._opaque = 0
        self._armed: float | None = None  # the socket's current per-call timeout
        self._used = 0.0  # monotonic time the last exchange ended
        #: receive buffer, reused: a fresh 256 KiB ``recv`` per reply costs the allocator
        #: (and page faults) more than the system call itself
        self._rbuf = memoryview(bytearray(_RECV_BYTES))
        #: held around :meth:`exchange` by users that share the connection across threads
        #: (a connection carries one exchange at a time)
        self.lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the socket (and authenticate) unless already open."""
        if self._sock is not None:
            return
        opts = self.options
        try:
            raw = socket.create_connection((self.host, self.port), timeout=opts.connect_timeout_s)
        except OSError as e:
            raise _connect_error(self.address, e) from e
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = (
                opts.ssl.wrap_socket(raw, server_hostname=self.host)
                if opts.ssl is not None
                else raw
            )
            if sock is raw and _KERNEL_TIMEOUTS:
                # blocking, the timeout in the kernel: one system call per send and per
                # receive (a Python timeout polls before each, and setting it is one more)
                raw.settimeout(None)
        except OSError as e:
            raw.close()
            raise _connect_error(self.address, e) from e
        self._sock = sock
        self._armed = None
        self._parser = ResponseParser()
        self._used = time.monotonic()
        if opts.secret:
            secret = opts.secret
            r = self.exchange([lambda o: encode_line("auth", secret, o)], opts.connect_timeout_s)[0]
            if r.code != 200:
                self.drop()
                raise _auth_error(self.address, r)

    def peer_closed(self) -> bool:
        """True when the open socket should not be reused: the peer closed or reset it, or
        bytes nobody asked for are waiting (no round trip; False when not connected)."""
        sock = self._sock
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        if not readable:
            return False
        if not isinstance(sock, ssl.SSLSocket):
            return True  # EOF, a reset, or bytes nobody asked for
        # TLS: the bytes may be a record for the TLS layer alone (a TLS 1.3 session ticket)
        try:
            sock.setblocking(False)
            sock.recv(1)  # application data or EOF: do not reuse
            return True
        except ssl.SSLWantReadError:
            return False
        except OSError:
            return True
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(self.request_timeout_s)
                self._armed = self.request_timeout_s

    def _next_opaque(self) -> int:
        self._opaque = self._opaque + 1 if self._opaque < OPAQUE_MAX else 1
        return self._opaque

    def exchange(
        self, builds: Sequence[FrameBuilder], timeout_s: float | None = None
    ) -> list[Response]:
        """Send the frames ``build(opaque)`` in one write; their replies, in order.

        Gives up ``timeout_s`` (default: the request timeout) after the call, or up to
        :data:`REARM_SLACK` of it (at most 1 s) later when the replies came in parts.

        Raises :class:`ConnectionLostError`, :class:`RequestTimeoutError` (both drop the
        socket), :class:`TLSError` or :class:`AuthenticationError` (on connect)."""
        start = time.monotonic()
        if start - self._used > REUSE_CHECK_S and self.peer_closed():
            self.drop()  # closed by the broker while unused (idleTimeout, restart)
        sock = self._sock
        if sock is None:
            self.connect()
            sock = self._sock
            assert sock is not None
        first = self._opaque + 1
        if first + len(builds) > OPAQUE_MAX:  # wrap: one at a time
            opaques = [self._next_opaque() for _ in builds]
        else:
            opaques = list(range(first, first + len(builds)))
            self._opaque = opaques[-1] if opaques else self._opaque
        frames = b"".join([b(o) for b, o in zip(builds, opaques, strict=True)])
        wanted = set(opaques)
        got: dict[int, Response] = {}
        limit = self.request_timeout_s if timeout_s is None else timeout_s
        deadline = start + limit
        try:
            if limit != self._armed:
                self._arm(sock, limit)
            sock.sendall(frames)
            rbuf = self._rbuf
            while wanted:
                n = sock.recv_into(rbuf)
                if not n:
                    raise ConnectionResetError("the broker closed the connection")
                for r in self._parser.feed(rbuf[:n].tobytes()):
                    if r.kind in ("check", "qmsg", "qbatch") or r.opaque not in wanted:
                        continue  # a check-back, or the reply to a request that timed out
                    wanted.discard(r.opaque)
                    got[r.opaque] = r
                if wanted:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    # the next receive gives up ``armed`` seconds from now: re-arm (two
                    # system calls, and two more to restore ``limit`` next time) only when
                    # that would overshoot the deadline by more than the slack
                    armed = self._armed
                    if armed is None or armed - remaining > min(1.0, limit * REARM_SLACK):
                        self._arm(sock, remaining)
        except (TimeoutError, BlockingIOError):  # BlockingIOError: a kernel timeout expired
            self.drop()
            raise RequestTimeoutError(
                f"{self.address}: no reply within {limit:g} s"
            ) from None
        except (OSError, ProtocolError) as e:
            self.drop()
            raise ConnectionLostError(f"connection to {self.address} lost: {e}") from e
        self._used = time.monotonic()
        return [got[o] for o in opaques]

    def _arm(self, sock: socket.socket, timeout: float) -> None:
        """Make each send and receive of ``sock`` give up after ``timeout`` seconds."""
        self._armed = timeout
        if sock.gettimeout() is not None:  # TLS (or no kernel timeouts): Python's own
            sock.settimeout(timeout)
            return
        sec = int(timeout)
        usec = max(1, int((timeout - sec) * 1e6)) if sec == 0 else int((timeout - sec) * 1e6)
        tv = struct.pack("ll", sec, usec)  # 0 would mean "no timeout"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)

    def request(self, build: FrameBuilder, timeout_s: float | None = None) -> Response:
        """One request, one reply (see :meth:`exchange`)."""
        return self.exchange([build], timeout_s)[0]

    def drop(self) -> None:
        """Close the socket without a word (the next request reconnects)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Say ``quit`` and close; never raises."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.settimeout(1.0)
                self._sock.sendall(b"quit\r\n")
        self.drop()

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
