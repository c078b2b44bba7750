"""The master's side of consistent cuts (:mod:`notify.replication.cut`): ``get __cut`` from a
replica link answers with the visible end of every partition that changed since the last
answer on that connection, or holds the request (a long poll) until one changes.

An answer is built in its own step of the event loop (``call_soon`` after the visibility
change that woke it), never inside the step that shows a transaction's shares: every
partition's visible end in it is from the same instant, so it is a consistent cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from notify.broker.connection import Connection
from notify.protocol.frames import Get, encode_result
from notify.replication.cut import cut_member, encode_cut
from notify.store.manager import MessageStore
from notify.store.partition import Partition


class CutServer:
    """Answers the cut requests of this broker's slaves."""

    def __init__(
        self,
        store: MessageStore,
        loop: asyncio.AbstractEventLoop,
        max_wait_ms: int,
        parked_gets: Callable[[Partition], bool],
    ) -> None:
        self.store = store
        self.loop = loop
        self.max_wait_ms = max_wait_ms
        #: whether a partition has long-poll gets parked on it (the service's)
        self.parked_gets = parked_gets
        #: what each connection was last told, per partition
        self._sent: dict[Connection, dict[tuple[str, int], int]] = {}
        #: requests held until something changes: connection -> (opaque, timer)
        self._waiters: dict[Connection, tuple[int, asyncio.TimerHandle]] = {}
        self._scheduled = False
        self.answered = 0

    @property
    def watching(self) -> bool:
        """Whether every visibility change must be reported (a slave waits for one)."""
        return bool(self._waiters)

    def get(self, conn: Connection, r: Get) -> None:
        """``get __cut <group> 0 0 <maxSize> <opaque> [<maxWaitMs>]``."""
        old = self._waiters.pop(conn, None)
        if old is not None:  # one request at a time per connection: the older ends empty
            old[1].cancel()
            conn.send(encode_result(200, old[0], b""))
        delta = self._delta(conn)
        if delta or r.max_wait_ms <= 0:
            return self._reply(conn, r.opaque, delta)
        wait_s = min(r.max_wait_ms, self.max_wait_ms) / 1000.0
        self._waiters[conn] = (r.opaque, self.loop.call_later(wait_s, self._expire, conn))
        if len(self._waiters) == 1:
            self._watch()

    def visible(self) -> None:
        """A partition shows more: answer the waiting requests, in a step of their own."""
        if self._waiters and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._answer)

    def closed(self, conn: Connection) -> None:
        self._sent.pop(conn, None)
        w = self._waiters.pop(conn, None)
        if w is not None:
            w[1].cancel()
            if not self._waiters:
                self._watch()

    def _answer(self) -> None:
        self._scheduled = False
        for conn, (opaque, timer) in list(self._waiters.items()):
            delta = self._delta(conn)
            if delta:
                timer.cancel()
                del self._waiters[conn]
                self._reply(conn, opaque, delta)
        if not self._waiters:
            self._watch()

    def _expire(self, conn: Connection) -> None:
        w = self._waiters.pop(conn, None)
        if w is not None:
            self._reply(conn, w[0], [])
            if not self._waiters:
                self._watch()

    def _reply(self, conn: Connection, opaque: int, delta: list[tuple[str, int, int]]) -> None:
        self.answered += 1
        if not conn.closed:
            conn.send(encode_result(200, opaque, encode_cut(delta)))

    def _delta(self, conn: Connection) -> list[tuple[str, int, int]]:
        sent = self._sent.setdefault(conn, {})
        out = []
        for key, part in self.store.partitions.items():
            if not cut_member(part):
                continue
            v = part.visible_end
            if sent.get(key) != v:
                sent[key] = v
                out.append((key[0], key[1], v))
        return out

    def _watch(self) -> None:
        """Partitions without group commit report every append only while someone waits
        (``Partition.waiting``): a parked get on them, or a slave's cut request."""
        on = bool(self._waiters)
        for part in self.store.all_partitions():
            part.waiting = on or self.parked_gets(part)
