"""Delayed and scheduled messages (``dput``, or a producer's ``delay=`` / ``deliver_at=``).

Storage: a delayed message is appended, durably and acknowledged like any put, to the
internal partition ``__delay-0`` as one record whose msgId is the message's final id and
whose payload is an envelope::

    u16 topicLen · topic (UTF-8) · u32 partition · i64 deliverAtMs · payload (the message's own)

Index: pending messages sit in one-second buckets, ``{second: array('q') of (__delay offset,
due ms) pairs}`` plus a heap of bucket keys: 16 bytes per pending message and no timer object
each, so a million pending messages cost megabytes, not a million callbacks. One asyncio task (the
broker's own timer, not an APScheduler job per message) wakes every 50 ms, takes the due
buckets, reads those records, and moves them in order of due time.

Moving is exactly once, through the same intent -> idempotent apply -> done mechanism as
transaction commits (:class:`notify.core.apply.Applier`), on a redo log of its own
(``<dataLogPath>/delay/``, :mod:`txlog`)::

    MOVE  (20)  seq:u64 · n:u16 · n*(topic:str · partition:u32 · hint:i64) · m:u32 · m*offset:i64
    MOVED (21)  seq:u64 · m:u32 · m*offset:i64 · [k:u16 · k*(topic:str · partition:u32 ·
                offset:i64 · bytes:u64)]   (where the messages went; absent in old logs)

MOVE is fsynced before any target partition is written; after the appends MOVED is logged
(not forced). Recovery re-applies a MOVE without MOVED idempotently (message ids tell what
already reached the target), then rebuilds the index by scanning ``__delay`` from the
checkpointed watermark (the lowest offset still pending), skipping delivered offsets.
Checkpoints (every ``delayCheckpointInterval`` ms) store ``watermark:u64 · k:u32 ·
k*delivered offset:i64`` (the delivered offsets above the watermark); segments of
``__delay`` wholly below the watermark are deleted. A move whose messages are not yet on
disk in their target partitions keeps its MOVE record and its ``__delay`` records (it
holds both the checkpoint and the watermark back), so a crash before the targets' fsync
still re-applies it.

Inside a transaction, a delayed put becomes an APPEND_MSG for ``__delay``; the commit applies
it there and the index learns it then, so a rolled-back delayed message never becomes due.
Only a master moves messages; a slave replicates ``__delay`` but waits until promoted.

Replication: the delay log travels to slaves as the reserved stream ``__delaylog``, at the
master's positions, exactly like the redo log (:mod:`notify.replication.redo`: pushed to a
synchronous slave, pulled by every slave). Each master checkpoint also logs its state as a
record, so a replica needs nothing but the frames::

    CKPT  (22)  watermark:u64 · k:u32 · k*delivered offset:i64   (as the checkpoint state)

Recovery reads a CKPT record as the state it carries.

Compaction: one far-future message would keep the oldest ``__delay`` segment, and every
segment after it, until it is due (``maxDelay``, 90 days by default). Before each
checkpoint, when the pending messages of the oldest segment (not the active one) fill less
than half of it, they are re-put at the end of ``__delay`` through the same intent ->
idempotent apply -> done path as a move, with ``__delay`` as the target::

    REPUT (23)  as MOVE; the hint is the oldest segment's end; done is MOVED

so their old offsets count as delivered, the watermark passes the segment and it is
deleted. The re-put records keep their message ids; recovery looks for them only from the
hint on (the originals, with the same ids, lie before it), so a crash anywhere neither
loses nor doubles one (``tests/broker/test_delay_compaction.py``). On a synchronous master the mover
waits for the slave's answer to a MOVE before writing any target partition, so a slave that
has a moved message also has its MOVE. A slave keeps its copy with :class:`DelayReplica`
(its own checkpoints, its ``__delay`` segments below the watermark deleted) and ``promote``
runs the recovery above on it, re-applying every MOVE still in the log idempotently (the
target bytes may not have reached the slave), then indexes what is still pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import struct
import sys
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from notify.config import SystemConfig, TopicConfig, default_topic
from notify.core.apply import Applier, Share, group_shares
from notify.core.effects import Placement
from notify.core.ports import Clock
from notify.errors import NotifyError, TxLogError
from notify.faults import crashpoint
from notify.fs import OS_FS, FileSystem
from notify.protocol import records
from notify.replication.redo import ReplicaRedo
from notify.store.idempotent import already_present
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.txlog import Position, TxLog, TxLogConfig

log = logging.getLogger("notify.delay")

DELAY_TOPIC: Final = "__delay"
MOVE: Final = 20
MOVED: Final = 21
CKPT: Final = 22
REPUT: Final = 23
#: Compact the oldest __delay segment when its pending messages fill less than this share.
COMPACT_RATIO: Final = 0.5
TICK_S: Final = 0.05
MAX_MOVE_BATCH: Final = 20_000

_U16 = struct.Struct(">H")
_ENV_TAIL = struct.Struct(">Iq")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_HINT = struct.Struct(">Iq")


def encode_envelope(topic: str, partition: int, deliver_at_ms: int, payload: bytes) -> bytes:
    t = topic.encode()
    return _U16.pack(len(t)) + t + _ENV_TAIL.pack(partition, deliver_at_ms) + payload


def decode_envelope(env: bytes) -> tuple[str, int, int, bytes]:
    """``(topic, partition, deliver_at_ms, payload)`` of an envelope; ValueError if broken."""
    if len(env) < 2:
        raise ValueError("delay envelope too short")
    (n,) = _U16.unpack_from(env, 0)
    if len(env) < 2 + n + _ENV_TAIL.size:
        raise ValueError("delay envelope too short")
    topic = env[2 : 2 + n].decode("utf-8")
    part, due = _ENV_TAIL.unpack_from(env, 2 + n)
    return topic, part, due, env[2 + n + _ENV_TAIL.size :]


def delay_topic_config(system_default: TopicConfig) -> TopicConfig:
    """The internal topic: one disk partition under group commit (a delayed message is
    acknowledged only once it is on disk, and moved only then), no direct puts."""
    return replace(
        system_default,
        name=DELAY_TOPIC,
        num_partitions=1,
        store="disk",
        unflush_threshold=0,
        accept_publish=False,
        retention_ignores_consumers=True,
    )


def _pack_i64s(values: list[int] | set[int]) -> bytes:
    a = array("q", sorted(values) if isinstance(values, set) else values)
    if sys.byteorder == "little":
        a.byteswap()
    return a.tobytes()


def _unpack_i64s(data: bytes) -> list[int]:
    a = array("q")
    a.frombytes(data)
    if sys.byteorder == "little":
        a.byteswap()
    return list(a)


class DelayQueue:
    """Pending delayed messages of one broker and the task that delivers them."""

    def __init__(
        self,
        store: MessageStore,
        sysc: SystemConfig,
        applier: Applier,
        clock: Clock,
        is_master: Callable[[], bool],
        fs: FileSystem = OS_FS,
        crash: Callable[[str], None] = crashpoint,
        replica: bool = False,
        before_delete: Callable[[], None] | None = None,
    ):
        self.crash = crash
        #: called before ``__delay`` segments are deleted: makes the transaction log's APPLIED
        #: records durable, so recovery never re-applies a committed delayed put whose
        #: segment is gone (it would be delivered twice)
        self.before_delete = before_delete
        #: a slave keeps its master's log (``open`` makes ``replica_log``) until ``promote``
        self.replica = replica
        self.replica_log: DelayReplica | None = None
        #: the synchronous slave's answer to the newest write of this log pushed to it
        self._shipped: asyncio.Future[None] | None = None
        self.store = store
        self.sysc = sysc
        self.applier = applier
        self.clock = clock
        self.is_master = is_master
        self.part: Partition | None = None
        self.log = TxLog.open(
            sysc.delay_log_path,
            TxLogConfig(flush_at_commit=1, max_checkpoints=sysc.max_checkpoints),
            fs=fs,
        )
        self.buckets: dict[int, array[int]] = {}
        self.heap: list[int] = []
        self.pending = 0
        self.delivered: set[int] = set()
        self.watermark = 0
        self.seq = 0
        self.moved_total = 0
        self.compacted_total = 0
        self._reput_retry: tuple[int, Position, int, list[int], list[bytes]] | None = None
        self.lateness_ms: deque[float] = deque(maxlen=10_000)
        self._task: asyncio.Task[None] | None = None
        self._last_checkpoint = clock.monotonic()
        #: (MOVE position, moved __delay offsets, placements) not yet flushed in targets
        self._unflushed: deque[tuple[Position, list[int], tuple[Placement, ...]]] = deque()

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Create ``__delay-0``, recover interrupted moves and rebuild the index (a replica:
        only follow the master's log, see :meth:`promote`)."""
        self.part = self.store.get(DELAY_TOPIC, 0)
        if self.part is None:
            sysc = self.sysc
            self.part = self.store.add_topic(delay_topic_config(default_topic(sysc, "")))[0]
        if self.replica:
            self.replica_log = DelayReplica(self.log, self.store, self.part)
            return
        self._recover(promoted=False)

    def promote(self) -> None:
        """This slave becomes the master: recover its copy of the master's log as a restarted
        master would, re-applying (idempotently) every MOVE still in it, since its target
        bytes may not have reached this broker; then index what is still pending."""
        if not self.replica:
            return
        self.replica = False
        self.replica_log = None
        self._recover(promoted=True)

    def ship(self, fut: asyncio.Future[None]) -> None:
        """A write of this log was pushed to the synchronous slave: the next move waits."""
        fut.add_done_callback(_consume)
        self._shipped = fut

    def _recover(self, promoted: bool) -> None:
        ck = self.log.latest_checkpoint()
        if ck is not None and ck.state:
            self.watermark, self.delivered = _decode_state(ck.state)
        # every MOVE still in the log is re-applied idempotently: one without MOVED was
        # interrupted, one with MOVED may have lost its unflushed target bytes in a crash
        moves: dict[int, tuple[Position, list[tuple[str, int, int]], list[int]]] = {}
        reputs: set[int] = set()  # REPUT seqs (re-puts into __delay by compaction)
        exact: set[int] = set()  # seqs whose hints are MOVED's placements
        for pos, rtype, body in self.log.replay():
            if rtype in (MOVE, REPUT):
                seq, hints, offs = _decode_move(body)
                moves[seq] = (pos, hints, offs)
                if rtype == REPUT:
                    reputs.add(seq)
                self.seq = max(self.seq, seq)
            elif rtype == CKPT:  # the state a checkpoint had (what a replica has of it)
                self.watermark, self.delivered = _decode_state(body)
            elif rtype == MOVED:
                seq, offs, placed = _decode_moved(body)
                self.delivered.update(offs)
                self.seq = max(self.seq, seq)
                if seq in moves and placed is not None:
                    if not promoted and self._present(placed):
                        del moves[seq]  # done, and its messages are all in their partitions
                    else:  # the exact offsets it went to are the hints for its re-apply
                        moves[seq] = (moves[seq][0], [(t, p, o) for t, p, o, _n in placed], offs)
                        exact.add(seq)
        touched: dict[Partition, None] = {}
        for seq, (pos, hints, offs) in sorted(moves.items()):
            if seq in reputs:
                placements = self._apply_reput(seq, pos, hints[0][2], offs, recovering=True)
            else:
                placements = self._apply_move(
                    seq, pos, hints, offs, recovering=True, exact=seq in exact
                )
            for pl in placements:
                target = self.store.get(pl.topic, pl.partition)
                if target is not None:
                    touched[target] = None
        for target in touched:
            target.sync()
        # offsets below the watermark are done whatever the records after a checkpoint say (a
        # promoted slave replays MOVEs from before its master's last CKPT): the set stays
        # as bounded as a checkpoint left it
        self.delivered = {o for o in self.delivered if o >= self.watermark}
        self._rebuild_index()
        self.log.sync()
        log.info(
            "delay queue: %d pending, watermark %d, %d delivered above it",
            self.pending,
            self.watermark,
            len(self.delivered),
        )

    def _present(self, placed: list[tuple[str, int, int, int]]) -> bool:
        """Whether a finished move's messages certainly survived: they end before their
        partitions' checked start (durable before the crash). Otherwise the move is applied
        again with ``verify`` (message ids tell what is already there)."""
        for topic, pidx, off, nbytes in placed:
            target = self.store.get(topic, pidx)
            if target is not None and not target.memory and target.scan_start < off + nbytes:
                return False
        return True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="delay-mover")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.replica:  # a replica's log is its master's: nothing of ours goes in
            with contextlib.suppress(NotifyError):
                self._checkpoint()
        self.log.close()

    # ------------------------------------------------------------------ index

    def add(self, offset: int, due_ms: int) -> None:
        sec = due_ms // 1000
        b = self.buckets.get(sec)
        if b is None:
            b = self.buckets[sec] = array("q")
            heapq.heappush(self.heap, sec)
        b.append(offset)
        b.append(due_ms)
        self.pending += 1

    def forget_from(self, offset: int) -> None:
        """``__delay`` records at or after ``offset`` were taken back (refused puts)."""
        self._forget({o for a in self.buckets.values() for o in a[0::2] if o >= offset})

    def index_appended(self, base: int, data: bytes | bytearray | memoryview) -> None:
        """Index records just appended to ``__delay`` at ``base`` (puts and tx commits)."""
        recs, _ = records.decode_all(bytes(data), base, verify=False)
        for r in recs:
            try:
                _t, _p, due, _payload = decode_envelope(r.payload)
            except ValueError:
                log.error("delay: unreadable envelope at offset %d skipped", r.offset)
                continue
            self.add(r.offset, due)

    def _rebuild_index(self) -> None:
        part = self.part
        assert part is not None
        off = max(self.watermark, part.min_offset)
        while off < part.end:
            recs, used = records.decode_all(part.read_raw(off, 1 << 20), off)
            if not recs:
                break
            for r in recs:
                if r.offset in self.delivered:
                    continue
                try:
                    _t, _p, due, _payload = decode_envelope(r.payload)
                except ValueError:
                    log.error("delay: unreadable envelope at offset %d skipped", r.offset)
                    continue
                self.add(r.offset, due)
            off += used

    # ------------------------------------------------------------------ moving

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if not self.is_master():
                continue
            try:
                prepared = self._prepare_move()
                if prepared is not None:
                    try:
                        shipped = self._shipped
                        if shipped is not None and not shipped.done():
                            # the synchronous slave has the MOVE before any target has the
                            # messages; a slave that does not answer is out of sync anyway
                            await asyncio.wait({shipped})
                    finally:  # even when cancelled: the MOVE is logged, apply it now
                        self._finish_move(prepared)
                interval = self.sysc.delay.checkpoint_interval_ms / 1000.0
                if self.clock.monotonic() - self._last_checkpoint >= interval:
                    self.compact()
                    self.trim_delivered()
                    self._checkpoint()
            except NotifyError as e:
                log.error("delay mover: %s (retrying)", e)
                await asyncio.sleep(1.0)

    def move_due(self, now_ms: int | None = None) -> int:
        """Deliver every pending message due by ``now_ms``; returns how many moved."""
        prepared = self._prepare_move(now_ms)
        return 0 if prepared is None else self._finish_move(prepared)

    def _prepare_move(self, now_ms: int | None = None) -> _Move | None:
        """Take the due messages and log their MOVE (forced); :meth:`_finish_move` appends
        them to their partitions."""
        now_ms = int(self.clock.time() * 1000) if now_ms is None else now_ms
        now_sec = now_ms // 1000
        part = self.part
        assert part is not None
        taken: list[tuple[int, int, str, int, bytes]] = []  # due, offset, topic, part, record
        later: list[tuple[int, int]] = []
        while self.heap and self.heap[0] <= now_sec and len(taken) < MAX_MOVE_BATCH:
            sec = heapq.heappop(self.heap)
            pairs = self.buckets.pop(sec, None)
            if pairs is None:  # emptied by forget_from
                continue
            self.pending -= len(pairs) // 2
            for i in range(0, len(pairs), 2):
                off, due = pairs[i], pairs[i + 1]
                if due > now_ms or len(taken) >= MAX_MOVE_BATCH or off >= part.visible_end:
                    # not due, or not yet durable in __delay: a crash could still take it
                    # (and its offset could then be reused by another message)
                    later.append((off, due))
                    continue
                rec = self._read_record(part, off)
                if rec is None:
                    continue
                topic, pidx, due, payload = decode_envelope(rec.payload)
                out = records.encode(rec.msg_id, rec.flag, payload)
                taken.append((due, off, topic, pidx, out))
        for off, due in later:
            self.add(off, due)
        if not taken:
            return None
        taken.sort(key=lambda x: (x[0], x[1]))
        hints: dict[tuple[str, int], int] = {}
        for _due, _off, topic, pidx, _out in taken:
            if (topic, pidx) not in hints:
                target = self.store.get(topic, pidx)
                hints[(topic, pidx)] = target.end if target is not None else 0
        self.seq += 1
        seq = self.seq
        hint_list = [(t, p, h) for (t, p), h in hints.items()]
        offsets = [x[1] for x in taken]
        try:
            pos = self.log.commit(MOVE, _encode_move(seq, hint_list, offsets))
        except TxLogError:
            for due, off, *_ in taken:  # not moved: try again next tick
                self.add(off, due)
            raise
        self.crash("after_move_intent")
        return seq, pos, hint_list, offsets, taken

    def _finish_move(self, move: _Move) -> int:
        seq, pos, hint_list, offsets, taken = move
        self._apply_move(seq, pos, hint_list, offsets, prepared=taken)
        now2 = self.clock.time() * 1000
        for due, *_ in taken:
            self.lateness_ms.append(now2 - due)
        return len(taken)

    def _read_record(self, part: Partition, off: int) -> records.Record | None:
        head = part.read_raw(off, records.HEADER_SIZE)
        size = records.first_record_size(head)
        if size is None:
            return None
        recs, _ = records.decode_all(part.read_raw(off, size), off)
        if not recs:
            log.error("delay: record at %d unreadable, skipped", off)
            return None
        return recs[0]

    def _apply_move(
        self,
        seq: int,
        pos: Position,
        hints: list[tuple[str, int, int]],
        offsets: list[int],
        recovering: bool = False,
        prepared: list[tuple[int, int, str, int, bytes]] | None = None,
        exact: bool = False,
    ) -> tuple[Placement, ...]:
        part = self.part
        assert part is not None
        if prepared is None:  # recovery: read the records again, keep due order
            prepared = []
            for off in offsets:
                if off < part.min_offset:
                    # below the checkpointed watermark: this move was on disk in its
                    # targets before its __delay segment was deleted
                    continue
                rec = self._read_record(part, off)
                if rec is None:
                    continue
                topic, pidx, due, payload = decode_envelope(rec.payload)
                prepared.append(
                    (due, off, topic, pidx, records.encode(rec.msg_id, rec.flag, payload))
                )
            prepared.sort(key=lambda x: (x[0], x[1]))
        shares = group_shares((topic, pidx, out, 1) for _d, _o, topic, pidx, out in prepared)

        def missing(sh: Share) -> None:
            log.error(
                "delay: %s-%d no longer exists: %d messages dropped",
                sh.topic,
                sh.partition,
                sh.count,
            )

        placements = tuple(
            self.applier.apply(
                shares,
                {(t, p): h for t, p, h in hints},
                verify=recovering,
                what=f"delay move {seq}",
                on_missing=missing,
                between="mid_move",
                exact=exact,
            )
        )
        try:
            self.log.append(MOVED, _encode_moved(seq, offsets, placements))
        except TxLogError as e:
            log.error("delay: MOVED %d not logged (recovery re-checks it): %s", seq, e)
        self.crash("after_move")
        self._unflushed.append((pos, offsets, placements))
        self.delivered.update(offsets)
        if not recovering:
            self.moved_total += len(offsets)
        return placements

    # ------------------------------------------------------------------ compaction

    def compact(self) -> int:
        """Re-put the pending messages of the oldest ``__delay`` segment when they fill less
        than COMPACT_RATIO of it (see the module doc); returns how many were re-put."""
        part = self.part
        assert part is not None
        if self._reput_retry is not None:  # the last re-put's append failed: finish it first
            retry, self._reput_retry = self._reput_retry, None
            self._apply_reput(*retry[:4], raw=retry[4], retry=retry)
        if len(part.segments) < 2 or self.replica:
            return 0
        oldest = part.segments[0]
        if oldest.end > part.visible_end:
            return 0
        bound = oldest.end
        found: list[tuple[int, int]] = []  # (offset, due)
        for a in self.buckets.values():
            for i in range(0, len(a), 2):
                if a[i] < bound:
                    found.append((a[i], a[i + 1]))
                    if len(found) > MAX_MOVE_BATCH:
                        return 0  # a segment full of pending messages: nothing to gain
        if not found:
            return 0
        found.sort()
        raw = self._read_records(part, found, "compacted")
        if raw is None:
            return 0
        if sum(map(len, raw)) >= COMPACT_RATIO * (oldest.end - oldest.start):
            return 0
        self._reput([off for off, _ in found], raw, bound)
        log.info("delay: %d pending messages re-put out of the oldest segment", len(found))
        return len(found)

    @staticmethod
    def _read_records(
        part: Partition, found: list[tuple[int, int]], what: str
    ) -> list[bytes] | None:
        """The whole records at ``found``'s offsets; None (logged) if one is unreadable."""
        raw: list[bytes] = []
        for off, _due in found:
            size = records.first_record_size(part.read_raw(off, records.HEADER_SIZE))
            if size is None:
                log.error("delay: record at %d unreadable, not %s", off, what)
                return None
            raw.append(part.read_raw(off, size))
        return raw

    def _reput(self, offsets: list[int], raw: list[bytes], hint: int) -> None:
        """Log a REPUT of the pending records at ``offsets`` (bytes ``raw``; all of them end
        at or before ``hint``, a durable record boundary) and apply it."""
        self.seq += 1
        seq = self.seq
        pos = self.log.commit(REPUT, _encode_move(seq, [(DELAY_TOPIC, 0, hint)], offsets))
        self._forget(set(offsets))
        self.crash("after_reput_intent")
        self._apply_reput(seq, pos, hint, offsets, raw=raw, retry=(seq, pos, hint, offsets, raw))

    def trim_delivered(self) -> int:
        """Keep the delivered set (and so the checkpoint) bounded: when more than
        ``delayMaxDelivered`` delivered offsets lie above the watermark (many messages
        delivered behind one far-future message in the same segment), re-put the oldest
        pending messages (at most MAX_MOVE_BATCH) at the end of ``__delay``, so the
        watermark passes at least half of those offsets at the next checkpoint. Returns how
        many were re-put."""
        part = self.part
        assert part is not None
        limit = self.sysc.delay.max_delivered
        if self.replica or self._reput_retry is not None or len(self.delivered) <= limit:
            return 0
        low = min((min(a[0::2]) for a in self.buckets.values() if len(a)), default=part.end)
        above = sorted(o for o in self.delivered if o >= low)
        if len(above) <= limit:
            return 0
        hint = part.flushed_end  # a durable record boundary: the originals all end before it
        bound = min(above[len(above) - limit // 2], hint)
        found = sorted(
            (a[i], a[i + 1])
            for a in self.buckets.values()
            for i in range(0, len(a), 2)
            if a[i] < bound
        )[:MAX_MOVE_BATCH]
        if not found:
            return 0
        raw = self._read_records(part, found, "re-put")
        if raw is None:
            return 0
        self._reput([off for off, _ in found], raw, hint)
        log.info(
            "delay: %d delivered offsets above the watermark (limit %d): %d pending messages "
            "re-put",
            len(above),
            limit,
            len(found),
        )
        return len(found)

    def _forget(self, offsets: set[int]) -> None:
        """Take ``offsets`` out of the index."""
        for sec in list(self.buckets):
            a = self.buckets[sec]
            keep = array("q")
            for i in range(0, len(a), 2):
                if a[i] not in offsets:
                    keep.append(a[i])
                    keep.append(a[i + 1])
            self.pending -= (len(a) - len(keep)) // 2
            if keep:
                self.buckets[sec] = keep
            else:  # its heap key stays: move_due pops a missing bucket as empty
                del self.buckets[sec]

    def _apply_reput(
        self,
        seq: int,
        pos: Position,
        hint: int,
        offsets: list[int],
        recovering: bool = False,
        raw: list[bytes] | None = None,
        retry: tuple[int, Position, int, list[int], list[bytes]] | None = None,
    ) -> tuple[Placement, ...]:
        """Append the records at ``offsets`` again at the end of ``__delay`` (recovery: only
        what is not already there from ``hint`` on), index them, log MOVED. When the append
        fails, ``retry`` is kept for the next :meth:`compact` (the messages are out of the
        index meanwhile; a restart re-applies the logged REPUT instead)."""
        part = self.part
        assert part is not None
        if raw is None:
            raw = []
            for off in offsets:
                if off < part.min_offset:
                    continue  # its segment was deleted: the re-put was durable before
                size = records.first_record_size(part.read_raw(off, records.HEADER_SIZE))
                if size is not None:
                    raw.append(part.read_raw(off, size))
        data = b"".join(raw)
        placements: list[Placement] = []
        skip, at, n_skip = 0, -1, 0
        if recovering and data:
            # the originals (same message ids) lie before hint: look only from there
            skip, at = already_present(part, hint, data, exact=True)
            while n_skip < len(raw) and sum(map(len, raw[: n_skip + 1])) <= skip:
                n_skip += 1
            if skip:
                placements.append(Placement(DELAY_TOPIC, 0, at, n_skip, skip))
        if skip < len(data):
            share = Share(DELAY_TOPIC, 0, data[skip:], len(raw) - n_skip)
            try:
                placed = self.applier.apply([share], {}, verify=False, what=f"delay re-put {seq}")
            except NotifyError:
                self._reput_retry = retry
                raise
            placements += placed
            if not recovering:  # (recovery rebuilds the index from the watermark)
                for pl in placed:
                    self.index_appended(pl.offset, data[skip:])
        try:
            self.log.append(MOVED, _encode_moved(seq, offsets, tuple(placements)))
        except TxLogError as e:
            log.error("delay: MOVED %d not logged (recovery re-checks it): %s", seq, e)
        self.crash("after_reput")
        self._unflushed.append((pos, offsets, tuple(placements)))
        self.delivered.update(offsets)
        self.compacted_total += len(offsets)
        return tuple(placements)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self) -> None:
        part = self.part
        assert part is not None
        self._last_checkpoint = self.clock.monotonic()
        unflushed = self._unflushed
        while unflushed and self.applier.durable(unflushed[0][2]):
            unflushed.popleft()
        low = min((min(a[0::2]) for a in self.buckets.values() if len(a)), default=part.end)
        if unflushed:  # keep the records a re-apply would read
            low = min(low, min(min(offs) for _p, offs, _pl in unflushed if offs))
        self.watermark = low
        self.delivered = {o for o in self.delivered if o >= low}
        state = _U64.pack(low) + _U32.pack(len(self.delivered)) + _pack_i64s(self.delivered)
        at = self.log.append(CKPT, state)  # the state in the log too: replicas follow it
        keep = unflushed[0][0] if unflushed else at
        self.log.checkpoint(keep, state)
        if len(part.segments) > 1 and part.segments[0].end <= low:
            if self.before_delete is not None:
                self.before_delete()
            part.delete_segments_before(low)

    def stats_items(self) -> list[tuple[str, object]]:
        lat = sorted(self.lateness_ms)

        def pct(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(len(lat) * p))], 1) if lat else 0.0

        return [
            ("delay_pending", self.pending),
            ("delay_buckets", len(self.buckets)),
            ("delay_moved", self.moved_total),
            ("delay_compacted", self.compacted_total),
            ("delay_delivered_tracked", len(self.delivered)),
            ("delay_segments", len(self.part.segments) if self.part is not None else 0),
            ("delay_next_due_s", self.heap[0] if self.heap else -1),
            ("delay_lateness_p50_ms", pct(0.5)),
            ("delay_lateness_p99_ms", pct(0.99)),
            ("delay_log_end", "{}:{}".format(*self.log.end_position)),
        ]


def _encode_move(seq: int, hints: list[tuple[str, int, int]], offsets: list[int]) -> bytes:
    parts = [_U64.pack(seq), _U16.pack(len(hints))]
    for topic, pidx, hint in hints:
        t = topic.encode()
        parts += [_U16.pack(len(t)), t, _HINT.pack(pidx, hint)]
    parts += [_U32.pack(len(offsets)), _pack_i64s(offsets)]
    return b"".join(parts)


def _decode_move(body: bytes) -> tuple[int, list[tuple[str, int, int]], list[int]]:
    (seq,) = _U64.unpack_from(body, 0)
    (n,) = _U16.unpack_from(body, 8)
    pos = 10
    hints = []
    for _ in range(n):
        (tl,) = _U16.unpack_from(body, pos)
        topic = body[pos + 2 : pos + 2 + tl].decode()
        pidx, hint = _HINT.unpack_from(body, pos + 2 + tl)
        hints.append((topic, pidx, hint))
        pos += 2 + tl + _HINT.size
    (m,) = _U32.unpack_from(body, pos)
    return seq, hints, _unpack_i64s(body[pos + 4 : pos + 4 + 8 * m])


_PLACED = struct.Struct(">Iqq")


def _encode_moved(seq: int, offsets: list[int], placements: tuple[Placement, ...] = ()) -> bytes:
    parts = [_U64.pack(seq), _U32.pack(len(offsets)), _pack_i64s(offsets)]
    parts.append(_U16.pack(len(placements)))
    for pl in placements:
        t = pl.topic.encode()
        parts += [_U16.pack(len(t)), t, _PLACED.pack(pl.partition, pl.offset, pl.nbytes)]
    return b"".join(parts)


def _decode_moved(body: bytes) -> tuple[int, list[int], list[tuple[str, int, int, int]] | None]:
    """``(seq, offsets, placements)``; placements are None in a record from an older broker."""
    (seq,) = _U64.unpack_from(body, 0)
    (m,) = _U32.unpack_from(body, 8)
    pos = 12 + 8 * m
    offsets = _unpack_i64s(body[12:pos])
    if len(body) < pos + 2:
        return seq, offsets, None
    (k,) = _U16.unpack_from(body, pos)
    pos += 2
    placed = []
    for _ in range(k):
        (tl,) = _U16.unpack_from(body, pos)
        topic = body[pos + 2 : pos + 2 + tl].decode()
        pidx, off, nbytes = _PLACED.unpack_from(body, pos + 2 + tl)
        placed.append((topic, pidx, off, nbytes))
        pos += 2 + tl + _PLACED.size
    return seq, offsets, placed


#: A logged MOVE not yet applied: seq, MOVE position, hints, __delay offsets, records.
_Taken = list[tuple[int, int, str, int, bytes]]
_Move = tuple[int, Position, list[tuple[str, int, int]], list[int], _Taken]


def _decode_state(state: bytes) -> tuple[int, set[int]]:
    """``(watermark, delivered offsets)`` of a checkpoint state or CKPT record."""
    (watermark,) = _U64.unpack_from(state, 0)
    (k,) = _U32.unpack_from(state, 8)
    return watermark, set(_unpack_i64s(state[12 : 12 + 8 * k]))


def _consume(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


class DelayReplica(ReplicaRedo):
    """A slave's copy of its master's delay log (the ``__delaylog`` stream): appended at the
    master's positions; checkpointed from the master's CKPT records, keeping every MOVE whose
    messages are not yet on this broker's disk in their partitions (``promote`` re-applies
    those); ``__delay`` segments below the master's watermark are deleted here too."""

    def __init__(self, log: TxLog, store: MessageStore, part: Partition):
        self.part = part
        #: MOVE seq -> (position, lowest __delay offset, placements once MOVED is seen)
        self.moves: dict[int, tuple[Position, int, list[tuple[str, int, int, int]] | None]] = {}
        #: the newest CKPT record: (position, state)
        self.ckpt: tuple[Position, bytes] | None = None
        self._low = 0
        super().__init__(log, store)

    def _track(self, pos: Position, rtype: int, body: bytes) -> None:
        try:
            if rtype in (MOVE, REPUT):
                seq, _hints, offs = _decode_move(body)
                self.moves.setdefault(seq, (pos, min(offs, default=0), None))
            elif rtype == MOVED:
                seq, _offs, placed = _decode_moved(body)
                ent = self.moves.get(seq)
                if ent is not None:
                    self.moves[seq] = (ent[0], ent[1], placed or [])
            elif rtype == CKPT:
                self.ckpt = (pos, body)
        except (struct.error, ValueError, IndexError) as e:
            log.error("delay replica: unreadable record at %s: %s", pos, e)

    def checkpoint_plan(self) -> tuple[Position, bytes] | None:
        """Where this copy may start (and the state it keeps), or None before the master's
        first CKPT record."""
        if self.ckpt is None:
            return None
        at, state = self.ckpt
        for seq, (pos, _low, placed) in list(self.moves.items()):
            if pos < at and placed is not None and self._on_disk(placed):
                del self.moves[seq]
        keep = min([at, *(e[0] for e in self.moves.values())])
        watermark, _ = _decode_state(state)
        self._low = min([watermark, *(e[1] for e in self.moves.values())])
        return keep, state

    def checkpointed(self) -> None:
        self.part.delete_segments_before(self._low)

    def _on_disk(self, placed: list[tuple[str, int, int, int]]) -> bool:
        for topic, pidx, off, nbytes in placed:
            target = self.store.get(topic, pidx)
            if target is not None and not target.memory and target.flushed_end < off + nbytes:
                return False
        return True
