"""The queue groups of a broker and their log: the state :class:`~notify.broker.queues.
QueueManager` serves the queue verbs from, made durable and recovered here.

:class:`QueueState` keeps every group (:class:`notify.core.queues.QueueGroup`) with its
subscribers, appends what changes to the queue log (``<dataLogPath>/queues/``: created and
dropped groups, finished messages, deliveries batched within ``DELIVER_LOG_DELAY_S``,
fsynced in the background and group-committed), writes the periodic checkpoint (the compact
form of every group, SNAPSHOT records), expires unused groups and makes room at
``queueMaxGroups``, and recovers everything from the latest checkpoint and the records
after it (a restart, or a promoted slave from its replica copy of the log).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from notify.config import ServerConfig, SystemConfig
from notify.configserver import ConfigServer
from notify.core.queues import (
    CODE_STATES,
    STATE_CODES,
    Finished,
    MsgState,
    QueueGroup,
    QueueLimits,
)
from notify.errors import NotifyError, TxLogError
from notify.protocol import queuelog
from notify.replication.redo import ReplicaRedo
from notify.runtime import SYSTEM_CLOCK
from notify.store.manager import MessageStore
from notify.txlog import Checkpoint, Position, TxLog, TxLogConfig

if TYPE_CHECKING:
    from notify.broker.connection import Connection

log = logging.getLogger("notify.broker.queues")

#: Deliveries are logged (DELIVER records) this long after the push, in one batch.
DELIVER_LOG_DELAY_S: Final = 0.005


#: Largest checkpoint (compact form of every group) the queue log accepts.
MAX_SNAPSHOT_BYTES: Final = 1 << 30


def limits_of(sysc: SystemConfig) -> QueueLimits:
    """The queue settings of ``[system]``."""
    return QueueLimits(
        lock_ms=sysc.queues.lock_timeout_ms,
        max_deliveries=sysc.queues.max_deliveries,
        max_in_flight=sysc.queues.max_in_flight,
        max_credit=sysc.queues.max_credit,
        max_dead_letters=sysc.queues.max_dead_letters,
        max_release_delay_ms=sysc.queues.max_release_delay_ms,
    )


@dataclass(slots=True)
class Subscriber:
    conn: Connection
    opaque: int
    #: cluster mode: the consumer's ZooKeeper id and the watch on its node
    zk_id: str = ""
    watch: Callable[[], None] | None = None
    #: ``qbsub``: messages are pushed in ``qbatch`` frames
    batch: bool = False


@dataclass(slots=True)
class GroupEntry:
    core: QueueGroup
    subs: dict[int, Subscriber] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    timer_at: float = 0.0
    next_part: int = 0
    #: consumers dropped because their ZooKeeper node went
    zk_removed: int = 0
    #: loop time since which the group has had no consumer (``queueGroupExpiry``)
    unused_since: float = 0.0


class QueueState:
    """Every queue group of the broker, its log, checkpoints and recovery."""

    def __init__(
        self,
        config: ServerConfig,
        store: MessageStore,
        loop: asyncio.AbstractEventLoop,
        replica: bool = False,
    ):
        #: a slave keeps its master's queue log (``replica_log``) until ``promote``
        self.replica = replica
        self.replica_log: QueueReplica | None = None
        #: the synchronous slave's answer to the newest write of the log pushed to it
        self._shipped: asyncio.Future[None] | None = None
        self.config = config
        self.store = store
        self.loop = loop
        self.limits = limits_of(config.system)
        self.path = config.system.queue_log_path
        self.groups: dict[tuple[str, str], GroupEntry] = {}
        self._by_topic: dict[str, list[GroupEntry]] = {}
        self.by_conn: dict[Connection, dict[tuple[str, str], int]] = {}
        #: the existing groups each open connection created (``queueMaxGroupsPerConnection``)
        self.created_by: dict[Connection, set[tuple[str, str]]] = {}
        #: groups deleted by an admin, expired, and removed to make room at queueMaxGroups
        self.deleted = 0
        self.expired = 0
        self.evicted = 0
        self._cid = 0
        self._log: TxLog | None = None
        self._dirty = False
        self._ckpt_timer: asyncio.TimerHandle | None = None
        self._ckpt_running = False
        self._syncing = False
        self._sync_again = False
        self._deliveries: dict[tuple[str, str], list[tuple[int, int, list[int]]]] = {}
        self._deliver_timer: asyncio.TimerHandle | None = None
        self.lost_to_retention = 0
        self.ack_frames = 0
        #: cluster mode: consumers are checked against their ZooKeeper nodes (README "Queues")
        self.cluster: ConfigServer | None = None
        self.zk_removed = 0
        self._zk_tasks: set[asyncio.Task[None]] = set()
        self._zk_joining: dict[tuple[Connection, tuple[str, str], str], bool] = {}
        #: automatic failover: why this broker may no longer answer ``conn``'s queue verbs
        #: (replaced master, stale epoch), asked again when an acknowledgement is released
        #: (``None``: the broker as a whole, asked before every push)
        self.fence: Callable[[Connection | None], str | None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open the queue log and rebuild every group from its checkpoint and records."""
        self._log = TxLog.open(self.path, TxLogConfig(max_record_bytes=MAX_SNAPSHOT_BYTES))
        if self.replica:
            self.replica_log = QueueReplica(self._log, self.store)
            return
        self._recover()

    def promote(self) -> None:
        """This slave becomes the master: rebuild the groups from the copy of the master's
        log, as a restarted master would."""
        if not self.replica or self._log is None:
            return
        self.replica = False
        self.replica_log = None
        self._recover()

    @property
    def log(self) -> TxLog | None:
        """The queue log (None before ``open`` and after ``close``)."""
        return self._log

    def ship(self, fut: asyncio.Future[None]) -> None:
        """A write of the log was pushed to the synchronous slave (acks wait for it)."""
        fut.add_done_callback(_consume)
        self._shipped = fut

    def _restore_snapshot(self, state: bytes) -> None:
        for snap in queuelog.decode_snapshot(state):
            core = self._restore_group(snap.topic, snap.group)
            for p, (low, fin) in snap.parts.items():
                core.restore(p, low, [(o, nx, CODE_STATES[s], c) for o, nx, s, c in fin])
            for p, o, ln, c, s, at in snap.dead:
                core.note_finished(p, o, o + ln, CODE_STATES[s], c, at)
            for p, o, ln in snap.replayed:
                core.restore_replayed(p, o, ln)
            for p, o, c in snap.counts:
                core.restore_count(p, o, c)

    def _recover(self) -> None:
        assert self._log is not None
        cp = self._log.latest_checkpoint()
        n = 0
        if cp is not None:  # a checkpoint of an older broker holds the state itself
            self._restore_snapshot(cp.state)
        snapshot = queuelog.SnapshotAssembler()
        for rec in self._log.replay():
            n += 1
            if rec.type == queuelog.SNAPSHOT:
                whole = snapshot.add(rec.body)
                if whole is not None:  # the whole state at that point: start over from it
                    self.groups.clear()
                    self._by_topic.clear()
                    self._restore_snapshot(whole)
            elif rec.type == queuelog.GROUP:
                topic, group, starts = queuelog.decode_group(rec.body)
                core = self._restore_group(topic, group)
                for p, start in starts.items():
                    core.add_partition(p, start)
            elif rec.type == queuelog.DONE:
                topic, group, items = queuelog.decode_done(rec.body)
                core = self._restore_group(topic, group)
                for it in items:
                    state = CODE_STATES[it.state]
                    core.note_finished(
                        it.partition, it.offset, it.next_offset, state, it.count, it.at_ms
                    )
            elif rec.type == queuelog.REPLAY:
                topic, group, reps = queuelog.decode_replay(rec.body)
                core = self._restore_group(topic, group)
                for p, o, ln in reps:
                    core.restore_replayed(p, o, ln)
            elif rec.type == queuelog.ACKED:
                topic, group, ranges = queuelog.decode_acked(rec.body)
                core = self._restore_group(topic, group)
                ack = MsgState.ACKNOWLEDGED
                for p, a, b, at in ranges:
                    core.note_finished(p, a, b, ack, 0, at)
            elif rec.type == queuelog.DROP:
                self._forget_group(*queuelog.decode_drop(rec.body))
            elif rec.type in (queuelog.DELIVER, queuelog.DELIVER_RUNS):
                decode = (queuelog.decode_deliver if rec.type == queuelog.DELIVER
                          else queuelog.decode_deliver_runs)
                topic, group, counts = decode(rec.body)
                core = self._restore_group(topic, group)
                for p, o, c in counts:
                    core.restore_count(p, o, c)
        if self.groups:
            log.info("queues: %d groups recovered (%d log records replayed)", len(self.groups), n)
        self._arm_checkpoint()

    def _restore_group(self, topic: str, group: str) -> QueueGroup:
        g = self.groups.get((topic, group))
        if g is None:
            g = self._new_group(topic, group)
        return g.core

    def _new_group(self, topic: str, group: str) -> GroupEntry:
        g = self.groups[(topic, group)] = GroupEntry(
            QueueGroup(topic, group, self.limits, SYSTEM_CLOCK)  # dead letters: wall clock
        )
        g.unused_since = self.loop.time()
        self._by_topic.setdefault(topic, []).append(g)
        return g

    def _forget_group(self, topic: str, group: str) -> GroupEntry | None:
        """Drop the group from memory (its timer, pending delivery records, creators)."""
        g = self.groups.pop((topic, group), None)
        if g is None:
            return None
        self._by_topic[topic].remove(g)
        if not self._by_topic[topic]:
            del self._by_topic[topic]
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        self._deliveries.pop((topic, group), None)  # pushes of a deleted group: not logged
        for keys in self.created_by.values():
            keys.discard((topic, group))
        return g

    async def close(self) -> None:
        """Final checkpoint, then close the log."""
        self.cluster = None
        for t in list(self._zk_tasks):
            t.cancel()
        if self._ckpt_timer is not None:
            self._ckpt_timer.cancel()
        if self._deliver_timer is not None:
            self._deliver_timer.cancel()
        for g in self.groups.values():
            if g.timer is not None:
                g.timer.cancel()
        if self._log is None:
            return
        try:
            if self._deliveries:
                self._flush_deliveries()
            if self._dirty and not self.replica:
                pos, state = self._snapshot()
                await self.loop.run_in_executor(None, self._log.checkpoint, pos, state)
        except NotifyError as e:
            log.error("queues: final checkpoint failed: %s", e)
        finally:
            self._log.close()
            self._log = None

    # ------------------------------------------------------------------ checkpoints

    def _arm_checkpoint(self) -> None:
        self._ckpt_timer = self.loop.call_later(
            self.config.system.queues.checkpoint_interval_ms / 1000.0, self._checkpoint_due
        )

    def _checkpoint_due(self) -> None:
        self._ckpt_timer = None
        self._expire_groups()
        if self._dirty and not self._ckpt_running and self._log is not None:
            self._ckpt_running = True
            pos, state = self._snapshot()
            self._dirty = False
            fut = self.loop.run_in_executor(None, self._log.checkpoint, pos, state)
            fut.add_done_callback(self._checkpoint_done)
        else:
            self._arm_checkpoint()

    def _checkpoint_done(self, fut: asyncio.Future[Checkpoint]) -> None:
        self._ckpt_running = False
        if fut.cancelled() or fut.exception() is not None:
            log.error("queues: checkpoint failed: %s", fut.exception())
            self._dirty = True
        if self._log is not None:
            self._arm_checkpoint()

    def _snapshot(self) -> tuple[Position, bytes]:
        """The log's end and the compact form of every group, taken in one loop step."""
        assert self._log is not None
        snaps = []
        for (topic, group), g in self.groups.items():
            core = g.core
            snap = queuelog.GroupSnapshot(topic, group)
            for p, (low, fin) in core.compact().items():
                snap.parts[p] = (low, [(o, nx, STATE_CODES[s], c) for o, nx, s, c in fin])
            snap.dead = [
                (d.partition, d.offset, d.length, d.count, STATE_CODES[d.reason], d.at_ms)
                for d in core.dead.values()
            ]
            snap.replayed = core.replayed_entries()
            snap.counts = core.delivery_counts()
            snaps.append(snap)
        # the state goes into the log (replicas follow it); the checkpoint points at it
        chunks = queuelog.encode_snapshot_chunks(queuelog.encode_snapshot(snaps))
        at = self._log.append_many((queuelog.SNAPSHOT, c) for c in chunks[:1])[0]
        for c in chunks[1:]:
            self._log.append(queuelog.SNAPSHOT, c)
        return at, b""

    # ------------------------------------------------------------------ logging

    def _append(self, rtype: int, body: bytes) -> object:
        assert self._log is not None
        self._dirty = True
        if self._deliveries and rtype == queuelog.REPLAY:
            self._flush_deliveries()  # a replay resets counts: older deliveries go first
        return self._log.append(rtype, body)

    def _note_deliveries(
        self, core: QueueGroup, counts: list[tuple[int, int, list[int]]]
    ) -> None:
        """Deliveries to log: appended after DELIVER_LOG_DELAY_S (or before a REPLAY record),
        then fsynced in the background (group commit). Their order against DONE records
        does not matter: a count recovered for a finished message is ignored."""
        self._deliveries.setdefault((core.topic, core.group), []).extend(counts)
        if self._deliver_timer is None:
            self._deliver_timer = self.loop.call_later(DELIVER_LOG_DELAY_S, self._deliver_due)

    def _deliver_due(self) -> None:
        self._deliver_timer = None
        if self._log is not None and self._deliveries:
            self._sync_later(self._flush_deliveries())

    def _flush_deliveries(self) -> object | None:
        assert self._log is not None
        pos = None
        pending, self._deliveries = self._deliveries, {}
        for (topic, group), counts in pending.items():
            pos = self._log.append(
                queuelog.DELIVER_RUNS, queuelog.encode_deliver_runs(topic, group, counts)
            )
        return pos

    def _log_finished(self, core: QueueGroup, fins: list[Finished]) -> object | None:
        """Append the DONE record of ``fins``; its position (None when nothing to log)."""
        if not fins:
            return None
        at = int(time.time() * 1000)
        codes = STATE_CODES
        rows = [(f.partition, f.offset, f.next_offset, codes[f.state], f.count, at) for f in fins]
        return self._append(
            queuelog.DONE, queuelog.encode_done_rows(core.topic, core.group, rows)
        )

    def _sync_later(self, pos: object | None) -> None:
        """Make records durable soon when nobody waits for them (deliveries, expiries,
        departures): one background fsync at a time, and one more if records were appended
        while it ran (group commit)."""
        if pos is None:
            return
        if self._syncing:
            self._sync_again = True
        else:
            self._syncing = True
            self.loop.create_task(self._sync_quietly())

    async def _sync_quietly(self) -> None:
        try:
            while self._log is not None:
                self._sync_again = False
                await self._log.sync_async()
                if not self._sync_again:
                    break
        except TxLogError as e:
            log.error("queues: fsync of the queue log failed: %s", e)
        finally:
            self._syncing = False

    def _now_ms(self) -> float:
        return self.loop.time() * 1000.0

    # ------------------------------------------------------------------ unused groups

    def _holds_nothing(self, g: GroupEntry) -> bool:
        ends = {p.index: p.visible_end for p in self.store.topic_partitions(g.core.topic)}
        return not g.subs and g.core.holds_nothing(ends)

    def _drop(self, g: GroupEntry, why: str) -> object | None:
        """Delete ``g`` and log it (DROP); the log position to make durable."""
        core = g.core
        self._forget_group(core.topic, core.group)
        log.warning("queue group %s/%s deleted: %s", core.topic, core.group, why)
        if self._log is None:
            return None
        return self._append(queuelog.DROP, queuelog.encode_drop(core.topic, core.group))

    def _expire_groups(self) -> None:
        """Delete the groups that had no consumer for ``queueGroupExpiry`` and hold
        nothing (run with the checkpoint timer)."""
        ttl = self.config.system.queues.group_expiry_ms / 1000.0
        if not ttl or self.replica or self._log is None:
            return
        if self.fence is not None and self.fence(None) is not None:
            return  # a replaced master changes nothing
        now = self.loop.time()
        pos = None
        for g in list(self.groups.values()):
            if not g.subs and now - g.unused_since >= ttl and self._holds_nothing(g):
                self.expired += 1
                pos = self._drop(g, f"expired (no consumer, nothing pending for {ttl:g} s)")
        self._sync_later(pos)

    def _make_room(self) -> bool:
        """At queueMaxGroups: delete the longest unused group that holds nothing."""
        idle = [g for g in self.groups.values() if not g.subs]
        for g in sorted(idle, key=lambda g: g.unused_since):
            if self._holds_nothing(g):
                self.evicted += 1
                self._sync_later(self._drop(g, "unused and empty, room made at queueMaxGroups"))
                return True
        return False

    def stats_items(self) -> list[tuple[str, object]]:
        """``stats queues``: one line per group."""
        out: list[tuple[str, object]] = []
        for (topic, group), g in sorted(self.groups.items()):
            c = g.core.counts()
            lows = " ".join(f"{p}:{ps.low_water}" for p, ps in sorted(g.core.parts.items()))
            figures = " ".join(f"{k}={v}" for k, v in [*c.items(), ("zk_removed", g.zk_removed)])
            out.append((f"{topic}/{group}", f"{figures} low_water={lows or '-'}"))
        return out


def _consume(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


class QueueReplica(ReplicaRedo):
    """A slave's copy of its master's queue log (stream ``__queuelog``), appended at the
    master's positions and checkpointed at the newest whole SNAPSHOT it holds."""

    def __init__(self, log: TxLog, store: MessageStore):
        self._building: Position | None = None
        self._next = 0
        self.snapshot_at: Position | None = None
        super().__init__(log, store)

    def _track(self, pos: Position, rtype: int, body: bytes) -> None:
        if rtype != queuelog.SNAPSHOT:
            return
        try:
            i, last, _chunk = queuelog.decode_snapshot_chunk(body)
        except NotifyError as e:
            log.error("queue replica: %s at %s", e, pos)
            return
        if i == 0:
            self._building, self._next = pos, 0
        if self._building is None or i != self._next:
            self._building = None
            return
        self._next += 1
        if last:
            self.snapshot_at, self._building = self._building, None

    def checkpoint_plan(self) -> tuple[Position, bytes] | None:
        return None if self.snapshot_at is None else (self.snapshot_at, b"")
