"""The client's connections: one reused :class:`~notify.transport.AsyncConnection` per broker.

The wire itself (pipelined, opaque-matched requests, ``check`` frames, auth and TLS) is
:mod:`notify.transport`; this module adds what the client needs on top: a
:class:`ConnectionPool` that keeps one connection per broker address, shared by every
producer and consumer of a session, and reconnects with exponential backoff after a failure.

It also carries automatic failover's epochs (README "Protocol notes", ``epoch``): for a broker
group known to fail over automatically (:meth:`ConnectionPool.bind_group`, from ZooKeeper),
every connection to one of its members declares the newest epoch this client has seen, once
when it opens and again whenever a newer one is learned (from ZooKeeper or from a broker's
answer), so a replaced master that wakes refuses this client's writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from notify.errors import ClientError, ConnectionLostError
from notify.protocol.frames import Response, encode_line
from notify.transport import AsyncConnection, TransportOptions, open_connection

log = logging.getLogger("notify.client")


class ConnectionPool:
    """One reused connection per broker address, reconnecting with exponential backoff.

    :meth:`get` returns an open connection or raises :class:`ConnectionLostError`; after a
    failed attempt the next one to the same address waits out the backoff (growing from
    ``backoff_min_s`` to ``backoff_max_s``, reset by a successful connect), so retry loops do
    not hammer a dead broker. Every connection is opened with ``options`` (shared secret,
    TLS, keep-alive: ``version`` after ``heartbeat_s`` without a request, so the broker's
    ``idleTimeout`` never closes it); a refused secret raises
    :class:`~notify.transport.AuthenticationError`.
    """

    def __init__(
        self,
        connect_timeout_s: float,
        backoff_min_s: float,
        backoff_max_s: float,
        options: TransportOptions | None = None,
    ):
        base = options or TransportOptions()
        self._options = TransportOptions(
            base.secret, base.ssl, connect_timeout_s, base.heartbeat_s
        )
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._conns: dict[str, AsyncConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._backoff: dict[str, float] = {}
        self._next_attempt: dict[str, float] = {}
        self._closed = False
        self.connects = 0
        #: automatic failover: broker address -> its group (broker id), for groups that
        #: have an epoch node; group -> newest epoch seen; connection -> epoch it declared
        self._groups: dict[str, int] = {}
        self.epochs: dict[int, int] = {}
        self._declared: dict[AsyncConnection, int] = {}
        #: called with a broker's address when it answered that it is a stale master
        self.on_stale: Callable[[str], None] | None = None
        self.stale_answers = 0
        self._followers: list[ConnectionPool] = []
        self._parent: ConnectionPool | None = None

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
            self._declare(c)
            return c

    # -- automatic failover's epochs

    def epoch_of(self, address: str) -> tuple[int, int] | None:
        """``(broker group, newest epoch seen)`` when ``address`` is a member of a group
        that fails over automatically, else None (any thread may ask)."""
        root = self._parent or self
        bid = root._groups.get(address)
        epoch = root.epochs.get(bid, 0) if bid is not None else 0
        return (bid, epoch) if bid is not None and epoch else None

    def share_epochs(self, parent: ConnectionPool) -> None:
        """Use ``parent``'s failover epochs (a transactional producer's own connections
        declare what the session learned, and teach it what they learn)."""
        self._parent = parent
        self._groups = parent._groups
        self.epochs = parent.epochs
        parent._followers.append(self)

    def bind_group(self, address: str, broker_id: int, epoch: int) -> None:
        """``address`` is a member of broker group ``broker_id`` (which fails over
        automatically; ``epoch`` read from ZooKeeper): declare it on its connections."""
        if self._parent is not None:
            return self._parent.bind_group(address, broker_id, epoch)
        self._groups[address] = broker_id
        self.learn_epoch(broker_id, epoch)
        for pool in (self, *self._followers):
            c = pool.cached(address)
            if c is not None:
                pool._declare(c)

    def learn_epoch(self, broker_id: int, epoch: int) -> None:
        """A newer epoch of ``broker_id`` is known: every open connection to a member of
        that group declares it (a paused old master reads it before any later write)."""
        if self._parent is not None:
            return self._parent.learn_epoch(broker_id, epoch)
        if epoch <= self.epochs.get(broker_id, 0):
            return
        self.epochs[broker_id] = epoch
        for pool in (self, *self._followers):
            for addr, bid in self._groups.items():
                c = pool.cached(addr) if bid == broker_id else None
                if c is not None:
                    pool._declare(c)

    def _declare(self, c: AsyncConnection) -> None:
        bid = self._groups.get(c.address)
        if bid is None:  # not a group that fails over: never sent (MetaQ brokers)
            return
        epoch = self.epochs.get(bid, 0)
        if epoch <= self._declared.get(c, 0):
            return
        for old in [k for k in self._declared if not k.is_open]:
            del self._declared[old]
        self._declared[c] = epoch
        try:
            fut = c.submit(lambda o: encode_line("epoch", bid, epoch, o))
        except ConnectionLostError:
            return
        fut.add_done_callback(lambda f: self._epoch_answer(c.address, bid, f))

    def _epoch_answer(self, address: str, bid: int, fut: asyncio.Future[Response]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        r = fut.result()
        if r.code == 200:  # "<brokerId> <epoch>": the broker's own epoch
            parts = r.body.split()
            if len(parts) == 2 and parts[0] == str(bid).encode() and parts[1].isdigit():
                self.learn_epoch(bid, int(parts[1]))
        elif r.code == 503:  # a replaced master: its writes are refused; find the new one
            self.stale_answers += 1
            log.warning("broker %s: %s", address, r.body.decode("utf-8", "replace"))
            root = self._parent or self
            if root.on_stale is not None:
                root.on_stale(address)

    def discard(self, conn: AsyncConnection) -> None:
        """Forget a connection that failed (the next :meth:`get` reconnects)."""
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
        conn.abort()

    async def close(self) -> None:
        """Close every connection and wait for their transports to finish."""
        self._closed = True
        if self._parent is not None and self in self._parent._followers:
            self._parent._followers.remove(self)
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
