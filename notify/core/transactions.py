"""The broker's transaction engine: MetaQ's ``transaction`` command and transactional puts,
as pure logic over explicit collaborators (requests in, effects out).

Collaborators, passed at construction and nothing else:

* ``log``      the redo log (:class:`txlog.TxLog` or anything with its append/replay API)
* ``store``    partitions by ``(topic, index)``; ``applier`` appends committed shares
* ``clock``    ``monotonic()`` for deadlines, ``time()`` for persisted timestamps
* ``ids``      message ids (``next()``, ``next_block(n)``)
* ``limits``   the settings that bound transactions (:class:`TxLimits`)
* ``out``      the outbox: every command appends :mod:`~notify.core.effects` to it and the
               shell (the broker, or the simulation) executes them

A transactional put's record (message id assigned here) goes to the redo log as APPEND_MSG and
is kept in memory. COMMIT is logged and, with ``force_at_commit``, made durable (a
:class:`~notify.core.effects.Force` effect; the shell group-commits and calls
:meth:`TxEngine.forced`) **before** any message reaches a partition; then the shares are
applied through the shared :class:`~notify.core.apply.Applier` (all shares under one
:class:`~notify.store.gate.Gate`: readers see all of them or none) and APPLIED is logged. The
commit is answered only once readers can see the messages (the gate opened), which needs no
partition fsync: the redo log holds them, and until their partitions are flushed the
checkpoint keeps their records (:meth:`TxEngine.checkpoint_position`).

Every state change goes through :func:`notify.core.states.next_state`.

Local transactions (``TX:<session>:<seq>``) belong to the connection ("owner") that began them:
rolled back when it drops, and, once prepared, still rolled back when it drops or times out
unless the owner registered a producer group (a Notify *half message*, resolved by check-back).
XA transactions (``XID:...``) are associated with their owner as JTA has it: until END only the
owner may add messages to, end, prepare or commit the branch; once ENDed (or prepared, or its
owner gone) any owner may prepare, commit or roll it back; a prepared one never times out.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

from notify.config import SystemConfig
from notify.core.apply import Applier, Joint, PartitionLookup, Share, group_shares, no_crashpoint
from notify.core.effects import (
    Applied,
    Complete,
    Defer,
    Effect,
    Force,
    Placement,
    Reply,
    SendCheck,
    Ticket,
)
from notify.core.ports import Clock
from notify.core.states import OPEN, TERMINAL, TxEvent, TxState, allowed, next_state
from notify.errors import NotifyError, TransactionError, TxLogError
from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.frames import Transaction
from notify.protocol.keys import is_xa, validate_key
from notify.protocol.replies import MultiPutAck, PutAck, encode_prepare_vote
from notify.protocol.xa import (
    XA_OK,
    XA_RBROLLBACK,
    XA_RBTIMEOUT,
    XA_RDONLY,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMERR,
    XAER_RMFAIL,
    encode_xa_failure,
)
from notify.store.gate import Gate
from txlog import Position

log = logging.getLogger("notify.tx")

#: the hints of an apply that verifies nothing (it never reads them)
_NO_HINTS: Final[dict[tuple[str, int], int]] = {}
#: how long an unanswered check-back counts as in flight before it may be asked again
CHECK_TIMEOUT_S: Final = 5.0
#: how long a timed-out transaction is remembered so its owner gets XA_RBTIMEOUT
TOMBSTONE_S: Final = 60.0
#: The timer heap is compacted once its dead entries outnumber the live ones (plus this
#: slack), so each pass frees at least half of it: amortised O(1) per transaction.
COMPACT_SLACK: Final = 64


class RedoLog(Protocol):
    """The part of :class:`txlog.TxLog` the engine uses."""

    @property
    def end_position(self) -> Position: ...

    def append(self, rtype: int, body: bytes) -> Position: ...

    def append_many(self, records: Iterable[tuple[int, bytes]]) -> list[Position]: ...

    def replay(self, start: Position | None = None) -> Iterator[Any]: ...

    def sync(self, pos: Position | None = None) -> None: ...


class IdSource(Protocol):
    """Message ids."""

    def next(self) -> int: ...

    def next_block(self, count: int) -> int: ...


@dataclass(frozen=True, slots=True)
class TxLimits:
    """The settings that bound transactions (from ``[system]``)."""

    max_timeout_s: int = 60
    capacity: int = 30000
    max_tx_size: int = 64 * 1024 * 1024
    check_back_delay_ms: int = 6000
    check_back_max_times: int = 15
    check_back_concurrency: int = 16
    force_at_commit: bool = True
    #: a half message's COMMIT answered before its force (``halfCommitEarlyAck``)
    half_early_ack: bool = False
    delay_topic: str = "__delay"

    @classmethod
    def from_system(cls, sysc: SystemConfig) -> TxLimits:
        return cls(
            max_timeout_s=sysc.max_tx_timeout_in_seconds,
            capacity=sysc.max_tx_timeout_timer_capacity,
            max_tx_size=sysc.max_tx_size,
            check_back_delay_ms=sysc.tx_check_back_delay_ms,
            check_back_max_times=sysc.tx_check_back_max_times,
            check_back_concurrency=sysc.tx_check_back_concurrency,
            force_at_commit=sysc.flush_tx_log_at_commit == 1,
            half_early_ack=sysc.half_commit_early_ack,
        )


@dataclass(eq=False, slots=True)
class BrokerTx:
    """One transaction known to the broker."""

    key: str
    xa: bool
    owner: Any
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
    #: the hints are an APPLIED record's placements (where the shares went), not COMMIT's
    hints_exact: bool = False
    apply_error: str | None = None
    ended_reason: str = ""
    #: why the transaction can only roll back (a put was refused)
    failure: str = ""
    #: its timer entry counts toward ``maxTxTimeoutTimerCapacity`` (see TxEngine._live)
    timer_live: bool = False

    @property
    def message_count(self) -> int:
        return sum(b.count for b in self.batches)

    @property
    def orphanable(self) -> bool:
        """A prepared local transaction nobody can resolve once its owner is gone."""
        return not self.xa and not self.group


@dataclass
class TxStats:
    """Counters shown in ``stats`` and ``/metrics``."""

    begun: int = 0
    committed: int = 0
    rolled_back: int = 0
    timed_out: int = 0
    connection_rollbacks: int = 0
    abandoned: int = 0
    recovered_prepared: int = 0
    recovered_reapplied: int = 0
    recovered_rolled_back: int = 0
    check_backs_sent: int = 0
    check_back_exhausted: int = 0
    exhausted: list[str] = field(default_factory=list)


class TxFailure(TransactionError):
    """An error reply for a transaction command: XAException code, text and reply code."""

    def __init__(self, code: int, message: str, http: int = 500):
        super().__init__(message)
        self.code = code
        self.http = http


@dataclass(slots=True)
class TxPut:
    """One put of a one-shot transaction (:meth:`TxEngine.oneshot`), validated by the shell:
    a ``put``'s body (``count`` 0, with its flag and CRC) or an ``mput``'s records
    (``count`` of them, ids still 0, stamped in place)."""

    topic: str
    partition: int
    opaque: int
    data: bytes | bytearray
    count: int = 0
    flag: int = 0
    crc: int = 0


#: what a step's ``finish`` returns: the reply body, and the gate readers must see open
#: before the reply is sent (None: at once)
Done = tuple[bytes, Gate | None]
#: what a step's ``start`` returns: the position to force (None: none), ``finish``, and what
#: a failed force means
Started = tuple[Position | None, Callable[[], Done], str]


@dataclass(slots=True)
class _Step:
    """A step waiting for the redo log to be forced up to ``pos``."""

    pos: Position
    ticket: Ticket | None
    finish: Callable[[], Done]
    unsure: str


@dataclass(slots=True)
class _Recovered:
    first: Position
    batches: list[lr.AppendMsg] = field(default_factory=list)
    state: str = "active"
    prepare: lr.Prepare | None = None
    commit: lr.Commit | None = None
    applied: lr.Applied | None = None
    heuristic: lr.Heuristic | None = None


def _forget_is_noop(key: str, tx: BrokerTx | None) -> bool:
    """MetaQ answers FORGET of any XA xid with 200 and only drops a heuristic outcome, so
    FORGET of an XA transaction that is gone (committed, rolled back, never known) or rolled
    back is a no-op success; FORGET of a live one stays a protocol error."""
    return is_xa(key) and (tx is None or tx.state is TxState.ROLLED_BACK)


def _xa_reply(e: TxFailure) -> tuple[int, bytes]:
    return e.http, encode_xa_failure(e.code, str(e))


class TxEngine:
    """Transactions of one broker; every method runs on the broker's one thread."""

    def __init__(
        self,
        log: RedoLog,
        store: PartitionLookup,
        applier: Applier,
        clock: Clock,
        ids: IdSource,
        limits: TxLimits,
        out: list[Effect],
        crashpoint: Callable[[str], None] = no_crashpoint,
    ) -> None:
        self.log = log
        self.store = store
        self.applier = applier
        self.clock = clock
        self.ids = ids
        self.limits = limits
        self.out = out
        self.crashpoint = crashpoint
        self.txs: dict[str, BrokerTx] = {}
        self.stats = TxStats()
        #: (deadline, key) of transactions that can time out; stale entries dropped lazily
        self._timers: list[tuple[float, str]] = []
        #: heap entries of transactions still in a timed state (the rest are dead, dropped
        #: lazily): the exact count ``maxTxTimeoutTimerCapacity`` bounds
        self._live = 0
        self._owned: dict[Any, set[str]] = {}
        self._owner_group: dict[Any, str] = {}
        self.groups: dict[str, list[Any]] = {}
        self._forcing: list[_Step] = []
        #: gates of applied transactions not yet open (retried when a share was refused)
        self._gates: list[Gate] = []
        self._tombstones: deque[tuple[float, str]] = deque()
        #: (first record, placements) of applied transactions not yet flushed in partitions
        self._unflushed: deque[tuple[Position, tuple[Placement, ...]]] = deque()
        #: APPLIED records not yet written: they go out with the next redo write (one
        #: write system call fewer per commit), see :meth:`write_backlog`
        self._backlog: list[tuple[int, bytes]] = []
        self._opaque = 0

    # ------------------------------------------------------------------ helpers

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def _to(self, tx: BrokerTx, ev: TxEvent) -> None:
        """The one place a transaction changes state."""
        try:
            tx.state = next_state(tx.state, ev)
        except TransactionError as e:
            raise TxFailure(XAER_PROTO, f"{tx.key}: {e}") from None
        if tx.timer_live:
            self._untime(tx)

    def _untime(self, tx: BrokerTx) -> None:
        """Its heap entry goes dead once no deadline applies (the entry is dropped lazily)."""
        if tx.timer_live and not self._timed(tx):
            tx.timer_live = False
            self._live -= 1

    def _reply(self, owner: Any, opaque: int, code: int, body: bytes = b"") -> None:
        self.out.append(Reply(owner, opaque, code, body))

    def _fail(self, owner: Any, opaque: int, e: TxFailure) -> None:
        code, body = _xa_reply(e)
        self.out.append(Reply(owner, opaque, code, body))

    def _log(self, rtype: int, body: bytes) -> Position:
        backlog = self._backlog
        if not backlog:
            return self.log.append(rtype, body)
        backlog.append((rtype, body))  # the waiting APPLIED records ride along, in order
        try:
            pos = self.log.append_many(backlog)[-1]
        except TxLogError:
            backlog.pop()
            raise
        self._backlog = []
        return pos

    def write_backlog(self) -> None:
        """Write the APPLIED records still waiting for the next redo write (before a
        checkpoint, at close): they are hints for recovery, which re-checks a commit
        without one by message id, so they are never forced."""
        if not self._backlog:
            return
        backlog, self._backlog = self._backlog, []
        try:
            self.log.append_many(backlog)
        except TxLogError as e:
            log.error("%d APPLIED records not logged (recovery re-checks): %s", len(backlog), e)

    # ------------------------------------------------------------------ owners

    def register(self, owner: Any, group: str, opaque: int) -> None:
        """``register <group>``: this owner's prepared transactions are half messages the
        broker may check back on through any owner of the group."""
        members = self.groups.setdefault(group, [])
        if owner not in members:
            members.append(owner)
        self._owner_group[owner] = group
        self._reply(owner, opaque, 200, b"registered")

    def owner_lost(self, owner: Any) -> None:
        """The owner's connection is gone: roll back its unprepared local transactions and
        its prepared ones nobody else can resolve."""
        group = self._owner_group.pop(owner, None)
        if group is not None:
            members = self.groups.get(group)
            if members is not None and owner in members:
                members.remove(owner)
                if not members:
                    del self.groups[group]
        keys = self._owned.pop(owner, None)
        if not keys:
            return
        for key in list(keys):
            tx = self.txs.get(key)
            if tx is None or tx.owner is not owner:
                continue
            tx.owner = None
            if tx.xa:
                continue
            if tx.state in OPEN:
                self.stats.connection_rollbacks += 1
                log.info("connection lost: rolled back local transaction %s", key)
                self._rollback_now(tx, TxEvent.CONNECTION_LOST, "connection lost")
            elif tx.state is TxState.PREPARED and tx.orphanable:
                self.stats.abandoned += 1
                log.info("connection lost: rolled back prepared local transaction %s", key)
                self._rollback_now(tx, TxEvent.ABANDONED, "connection lost while prepared")

    # ------------------------------------------------------------------ puts

    def _tx_for_put(self, owner: Any, key: str) -> BrokerTx:
        tx = self.txs.get(key)
        if tx is None:
            raise TxFailure(XAER_NOTA, f"unknown transaction {key}: send BEGIN first")
        if tx.owner is not owner:  # XA too: only the connection that began the branch
            raise TxFailure(XAER_PROTO, f"transaction {key} belongs to another connection")
        if tx.state is TxState.ROLLED_BACK and tx.ended_reason == "timeout":
            raise TxFailure(XA_RBTIMEOUT, f"transaction {key} timed out and was rolled back")
        if tx.state is TxState.ROLLBACK_ONLY:
            raise TxFailure(XA_RBROLLBACK, f"transaction {key} can only roll back: {tx.failure}")
        if not allowed(tx.state, TxEvent.PUT):
            raise TxFailure(XAER_PROTO, f"cannot add messages to {key} in state {tx.state.value}")
        return tx

    def _add_batch(self, tx: BrokerTx, am: lr.AppendMsg) -> None:
        """Log one batch of the transaction; a refusal makes the transaction rollback-only."""
        try:
            if tx.nbytes + len(am.records) > self.limits.max_tx_size:
                raise TxFailure(
                    XAER_RMERR,
                    f"transaction {tx.key} would exceed maxTxSize {self.limits.max_tx_size}",
                )
            try:
                pos = self._log(lr.APPEND_MSG, am.encode())
            except TxLogError as e:
                raise TxFailure(XAER_RMFAIL, f"transaction log write failed: {e}") from e
        except TxFailure as e:
            tx.failure = str(e)
            if allowed(tx.state, TxEvent.FAILED):
                self._to(tx, TxEvent.FAILED)
            raise
        self._to(tx, TxEvent.PUT)
        if tx.first_pos is None:
            tx.first_pos = pos
        tx.batches.append(am)
        tx.nbytes += len(am.records)
        self.crashpoint("after_append_msg")

    def put(
        self,
        owner: Any,
        key: str,
        topic: str,
        partition: int,
        flag: int,
        body: bytes,
        crc: int,
        opaque: int,
        reply_partition: int = -1,
    ) -> None:
        """A put inside a transaction (a delayed put passes its envelope for the delay
        partition and the target partition to report in the reply)."""
        try:
            tx = self._tx_for_put(owner, key)
            msg_id = self.ids.next()
            rec = records.encode(msg_id, flag, body, crc)
            self._add_batch(tx, lr.AppendMsg(tx.key, topic, partition, 1, rec))
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        shown = partition if reply_partition < 0 else reply_partition
        self._reply(owner, opaque, 200, PutAck(msg_id, shown, -1).encode())

    def mput(
        self,
        owner: Any,
        key: str,
        topic: str,
        partition: int,
        buf: bytearray,
        count: int,
        opaque: int,
    ) -> None:
        """A batch of validated records (ids still 0) inside a transaction."""
        try:
            tx = self._tx_for_put(owner, key)
            first = self.ids.next_block(count)
            records.stamp_ids(buf, first)
            self._add_batch(tx, lr.AppendMsg(tx.key, topic, partition, count, bytes(buf)))
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        self._reply(owner, opaque, 200, MultiPutAck(first, partition, -1, count).encode())

    def oneshot(
        self, owner: Any, begin: Transaction, puts: list[TxPut], commit: Transaction
    ) -> bool:
        """BEGIN, ``puts`` and COMMIT_ONE_PHASE of one local transaction that arrived
        together (one read): handled as one unit with the same replies, states and redo
        records as one by one, but the APPEND_MSG records and the COMMIT go to the redo log
        in one write. False (nothing changed, nothing answered) when the shape is not the
        plain one (unknown or reused key, capacity reached, over ``maxTxSize``, a
        ``msgs=<n>`` mismatch, a failing log write): the shell then runs the requests one
        by one, which gives the usual errors."""
        key = begin.tx_key
        if key is None or commit.tx_key != key or not puts:
            return False
        try:
            key = validate_key(key)
        except TransactionError:
            return False
        limits = self.limits
        if key in self.txs or is_xa(key) or len(self._timers) >= limits.capacity:
            return False
        count = 0
        nbytes = 0
        for p in puts:
            if p.count:
                count += p.count
                nbytes += len(p.data)
            else:
                count += 1
                nbytes += len(p.data) + records.HEADER_SIZE
        expect = commit.expect_messages
        if nbytes > limits.max_tx_size or (expect is not None and expect != count):
            return False
        cap_s = limits.max_timeout_s
        timeout = cap_s if not begin.timeout or begin.timeout <= 0 else min(begin.timeout, cap_s)
        now_ms = self._now_ms()
        tx = BrokerTx(
            key, False, owner, TxState.NEW, timeout, self.clock.monotonic() + timeout, now_ms
        )
        self._to(tx, TxEvent.BEGIN)
        acks: list[Reply] = [Reply(owner, begin.opaque, 200, b"")]
        frames: list[tuple[int, bytes]] = []
        batches = tx.batches
        hints: list[tuple[str, int, int]] = []
        store = self.store
        ids = self.ids
        for p in puts:
            if p.count:
                first = ids.next_block(p.count)
                records.stamp_ids(p.data, first)  # type: ignore[arg-type]
                am = lr.AppendMsg(key, p.topic, p.partition, p.count, bytes(p.data))
                ack = MultiPutAck(first, p.partition, -1, p.count).encode()
            else:
                msg_id = ids.next_block(1)
                rec = records.encode(msg_id, p.flag, cast(bytes, p.data), p.crc)
                am = lr.AppendMsg(key, p.topic, p.partition, 1, rec)
                ack = PutAck(msg_id, p.partition, -1).encode()
            self._to(tx, TxEvent.PUT)
            batches.append(am)
            tx.nbytes += len(am.records)
            frames.append((lr.APPEND_MSG, am.encode()))
            acks.append(Reply(owner, p.opaque, 200, ack))
            for h in hints:  # one per partition, in the order partitions first appear
                if h[1] == p.partition and h[0] == p.topic:
                    break
            else:
                part = store.get(p.topic, p.partition)
                hints.append((p.topic, p.partition, part.end if part is not None else 0))
        tx.hints = hints_t = tuple(hints)
        frames.append((lr.COMMIT, lr.Commit(key, now_ms, hints_t).encode()))
        backlog = self._backlog
        try:
            positions = self.log.append_many(backlog + frames if backlog else frames)
        except TxLogError:
            tx.hints = ()
            return False  # nothing written: the one-by-one path reports the failure
        if backlog:
            self._backlog = []
        tx.first_pos = positions[len(backlog)]
        self.txs[key] = tx
        self.stats.begun += 1
        self.out.extend(acks)
        self.crashpoint("after_append_msg")  # (the COMMIT is in the same write)
        self._to(tx, TxEvent.COMMIT_ONE_PHASE)  # -> COMMITTING
        pos = positions[-1]
        self._step(owner, commit.opaque, lambda: self._committed(tx, pos))
        return True

    # ------------------------------------------------------------------ the command

    def handle(self, owner: Any, r: Transaction) -> None:
        """One ``transaction`` command."""
        t = r.type
        try:
            if t == "RECOVER":
                return self._recover_cmd(owner, r)
            if r.tx_key is None:
                raise TxFailure(XAER_INVAL, f"{t} needs a transaction key")
            try:
                key = validate_key(r.tx_key)
            except TransactionError as e:
                raise TxFailure(XAER_INVAL, str(e)) from None
            if t == "BEGIN":
                return self._begin(owner, key, r)
            tx = self.txs.get(key)
            if t == "FORGET" and _forget_is_noop(key, tx):
                return self._reply(owner, r.opaque, 200)
            if tx is None:
                raise TxFailure(XAER_NOTA, f"unknown transaction {key}")
            if t != "END" and t != "PREPARE" and not getattr(owner, "admin", True):
                self._require_resolver(owner, tx, t)
            if t == "END":
                self._check_owner(tx, owner)
                self._to(tx, TxEvent.END)
                self._reply(owner, r.opaque, 200)
            elif t == "PREPARE":
                self._check(tx, TxEvent.PREPARE, owner)
                self._check_count(tx, r.expect_messages)
                self._step(owner, r.opaque, lambda: self._prepare(tx, owner))
            elif t in ("COMMIT_ONE_PHASE", "COMMIT_TWO_PHASE"):
                ev = (
                    TxEvent.COMMIT_ONE_PHASE
                    if t == "COMMIT_ONE_PHASE"
                    else TxEvent.COMMIT_TWO_PHASE
                )
                self._check(tx, ev, owner)
                if ev is TxEvent.COMMIT_ONE_PHASE:
                    self._check_count(tx, r.expect_messages)
                elif (
                    self.limits.half_early_ack
                    and tx.group
                    and not tx.xa
                    and tx.state is TxState.PREPARED
                    and (tx.owner is owner or self._owner_group.get(owner) == tx.group)
                ):  # a half message committed by its producer group (not an admin)
                    return self._commit_half(owner, r.opaque, tx)
                self._step(owner, r.opaque, lambda: self._commit(tx, ev))
            elif t == "ROLLBACK":
                self._check(tx, TxEvent.ROLLBACK, owner)
                self._step(
                    owner, r.opaque, lambda: self._rollback(tx, TxEvent.ROLLBACK, "rollback")
                )
            elif t == "FORGET":
                self._to(tx, TxEvent.FORGET)
                self._log(lr.FORGET, lr.Forget(key).encode())
                self._drop(tx)
                self._reply(owner, r.opaque, 200)
        except TxFailure as e:
            self._fail(owner, r.opaque, e)

    def _check_count(self, tx: BrokerTx, expected: int | None) -> None:
        """``msgs=<n>`` on COMMIT_ONE_PHASE/PREPARE: fewer (or more) messages recorded than
        the client wrote means a put was refused before it reached the transaction (unknown
        partition, bad checksum, too large...): the transaction becomes rollback-only, so
        the commit or prepare that follows rolls it back."""
        if expected is None or tx.message_count == expected:
            return
        if not tx.failure:
            tx.failure = (
                f"the client wrote {expected} messages, {tx.message_count} were recorded "
                "(a put was refused)"
            )
        if allowed(tx.state, TxEvent.FAILED):
            self._to(tx, TxEvent.FAILED)

    def _require_resolver(self, owner: Any, tx: BrokerTx, ttype: str) -> None:
        """Without the admin role (``adminSecret`` set, ``auth`` with ``authSecret``) an owner
        may commit or roll back only what an application may: its own transactions, any XA
        transaction (apps commit their xids from any connection), and half messages of the
        producer group it registered (check-back answers). FORGET and anything in a heuristic
        state are administrator paths."""
        if ttype == "FORGET" or tx.state in (
            TxState.HEURISTIC_COMMITTED,
            TxState.HEURISTIC_ROLLED_BACK,
        ):
            ok = False
        elif tx.xa or tx.owner is owner:
            ok = True
        else:
            ok = bool(tx.group) and self._owner_group.get(owner) == tx.group
        if not ok:
            raise TxFailure(
                XAER_PROTO, f"{ttype} of {tx.key} needs the admin role (auth with adminSecret)", 403
            )

    def _check_owner(self, tx: BrokerTx, owner: Any) -> None:
        """A local transaction is its connection's until prepared; an XA branch is
        associated with the connection that began it until END (JTA: only it may add to,
        end, prepare or commit it while active), then any connection may prepare, commit
        or roll it back (a recovering coordinator's), as it may once that one is gone."""
        if tx.owner is None or tx.owner is owner:
            return
        if tx.xa:
            if tx.state is TxState.ACTIVE:
                raise TxFailure(
                    XAER_PROTO,
                    f"XA branch {tx.key} is associated with the connection that began it "
                    "until END",
                )
        elif tx.state is not TxState.PREPARED:
            raise TxFailure(XAER_PROTO, f"transaction {tx.key} belongs to another connection")

    def _check(self, tx: BrokerTx, ev: TxEvent, owner: Any) -> None:
        if tx.state is TxState.ROLLED_BACK and tx.ended_reason == "timeout":
            raise TxFailure(XA_RBTIMEOUT, f"transaction {tx.key} timed out and was rolled back")
        if not allowed(tx.state, ev):
            raise TxFailure(XAER_PROTO, f"{ev.value} is not allowed in state {tx.state.value}")
        self._check_owner(tx, owner)

    def _compact_timers(self) -> None:
        """Drop dead heap entries once they outnumber the live ones: each pass is O(heap)
        and frees at least half of it, so it costs O(1) per transaction amortised (a
        compaction per end+begin pair at capacity cost O(capacity) each before), and the
        heap never holds more than about twice ``maxTxTimeoutTimerCapacity`` entries."""
        timers = self._timers
        if len(timers) > 2 * self._live + COMPACT_SLACK:
            self._timers = timers = [
                (d, k)
                for d, k in timers
                if (tx := self.txs.get(k)) is not None and tx.deadline == d and tx.timer_live
            ]
            heapq.heapify(timers)

    @staticmethod
    def _timed(tx: BrokerTx) -> bool:
        """Whether a deadline still applies: open ones, and prepared ones nobody resolves."""
        return tx.state in OPEN or (tx.state is TxState.PREPARED and tx.orphanable)

    def _begin(self, owner: Any, key: str, r: Transaction) -> None:
        old = self.txs.get(key)
        if old is not None and old.state not in TERMINAL:
            raise TxFailure(XAER_DUPID, f"transaction {key} already exists")
        cap = self.limits.capacity
        live = self._live
        if live >= cap:
            raise TxFailure(
                XAER_RMFAIL,
                f"too many open transactions ({live} >= maxTxTimeoutTimerCapacity {cap}); "
                "retry later",
                503,
            )
        cap_s = self.limits.max_timeout_s
        timeout = cap_s if not r.timeout or r.timeout <= 0 else min(r.timeout, cap_s)
        tx = BrokerTx(
            key=key,
            xa=is_xa(key),
            owner=owner,
            state=TxState.NEW,
            timeout_s=timeout,
            deadline=self.clock.monotonic() + timeout,
            created_ms=self._now_ms(),
        )
        self._to(tx, TxEvent.BEGIN)
        self.txs[key] = tx
        self._compact_timers()
        heapq.heappush(self._timers, (tx.deadline, key))
        tx.timer_live = True
        self._live += 1
        self._owned.setdefault(owner, set()).add(key)
        self.stats.begun += 1
        self._reply(owner, r.opaque, 200)

    def _recover_cmd(self, owner: Any, r: Transaction) -> None:
        uq = r.unique_qualifier
        keys = [
            tx.key
            for tx in self.txs.values()
            if tx.xa
            and tx.state is TxState.PREPARED
            and (not uq or uq == "null" or tx.key.rsplit(":", 1)[-1] == uq)
        ]
        self._reply(owner, r.opaque, 200, "\r\n".join(keys).encode())

    # ------------------------------------------------------------------ steps and forcing

    def _step(self, owner: Any, opaque: int, start: Callable[[], Started]) -> None:
        """Run a step: ``start()`` changes state and appends its record (no fsync) and
        returns ``(position to force or None, finish, what a failed force means)``. With
        ``force_at_commit`` the reply waits for the force; ``finish`` then returns the
        reply body and the gate readers must see open first."""
        try:
            pos, finish, unsure = start()
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        if pos is None or not self.limits.force_at_commit:
            return self._finish(owner, opaque, None, finish)
        ticket = Ticket(owner, opaque)
        self.out.append(Defer(ticket))
        self._forcing.append(_Step(pos, ticket, finish, unsure))
        self.out.append(Force(pos))

    def _commit_half(self, owner: Any, opaque: int, tx: BrokerTx) -> None:
        """COMMIT_TWO_PHASE of a prepared half message with ``halfCommitEarlyAck``: answered
        as soon as the COMMIT is logged, without waiting for its force. Safe because the
        PREPARE was forced and the messages are applied (readable) only once the COMMIT is
        forced: if a crash loses the COMMIT, recovery finds the half message prepared and the
        check-back asks the producer group, whose checker answers COMMIT from the
        application's database (README "Transactions")."""
        try:
            pos, finish, unsure = self._commit(tx, TxEvent.COMMIT_TWO_PHASE)
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        self._reply(owner, opaque, 200)
        if pos is None or not self.limits.force_at_commit:
            finish()
            return
        self._forcing.append(_Step(pos, None, finish, unsure))
        self.out.append(Force(pos, lazy=True))

    def _finish(
        self,
        owner: Any,
        opaque: int,
        ticket: Ticket | None,
        finish: Callable[[], Done],
    ) -> None:
        try:
            body, gate = finish()
        except TxFailure as e:
            code, fbody = _xa_reply(e)
            if ticket is None:
                return self._reply(owner, opaque, code, fbody)
            ticket.set(code, fbody)
            self.out.append(Complete(ticket))
            return
        if gate is None or gate.is_open:
            if ticket is None:
                return self._reply(owner, opaque, 200, body)
            ticket.set(200, body)
            self.out.append(Complete(ticket))
            return
        if ticket is None:
            ticket = Ticket(owner, opaque)
            self.out.append(Defer(ticket))
        t = ticket
        hook = gate.on_open

        def opened() -> None:
            if hook is not None:
                hook()
            if not t.done:
                t.set(200, body)
                self.out.append(Complete(t))

        gate.on_open = opened

    @property
    def acked_before_force(self) -> bool:
        """Whether a step waiting for the force was already answered (a half message's
        commit, see :meth:`_commit_half`)."""
        return any(s.ticket is None for s in self._forcing)

    @property
    def pending_force(self) -> bool:
        """Whether steps wait for a force of the redo log."""
        return bool(self._forcing)

    def forced(self, upto: Position, error: str | None = None) -> None:
        """The shell forced the redo log up to ``upto`` (``error``: the force failed, so the
        outcome of those steps is unknown until a restart's recovery settles it)."""
        ready = [s for s in self._forcing if s.pos <= upto]
        if not ready:
            return
        self._forcing = [s for s in self._forcing if s.pos > upto]
        for s in ready:
            t = s.ticket
            if error is not None:
                if t is not None:
                    t.set(*_xa_reply(TxFailure(XAER_RMFAIL, f"{s.unsure}: {error}")))
                    self.out.append(Complete(t))
                continue
            if t is None:
                s.finish()
            else:
                self._finish(t.owner, t.opaque, t, s.finish)

    # ------------------------------------------------------------------ prepare, commit, rollback

    def _prepare(
        self, tx: BrokerTx, owner: Any
    ) -> Started:
        if tx.state is TxState.ROLLBACK_ONLY:
            self._rollback_only(tx, TxEvent.PREPARE)
        if not tx.batches:
            self._to(tx, TxEvent.READ_ONLY)  # no work: vote read-only, nothing to remember
            self._forget_finished(tx)
            return None, lambda: (encode_prepare_vote(XA_RDONLY), None), ""
        group = self._owner_group.get(owner, "")
        at = self._now_ms()
        body = lr.Prepare(tx.key, at, tx.timeout_s, group).encode()
        try:
            pos = self._log(lr.PREPARE, body)
        except TxLogError as e:
            # the record did not reach the log: the transaction can only roll back now
            tx.failure = f"prepare record not written: {e}"
            self._to(tx, TxEvent.FAILED)
            raise TxFailure(XAER_RMFAIL, tx.failure) from e
        self._to(tx, TxEvent.PREPARE)
        tx.group = group
        self._untime(tx)  # a half message has no deadline
        tx.prepared_at_ms = at

        def finish() -> Done:
            self.crashpoint("after_prepare_record")
            return encode_prepare_vote(XA_OK), None

        return pos, finish, "prepare not known to be durable; roll it back"

    def _rollback_only(self, tx: BrokerTx, ev: TxEvent) -> None:
        """A commit or prepare of a transaction one of whose puts failed: roll it back."""
        reason = tx.failure or "a put of this transaction failed"
        self._to(tx, ev)  # ROLLBACK_ONLY -> ROLLED_BACK
        tx.ended_reason = reason
        self._log_rollback(tx, reason)
        self.stats.rolled_back += 1
        self._forget_finished(tx)
        raise TxFailure(XA_RBROLLBACK, f"transaction {tx.key} was rolled back: {reason}", 500)

    def _commit(
        self, tx: BrokerTx, ev: TxEvent
    ) -> Started:
        if tx.state is TxState.ROLLBACK_ONLY:
            self._rollback_only(tx, ev)
        if not tx.batches:
            self._to(tx, ev)
            self._to(tx, TxEvent.APPLIED)
            self._forget_finished(tx)
            self.stats.committed += 1
            return None, lambda: (b"", None), ""
        hints: list[tuple[str, int, int]] = []
        seen: set[tuple[str, int]] = set()
        for b in tx.batches:
            k = (b.topic, b.partition)
            if k not in seen:
                seen.add(k)
                part = self.store.get(b.topic, b.partition)
                hints.append((b.topic, b.partition, part.end if part is not None else 0))
        try:
            pos = self._log(lr.COMMIT, lr.Commit(tx.key, self._now_ms(), tuple(hints)).encode())
        except TxLogError as e:  # the decision never reached the log: nothing changed
            raise TxFailure(XAER_RMFAIL, f"commit record not written: {e}") from e
        self._to(tx, ev)  # -> COMMITTING; no other command can touch it now
        tx.hints = tuple(hints)
        return self._committed(tx, pos)

    def _committed(
        self, tx: BrokerTx, pos: Position
    ) -> Started:
        """A COMMIT record was written at ``pos`` (not yet forced): the step that applies it."""

        def finish() -> Done:
            self.crashpoint("after_commit_record")
            self.stats.committed += 1
            applied = self._apply(tx)
            if applied is None:
                return b"committed; messages will appear when the store recovers", None
            return b"", applied.gate

        # a failed force leaves the decision unknown: the restart's recovery settles it
        return pos, finish, "commit decision not known to be durable (outcome unknown)"

    def _apply(self, tx: BrokerTx, recovering: bool = False) -> Joint | None:
        """Append the transaction's messages to their partitions (once, all under one gate:
        readers see all or none of them), then log APPLIED (once every share is placed:
        shares deferred to the gate's opening are placed later). None when a partition
        refused (the apply is retried; nothing of it is visible). Recovery applies without
        a gate: nobody reads meanwhile, and it ends with every touched partition synced."""
        batches = tx.batches
        if len(batches) == 1:
            b = batches[0]
            shares = [Share(b.topic, b.partition, b.records, b.count)]
        else:
            shares = group_shares((b.topic, b.partition, b.records, b.count) for b in batches)
        verify = recovering or tx.apply_error is not None
        # where each partition ended at the decision: read only to verify what is there
        hints = {(t, p): h for t, p, h in tx.hints} if verify else _NO_HINTS

        def missing(sh: Share) -> None:
            log.error(
                "transaction %s: partition %s-%d no longer exists; %d messages dropped",
                tx.key,
                sh.topic,
                sh.partition,
                sh.count,
            )

        what = f"transaction {tx.key}"
        try:
            if recovering:
                joint = Joint(
                    self.applier.apply(
                        shares,
                        hints,
                        verify=True,
                        what=what,
                        on_missing=missing,
                        exact=tx.hints_exact,
                    ),
                    None,
                )
            else:
                joint = self.applier.apply_joint(
                    shares, hints, verify=verify, what=what, on_missing=missing
                )
        except NotifyError as e:
            if tx.apply_error is None:
                log.error(
                    "transaction %s is committed but applying it failed (%s); nothing of it "
                    "is visible; retrying every second",
                    tx.key,
                    e,
                )
            tx.apply_error = str(e)
            return None
        tx.apply_error = None
        gate = joint.gate
        if gate is None or not gate.deferred:
            self._applied(tx, shares, tuple(joint.placements), recovering)
            return joint
        # the shares of settled partitions without group commit are placed when the gate
        # opens: APPLIED (and the end of COMMITTING, which keeps the COMMIT record from
        # checkpoints) waits for them
        later = [(d.part, d.count) for d in gate.deferred]
        now = list(joint.placements)

        def placed(done: list[tuple[Any, int, int]]) -> None:
            more = [
                Placement(part.topic, part.index, start, count, end - start)
                for (part, count), (_p, start, end) in zip(later, done, strict=True)
            ]
            self._applied(tx, shares, tuple(now + more), False)

        gate.on_placed = placed
        if len(self._gates) > 64:
            self._gates = [g for g in self._gates if not g.is_open]
        self._gates.append(gate)
        return joint

    def _applied(
        self,
        tx: BrokerTx,
        shares: list[Share],
        placements: tuple[Placement, ...],
        recovering: bool,
    ) -> None:
        """Every share of ``tx`` is placed: log APPLIED, finish its state, tell the shell."""
        applied = lr.Applied(
            tx.key, tuple([(p.topic, p.partition, p.offset, p.count, p.nbytes) for p in placements])
        ).encode()
        if recovering:
            # a re-apply may land below the COMMIT's hint (the partition's tail was lost):
            # only this record tells the next recovery where, so it is written now
            try:
                self._log(lr.APPLIED, applied)
            except TxLogError as e:
                log.error("APPLIED of %s not logged (recovery re-checks it): %s", tx.key, e)
        else:
            # the next redo write carries it: the messages went at or after the COMMIT's
            # hint, where a recovery without this record finds them by message id
            self._backlog.append((lr.APPLIED, applied))
        self.crashpoint("after_apply")
        self._to(tx, TxEvent.APPLIED)
        if tx.first_pos is not None:
            self._unflushed.append((tx.first_pos, placements))
        delay_topic = self.limits.delay_topic
        delayed: tuple[tuple[int, bytes], ...] = ()
        for p in placements:
            if p.topic == delay_topic:
                data_of = {(sh.topic, sh.partition): sh.data for sh in shares}
                delayed = tuple(
                    [(q.offset, data_of[(q.topic, q.partition)])
                     for q in placements if q.topic == delay_topic]
                )
                break
        self.out.append(Applied(tx.key, placements, delayed))
        self._forget_finished(tx)

    def _log_rollback(self, tx: BrokerTx, reason: str) -> Position | None:
        if not tx.batches:
            return None
        try:
            return self._log(lr.ROLLBACK, lr.Rollback(tx.key, reason).encode())
        except TxLogError as e:
            log.warning("rollback record of %s not written: %s", tx.key, e)
            return None

    def _rollback(
        self, tx: BrokerTx, ev: TxEvent, reason: str
    ) -> Started:
        was_prepared = tx.state is TxState.PREPARED
        self._to(tx, ev)
        tx.ended_reason = reason
        pos = self._log_rollback(tx, reason)
        self.stats.rolled_back += 1
        self._forget_finished(tx)
        # presumed abort: only a prepared transaction's rollback needs to be forced
        return (
            (pos if was_prepared else None),
            lambda: (b"", None),
            "rollback not known to be durable",
        )

    def _rollback_now(self, tx: BrokerTx, ev: TxEvent, reason: str) -> None:
        """Roll back without a reply (timeouts, lost owners, exhausted check-backs)."""
        self._to(tx, ev)
        tx.ended_reason = reason
        self._log_rollback(tx, reason)
        self.stats.rolled_back += 1
        if reason == "timeout":
            # keep a timed-out transaction known so its owner gets XA_RBTIMEOUT
            tx.batches = []
            self._tombstones.append((self.clock.monotonic() + tx.timeout_s + TOMBSTONE_S, tx.key))
        else:
            self._forget_finished(tx)

    def _drop(self, tx: BrokerTx) -> None:
        if self.txs.get(tx.key) is tx:
            del self.txs[tx.key]
        keys = self._owned.get(tx.owner)
        if keys is not None:
            keys.discard(tx.key)

    def _forget_finished(self, tx: BrokerTx) -> None:
        tx.batches = []
        self._drop(tx)

    # ------------------------------------------------------------------ time-driven work

    def expire(self) -> None:
        """Roll back transactions past their deadline (open ones; prepared local ones nobody
        can resolve) and forget old tombstones."""
        now = self.clock.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, key = heapq.heappop(timers)
            tx = self.txs.get(key)
            if tx is None or tx.deadline != deadline or not tx.timer_live:
                continue
            tx.timer_live = False
            self._live -= 1
            if tx.state in OPEN:
                self.stats.timed_out += 1
                log.info("transaction %s timed out after %ds: rolled back", tx.key, tx.timeout_s)
                self._rollback_now(tx, TxEvent.TIMEOUT, "timeout")
            elif tx.state is TxState.PREPARED and tx.orphanable:
                self.stats.abandoned += 1
                log.info("prepared local transaction %s timed out: rolled back", tx.key)
                self._rollback_now(tx, TxEvent.ABANDONED, "timeout")
        tomb = self._tombstones
        while tomb and tomb[0][0] <= now:
            _t, key = tomb.popleft()
            tx = self.txs.get(key)
            if tx is not None and tx.state is TxState.ROLLED_BACK:
                self._drop(tx)

    def check_backs(self) -> None:
        """Ask producers about half messages prepared longer than ``txCheckBackDelay``."""
        now = self.clock.monotonic()
        lim = self.limits
        delay = lim.check_back_delay_ms / 1000.0
        in_flight = 0
        due: list[BrokerTx] = []
        wall = self.clock.time()
        for tx in self.txs.values():
            if tx.state is not TxState.PREPARED or not tx.group:
                continue
            if tx.checking and now - tx.last_check > CHECK_TIMEOUT_S:
                tx.checking = False  # the producer did not answer: ask again later
            if tx.checking:
                in_flight += 1
                continue
            age = wall - tx.prepared_at_ms / 1000.0
            if age >= delay and now - tx.last_check >= delay:
                due.append(tx)
        for tx in due:
            if in_flight >= lim.check_back_concurrency:
                break
            if tx.checks >= lim.check_back_max_times:
                self.stats.check_back_exhausted += 1
                self.stats.exhausted.append(tx.key)
                del self.stats.exhausted[:-100]
                log.warning(
                    "half message %s: no answer after %d check-backs: rolled back",
                    tx.key,
                    tx.checks,
                )
                self._rollback_now(tx, TxEvent.CHECK_BACK_EXHAUSTED, "check-back exhausted")
                continue
            owners = self.groups.get(tx.group)
            if not owners:
                continue
            owner = owners[tx.checks % len(owners)]
            tx.checks += 1
            tx.last_check = now
            tx.checking = True
            in_flight += 1
            self.stats.check_backs_sent += 1
            first = tx.batches[0]
            self._opaque = (self._opaque + 1) & 0x7FFFFFFF
            self.out.append(
                SendCheck(owner, tx.key, first.topic, first.partition, first.records, self._opaque)
            )

    def retry_applies(self) -> None:
        """Apply committed transactions whose apply failed (a full disk) again, and the
        shares a partition refused when their gate was ready to open."""
        for tx in list(self.txs.values()):
            if tx.state is TxState.COMMITTING and tx.apply_error is not None:
                self._apply(tx)
        self._gates = [g for g in self._gates if not g.is_open]
        self.applier.retry_stalled(self._gates)

    def checkpoint_position(self) -> Position:
        """Where replay must start: the first record of the oldest transaction that is
        unfinished, or applied but not yet on disk in its partitions (the waiting APPLIED
        records are written first)."""
        self.write_backlog()
        unflushed = self._unflushed
        while unflushed and self.applier.durable(unflushed[0][1]):
            unflushed.popleft()
        live = [
            tx.first_pos
            for tx in self.txs.values()
            if tx.first_pos is not None
            and (
                tx.state not in TERMINAL
                or tx.state in (TxState.HEURISTIC_COMMITTED, TxState.HEURISTIC_ROLLED_BACK)
            )
        ]
        live += [pos for pos, _pl in unflushed]
        return min(live, default=self.log.end_position)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Replay the redo log: re-apply committed transactions whose messages are not all in
        their partitions (in commit order, at their original offsets), restore prepared
        XA transactions and half messages, roll back the rest."""
        table: dict[str, _Recovered] = {}
        commit_order: list[str] = []
        for pos, rtype, body in self.log.replay():
            key = lr.key_of(body)
            ent = table.get(key)
            if ent is None:
                ent = table[key] = _Recovered(pos)
            if rtype == lr.APPEND_MSG:
                ent.batches.append(lr.AppendMsg.decode(body))
            elif rtype == lr.PREPARE:
                ent.state = "prepared"
                ent.prepare = lr.Prepare.decode(body)
            elif rtype == lr.COMMIT:
                ent.state = "committed"
                ent.commit = lr.Commit.decode(body)
                commit_order.append(key)
            elif rtype == lr.APPLIED:
                ent.state = "applied"
                ent.applied = lr.Applied.decode(body)
            elif rtype == lr.ROLLBACK or rtype == lr.FORGET:
                ent.state = "done"
            elif rtype == lr.HEURISTIC:
                ent.state = "heuristic"
                ent.heuristic = lr.Heuristic.decode(body)
        now = self.clock.monotonic()
        cap_s = self.limits.max_timeout_s
        touched: set[Any] = set()
        for key in commit_order:
            ent = table[key]
            if ent.state == "committed" or (ent.state == "applied" and not self._all_present(ent)):
                tx = self._restored(key, ent, now, cap_s, TxEvent.RECOVERED_COMMITTED)
                assert ent.commit is not None
                tx.hints = self._recovery_hints(ent)
                tx.hints_exact = ent.applied is not None
                self.txs[key] = tx
                ends = self._ends(ent)
                joint = self._apply(tx, recovering=True)
                if ends != self._ends(ent):  # something had to be appended again
                    self.stats.recovered_reapplied += 1
                for pl in joint.placements if joint is not None else ():
                    part = self.store.get(pl.topic, pl.partition)
                    if part is not None:
                        touched.add(part)
        for part in touched:
            part.sync()  # re-applied messages are on disk before the log may forget them
        for key, ent in table.items():
            if ent.state == "prepared":
                assert ent.prepare is not None
                p = ent.prepare
                if not is_xa(key) and not p.group:
                    # a prepared local transaction without a producer group: its connection
                    # is gone with the restart, so nobody can ever resolve it
                    self._log(
                        lr.ROLLBACK, lr.Rollback(key, "broker restart while prepared").encode()
                    )
                    self.stats.recovered_rolled_back += 1
                    continue
                tx = self._restored(key, ent, now, cap_s, TxEvent.RECOVERED_PREPARED)
                tx.group = p.group
                tx.prepared_at_ms = p.prepared_at_ms
                tx.timeout_s = p.timeout_s
                self.txs[key] = tx
                self.stats.recovered_prepared += 1
                log.info("recovered prepared transaction %s (%d messages)", key, tx.message_count)
            elif ent.state == "heuristic":
                assert ent.heuristic is not None
                ev = (
                    TxEvent.RECOVERED_HEURISTIC_COMMIT
                    if ent.heuristic.commit
                    else TxEvent.RECOVERED_HEURISTIC_ROLLBACK
                )
                self.txs[key] = self._restored(key, ent, now, cap_s, ev)
            elif ent.state == "active":  # no decision was ever logged
                self._log(lr.ROLLBACK, lr.Rollback(key, "broker restart").encode())
                self.stats.recovered_rolled_back += 1
                log.info(
                    "rolled back unfinished transaction %s (%d messages) at restart",
                    key,
                    sum(b.count for b in ent.batches),
                )
        self.log.sync()

    def _ends(self, ent: _Recovered) -> list[int]:
        ends = []
        for b in ent.batches:
            part = self.store.get(b.topic, b.partition)
            ends.append(part.end if part is not None else -1)
        return ends

    def _restored(self, key: str, ent: _Recovered, now: float, cap_s: int, ev: TxEvent) -> BrokerTx:
        tx = BrokerTx(
            key=key,
            xa=is_xa(key),
            owner=None,
            state=TxState.NEW,
            timeout_s=cap_s,
            deadline=now + cap_s,
            created_ms=self._now_ms(),
            first_pos=ent.first,
            batches=ent.batches,
            nbytes=sum(len(b.records) for b in ent.batches),
        )
        self._to(tx, ev)
        return tx

    def _all_present(self, ent: _Recovered) -> bool:
        """Whether every placement an APPLIED record names certainly survived the crash: it
        ends before its partition's checked start (durable before the crash; a gone or
        in-memory partition counts as present). Anything later is verified by re-applying
        with ``verify``, which matches message ids and appends only what is missing."""
        assert ent.applied is not None
        for topic, pidx, off, _n, nbytes in ent.applied.placements:
            part = self.store.get(topic, pidx)
            if part is not None and not part.memory and part.scan_start < off + nbytes:
                return False
        return True

    @staticmethod
    def _recovery_hints(ent: _Recovered) -> tuple[tuple[str, int, int], ...]:
        assert ent.commit is not None
        if ent.applied is None:
            return ent.commit.hints
        # the APPLIED record knows exactly where each share went
        return tuple((t, p, off) for t, p, off, _n, _b in ent.applied.placements)

    # ------------------------------------------------------------------ admin

    def snapshot(self) -> list[BrokerTx]:
        """The known transactions, oldest first."""
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
            ("tx_abandoned", s.abandoned),
            ("tx_recovered_prepared", s.recovered_prepared),
            ("tx_recovered_reapplied", s.recovered_reapplied),
            ("tx_recovered_rolled_back", s.recovered_rolled_back),
            ("tx_check_backs_sent", s.check_backs_sent),
            ("tx_check_back_exhausted", s.check_back_exhausted),
        ]
        items += [(f"tx_state_{k.lower()}", v) for k, v in sorted(by_state.items())]
        return items
