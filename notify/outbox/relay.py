"""The relay: publishes the outbox's rows exactly once, in commit order per key.

One thread per shard. A shard thread is a *standby* until its instance is assigned the
shard (the live instances share the shards, :class:`~notify.outbox.relaydb.Instances`)
and wins the shard's leadership lock; then it *leads*:

1. take-over: a new epoch in ``notify_outbox_relay`` (every later write of this leader
   is conditional on it), claim the shard's broker identity, and if a batch is recorded
   as pending (the previous leader died between recording it and removing its rows),
   send it again with its recorded partitions and sequence numbers: the broker stores
   what it did not have and answers the rest from what it stored.
2. cycles, each one database transaction: remove the rows the broker acknowledged in the
   previous cycle, read the oldest rows, cut them into one sub-batch per partition
   (:func:`~notify.outbox.plan.plan_cycle`), record that batch and the sequences it
   takes, commit; then publish the sub-batches (one ``mput`` each, in parallel across
   partitions) and wait for every acknowledgement. A broker that cannot be reached (down,
   restarting, failing over) gets the same batch again, with backoff, for as long as it
   takes: the application keeps committing meanwhile and the backlog flows when it
   returns.
3. nothing to read: poll again after a delay doubling from ``poll_min_s`` to
   ``poll_max_s``. On PostgreSQL, once nothing came for ``notify_after_s``, the relay
   takes the shard's waiting lock in its next read and, that read empty too, sleeps until
   a writer's commit NOTIFYs it: writers NOTIFY only while that lock is held, so busy
   writers (whose rows the relay finds by polling) never pay NOTIFY's lock, which
   serializes commits.

Exactly once: a row leaves the table only in the cycle after the broker acknowledged it;
a batch is recorded (with its sequences) before it is sent, and sent again identically
until acknowledged; a relay that lost its shard cannot record or remove anything (epoch).
What the broker already stored it answers instead of storing again (idempotent producer,
one identity per shard, one batch in flight per partition).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import psycopg
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from notify.faults import armed, crashpoint
from notify.transitions import TransitionTable

from .plan import Backoff, Limits, Plan, Planned, RelayRow, plan_cycle
from .publisher import Batch, Identity, PublishAck, Publisher, PublishError
from .relaydb import (
    Cycle,
    Done,
    FencedError,
    Instances,
    PgCycle,
    ShardDB,
    ShardState,
    Vacuum,
    assigned,
    transient,
)
from .rows import (
    OutboxError,
    PendingBatch,
    Seqs,
    SubBatch,
    encode_pending,
    encode_seqs,
    seqs_after,
)
from .sql import DEFAULT_PG_LOCK_BASE, dialect_name

log = logging.getLogger("notify.outbox")


class RelayStateError(OutboxError):
    """A relay event its state does not allow (a bug, not an operating condition)."""


class OutboxStateError(OutboxError):
    """The outbox's recorded state contradicts the broker (e.g. the database was restored
    from a backup older than what the broker stored): the shard is not published."""


class ShardState_(Enum):
    """Where a shard thread stands."""

    STANDBY = "standby"
    LEADING = "leading"
    STOPPED = "stopped"


class ShardEvent(Enum):
    """What moves a shard thread."""

    ELECTED = "elected"
    STEP_DOWN = "step down"
    STOP = "stop"


_SHARD_TABLE: TransitionTable[ShardState_, ShardEvent] = TransitionTable(
    {
        (ShardState_.STANDBY, ShardEvent.ELECTED): ShardState_.LEADING,
        (ShardState_.STANDBY, ShardEvent.STOP): ShardState_.STOPPED,
        (ShardState_.LEADING, ShardEvent.STEP_DOWN): ShardState_.STANDBY,
        (ShardState_.LEADING, ShardEvent.STOP): ShardState_.STOPPED,
    },
    RelayStateError,
)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """Settings of a relay (defaults suit a relay beside PostgreSQL and the broker).

    ``shards``: the shards this instance may lead (None: any, shared with the other live
    instances); ``limits``: rows per cycle and per ``mput``; ``poll_min_s``/``poll_max_s``:
    the polling delays when there is nothing to publish (PostgreSQL: before the relay
    sleeps on NOTIFY, after ``notify_after_s`` of empty polls: while rows keep coming the
    relay polls and writers never NOTIFY, whose lock serializes commits); ``notify_wait_s``: the
    longest sleep on NOTIFY; ``heartbeat_s``/``instance_ttl_s``: liveness of instances;
    ``standby_poll_s``: how often a standby tries to take its shard; ``retry_min_s``/
    ``retry_max_s``: backoff of a batch the broker did not take; ``dead_letter_after_s``:
    how long rows of a topic the broker does not know (or refuses with 403/404) are
    retried before they move to ``notify_outbox_dead``; ``delayed_check_s``: how often the
    delayed rows are looked at; ``lock_dir``: SQLite: where the leadership lock files go
    (default: beside the database)."""

    shards: tuple[int, ...] | None = None
    limits: Limits = field(default_factory=Limits)
    poll_min_s: float = 0.0005
    poll_max_s: float = 0.05
    notify_after_s: float = 0.01
    notify_wait_s: float = 1.0
    heartbeat_s: float = 1.0
    instance_ttl_s: float = 5.0
    standby_poll_s: float = 0.5
    retry_min_s: float = 0.05
    retry_max_s: float = 2.0
    dead_letter_after_s: float = 60.0
    delayed_check_s: float = 1.0
    delayed_batch: int = 1000
    lock_dir: Path | None = None

    def __post_init__(self) -> None:
        if not 0 < self.poll_min_s <= self.poll_max_s:
            raise ValueError("need 0 < poll_min_s <= poll_max_s")
        if self.heartbeat_s <= 0 or self.instance_ttl_s < 2 * self.heartbeat_s:
            raise ValueError("need heartbeat_s > 0 and instance_ttl_s >= 2 x heartbeat_s")
        if not 0 < self.retry_min_s <= self.retry_max_s:
            raise ValueError("need 0 < retry_min_s <= retry_max_s")
        for name in ("notify_wait_s", "standby_poll_s", "delayed_check_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.notify_after_s < 0 or self.dead_letter_after_s < 0:
            raise ValueError("notify_after_s and dead_letter_after_s must be >= 0")


@dataclass(slots=True)
class ShardStats:
    """What one shard thread did (read without a lock: figures for people)."""

    shard: int
    state: str = ShardState_.STANDBY.value
    epoch: int = 0
    published: int = 0
    batches: int = 0
    resent: int = 0
    dead: int = 0
    retries: int = 0
    takeovers: int = 0
    wakeups: int = 0
    vacuums: int = 0
    last_error: str = ""


class _NotNow(Exception):
    """The brokers cannot answer a claim right now."""


class _StepDown(Exception):
    """Leave the leading state (yield the shard, lost the lock, stopping)."""


class Relay:
    """A running relay over ``engine``'s outbox (see the module doc). Use as a context
    manager or call :meth:`stop` (which closes ``publisher`` when ``own_publisher``).
    Built by :meth:`notify.outbox.Outbox.relay` or ``notify outbox relay``."""

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        config: RelayConfig | None = None,
        pg_lock_base: int | None = None,
        own_publisher: bool = False,
    ):
        from_cfg = config or RelayConfig()
        dialect_name(engine.dialect)
        self.engine = engine
        self.publisher = publisher
        self.config = from_cfg
        self.instance = uuid.uuid4().hex
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{self.instance[:8]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._live: list[str] = [self.instance]
        self._instances = Instances(engine, self.instance)
        self._pg_lock_base = pg_lock_base
        self.stats: dict[int, ShardStats] = {}
        self._started = False
        self._own_publisher = own_publisher
        #: PostgreSQL: VACUUMs notify_outbox on a thread of its own (see Vacuum)
        self.vacuum: Vacuum | None = (
            Vacuum(engine) if dialect_name(engine.dialect) == "postgresql" else None
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Relay:
        """Start the heartbeat and one thread per shard (reads the shard list)."""
        if self._started:
            return self
        base = DEFAULT_PG_LOCK_BASE if self._pg_lock_base is None else self._pg_lock_base
        with self.engine.connect() as c:
            shards = sorted(
                int(r[0]) for r in c.execute(sa.text("SELECT shard FROM notify_outbox_relay"))
            )
        if self.config.shards is not None:
            missing = set(self.config.shards) - set(shards)
            if missing:
                raise OutboxError(f"no such shard(s): {sorted(missing)} (have {shards})")
            shards = sorted(self.config.shards)
        self._started = True
        self._beat()
        hb = threading.Thread(target=self._heartbeats, name="outbox-heartbeat", daemon=True)
        self._threads.append(hb)
        hb.start()
        if self.vacuum is not None:
            vt = threading.Thread(target=self.vacuum.run, name="outbox-vacuum", daemon=True)
            self._threads.append(vt)
            vt.start()
        for s in shards:
            self.stats[s] = ShardStats(s)
            t = threading.Thread(
                target=_ShardWorker(self, s, base).run, name=f"outbox-shard-{s}", daemon=True
            )
            self._threads.append(t)
            t.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every shard (a batch in flight stays recorded: the next leader sends it)."""
        self._stop.set()
        if self.vacuum is not None:
            self.vacuum.close()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        try:
            self._instances.leave()
        except sa_exc.SQLAlchemyError as e:
            log.info("outbox relay: could not remove instance %s: %s", self.instance[:8], e)
        if self._own_publisher:
            self.publisher.close()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def leading(self) -> list[int]:
        """The shards this relay leads now."""
        return sorted(s for s, st in self.stats.items() if st.state == "leading")

    @property
    def published(self) -> int:
        """Rows this relay published (acknowledged by the broker)."""
        return sum(st.published for st in self.stats.values())

    # ------------------------------------------------------------------ instances

    def _beat(self) -> None:
        try:
            self._instances.beat(self.leading)
            self._live = self._instances.live(self.config.instance_ttl_s)
        except sa_exc.SQLAlchemyError as e:
            log.warning("outbox relay: heartbeat failed: %s", _first_line(e))

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.config.heartbeat_s):
            self._beat()

    def assigned(self, shard: int) -> bool:
        """Whether this instance should lead ``shard`` now."""
        if self.config.shards is not None:
            return True
        return assigned(shard, self._live, self.instance)

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; True when stopping."""
        return self._stop.wait(seconds)


def _first_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]


class _ShardWorker:
    """One shard's thread: standby, leading, stopped (:data:`_SHARD_TABLE`)."""

    def __init__(self, relay: Relay, shard: int, pg_lock_base: int):
        self.r = relay
        self.cfg = relay.config
        self.shard = shard
        self.stats = relay.stats[shard]
        self.db = ShardDB(relay.engine, shard, pg_lock_base, relay.config.lock_dir)
        self.state = ShardState_.STANDBY
        self.identity = Identity("", "", 0)
        self.claimed: set[str] = set()  # topics whose brokers this leader claimed on
        self.epoch = 0
        self.seqs: Seqs = {}
        self.round_robin = 0
        self.blocked: dict[str, float] = {}  # topic -> first time the broker did not know it
        self.recheck_at = 0.0
        self.parts: dict[str, tuple[float, Sequence[str] | None]] = {}
        self.due_at = 0.0
        self.unassigned_since: float | None = None

    def _to(self, event: ShardEvent) -> None:
        self.state = _SHARD_TABLE.next_state(self.state, event)
        self.stats.state = self.state.value

    def run(self) -> None:
        backoff = Backoff(self.cfg.standby_poll_s, 10 * self.cfg.standby_poll_s)
        producer = ""
        try:
            while not self.r.stopped:
                if not self.r.assigned(self.shard):
                    self.r.sleep(self.cfg.standby_poll_s)
                    continue
                try:
                    if not producer:
                        producer = self._producer_name()
                    won = self.db.try_lead(producer)
                except (sa_exc.SQLAlchemyError, psycopg.Error) as e:
                    self._error(f"cannot reach the database: {_first_line(e)}")
                    self.db.close()
                    self.r.sleep(backoff.empty())
                    continue
                if not won:
                    self.r.sleep(self.cfg.standby_poll_s)
                    continue
                backoff.found()
                self._to(ShardEvent.ELECTED)
                try:
                    self._lead()
                except _StepDown:
                    pass
                except FencedError as e:
                    log.warning("outbox shard %d: %s", self.shard, e)
                except OutboxStateError as e:
                    self._error(str(e))
                    log.error("outbox shard %d: %s; not published", self.shard, e)
                    self.r.sleep(30 * self.cfg.standby_poll_s)
                except (sa_exc.SQLAlchemyError, psycopg.Error, OSError) as e:
                    self._error(f"database: {_first_line(e)}")
                    self.r.sleep(backoff.empty())
                except Exception as e:  # a bug: logged, the shard goes on after a pause
                    log.exception("outbox shard %d: unexpected error", self.shard)
                    self._error(f"unexpected: {e!r}")
                    self.r.sleep(backoff.empty())
                finally:
                    self.db.close()
                    self._to(ShardEvent.STEP_DOWN)
        finally:
            self.db.close()
            self._to(ShardEvent.STOP)

    def _producer_name(self) -> str:
        with self.r.engine.connect() as c:
            return str(
                c.execute(
                    sa.text("SELECT producer_name FROM notify_outbox_relay WHERE shard = :s"),
                    {"s": self.shard},
                ).scalar_one()
            )

    def _error(self, message: str) -> None:
        if message != self.stats.last_error:
            log.warning("outbox shard %d: %s", self.shard, message)
        self.stats.last_error = message

    # ------------------------------------------------------------------ leading

    def _lead(self) -> None:
        st = self.db.take_over(self.r.owner)
        self.stats.takeovers += 1
        self.epoch, self.identity, self.seqs = st.epoch, st.identity, dict(st.seqs)
        self.stats.epoch = st.epoch
        log.info("outbox shard %d: leading (epoch %d, %s)", self.shard, st.epoch, st.identity)
        self._claim(st)
        done: Done | None = None
        if st.pending is not None:
            done = self._resend(st.pending)
        self.due_at = 0.0
        backoff = Backoff(self.cfg.poll_min_s, self.cfg.poll_max_s)
        empty_since: float | None = None
        wait = False  # the next cycle takes the waiting lock (PostgreSQL)
        last_alive = time.monotonic()
        while True:
            now = time.monotonic()
            self._check_leading(now)
            if now - last_alive > self.cfg.heartbeat_s:
                if not self.db.alive():
                    raise _StepDown
                last_alive = now
            if now >= self.due_at:
                self._move_due(now)
            try:
                plan = self._cycle(done, wait)
            except sa_exc.DBAPIError as e:
                if not transient(e):
                    raise
                self.stats.retries += 1  # rolled back: the same cycle again (done kept)
                self.r.sleep(self.cfg.poll_min_s)
                continue
            done = None
            if plan is not None and plan.batches:
                self.db.end_wait()  # (its record gave the lock back already: no-op)
                backoff.found()
                empty_since = None
                crashpoint("outbox.recorded")  # recorded, nothing sent
                done = self._publish(plan)
                crashpoint("outbox.acked")  # acknowledged, rows not removed
                wait = False
                continue
            if plan is None:  # could not plan: the broker cannot route right now
                self.db.end_wait()
                self.r.sleep(self._retry_delay(backoff))
                continue
            empty_since = empty_since or now
            wait = self._idle(backoff, now - empty_since, wait)

    def _check_leading(self, now: float) -> None:
        if self.r.stopped:
            raise _StepDown
        if self.r.assigned(self.shard):
            self.unassigned_since = None
        elif self.unassigned_since is None:
            self.unassigned_since = now
        elif now - self.unassigned_since > 2 * self.cfg.heartbeat_s:
            log.info("outbox shard %d: handed over to its assigned instance", self.shard)
            raise _StepDown

    def _idle(self, backoff: Backoff, empty_for: float, tried: bool) -> bool:
        """Nothing to publish: on PostgreSQL sleep until a commit NOTIFYs (once the cycle
        that read nothing held the waiting lock; else ask the next cycle to take it),
        elsewhere poll. Returns whether the next cycle should take the waiting lock."""
        if self.db.d != "postgresql" or empty_for < self.cfg.notify_after_s:
            self.r.sleep(backoff.empty())
            return False
        if not self.db.waiting:
            if tried:  # a writer was committing when the cycle tried: look again soon
                self.r.sleep(backoff.empty())
            return True
        limit = self.cfg.notify_wait_s
        if self.due_at:
            limit = max(0.001, min(limit, self.due_at - time.monotonic()))
        if self.db.wait_notified(limit, self.r._stop):
            self.stats.wakeups += 1
        return True

    def _retry_delay(self, backoff: Backoff) -> float:
        backoff.min_s, backoff.max_s = self.cfg.retry_min_s, self.cfg.retry_max_s
        return backoff.empty()

    def _claim(self, st: ShardState) -> None:
        """Claim the identity at the new epoch (fencing the last leader on the brokers)
        on the brokers of the topics the shard published to."""
        self.claimed = set()
        pending = st.pending.subs if st.pending else ()
        topics = {t for t, _p in self.seqs} | {s.topic for s in pending}
        self._claim_topics(topics, {(s.topic, s.partition): s.first_seq for s in pending})

    def _claim_topics(
        self, topics: set[str], pending: Mapping[tuple[str, str], int], wait: bool = True
    ) -> bool:
        """Claim the identity on the brokers of ``topics`` not claimed yet in this
        leadership; a broker ahead of the recorded sequences means the database lost what
        it recorded (restored from an older backup?): refuse to publish over it (the
        broker would take the new batches for re-sent ones and drop them)."""
        new = topics - self.claimed
        if not new:
            return True
        identity = self.identity
        try:
            last = self._call_publisher(
                lambda: self.r.publisher.claim(identity, sorted(new)), wait
            )
        except _NotNow:
            return False
        self.claimed |= new
        for key, seq in (last or {}).items():
            nxt = self.seqs.get(key, 0)
            if key in pending and pending[key] <= seq < nxt:
                continue  # the pending batch: stored before the crash, answered on re-send
            if seq >= nxt:
                raise OutboxStateError(
                    f"the broker stored sequence {seq} of {identity} in {key[0]} "
                    f"{key[1]} but the outbox recorded only up to {nxt - 1}"
                )
        return True

    def _call_publisher(
        self, fn: Callable[[], Mapping[tuple[str, str], int] | None], wait: bool = True
    ) -> dict[tuple[str, str], int] | None:
        """``fn`` (a claim) until it answers; ``wait`` False: once (:class:`_NotNow`
        when the brokers cannot answer now)."""
        backoff = Backoff(self.cfg.retry_min_s, self.cfg.retry_max_s)
        while True:
            try:
                got = fn()
                return None if got is None else dict(got)
            except PublishError as e:
                if e.fenced:
                    raise FencedError(f"shard {self.shard}: {e}") from e
                if not e.retriable:
                    raise OutboxStateError(f"claim of the shard's identity: {e}") from e
                self._error(f"claim: {e}")
                if not wait:
                    raise _NotNow from e
            if self.r.sleep(backoff.empty()):
                raise _StepDown

    # ------------------------------------------------------------------ cycles

    def _cycle(self, done: Done | None, wait: bool = False) -> Plan | None:
        """One transaction: finish ``done``, read, plan, record. None when the batch could
        not be planned (the broker cannot say where its topics go right now)."""
        limits = self.cfg.limits
        now = time.monotonic()
        recheck = now >= self.recheck_at
        if recheck:
            self.recheck_at = now + 2.0
        with self.db.cycle(self.epoch, wait) as cyc:
            if done is None:
                done = self._dead_unroutable(cyc, now)
            cyc.finish(done)
            exclude = [] if recheck else list(self.blocked)
            rows = cyc.read(limits.max_rows, exclude)
            plan = self._plan(rows) if rows else Plan()
            if plan is None:
                # keep the cycle's deletions: record nothing new (still this epoch)
                if done is not None:
                    cyc.record(self.epoch, None, None, done.count, durable=False)
                return None
            for topic in {r[1] for r in rows}:
                if topic in plan.unroutable:
                    self.blocked.setdefault(topic, now)
                else:
                    self.blocked.pop(topic, None)
            pending: bytes | None = None
            seqs: str | None = None
            if plan.batches:
                subs = tuple(p.sub for p in plan.batches)
                pending = encode_pending(PendingBatch(subs))
                self.seqs = seqs_after(self.seqs, subs)
                seqs = encode_seqs(self.seqs)
                self.round_robin += 1
            if pending is not None:
                # sent only once this is durable: a relay that takes over sends it again
                cyc.record(self.epoch, pending, seqs, done.count if done else 0)
            elif done is not None:
                # only removing what the broker has: if a crash loses this, the batch is
                # sent again and answered from what the broker stored (no fsync to wait)
                cyc.record(self.epoch, None, None, done.count, durable=False)
            # else: nothing read, nothing to finish: a read-only transaction
        if done is not None:
            self.stats.published += done.count
            self.stats.dead += sum(len(ids) for ids, _e in done.dead)
            if self.r.vacuum is not None and self.r.vacuum.note(
                done.count, len(rows) < limits.max_rows
            ):
                self.stats.vacuums += 1
        return plan

    def _dead_unroutable(self, cyc: Cycle | PgCycle, now: float) -> Done | None:
        """Rows of topics the broker has not known for ``dead_letter_after_s``: aside."""
        old = [t for t, since in self.blocked.items() if now - since > self.cfg.dead_letter_after_s]
        if not old:
            return None
        dead: list[tuple[list[int], str]] = []
        for topic in old:
            ids = cyc.rows_of_topic(topic, self.cfg.limits.max_rows)
            if ids:
                dead.append((ids, f"topic {topic} unknown to the broker"))
                log.error(
                    "outbox shard %d: %d row(s) of unknown topic %s moved to notify_outbox_dead",
                    self.shard,
                    len(ids),
                    topic,
                )
            else:
                del self.blocked[topic]
        return Done([], dead)

    def _plan(self, rows: list[RelayRow]) -> Plan | None:
        parts: dict[str, Sequence[str] | None] = {}
        for topic in {r[1] for r in rows}:
            try:
                parts[topic] = self._partitions(topic)
            except PublishError as e:
                self._error(f"partitions of {topic}: {e}")
                return None
        if not self._claim_topics({t for t, names in parts.items() if names}, {}, wait=False):
            return None  # the brokers cannot answer the claim now: the cycle plans nothing
        return plan_cycle(rows, parts, self.seqs, self.cfg.limits, self.round_robin)

    def _partitions(self, topic: str) -> Sequence[str] | None:
        now = time.monotonic()
        hit = self.parts.get(topic)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            names: Sequence[str] | None = list(self.r.publisher.partitions(topic))
        except PublishError as e:
            if e.code != 404:
                raise
            names = None
        self.parts[topic] = (now + 1.0, names)
        return names

    # ------------------------------------------------------------------ publishing

    def _resend(self, pending: PendingBatch) -> Done:
        """Send the recorded batch again, record for record (its rows by id)."""
        rows = self.db.fetch(pending.row_ids)
        batches: list[Planned] = []
        for sub in pending.subs:
            present = [rows[i] for i in sub.row_ids if i in rows]
            if len(present) != sub.count:
                log.error(
                    "outbox shard %d: %d row(s) of the pending batch are gone",
                    self.shard,
                    sub.count - len(present),
                )
            if present:
                s = SubBatch(sub.topic, sub.partition, sub.first_seq, tuple(r[0] for r in present))
                recs = [(r[3], r[4]) for r in present]
                batches.append(Planned(s, recs, sum(len(p) for _f, p in recs)))
        self.stats.resent += sum(b.sub.count for b in batches)
        log.info(
            "outbox shard %d: sending the pending batch again (%d rows)",
            self.shard,
            sum(b.sub.count for b in batches),
        )
        return self._publish(Plan(batches))

    def _publish(self, plan: Plan) -> Done:
        """Publish every sub-batch until each is acknowledged or refused for good."""
        todo = list(plan.batches)
        acked: list[int] = []
        dead: list[tuple[list[int], str]] = []
        first_failure: dict[int, float] = {}
        backoff = Backoff(self.cfg.retry_min_s, self.cfg.retry_max_s)
        while todo:
            results = self._send_all(todo)
            retry: list[Planned] = []
            for p, res in zip(todo, results, strict=True):
                if isinstance(res, PublishAck):
                    acked.extend(p.sub.row_ids)
                    continue
                if res.fenced:
                    raise FencedError(f"shard {self.shard}: identity claimed elsewhere: {res}")
                since = first_failure.setdefault(id(p), time.monotonic())
                permanent = not res.retriable and (
                    res.code not in (403, 404)
                    or time.monotonic() - since > self.cfg.dead_letter_after_s
                )
                if permanent:
                    log.error(
                        "outbox shard %d: %d row(s) for %s %s refused: %s; moved to "
                        "notify_outbox_dead",
                        self.shard,
                        p.sub.count,
                        p.sub.topic,
                        p.sub.partition,
                        res,
                    )
                    dead.append((list(p.sub.row_ids), str(res)))
                    continue
                retry.append(p)
                self._error(str(res))
            self.stats.batches += 1
            todo = retry
            if todo:
                self.stats.retries += 1
                if self.r.sleep(backoff.empty()):
                    raise _StepDown  # stopping: the batch stays recorded for the next leader
                self._check_leading(time.monotonic())
                if not self.db.alive():
                    raise _StepDown  # lost the shard's lock: its next leader sends the batch
        order = {i: n for n, i in enumerate(pid for p in plan.batches for pid in p.sub.row_ids)}
        acked.sort(key=order.__getitem__)
        return Done(acked, dead)

    def _send_all(self, todo: list[Planned]) -> list[PublishAck | PublishError]:
        batches = [
            Batch(p.sub.topic, p.sub.partition, p.records, p.sub.first_seq) for p in todo
        ]
        if len(batches) > 1 and "outbox.first_ack" in armed():
            # crash tests: a batch's first partition acknowledged, the others not sent
            head = self._publish_call(batches[:1])
            crashpoint("outbox.first_ack")
            return head + self._publish_call(batches[1:])
        return self._publish_call(batches)

    def _publish_call(self, batches: list[Batch]) -> list[PublishAck | PublishError]:
        try:
            got = list(self.r.publisher.publish(self.identity, batches))
        except PublishError as e:
            return [e] * len(batches)
        except Exception as e:  # a publisher bug or a closed session: retried as unknown
            log.warning("outbox shard %d: publisher failed: %r", self.shard, e)
            return [PublishError(f"publisher: {e}", retriable=True)] * len(batches)
        if len(got) != len(batches):
            return [PublishError("publisher answered the wrong number", retriable=True)] * len(
                batches
            )
        return got

    # ------------------------------------------------------------------ delayed rows

    def _move_due(self, now: float) -> None:
        moved = self.db.move_due(self.epoch, self.cfg.delayed_batch)
        if moved >= self.cfg.delayed_batch:
            self.due_at = now  # more are due: again next cycle
            return
        nxt = self.db.next_due_ms()
        wait = self.cfg.delayed_check_s
        if nxt is not None:
            wait = min(wait, nxt / 1000)
        self.due_at = now + wait
