"""The I/O shell of broker transactions: runs :class:`notify.core.transactions.TxEngine` on the
broker's event loop and executes its effects.

* replies go to connections in request order (a deferred reply holds its place as a
  :class:`~notify.broker.connection.PendingReplies` slot until the engine completes it);
* ``Force`` effects of one loop turn, and of the turn after it, share one fdatasync of the
  redo log (group commit), run on the loop thread: a thread hand-off costs more than the
  fsync itself on small machines, and while the loop is blocked the next turn's requests
  pile up in the socket buffers and form the next group;
* check-back frames go to producers' connections;
* APScheduler (AsyncIOScheduler, coroutine jobs on the loop) runs timeouts, check-backs,
  retries of failed applies and checkpoints (the checkpoint's file work in a thread).

All transaction logic lives in the engine; this module only moves bytes and time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from notify.broker.connection import Connection, PendingReplies
from notify.config import SystemConfig
from notify.core.apply import Applier
from notify.core.effects import Applied, Complete, Defer, Effect, Force, Reply, SendCheck
from notify.core.transactions import BrokerTx, IdSource, TxEngine, TxLimits, TxPut, TxStats
from notify.errors import TxLogError
from notify.faults import crashpoint
from notify.protocol.frames import (
    MultiPut,
    Put,
    Register,
    Transaction,
    encode_check,
    encode_result,
    encode_results,
)
from notify.protocol.xa import XAER_RMFAIL, encode_xa_failure
from notify.runtime import SYSTEM_CLOCK
from notify.store.flusher import Flusher
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.txlog import Position, TxLog, TxLogConfig

log = logging.getLogger("notify.tx")

class TransactionManager:
    """Broker transactions: the engine plus the loop, the log's fsyncs and the jobs."""

    def __init__(
        self,
        sysc: SystemConfig,
        store: MessageStore,
        flusher: Flusher,
        ids: IdSource,
        loop: asyncio.AbstractEventLoop,
        scheduler: AsyncIOScheduler,
        on_applied: Callable[[Applied], None],
    ) -> None:
        self.sys = sysc
        #: how long an answered half-message COMMIT waits for a force another step starts
        self.lazy_force_s = sysc.half_commit_force_delay_ms / 1000
        self.loop = loop
        self.scheduler = scheduler
        self.flusher = flusher
        self.on_applied = on_applied
        self.log = TxLog.open(
            sysc.tx_log_path,
            TxLogConfig(
                flush_at_commit=sysc.flush_tx_log_at_commit, max_checkpoints=sysc.max_checkpoints
            ),
        )
        self.out: list[Effect] = []
        self.applier = Applier(store, self._after_append, crashpoint)
        self.engine = TxEngine(
            self.log,
            store,
            self.applier,
            SYSTEM_CLOCK,
            ids,
            TxLimits.from_system(sysc),
            self.out,
            crashpoint,
        )
        self._force_upto: Position | None = None
        self._lazy_armed = False
        self._closed = False
        #: a slave's log is its master's copy: no engine runs on it, no checkpoint of ours
        #: (notify.replication.redo does them) until ``promote`` recovers it
        self.replica = False
        #: the synchronous slave's answer to the newest redo write pushed to it
        self._shipped: asyncio.Future[None] | None = None
        #: automatic failover: why this master must not acknowledge now (None: it may).
        #: Checked when a step's force completes and again when its reply is released, so
        #: a COMMIT or PREPARE is never acknowledged by a master replaced meanwhile
        self.fence: Callable[[], str | None] | None = None

    def ship(self, fut: asyncio.Future[None]) -> None:
        """A redo write was pushed to the synchronous slave: forces wait for its answer."""
        self._shipped = fut

    # ------------------------------------------------------------------ views for admin/HTTP

    @property
    def txs(self) -> dict[str, BrokerTx]:
        return self.engine.txs

    @property
    def stats(self) -> TxStats:
        return self.engine.stats

    def snapshot(self) -> list[BrokerTx]:
        return self.engine.snapshot()

    def stats_items(self) -> list[tuple[str, object]]:
        return [
            *self.engine.stats_items(),
            ("txlog_end", _fields(self.log.end_position)),
            ("txlog_durable", _fields(self.log.durable_position)),
        ]

    # ------------------------------------------------------------------ requests

    def handle(self, conn: Connection, r: Transaction) -> None:
        self.engine.handle(conn, r)
        self._drain()

    def put(self, conn: Connection, r: Put, crc: int, reply_partition: int = -1) -> None:
        assert r.tx_key is not None
        self.engine.put(
            conn, r.tx_key, r.topic, r.partition, r.flag, r.body, crc, r.opaque, reply_partition
        )
        self._drain()

    def oneshot(
        self, conn: Connection, begin: Transaction, puts: list[TxPut], commit: Transaction
    ) -> bool:
        """BEGIN, puts and COMMIT_ONE_PHASE that arrived together, as one unit (see
        :meth:`TxEngine.oneshot`); False: run them one by one."""
        if not self.engine.oneshot(conn, begin, puts, commit):
            return False
        self._drain(coalesce=not self.engine.limits.force_at_commit)
        return True

    def mput(self, conn: Connection, r: MultiPut, buf: bytearray) -> None:
        assert r.tx_key is not None
        self.engine.mput(conn, r.tx_key, r.topic, r.partition, buf, r.count, r.opaque)
        self._drain()

    def register(self, conn: Connection, r: Register) -> None:
        conn.producer_group = r.group
        self.engine.register(conn, r.group, r.opaque)
        self._drain()

    def connection_closed(self, conn: Connection) -> None:
        self.engine.owner_lost(conn)
        self._drain()

    def partition_visible(self, _part: Partition) -> None:
        """A partition shows more: send the replies of the commits whose gate opened."""
        if self.out:
            self._drain()

    # ------------------------------------------------------------------ effects

    def _after_append(self, part: Partition, count: int) -> None:
        fut = self.flusher.after_append(part, count)
        if fut is not None:
            fut.add_done_callback(_consume)

    def _drain(self, coalesce: bool = False) -> None:
        """Carry out the engine's effects. ``coalesce`` (a one-shot transaction: BEGIN,
        puts and COMMIT that arrived together): the replies that come before the COMMIT's
        deferred reply on the same connection are written with it, in one write, instead
        of ahead of it (the client waits for all of them anyway: one wake-up, not two).
        A deferred reply's ``ticket.head`` (the engine's own coalescing) goes the same way."""
        out = self.out
        held: list[bytes] = []  # (coalesce) replies of ``held_by`` for the next Defer
        held_by: Connection | None = None
        while out:
            batch: list[Any] = out[:]  # (dispatched on the exact type below)
            out.clear()
            for eff in batch:
                kind = type(eff)
                if kind is Force:  # sends nothing: the order of replies is not its concern
                    if eff.lazy:
                        # an answered half-message commit: the next force covers it (e.g. the
                        # next PREPARE's), or this one after halfCommitForceDelay;
                        # nobody waits meanwhile
                        if not self._lazy_armed:
                            self._lazy_armed = True
                            self.loop.call_later(self.lazy_force_s, self._lazy_force)
                    elif self._force_upto is None:
                        self._force_upto = eff.pos
                        self.loop.call_soon(self._force_next_turn)
                    elif eff.pos > self._force_upto:
                        self._force_upto = eff.pos
                    continue
                if kind is Reply:
                    conn: Connection = eff.owner
                    if conn.closed:
                        continue
                    frame = encode_result(eff.code, eff.opaque, eff.body)
                    if coalesce and (held_by is None or held_by is conn):
                        held_by = conn
                        held.append(frame)
                    else:
                        conn.send(frame)
                    continue
                if kind is Defer:
                    tk = eff.ticket
                    owner: Connection = tk.owner
                    slot = PendingReplies(owner, 0)
                    slot.items.append([tk.opaque])
                    head = tk.head
                    if held:  # written before the deferred reply, when it is set
                        if owner is held_by:
                            if head is not None:
                                held.append(encode_results(head))
                            slot.body = b"".join(held)
                            held = []
                        else:
                            self._release(held_by, held)  # anything else keeps its order
                            if head is not None:
                                slot.body = encode_results(head)
                    elif head is not None:
                        slot.body = encode_results(head)
                    coalesce = False
                    tk.slot = slot
                    if not owner.closed:
                        owner.send(slot)
                    continue
                if held:
                    self._release(held_by, held)  # anything else keeps its order
                coalesce = False
                if kind is Complete:
                    tk = eff.ticket
                    fence = self.fence
                    fenced = fence() if fence is not None and tk.code == 200 else None
                    if fenced is not None:  # replaced after the step: outcome unknown here
                        tk.set(500, encode_xa_failure(XAER_RMFAIL, f"not acknowledged: {fenced}"))
                    slot = tk.slot
                    reply = encode_result(tk.code, tk.opaque, tk.body)
                    slot.body = slot.body + reply if slot.body else reply  # after coalesced ones
                    slot.resolve()
                elif kind is Applied:
                    self.on_applied(eff)
                else:
                    assert kind is SendCheck
                    sc_owner: Connection = eff.owner
                    if not sc_owner.closing:
                        sc_owner.send(
                            encode_check(eff.key, eff.topic, eff.partition, eff.records, eff.opaque)
                        )
        if held:
            self._release(held_by, held)

    @staticmethod
    def _release(conn: Connection | None, held: list[bytes]) -> None:
        if conn is not None and not conn.closed:
            for frame in held:
                conn.send(frame)
        held.clear()

    def _lazy_force(self) -> None:
        self._lazy_armed = False
        if not self.engine.pending_force or self._closed:
            return  # a force since covered it
        if self._force_upto is None:
            self._force_upto = self.log.end_position
            self._force_round()
        else:
            self._force_upto = self.log.end_position  # a round is already scheduled

    def _force_next_turn(self) -> None:
        """Run the force round one loop turn later: the requests that arrived meanwhile
        (read in that turn's poll) join its fdatasync. 32 closed-loop clients formed groups
        of about 16 with the round in the same turn, about 28 with it one turn later; a
        lone client waits one loop turn more (microseconds, against the fsync's
        milliseconds)."""
        self.loop.call_soon(self._force_round)

    def _force_round(self) -> None:
        """Group commit of one loop turn: one fdatasync covers every step queued meanwhile."""
        upto, self._force_upto = self._force_upto, None
        if upto is None:
            return
        err: str | None = None
        if self.engine.acked_before_force:
            crashpoint("before_half_commit_force")  # tests: the acknowledged COMMIT unforced
        try:
            self.log.sync(upto)
        except TxLogError as e:
            err = str(e)
        shipped = self._shipped
        if err is None and shipped is not None and not shipped.done():
            # a synchronous slave: the step is durable when the slave has it on disk too
            # (pushes are answered in order, so the newest answer covers everything before)
            shipped.add_done_callback(lambda f: self._slave_forced(upto, f))
            return
        if err is None and shipped is not None:
            err = _failure(shipped)
        self.engine.forced(upto, err or self._fenced())
        self._drain()

    def _slave_forced(self, upto: Position, fut: asyncio.Future[None]) -> None:
        self.engine.forced(upto, _failure(fut) or self._fenced())
        self._drain()

    def _fenced(self) -> str | None:
        return self.fence() if self.fence is not None else None

    # ------------------------------------------------------------------ lifecycle and jobs

    def recover(self) -> None:
        """Replay the redo log (before the broker serves anyone), then checkpoint."""
        self.engine.recover()
        self._drain()
        self._checkpoint_at(self.engine.checkpoint_position())
        s = self.engine.stats
        log.info(
            "transaction recovery: %d prepared, %d re-applied, %d rolled back",
            s.recovered_prepared,
            s.recovered_reapplied,
            s.recovered_rolled_back,
        )

    def add_jobs(self) -> None:
        sch = self.scheduler
        sch.add_job(self._expire_job, "interval", seconds=0.5, id="tx-timeouts", max_instances=1)
        sch.add_job(self._check_back_job, "interval", seconds=0.5, id="tx-check-back")
        sch.add_job(self._retry_apply_job, "interval", seconds=1, id="tx-apply-retry")
        sch.add_job(
            self._checkpoint_job,
            "interval",
            seconds=self.sys.checkpoint_interval_ms / 1000.0,
            id="tx-checkpoint",
            max_instances=1,
        )

    async def _expire_job(self) -> None:
        self.engine.expire()
        self._drain()

    async def _check_back_job(self) -> None:
        self.engine.check_backs()
        self._drain()

    async def _retry_apply_job(self) -> None:
        self.engine.retry_applies()
        self._drain()

    async def _checkpoint_job(self) -> None:
        oldest = self.engine.checkpoint_position()
        await self.loop.run_in_executor(None, self._checkpoint_at, oldest)

    def _checkpoint_at(self, oldest: Position) -> None:
        try:
            self.log.checkpoint(oldest)
        except TxLogError as e:
            log.error("transaction log checkpoint failed: %s", e)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._force_upto is not None or self.engine.pending_force:
            self._force_upto = self.log.end_position
            self._force_round()
        if not self.replica:
            self._checkpoint_at(self.engine.checkpoint_position())
        self.log.close()


def _failure(fut: asyncio.Future[None]) -> str | None:
    """Why the synchronous slave did not take a redo push (None: it did)."""
    if fut.cancelled():
        return "the synchronous slave's answer was cancelled"
    exc = fut.exception()
    return None if exc is None else f"synchronous slave: {exc}"


def _consume(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()


def _fields(pos: Position) -> str:
    """A redo-log position as stats fields: ``file_no=N offset=M``."""
    return f"file_no={pos.file_no} offset={pos.offset}"
