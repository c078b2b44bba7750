"""Broker transactions: MetaQ's ``transaction`` command, transactional puts, the redo log.

A put carrying a txKey is not written to its partition: its record (message id already
assigned) goes to the redo log (``<dataLogPath>/transactions``) as APPEND_MSG and is kept in
memory. Committing writes the COMMIT decision and makes it durable per
``flushTxLogAtCommit`` **before** any message reaches a partition, then appends each
partition's messages with one write and logs APPLIED. Recovery therefore never finds
messages visible for a transaction the log calls in flight, and a COMMIT without APPLIED is
re-applied idempotently: the message ids tell which records already reached the partition.

Local transactions (``TX:<session>:<seq>``) belong to the connection that began them and are
rolled back when it drops, unless prepared. A local transaction prepared on a connection
that registered a producer group is a Notify-style *half message*: after
``txCheckBackDelay`` the broker asks a live producer of that group (``check`` frame) whether
to commit it, at most ``txCheckBackMaxTimes`` times, then rolls it back.

XA transactions (``XID:...``) are global: any connection may prepare, commit or roll them
back; PREPARE is durable; timeouts never touch a prepared transaction; RECOVER lists the
prepared ones per uniqueQualifier.

APScheduler (AsyncIOScheduler, coroutine jobs on the broker's loop) runs the timeouts, the
check-backs, checkpoints and retries of applies that failed (a full disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from notify.broker.connection import Connection, PendingReplies
from notify.broker.delay import DELAY_TOPIC
from notify.core.states import TERMINAL, TxEvent, TxState, allowed, next_state
from notify.errors import NotifyError, TransactionError, TxLogError
from notify.faults import crashpoint
from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.frames import MultiPut, Put, Register, Transaction, encode_check, encode_result
from notify.protocol.keys import is_xa, parse_xid, validate_key
from notify.protocol.xa import (
    XA_OK,
    XA_RBTIMEOUT,
    XA_RDONLY,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMERR,
    XAER_RMFAIL,
)
from notify.store.idempotent import already_present
from notify.store.partition import Partition
from txlog import Position, TxLog, TxLogConfig

if TYPE_CHECKING:
    from notify.broker.service import BrokerService

log = logging.getLogger("notify.tx")

CHECK_TIMEOUT_S: Final = 5.0
_OPEN: Final = (TxState.ACTIVE, TxState.ENDED)


@dataclass(eq=False, slots=True)
class BrokerTx:
    """One transaction known to the broker."""

    key: str
    xa: bool
    conn: Connection | None
    state: TxState
    timeout_s: int
    deadline: float
    created_ms: int
    first_pos: Position | None = None
    batches: list[lr.AppendMsg] = field(default_factory=list)
    nbytes: int = 0
    group: str = ""
    prepared_at_ms: int = 0
    checks: int = 0
    last_check: float = 0.0
    checking: bool = False
    hints: tuple[tuple[str, int, int], ...] = ()
    apply_error: str | None = None
    ended_reason: str = ""

    @property
    def message_count(self) -> int:
        return sum(b.count for b in self.batches)


@dataclass
class TxStats:
    begun: int = 0
    committed: int = 0
    rolled_back: int = 0
    timed_out: int = 0
    connection_rollbacks: int = 0
    recovered_prepared: int = 0
    recovered_reapplied: int = 0
    recovered_rolled_back: int = 0
    check_backs_sent: int = 0
    check_back_exhausted: int = 0
    exhausted: list[str] = field(default_factory=list)


class TxFailure(Exception):
    """An error reply for a transaction command: XAException code and text."""

    def __init__(self, code: int, message: str, http: int = 500):
        super().__init__(message)
        self.code = code
        self.http = http


_HEURISTIC: Final = frozenset({TxState.HEURISTIC_COMMITTED, TxState.HEURISTIC_ROLLED_BACK})


def _require_resolver(conn: Connection, tx: BrokerTx, ttype: str) -> None:
    """Without the admin role (``adminSecret`` set, ``auth`` with ``authSecret``) a
    connection may commit or roll back only what an application may: its own transactions,
    any XA transaction (apps commit their xids from any connection), and half messages of the
    producer group it registered (check-back answers). FORGET and anything in a heuristic
    state are administrator paths."""
    if ttype == "FORGET" or tx.state in _HEURISTIC:
        ok = False
    elif tx.xa or tx.conn is conn:
        ok = True
    else:
        ok = bool(tx.group) and conn.producer_group == tx.group
    if not ok:
        raise TxFailure(
            XAER_PROTO,
            f"{ttype} of {tx.key} needs the admin role (auth with adminSecret)",
            403,
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionManager:
    """Transactions of one broker; all methods run on the broker's event loop."""

    def __init__(self, service: BrokerService, scheduler: AsyncIOScheduler):
        self.service = service
        self.store = service.store
        sysc = service.config.system
        self.sys = sysc
        self.loop = service.loop
        self.log = TxLog.open(
            sysc.tx_log_path,
            TxLogConfig(
                flush_at_commit=sysc.flush_tx_log_at_commit, max_checkpoints=sysc.max_checkpoints
            ),
        )
        self.txs: dict[str, BrokerTx] = {}
        #: (deadline, key) of open transactions; entries of finished ones are dropped lazily
        self._timers: list[tuple[float, str]] = []
        self.groups: dict[str, list[Connection]] = {}
        self.stats = TxStats()
        self.scheduler = scheduler
        self.force_at_commit = sysc.flush_tx_log_at_commit == 1
        self._to_force: list[tuple[Position, Callable[[], bytes], str, PendingReplies, int]] = []
        self._force_scheduled = False
        self._applied: list[tuple[int, bytes]] = []
        self._applied_scheduled = False
        self._opaque = 0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def recover(self) -> None:
        """Replay the redo log: re-apply committed, restore prepared, roll back the rest."""
        t0 = time.monotonic()
        table: dict[str, dict[str, Any]] = {}
        for pos, rtype, body in self.log.replay():
            key = lr.key_of(body)
            ent = table.get(key)
            if ent is None:
                ent = table[key] = {"first": pos, "batches": [], "state": "active"}
            if rtype == lr.APPEND_MSG:
                ent["batches"].append(lr.AppendMsg.decode(body))
            elif rtype == lr.PREPARE:
                ent["state"] = "prepared"
                ent["prepare"] = lr.Prepare.decode(body)
            elif rtype == lr.COMMIT:
                ent["state"] = "committed"
                ent["commit"] = lr.Commit.decode(body)
            elif rtype == lr.APPLIED or rtype == lr.ROLLBACK:
                ent["state"] = "done"
            elif rtype == lr.HEURISTIC:
                ent["state"] = "heuristic"
                ent["heuristic"] = lr.Heuristic.decode(body)
            elif rtype == lr.FORGET:
                ent["state"] = "done"
        now = time.monotonic()
        for key, ent in table.items():
            st = ent["state"]
            batches: list[lr.AppendMsg] = ent["batches"]
            if st == "done":
                continue
            tx = BrokerTx(
                key=key,
                xa=is_xa(key),
                conn=None,
                state=TxState.PREPARED,
                timeout_s=self.sys.max_tx_timeout_in_seconds,
                deadline=now + self.sys.max_tx_timeout_in_seconds,
                created_ms=_now_ms(),
                first_pos=ent["first"],
                batches=batches,
                nbytes=sum(len(b.records) for b in batches),
            )
            if st == "committed":
                tx.state = TxState.COMMITTING
                tx.hints = ent["commit"].hints
                self.txs[key] = tx
                self._apply(tx, recovering=True)
                self.stats.recovered_reapplied += 1
            elif st == "prepared":
                p: lr.Prepare = ent["prepare"]
                tx.group = p.group
                tx.prepared_at_ms = p.prepared_at_ms
                tx.timeout_s = p.timeout_s
                self.txs[key] = tx
                self.stats.recovered_prepared += 1
                log.info("recovered prepared transaction %s (%d messages)", key, tx.message_count)
            elif st == "heuristic":
                h: lr.Heuristic = ent["heuristic"]
                tx.state = (
                    TxState.HEURISTIC_COMMITTED if h.commit else TxState.HEURISTIC_ROLLED_BACK
                )
                self.txs[key] = tx
            else:  # active: no decision was ever logged
                self.log.append(lr.ROLLBACK, lr.Rollback(key, "broker restart").encode())
                self.stats.recovered_rolled_back += 1
                log.info(
                    "rolled back unfinished transaction %s (%d messages) at restart",
                    key,
                    tx.message_count,
                )
        self.log.sync()
        self._checkpoint_now()
        log.info(
            "transaction recovery: %d prepared, %d re-applied, %d rolled back in %.3fs",
            self.stats.recovered_prepared,
            self.stats.recovered_reapplied,
            self.stats.recovered_rolled_back,
            time.monotonic() - t0,
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

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._write_applied()
        self._checkpoint_now()
        self.log.close()

    # ------------------------------------------------------------------ scheduled jobs

    async def _expire_job(self) -> None:
        now = time.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, key = heapq.heappop(timers)
            tx = self.txs.get(key)
            if tx is None or tx.deadline != deadline or tx.state not in _OPEN:
                continue
            self.stats.timed_out += 1
            log.info("transaction %s timed out after %ds: rolled back", tx.key, tx.timeout_s)
            self._rollback_now(tx, TxEvent.TIMEOUT, "timeout")

    def _compact_timers(self) -> None:
        """Drop timer entries of transactions that finished before their deadline."""
        self._timers = [
            (d, k)
            for d, k in self._timers
            if (tx := self.txs.get(k)) is not None and tx.deadline == d and tx.state in _OPEN
        ]
        heapq.heapify(self._timers)

    async def _check_back_job(self) -> None:
        now = time.monotonic()
        delay = self.sys.tx_check_back_delay_ms / 1000.0
        in_flight = 0
        due: list[BrokerTx] = []
        for tx in self.txs.values():
            if tx.state is not TxState.PREPARED or not tx.group:
                continue
            if tx.checking and now - tx.last_check > CHECK_TIMEOUT_S:
                tx.checking = False  # the producer did not answer: ask again later
            if tx.checking:
                in_flight += 1
                continue
            age = time.time() - tx.prepared_at_ms / 1000.0
            if age >= delay and now - tx.last_check >= delay:
                due.append(tx)
        for tx in due:
            if in_flight >= self.sys.tx_check_back_concurrency:
                break
            if tx.checks >= self.sys.tx_check_back_max_times:
                self.stats.check_back_exhausted += 1
                self.stats.exhausted.append(tx.key)
                del self.stats.exhausted[:-100]
                log.warning(
                    "half message %s: no answer after %d check-backs: rolled back",
                    tx.key,
                    tx.checks,
                )
                pos, _finish, _ = self._rollback(tx, TxEvent.ROLLBACK, "check-back exhausted")
                if pos is not None:
                    with contextlib.suppress(TxLogError):
                        await self.log.sync_async(pos)
                continue
            conns = [c for c in self.groups.get(tx.group, []) if not c.closing]
            if not conns:
                continue
            conn = conns[tx.checks % len(conns)]
            tx.checks += 1
            tx.last_check = now
            tx.checking = True
            in_flight += 1
            self.stats.check_backs_sent += 1
            first = tx.batches[0]
            self._opaque = (self._opaque + 1) & 0x7FFFFFFF
            conn.send(
                encode_check(tx.key, first.topic, first.partition, first.records, self._opaque)
            )

    async def _retry_apply_job(self) -> None:
        for tx in list(self.txs.values()):
            if tx.state is TxState.COMMITTING and tx.apply_error is not None:
                self._apply(tx)

    async def _checkpoint_job(self) -> None:
        oldest = self._oldest_live()
        await self.loop.run_in_executor(None, self._checkpoint_at, oldest)

    def _oldest_live(self) -> Position:
        """Where replay must start: the first record of the oldest unfinished transaction."""
        heuristic = (TxState.HEURISTIC_COMMITTED, TxState.HEURISTIC_ROLLED_BACK)
        live = [
            tx.first_pos
            for tx in self.txs.values()
            if tx.first_pos is not None and (tx.state not in TERMINAL or tx.state in heuristic)
        ]
        return min(live, default=self.log.end_position)

    def _checkpoint_now(self) -> None:
        self._checkpoint_at(self._oldest_live())

    def _checkpoint_at(self, oldest: Position) -> None:
        try:
            self.log.checkpoint(oldest)
        except TxLogError as e:
            log.error("transaction log checkpoint failed: %s", e)

    # ------------------------------------------------------------------ connections

    def connection_closed(self, conn: Connection) -> None:
        for members in self.groups.values():
            if conn in members:
                members.remove(conn)
        keys: set[str] | None = conn.session
        if not keys:
            return
        for key in list(keys):
            tx = self.txs.get(key)
            if tx is None or tx.conn is not conn:
                continue
            tx.conn = None
            if tx.state in (TxState.ACTIVE, TxState.ENDED) and not tx.xa:
                self.stats.connection_rollbacks += 1
                log.info("connection %s lost: rolled back local transaction %s", conn.peer, key)
                self._rollback_now(tx, TxEvent.CONNECTION_LOST, "connection lost")

    def register(self, conn: Connection, r: Register) -> None:
        members = self.groups.setdefault(r.group, [])
        if conn not in members:
            members.append(conn)
        conn.producer_group = r.group
        conn.send(encode_result(200, r.opaque, b"registered"))

    # ------------------------------------------------------------------ puts

    def _tx_for_put(self, conn: Connection, key: str) -> BrokerTx:
        tx = self.txs.get(key)
        if tx is None:
            raise TxFailure(XAER_NOTA, f"unknown transaction {key}: send BEGIN first")
        if not tx.xa and tx.conn is not conn:
            raise TxFailure(XAER_PROTO, f"transaction {key} belongs to another connection")
        if tx.state is TxState.ROLLED_BACK and tx.ended_reason == "timeout":
            raise TxFailure(XA_RBTIMEOUT, f"transaction {key} timed out and was rolled back")
        if not allowed(tx.state, TxEvent.PUT):
            raise TxFailure(XAER_PROTO, f"cannot add messages to {key} in state {tx.state.value}")
        return tx

    def _log_append(self, tx: BrokerTx, am: lr.AppendMsg) -> None:
        if tx.nbytes + len(am.records) > self.sys.max_tx_size:
            raise TxFailure(
                XAER_RMERR, f"transaction {tx.key} would exceed maxTxSize {self.sys.max_tx_size}"
            )
        try:
            pos = self.log.append(lr.APPEND_MSG, am.encode())
        except TxLogError as e:
            raise TxFailure(XAER_RMFAIL, f"transaction log write failed: {e}") from e
        if tx.first_pos is None:
            tx.first_pos = pos
        tx.batches.append(am)
        tx.nbytes += len(am.records)
        crashpoint("after_append_msg")

    def put(self, conn: Connection, r: Put, crc: int, reply_partition: int = -1) -> None:
        """A put inside a transaction (a delayed put passes the envelope for ``__delay`` and
        the target partition to report in the reply)."""
        assert r.tx_key is not None
        try:
            tx = self._tx_for_put(conn, r.tx_key)
            msg_id = self.service.ids.next()
            rec = records.encode(msg_id, r.flag, r.body, crc)
            self._log_append(tx, lr.AppendMsg(tx.key, r.topic, r.partition, 1, rec))
        except TxFailure as e:
            return self._fail(conn, r.opaque, e)
        shown = r.partition if reply_partition < 0 else reply_partition
        conn.send(encode_result(200, r.opaque, b"%d %d -1" % (msg_id, shown)))

    def mput(self, conn: Connection, r: MultiPut, buf: bytearray) -> None:
        from notify.broker.service import _stamp_ids

        assert r.tx_key is not None
        try:
            tx = self._tx_for_put(conn, r.tx_key)
            first = self.service.ids.next_block(r.count)
            _stamp_ids(buf, first)
            self._log_append(tx, lr.AppendMsg(tx.key, r.topic, r.partition, r.count, bytes(buf)))
        except TxFailure as e:
            return self._fail(conn, r.opaque, e)
        conn.send(encode_result(200, r.opaque, b"%d %d -1 %d" % (first, r.partition, r.count)))

    # ------------------------------------------------------------------ the command

    def _fail(self, conn: Connection, opaque: int, e: TxFailure) -> None:
        conn.send(
            encode_result(
                e.http, opaque, f"XAException:code={e.code},msg={e}".encode("utf-8", "replace")
            )
        )

    def _step(
        self,
        conn: Connection,
        opaque: int,
        start: Callable[[], tuple[Position | None, Callable[[], bytes], str]],
    ) -> None:
        """Run a transaction step: ``start()`` changes state and appends its record (no
        fsync) and returns ``(position to force or None, finish, what a failed fsync
        means)``. With flushTxLogAtCommit=1 the reply waits for the group-committed fsync
        of that position; otherwise ``finish`` runs and the reply is sent at once."""
        try:
            pos, finish, unsure = start()
            if pos is None or not self.force_at_commit:
                conn.send(encode_result(200, opaque, finish()))
                return
        except TxFailure as e:
            return self._fail(conn, opaque, e)
        slot = PendingReplies(conn, 0)
        slot.items.append([opaque])
        conn.send(slot)
        self._to_force.append((pos, finish, unsure, slot, opaque))
        if not self._force_scheduled:
            self._force_scheduled = True
            self.loop.call_soon(self._force_round)

    def _force_round(self) -> None:
        """Group commit of one loop turn: one fdatasync covers every step queued during the
        turn, then each step finishes and its reply is released.

        The fsync runs on the event loop thread. A thread hand-off costs more than the
        fsync itself on small machines, and while the loop is blocked the next turn's
        requests pile up in the socket buffers: they form the next group."""
        self._force_scheduled = False
        batch, self._to_force = self._to_force, []
        if not batch:
            return
        err: TxLogError | None = None
        try:
            self.log.sync(max(item[0] for item in batch))
        except TxLogError as e:
            err = e
        for _pos, finish, unsure, slot, opaque in batch:
            try:
                if err is not None:
                    raise TxFailure(XAER_RMFAIL, f"{unsure}: {err}") from err
                slot.body = encode_result(200, opaque, finish())
            except TxFailure as e:
                slot.body = encode_result(
                    e.http, opaque, f"XAException:code={e.code},msg={e}".encode()
                )
            slot.resolve()

    def handle(self, conn: Connection, r: Transaction) -> None:
        t = r.type
        try:
            if t == "RECOVER":
                return self._recover_cmd(conn, r)
            if r.tx_key is None:
                raise TxFailure(XAER_INVAL, f"{t} needs a transaction key")
            try:
                key = validate_key(r.tx_key)
            except TransactionError as e:
                raise TxFailure(XAER_INVAL, str(e)) from None
            if t == "BEGIN":
                return self._begin(conn, key, r)
            tx = self.txs.get(key)
            if tx is None:
                raise TxFailure(XAER_NOTA, f"unknown transaction {key}")
            if not conn.admin and t != "END" and t != "PREPARE":
                _require_resolver(conn, tx, t)
            if t == "END":
                self._transition(tx, TxEvent.END)
                conn.send(encode_result(200, r.opaque, b""))
            elif t == "PREPARE":
                self._step(conn, r.opaque, lambda: self._prepare(tx, conn))
            elif t in ("COMMIT_ONE_PHASE", "COMMIT_TWO_PHASE"):
                ev = (
                    TxEvent.COMMIT_ONE_PHASE
                    if t == "COMMIT_ONE_PHASE"
                    else TxEvent.COMMIT_TWO_PHASE
                )
                self._check(tx, ev, conn)
                self._step(conn, r.opaque, lambda: self._commit(tx, ev))
            elif t == "ROLLBACK":
                self._check(tx, TxEvent.ROLLBACK, conn)
                self._step(conn, r.opaque, lambda: self._rollback(tx, TxEvent.ROLLBACK, "rollback"))
            elif t == "FORGET":
                self._transition(tx, TxEvent.FORGET)
                self.log.append(lr.FORGET, lr.Forget(key).encode())
                del self.txs[key]
                conn.send(encode_result(200, r.opaque, b""))
        except TxFailure as e:
            self._fail(conn, r.opaque, e)

    def _check(self, tx: BrokerTx, ev: TxEvent, conn: Connection) -> None:
        if tx.state is TxState.ROLLED_BACK and tx.ended_reason == "timeout":
            raise TxFailure(XA_RBTIMEOUT, f"transaction {tx.key} timed out and was rolled back")
        if not allowed(tx.state, ev):
            raise TxFailure(XAER_PROTO, f"{ev.value} is not allowed in state {tx.state.value}")
        if (
            not tx.xa
            and tx.conn is not None
            and tx.conn is not conn
            and tx.state is not TxState.PREPARED
        ):
            raise TxFailure(XAER_PROTO, f"transaction {tx.key} belongs to another connection")

    def _transition(self, tx: BrokerTx, ev: TxEvent) -> None:
        try:
            tx.state = next_state(tx.state, ev)
        except TransactionError as e:
            raise TxFailure(XAER_PROTO, f"{tx.key}: {e}") from None

    def _begin(self, conn: Connection, key: str, r: Transaction) -> None:
        old = self.txs.get(key)
        if old is not None and old.state not in TERMINAL:
            raise TxFailure(XAER_DUPID, f"transaction {key} already exists")
        cap = self.sys.max_tx_timeout_timer_capacity
        if len(self._timers) >= cap:
            self._compact_timers()
        live = len(self._timers)
        if live >= cap:
            raise TxFailure(
                XAER_RMFAIL,
                f"too many open transactions ({live} >= maxTxTimeoutTimerCapacity {cap}); "
                "retry later",
                503,
            )
        if is_xa(key):
            try:
                parse_xid(key)
            except TransactionError as e:
                raise TxFailure(XAER_INVAL, str(e)) from None
        cap_s = self.sys.max_tx_timeout_in_seconds
        timeout = cap_s if not r.timeout or r.timeout <= 0 else min(r.timeout, cap_s)
        tx = BrokerTx(
            key=key,
            xa=is_xa(key),
            conn=conn,
            state=TxState.ACTIVE,
            timeout_s=timeout,
            deadline=time.monotonic() + timeout,
            created_ms=_now_ms(),
        )
        self.txs[key] = tx
        heapq.heappush(self._timers, (tx.deadline, key))
        if conn.session is None:
            conn.session = set()
        conn.session.add(key)
        self.stats.begun += 1
        conn.send(encode_result(200, r.opaque, b""))

    def _recover_cmd(self, conn: Connection, r: Transaction) -> None:
        uq = r.unique_qualifier
        keys = [
            tx.key
            for tx in self.txs.values()
            if tx.xa
            and tx.state is TxState.PREPARED
            and (not uq or uq == "null" or tx.key.rsplit(":", 1)[-1] == uq)
        ]
        conn.send(encode_result(200, r.opaque, "\r\n".join(keys).encode()))

    # ------------------------------------------------------------------ the steps

    def _prepare(
        self, tx: BrokerTx, conn: Connection
    ) -> tuple[Position | None, Callable[[], bytes], str]:
        self._check(tx, TxEvent.PREPARE, conn)
        if not tx.batches:
            # no work: vote read-only, nothing to remember
            tx.state = TxState.COMMITTED
            self._forget_finished(tx)
            return None, lambda: b"%d" % XA_RDONLY, ""
        prev = tx.state
        tx.state = TxState.PREPARED
        tx.group = conn.producer_group
        tx.prepared_at_ms = _now_ms()
        body = lr.Prepare(tx.key, tx.prepared_at_ms, tx.timeout_s, tx.group).encode()
        try:
            pos = self.log.append(lr.PREPARE, body)
        except TxLogError as e:
            tx.state = prev
            raise TxFailure(XAER_RMFAIL, f"prepare record not written: {e}") from e

        def finish() -> bytes:
            crashpoint("after_prepare_record")
            return b"%d" % XA_OK

        return pos, finish, "prepare not known to be durable; roll it back"

    def _commit(
        self, tx: BrokerTx, ev: TxEvent
    ) -> tuple[Position | None, Callable[[], bytes], str]:
        self._transition(tx, ev)  # -> COMMITTING; no other command can touch it now
        if not tx.batches:
            tx.state = TxState.COMMITTED
            self._forget_finished(tx)
            self.stats.committed += 1
            return None, lambda: b"", ""
        hints = []
        seen: set[tuple[str, int]] = set()
        for b in tx.batches:
            k = (b.topic, b.partition)
            if k not in seen:
                seen.add(k)
                part = self.store.get(b.topic, b.partition)
                hints.append((b.topic, b.partition, part.end if part is not None else 0))
        tx.hints = tuple(hints)
        try:
            pos = self.log.append(lr.COMMIT, lr.Commit(tx.key, _now_ms(), tx.hints).encode())
        except TxLogError as e:
            tx.state = TxState.PREPARED if ev is TxEvent.COMMIT_TWO_PHASE else TxState.ENDED
            raise TxFailure(XAER_RMFAIL, f"commit record not written: {e}") from e

        def finish() -> bytes:
            crashpoint("after_commit_record")
            self._apply(tx)
            self.stats.committed += 1
            if tx.apply_error:
                return b"committed; messages will appear when the store recovers"
            return b""

        # a failed fsync leaves the decision unknown: the restart's recovery settles it
        return pos, finish, "commit decision not known to be durable (outcome unknown)"

    def _apply(self, tx: BrokerTx, recovering: bool = False) -> None:
        """Append the transaction's messages to their partitions (once), then log APPLIED."""
        grouped: dict[tuple[str, int], list[bytes]] = {}
        counts: dict[tuple[str, int], int] = {}
        for b in tx.batches:
            grouped.setdefault((b.topic, b.partition), []).append(b.records)
            counts[(b.topic, b.partition)] = counts.get((b.topic, b.partition), 0) + b.count
        hints = {(t, p): h for t, p, h in tx.hints}
        placements: list[tuple[str, int, int, int, int]] = []
        first = True
        done: list[tuple[Partition, int, int]] = []  # partition, end before, records
        delayed: tuple[int, bytes] | None = None
        for (topic, pidx), chunks in grouped.items():
            part = self.store.get(topic, pidx)
            if part is None:
                log.error(
                    "transaction %s: partition %s-%d no longer exists; its messages are dropped",
                    tx.key,
                    topic,
                    pidx,
                )
                continue
            data = b"".join(chunks)
            if recovering or tx.apply_error is not None:
                present, off0 = already_present(part, hints.get((topic, pidx), 0), data)
                if present == len(data):
                    placements.append((topic, pidx, off0, counts[(topic, pidx)], len(data)))
                    continue
                data = data[present:]
            if not first:
                crashpoint("mid_apply")
            first = False
            before = part.end
            try:
                off = part.append(data)
            except NotifyError as e:
                # all or nothing: take back the shares already appended in this step
                for p, end, _n in done:
                    try:
                        p.rollback_to(end)
                    except (NotifyError, OSError) as e2:
                        log.error("cannot take back %s-%d: %s", p.topic, p.index, e2)
                tx.apply_error = str(e)
                log.error(
                    "transaction %s is committed but applying it to %s-%d failed (%s); "
                    "nothing of it is visible; retrying every second",
                    tx.key,
                    topic,
                    pidx,
                    e,
                )
                return
            done.append((part, before, counts[(topic, pidx)]))
            placements.append((topic, pidx, off, counts[(topic, pidx)], len(data)))
            if topic == DELAY_TOPIC:
                delayed = (off, data)
        if delayed is not None and self.service.delay is not None:
            self.service.delay.index_appended(*delayed)  # delayed messages: due later
        for part, _before, n in done:
            fut = self.service.flusher.after_append(part, n)
            if fut is not None:
                fut.add_done_callback(_consume)
        tx.apply_error = None
        # APPLIED only saves recovery a look at the partition, so it is not forced and is
        # written with the other APPLIED records of this loop turn in one write
        self._applied.append((lr.APPLIED, lr.Applied(tx.key, tuple(placements)).encode()))
        if recovering or len(self._applied) >= 1024:
            self._write_applied()
        elif not self._applied_scheduled:
            self._applied_scheduled = True
            self.loop.call_soon(self._write_applied)
        tx.state = TxState.COMMITTED
        self.service._count_put_tx(placements)
        self._forget_finished(tx)

    def _write_applied(self) -> None:
        self._applied_scheduled = False
        batch, self._applied = self._applied, []
        if not batch:
            return
        try:
            self.log.append_many(batch)
        except TxLogError as e:
            log.error("%d APPLIED records not logged (recovery re-checks them): %s", len(batch), e)
        crashpoint("after_apply")

    def _rollback(
        self, tx: BrokerTx, ev: TxEvent, reason: str
    ) -> tuple[Position | None, Callable[[], bytes], str]:
        was_prepared = tx.state is TxState.PREPARED
        self._transition(tx, ev)
        tx.ended_reason = reason
        pos: Position | None = None
        if tx.batches:
            try:
                pos = self.log.append(lr.ROLLBACK, lr.Rollback(tx.key, reason).encode())
            except TxLogError as e:
                log.warning("rollback record of %s not written: %s", tx.key, e)
        self.stats.rolled_back += 1
        self._forget_finished(tx)
        # presumed abort: only a prepared transaction's rollback needs to be forced
        return (pos if was_prepared else None), lambda: b"", "rollback not known to be durable"

    def _rollback_now(self, tx: BrokerTx, ev: TxEvent, reason: str) -> None:
        """Roll back an unprepared transaction synchronously (timeouts, dropped connections)."""
        self._transition(tx, ev)
        tx.ended_reason = reason
        if tx.batches:
            try:
                self.log.append(lr.ROLLBACK, lr.Rollback(tx.key, reason).encode())
            except TxLogError as e:
                log.warning("rollback record of %s not written: %s", tx.key, e)
        self.stats.rolled_back += 1
        # keep a timed-out tx visible so its owner gets XA_RBTIMEOUT, then drop it
        if reason == "timeout":
            tx.batches = []
            self.loop.call_later(tx.timeout_s + 60, self._drop, tx)
        else:
            self._forget_finished(tx)

    def _drop(self, tx: BrokerTx) -> None:
        if self.txs.get(tx.key) is tx:
            del self.txs[tx.key]

    def _forget_finished(self, tx: BrokerTx) -> None:
        tx.batches = []
        if self.txs.get(tx.key) is tx:
            del self.txs[tx.key]
        if tx.conn is not None and tx.conn.session:
            tx.conn.session.discard(tx.key)

    # ------------------------------------------------------------------ admin

    def snapshot(self) -> list[BrokerTx]:
        return sorted(self.txs.values(), key=lambda t: t.created_ms)

    def stats_items(self) -> list[tuple[str, object]]:
        by_state: dict[str, int] = {}
        for tx in self.txs.values():
            by_state[tx.state.value] = by_state.get(tx.state.value, 0) + 1
        s = self.stats
        items: list[tuple[str, object]] = [
            ("tx_begun", s.begun),
            ("tx_committed", s.committed),
            ("tx_rolled_back", s.rolled_back),
            ("tx_timed_out", s.timed_out),
            ("tx_connection_rollbacks", s.connection_rollbacks),
            ("tx_recovered_prepared", s.recovered_prepared),
            ("tx_recovered_reapplied", s.recovered_reapplied),
            ("tx_recovered_rolled_back", s.recovered_rolled_back),
            ("tx_check_backs_sent", s.check_backs_sent),
            ("tx_check_back_exhausted", s.check_back_exhausted),
            ("txlog_end", str(self.log.end_position)),
            ("txlog_durable", str(self.log.durable_position)),
        ]
        items += [(f"tx_state_{k.lower()}", v) for k, v in sorted(by_state.items())]
        return items


def _consume(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()
