"""The client's connections: one reused :class:`~notify.transport.AsyncConnection` per broker.

The wire itself (pipelined, opaque-matched requests, ``check`` frames, auth and TLS) is
:mod:`notify.transport`; this module adds what the client needs on top: a
:class:`ConnectionPool` that keeps one connection per broker address, shared by every
producer and consumer of a session, and reconnects with exponential backoff after a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time

from notify.errors import ClientError, ConnectionLostError
from notify.transport import AsyncConnection, TransportOptions, open_connection

log = logging.getLogger("notify.client")


class ConnectionPool:
    """One reused connection per broker address, reconnecting with exponential backoff.

    :meth:`get` returns an open connection or raises :class:`ConnectionLostError`; after a
    failed attempt the next one to the same address waits out the backoff (growing from
    ``backoff_min_s`` to ``backoff_max_s``, reset by a successful connect), so retry loops do
    not hammer a dead broker. Every connection is opened with ``options`` (shared secret,
    TLS); a refused secret raises :class:`~notify.transport.AuthenticationError`.
    """

    def __init__(
        self,
        connect_timeout_s: float,
        backoff_min_s: float,
        backoff_max_s: float,
        options: TransportOptions | None = None,
    ):
        base = options or TransportOptions()
        self._options = TransportOptions(base.secret, base.ssl, connect_timeout_s)
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._conns: dict[str, AsyncConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._backoff: dict[str, float] = {}
        self._next_attempt: dict[str, float] = {}
        self._closed = False
        self.connects = 0

    @property
    def options(self) -> TransportOptions:
        """How this pool opens connections (secret, TLS, connect timeout)."""
        return self._options

    def cached(self, address: str) -> AsyncConnection | None:
        """The open connection to ``address`` if there is one (no I/O)."""
        c = self._conns.get(address)
        return c if c is not None and c.is_open else None

    async def get(self, address: str) -> AsyncConnection:
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
                c = await open_connection(address, self._options)
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

    def discard(self, conn: AsyncConnection) -> None:
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
