"""The transaction engine's data and its shared state: what a transaction is (:class:`BrokerTx`),
the limits and counters, and :class:`EngineBase`, the state every part of
:class:`~notify.core.transactions.TxEngine` reads (transactions, timers, owners, the outbox)
with the helpers they share (the one transition, replies, redo records, forgetting).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from notify.config import SystemConfig
from notify.core.apply import Applier, PartitionLookup, no_crashpoint
from notify.core.effects import (
    Effect,
    Placement,
    Reply,
    Ticket,
)
from notify.core.ports import Clock
from notify.core.states import OPEN, TxEvent, TxState, next_state
from notify.errors import TransactionError, TxLogError
from notify.protocol import logrecords as lr
from notify.protocol.keys import is_xa
from notify.protocol.xa import (
    XAER_PROTO,
    encode_xa_failure,
)
from notify.store.gate import Gate
from notify.txlog import Position

log = logging.getLogger("notify.tx")

#: the hints of an apply that verifies nothing (it never reads them)
NO_HINTS: Final[dict[tuple[str, int], int]] = {}
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


class BrokerTx:
    """One transaction known to the broker.

    A plain class, not a slotted dataclass: the optional fields are class-level defaults, so
    making a transaction sets only what it was given (a one-shot transaction is made for
    every request of its kind); an instance holds what it changed."""

    first_pos: Position | None = None
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

    def __init__(
        self,
        key: str,
        xa: bool,
        owner: Any,
        state: TxState,
        timeout_s: int,
        deadline: float,
        created_ms: int,
        first_pos: Position | None = None,
        batches: list[lr.AppendMsg] | None = None,
        nbytes: int = 0,
    ) -> None:
        self.key = key
        self.xa = xa
        self.owner = owner
        self.state = state
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.created_ms = created_ms
        self.batches: list[lr.AppendMsg] = [] if batches is None else batches
        if first_pos is not None:
            self.first_pos = first_pos
        if nbytes:
            self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"BrokerTx({self.key!r}, {self.state.value}, {len(self.batches)} batches)"

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
class ForceWait:
    """A step waiting for the redo log to be forced up to ``pos``."""

    pos: Position
    ticket: Ticket | None
    finish: Callable[[], Done]
    unsure: str


@dataclass(slots=True)
class Recovered:
    first: Position
    batches: list[lr.AppendMsg] = field(default_factory=list)
    state: str = "active"
    prepare: lr.Prepare | None = None
    commit: lr.Commit | None = None
    applied: lr.Applied | None = None
    heuristic: lr.Heuristic | None = None


def forget_is_noop(key: str, tx: BrokerTx | None) -> bool:
    """MetaQ answers FORGET of any XA xid with 200 and only drops a heuristic outcome, so
    FORGET of an XA transaction that is gone (committed, rolled back, never known) or rolled
    back is a no-op success; FORGET of a live one stays a protocol error."""
    return is_xa(key) and (tx is None or tx.state is TxState.ROLLED_BACK)


def xa_reply(e: TxFailure) -> tuple[int, bytes]:
    return e.http, encode_xa_failure(e.code, str(e))


class EngineBase:
    """The engine's state and shared helpers (see :class:`~notify.core.transactions.TxEngine`)."""

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
        self._forcing: list[ForceWait] = []
        #: gates of applied transactions not yet open (retried when a share was refused)
        self._gates: list[Gate] = []
        self._tombstones: deque[tuple[float, str]] = deque()
        #: (first record, placements) of applied transactions not yet flushed in partitions
        self._unflushed: deque[tuple[Position, tuple[Placement, ...]]] = deque()
        #: APPLIED records not yet written: they go out with the next redo write (one
        #: write system call fewer per commit), see :meth:`write_backlog`
        self._backlog: list[tuple[int, bytes]] = []
        self._opaque = 0

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
        code, body = xa_reply(e)
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

    @staticmethod
    def _timed(tx: BrokerTx) -> bool:
        """Whether a deadline still applies: open ones, and prepared ones nobody resolves."""
        return tx.state in OPEN or (tx.state is TxState.PREPARED and tx.orphanable)

    def _drop(self, tx: BrokerTx) -> None:
        txs = self.txs
        key = tx.key
        if txs.get(key) is tx:
            del txs[key]
        keys = self._owned.get(tx.owner)
        if keys is not None:
            keys.discard(tx.key)

    def _forget_finished(self, tx: BrokerTx) -> None:
        tx.batches = []
        self._drop(tx)

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

