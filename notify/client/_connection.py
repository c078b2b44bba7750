"""The client's connections: one :class:`ConnectionPool` per session holds every one of them.

The wire itself (pipelined, opaque-matched requests, ``check`` frames, auth and TLS) is
:mod:`.transport`; the pool adds what the client needs on top, in one place:

* asyncio connections, one per (lane, broker address), used on the session's loop: the
  shared lane (every producer and consumer of the session) and a lane per transactional
  producer (its own connections, registered with its producer group, which no other user of
  the session can drop);
* blocking connections of the synchronous API's direct paths (``send()`` and transactions
  over the calling thread's own socket: ``_direct``, ``_directtx``), one per (thread, lane,
  address), opened on first use and closed with the session or when their thread has ended;
* one reconnect backoff per address (exponential, reset by a successful connect), so retry
  loops do not hammer a dead broker, and a short pause of the direct paths after one of their
  connections failed (:data:`SKIP_AFTER_FAILURE_S`: the loop's backoff, not a blocking
  connect per message);
* automatic failover's epochs (README "Protocol notes", ``epoch``): for a broker group known
  to fail over automatically (:meth:`ConnectionPool.bind_group`, from ZooKeeper), every
  connection to one of its members declares the newest epoch this client has seen, once when
  it opens and again whenever a newer one is learned (from ZooKeeper or from a broker's
  answer), so a replaced master that wakes refuses this client's writes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from notify.errors import ClientError, ConnectionLostError
from notify.protocol.frames import FrameBuilder, Response, encode_line

from .transport import (
    DEFAULT_REQUEST_TIMEOUT_S,
    AsyncConnection,
    BlockingConnection,
    TransportOptions,
    open_connection,
)

log = logging.getLogger("notify.client")

#: The lane of the session's shared connections.
SHARED: Final = ""
#: Seconds an address is left to the loop path after a direct request to it failed.
SKIP_AFTER_FAILURE_S: Final = 1.0


def epoch_frame(broker_id: int, epoch: int) -> FrameBuilder:
    """``epoch <brokerId> <epoch>``: declare the newest failover epoch seen."""
    return lambda o: encode_line("epoch", broker_id, epoch, o)


class ConnectionPool:
    """Every connection of one session (see the module docstring).

    :meth:`get` returns an open asyncio connection or raises :class:`ConnectionLostError`;
    after a failed attempt the next one to the same address waits out the backoff (growing
    from ``backoff_min_s`` to ``backoff_max_s``). Every connection is opened with ``options``
    (shared secret, TLS, keep-alive: ``version`` after ``heartbeat_s`` without a request, so
    the broker's ``idleTimeout`` never closes it); a refused secret raises
    :class:`~.transport.AuthenticationError`. :meth:`blocking` hands out the calling
    thread's blocking connections (``request_timeout_s`` is theirs).
    """

    def __init__(
        self,
        connect_timeout_s: float,
        backoff_min_s: float,
        backoff_max_s: float,
        options: TransportOptions | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ):
        base = options or TransportOptions()
        self._options = TransportOptions(
            base.secret, base.ssl, connect_timeout_s, base.heartbeat_s
        )
        self.request_timeout_s = request_timeout_s
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._shared: dict[str, AsyncConnection] = {}
        self._lanes: dict[str, dict[str, AsyncConnection]] = {SHARED: self._shared}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
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
        #: blocking connections: thread -> lane -> address -> connection, and the epoch
        #: each declared
        self._by_thread: dict[int, dict[str, dict[str, BlockingConnection]]] = {}
        self.blocking_declared: dict[BlockingConnection, int] = {}
        self._skip_until: dict[str, float] = {}
        self._blocking_lock = threading.Lock()

    @property
    def options(self) -> TransportOptions:
        """How this pool opens connections (secret, TLS, connect timeout)."""
        return self._options

    # -- asyncio connections (on the loop)

    def cached(self, address: str, lane: str = SHARED) -> AsyncConnection | None:
        """The open connection to ``address`` in ``lane`` if there is one (no I/O)."""
        conns = self._lanes.get(lane)
        c = conns.get(address) if conns is not None else None
        return c if c is not None and c.is_open else None

    async def get(self, address: str, lane: str = SHARED) -> AsyncConnection:
        """An open connection to ``address`` in ``lane`` (connecting when there is none)."""
        conns = self._shared if not lane else self._lanes.setdefault(lane, {})
        c = conns.get(address)
        if c is not None and c.is_open:
            return c
        if self._closed:
            raise ClientError("session is closed")
        lock = self._locks.setdefault((lane, address), asyncio.Lock())
        async with lock:
            c = conns.get(address)
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
            conns[address] = c
            self.connects += 1
            self._declare(c)
            return c

    def discard(self, conn: AsyncConnection, lane: str = SHARED) -> None:
        """Forget a connection that failed (the next :meth:`get` reconnects)."""
        conns = self._lanes.get(lane)
        if conns is not None and conns.get(conn.address) is conn:
            del conns[conn.address]
        conn.abort()

    async def close_lane(self, lane: str) -> None:
        """Close the connections of ``lane`` (a transactional producer's, as it closes)."""
        conns = self._lanes.pop(lane, {}) if lane != SHARED else {}
        await _close_all(list(conns.values()))

    # -- blocking connections (any thread)

    def blocking(self, address: str, lane: str) -> BlockingConnection | None:
        """The calling thread's blocking connection to ``address`` in ``lane`` (connected on
        first use); None when the pool is closed or the address recently failed."""
        ident = threading.get_ident()
        lanes = self._by_thread.get(ident)
        conns = lanes.get(lane) if lanes is not None else None
        c = conns.get(address) if conns is not None else None
        if c is not None:
            return c
        until = self._skip_until.get(address)
        if until is not None and until > time.monotonic():
            return None
        try:
            c = BlockingConnection(address, self._options, self.request_timeout_s)
        except ClientError:  # an address the loop path will report on
            return None
        with self._blocking_lock:
            if self._closed:
                return None
            self._prune()
            self._by_thread.setdefault(ident, {}).setdefault(lane, {})[address] = c
        return c

    def blocking_of(self, lane: str) -> dict[str, BlockingConnection]:
        """The calling thread's blocking connections of ``lane``, by address (a copy)."""
        return dict(self._by_thread.get(threading.get_ident(), {}).get(lane, {}))

    def blocking_failed(self, conn: BlockingConnection) -> None:
        """``conn`` failed: drop it, leave its address to the loop path for a while."""
        conn.drop()
        self.blocking_declared.pop(conn, None)
        self._skip_until[conn.address] = time.monotonic() + SKIP_AFTER_FAILURE_S

    def owed_epoch(self, conn: BlockingConnection) -> tuple[int, int] | None:
        """``(broker group, epoch)`` that ``conn`` must declare before its next request
        (a member of a group that fails over automatically), else None."""
        if not self._groups:  # no broker group fails over automatically (the usual case)
            return None
        epoch = self.epoch_of(conn.address)
        if epoch is None or self.blocking_declared.get(conn, 0) >= epoch[1]:
            return None
        return epoch

    def _prune(self) -> None:
        alive = {t.ident for t in threading.enumerate()}
        for ident in [i for i in self._by_thread if i not in alive]:
            for conns in self._by_thread.pop(ident).values():
                for c in conns.values():
                    self.blocking_declared.pop(c, None)
                    c.close()

    def close_blocking_lane(self, lane: str) -> None:
        """Close the blocking connections of ``lane`` in every thread (its owner closes)."""
        with self._blocking_lock:
            conns = [c for lanes in self._by_thread.values() for c in lanes.pop(lane, {}).values()]
        for c in conns:
            self.blocking_declared.pop(c, None)
            c.close()

    def _close_blocking(self) -> None:
        with self._blocking_lock:
            conns = [
                c for lanes in self._by_thread.values() for d in lanes.values() for c in d.values()
            ]
            self._by_thread.clear()
        for c in conns:
            c.close()

    # -- automatic failover's epochs

    def epoch_of(self, address: str) -> tuple[int, int] | None:
        """``(broker group, newest epoch seen)`` when ``address`` is a member of a group
        that fails over automatically, else None (any thread may ask)."""
        bid = self._groups.get(address)
        epoch = self.epochs.get(bid, 0) if bid is not None else 0
        return (bid, epoch) if bid is not None and epoch else None

    def bind_group(self, address: str, broker_id: int, epoch: int) -> None:
        """``address`` is a member of broker group ``broker_id`` (which fails over
        automatically; ``epoch`` read from ZooKeeper): declare it on its connections."""
        self._groups[address] = broker_id
        self.learn_epoch(broker_id, epoch)
        for conns in self._lanes.values():
            c = conns.get(address)
            if c is not None and c.is_open:
                self._declare(c)

    def learn_epoch(self, broker_id: int, epoch: int) -> None:
        """A newer epoch of ``broker_id`` is known: every open connection to a member of
        that group declares it (a paused old master reads it before any later write)."""
        if epoch <= self.epochs.get(broker_id, 0):
            return
        self.epochs[broker_id] = epoch
        for addr, bid in self._groups.items():
            if bid != broker_id:
                continue
            for conns in self._lanes.values():
                c = conns.get(addr)
                if c is not None and c.is_open:
                    self._declare(c)

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
            fut = c.submit(epoch_frame(bid, epoch))
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
            if self.on_stale is not None:
                self.on_stale(address)

    async def close(self) -> None:
        """Close every connection and wait for their transports to finish."""
        self._closed = True
        self._close_blocking()
        conns = [c for d in self._lanes.values() for c in d.values()]
        for d in self._lanes.values():
            d.clear()
        await _close_all(conns)


async def _close_all(conns: list[AsyncConnection]) -> None:
    for c in conns:
        c.close()
    for c in conns:
        try:
            async with asyncio.timeout(1.0):
                await asyncio.shield(c.closed_future)
        except TimeoutError:  # pragma: no cover
            c.abort()
