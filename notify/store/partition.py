"""A partition: ``<dataPath>/<topic>-<partition>/`` holding segment files, offsets in bytes.

Offsets run across segments: segment ``k+1`` starts where segment ``k`` ends. Three marks:

* ``end``          bytes written (page cache);
* ``flushed_end``  bytes known to be on disk (an fdatasync completed after they were written);
* ``visible_end``  what consumers are served. Under group commit (``unflushThreshold=0``) it
                   follows ``flushed_end``, so a consumer never sees a message that a crash
                   could still take back; otherwise it follows ``end`` as in MetaQ.
                   Appends *covered* by another log (a committed transaction's messages,
                   :meth:`append_covered`) need no fsync of their own. Three things stop it
                   (the *limit*): an append *held* for a synchronous slave's confirmation
                   (``append(..., hold=True)``: invisible until :meth:`confirm`;
                   :meth:`drop_from` can take it back), a transaction's share whose
                   :class:`~notify.store.gate.Gate` is closed (the transaction's shares in
                   other partitions are not all showable yet), and on a slave the last
                   consistent cut of its master it reached (:meth:`set_cut`).

Recovery on open: every segment but the last was fsynced when it was rolled, so only the
last segment is scanned, from the recovery point (the last known-durable offset, when given)
to its end; each record's length and CRC are checked and a torn or corrupt tail is cut off
and reported.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from notify.errors import OffsetOutOfRangeError, StoreCorruptError, StoreError
from notify.fs import FSYNC_FAILED, OS_FS, FileSystem, ensure_dir, leave_marker
from notify.protocol import records
from notify.store.gate import Gate, settle
from notify.store.segment import Segment, parse_segment_name

log = logging.getLogger("notify.store")

SCAN_CHUNK: Final = 8 * 1024 * 1024
#: no limit on what a partition shows (see :attr:`Partition._limit`)
NO_LIMIT: Final = 1 << 62
#: Bytes a stored record may exceed its payload limit by (a delayed message's envelope).
RECORD_SLACK: Final = 4096


@dataclass(frozen=True)
class RecoveryReport:
    """What opening a partition found: bytes checked and what a torn tail cost."""

    topic: str
    partition: int
    segment: str
    scanned_bytes: int
    truncated_bytes: int
    reason: str | None
    seconds: float


@dataclass(frozen=True, slots=True)
class Slice:
    """A byte range of one segment to serve: ``length`` bytes at ``file_pos`` of ``segment``."""

    segment: Segment
    file_pos: int
    length: int
    offset: int


class Partition:
    """One topic partition on disk. Used from one thread (the broker's event loop), except
    :meth:`Segment.sync` of the active segment, which the flusher runs in a worker thread.
    All file I/O goes through ``fs`` (the real file system by default)."""

    memory = False
    #: the largest record a read widens its window to (header + maxMessageSize + slack; set
    #: by the store): a get at a mid-record offset, whose "length" is garbage, stays bounded
    max_record: int = records.HEADER_SIZE + 4 * 1024 * 1024 + RECORD_SLACK

    def __init__(
        self,
        topic: str,
        index: int,
        directory: Path,
        max_segment_size: int,
        group_commit: bool,
        fs: FileSystem = OS_FS,
    ):
        self.fs = fs
        self.topic = topic
        self.index = index
        self.directory = directory
        self.max_segment_size = max_segment_size
        self.group_commit = group_commit
        self.segments: list[Segment] = []
        self._starts: list[int] = []
        self.flushed_end = 0
        self.visible_end = 0
        # flush bookkeeping, owned by notify.store.flusher
        self.unflushed = 0
        self.last_flush = time.monotonic()
        self.flush_inflight: object | None = None
        self.flush_next: object | None = None
        self.failed: str | None = None
        self.recovery: RecoveryReport | None = None
        self.closed = False
        #: long-poll hook: called when ``visible_end`` advances while ``waiting`` is set
        #: (and whenever a flush, a confirmation, a covered append or a gate advances it)
        self.waiting = False
        self.on_visible: Callable[[Partition], None] | None = None
        #: ``(start, end)`` of appends another log keeps durable (applied commits), in order
        self._covered: deque[tuple[int, int]] = deque()
        #: ``[start, end, confirmed]`` of held appends, in order (readers stop at the first)
        self._held: deque[list[int]] = deque()
        #: ``(start, gate)`` of gated shares not yet shown, in order (readers stop at the
        #: first whose gate is closed; gates open in this order)
        self._gates: deque[tuple[int, Gate]] = deque()
        #: a slave's cap: the end of this partition in the last consistent cut of its
        #: master that the slave reached (None: no cap, a master)
        self.cut: int | None = None
        #: what ``visible_end`` may not pass: the first held append, the first closed
        #: gate's share, the cut (NO_LIMIT when none)
        self._limit = NO_LIMIT
        #: the lowest offset rolled back to since the fsync in flight began (see
        #: :meth:`begin_sync`): that fsync vouches for nothing at or past it
        self._stable = NO_LIMIT
        self.scan_start = 0

    # ------------------------------------------------------------------ open / recover

    @classmethod
    def open(
        cls,
        topic: str,
        index: int,
        directory: Path,
        max_segment_size: int,
        group_commit: bool,
        recovery_point: int | None = None,
        fs: FileSystem = OS_FS,
    ) -> Partition:
        p = cls(topic, index, directory, max_segment_size, group_commit, fs)
        try:
            ensure_dir(fs, directory)
            names = sorted(fs.listdir(directory))
        except OSError as e:
            raise StoreError(f"cannot open partition directory {directory}: {e.strerror}") from e
        starts = sorted(s for s in (parse_segment_name(n) for n in names) if s is not None)
        if not starts:
            seg = Segment.open(directory, 0, create=True, fs=fs)
            try:
                fs.fsync_dir(directory)
            except OSError as e:
                seg.close()
                raise StoreError(f"cannot sync partition directory {directory}: {e}") from e
            p._add(seg)
        else:
            for s in starts:
                p._add(Segment.open(directory, s, fs=fs))
            p._check_contiguous()
        p.recovery = p._recover(recovery_point)
        p._repair_after_failed_fsync()
        p.flushed_end = p.end
        p.visible_end = p.end
        return p

    def fail(self, reason: str) -> None:
        """Make the partition read-only after a failed fsync (the page cache may have dropped
        the dirty pages and marked them clean) and leave the ``fsync-failed`` marker the next
        open repairs from (see :meth:`_repair_after_failed_fsync`)."""
        self.failed = reason
        if self.memory:
            return
        try:
            leave_marker(self.fs, self.directory / FSYNC_FAILED)
        except OSError as e:
            log.error("%s-%d: cannot leave the fsync-failed marker: %s", self.topic, self.index, e)

    def _repair_after_failed_fsync(self) -> None:
        """An earlier run's fsync failed: within the same boot the page cache still shows
        records the disk never got, as clean pages. Rewrite the active segment from the scan
        start (everything before it was durable) so later appends never sit behind a hole."""
        marker = self.directory / FSYNC_FAILED
        if self.memory or not self.fs.exists(marker):
            return
        seg = self.segments[-1]
        try:
            n = seg.rewrite(max(0, self.scan_start - seg.start))
            self.fs.unlink(marker)
            self.fs.fsync_dir(self.directory)
        except OSError as e:
            raise StoreError(
                f"{self.directory}: rewriting {seg.path.name} after a failed fsync failed: {e}"
            ) from e
        log.warning(
            "%s-%d: rewrote %d bytes of %s after an earlier failed fsync",
            self.topic, self.index, n, seg.path.name,
        )  # fmt: skip

    def _add(self, seg: Segment) -> None:
        self.segments.append(seg)
        self._starts.append(seg.start)

    def _check_contiguous(self) -> None:
        for a, b in zip(self.segments, self.segments[1:], strict=False):
            if a.end != b.start:
                raise StoreCorruptError(
                    f"{self.directory}: segment {a.path.name} ends at {a.end} but the next "
                    f"segment {b.path.name} starts at {b.start}; refusing to guess which bytes "
                    "are right (move the bad file away and restart)"
                )

    def _recover(self, recovery_point: int | None) -> RecoveryReport:
        t0 = time.monotonic()
        seg = self.segments[-1]
        size = seg.size
        start = 0
        if recovery_point is not None and seg.start <= recovery_point <= seg.end:
            start = recovery_point - seg.start
        elif recovery_point is not None and recovery_point > seg.end:
            log.warning(
                "%s-%d: recovery point %d is past the end %d of the data: the disk lost "
                "acknowledged data; scanning the whole last segment",
                self.topic,
                self.index,
                recovery_point,
                seg.end,
            )
        pos = start
        #: a record boundary from which every record was checked at open: data before it
        #: was durable before the last crash, so re-applies verify only from here on
        self.scan_start = seg.start + start
        reason: str | None = None
        while pos < size:
            want = min(SCAN_CHUNK, size - pos)
            buf = seg.read(pos, want)
            valid, why = records.scan(buf)
            pos += valid
            if why is None:
                continue
            if valid > 0:
                continue  # re-read from the first record the chunk did not hold whole
            if why == "incomplete payload":
                need = records.first_record_size(buf)
                if need is not None and pos + need <= size:
                    whole = seg.read(pos, need)
                    ok, why2 = records.scan(whole)
                    if ok == need and why2 is None:
                        pos += need
                        continue
                    why = why2 or why
            reason = why
            break
        cut = size - pos
        if cut:
            log.warning(
                "%s-%d: truncating torn tail of %s: %d bytes cut at offset %d (%s)",
                self.topic,
                self.index,
                seg.path.name,
                cut,
                seg.start + pos,
                reason,
            )
            seg.truncate(pos)
        return RecoveryReport(
            self.topic,
            self.index,
            seg.path.name,
            size - start,
            cut,
            reason if cut else None,
            time.monotonic() - t0,
        )

    # ------------------------------------------------------------------ properties

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def end(self) -> int:
        return self.segments[-1].end

    @property
    def min_offset(self) -> int:
        return self.segments[0].start

    @property
    def size_bytes(self) -> int:
        return self.end - self.min_offset

    # ------------------------------------------------------------------ writing

    def append(self, data: bytes | bytearray | memoryview, hold: bool = False) -> int:
        """Append whole records; return the offset of the first. Rolls the active segment
        first when it is non-empty and the data would take it past ``max_segment_size``.
        ``hold``: invisible to readers until :meth:`confirm` (a synchronous slave's answer)."""
        if self.failed:
            raise StoreError(self.failed)
        seg = self.segments[-1]
        if seg.size and seg.size + len(data) > self.max_segment_size:
            seg = self._roll()
        offset = seg.append(data)
        if hold:
            self._held.append([offset, seg.end, 0])
            if offset < self._limit:
                self._limit = offset
        if not self.group_commit:
            v = seg.end if seg.end < self._limit else self._limit
            if v > self.visible_end:
                self.visible_end = v
                if self.waiting and self.on_visible is not None:
                    self.on_visible(self)
        return offset

    def set_limit(self) -> None:
        """Recompute the limit (after held appends, gates or the cut changed)."""
        lim = NO_LIMIT
        if self._held:
            lim = self._held[0][0]
        if self._gates and self._gates[0][0] < lim:
            lim = self._gates[0][0]
        if self.cut is not None and self.cut < lim:
            lim = self.cut
        self._limit = lim

    def refresh_visible(self) -> bool:
        """Recompute ``visible_end`` (never backwards): everything flushed (under group
        commit; else everything written), extended over covered appends that start at or
        before it, up to the limit. True when it advanced. Hooks are the caller's
        (:func:`notify.store.gate.settle`)."""
        before = self.visible_end
        limit = self._limit
        v = self.flushed_end if self.group_commit else self.end
        if v < before:
            v = before
        cov = self._covered
        while cov and cov[0][0] <= v and cov[0][0] < limit:
            e = cov.popleft()[1]
            if e > v:
                v = e
        if v > limit:
            v = limit
        if v > before:
            self.visible_end = v
            return True
        return False

    def head_gate(self) -> Gate | None:
        """The gate of the first gated share not yet shown (None: none)."""
        return self._gates[0][1] if self._gates else None

    def head_gate_start(self) -> int:
        return self._gates[0][0] if self._gates else NO_LIMIT

    def gate_opened(self, gate: Gate) -> None:
        """``gate`` opened: its share here (the first gated one) may be shown."""
        if self._gates and self._gates[0][1] is gate:
            self._gates.popleft()
            self.set_limit()

    def confirm(self, start: int) -> None:
        """The held append at ``start`` is confirmed: readers may see it once everything
        before it is visible (and, under group commit, flushed)."""
        for h in self._held:
            if h[0] == start:
                h[2] = 1
                break
        else:
            return
        while self._held and self._held[0][2]:
            self._held.popleft()
        self.set_limit()
        settle((self,))

    def holds_last(self, start: int) -> bool:
        """Whether the newest append, at ``start``, is held and nothing follows it."""
        return bool(self._held) and self._held[-1][0] == start and self._held[-1][1] == self.end

    def held_from(self, start: int) -> bool:
        """Whether everything from ``start`` to the end is held appends (nothing a reader
        saw, nothing another log covers): :meth:`drop_from` may take it back."""
        at = start
        for h in self._held:
            if h[1] <= start:
                continue
            if h[0] != at:
                return False
            at = h[1]
        return at == self.end and at > start

    def drop_from(self, start: int) -> None:
        """Take back the held appends from ``start`` on (truncated, fsynced): no reader was
        served them. Raises StoreError unless :meth:`held_from` ``start``."""
        if not self.held_from(start):
            raise StoreError(f"{self.topic}-{self.index}: {start} is not a held tail")
        self.rollback_to(start)
        self._held = deque(h for h in self._held if h[0] < start)
        self.set_limit()

    def append_covered(
        self, data: bytes | bytearray | memoryview, gate: Gate | None = None
    ) -> int:
        """Append records whose durability another log already guarantees (a committed
        transaction's messages sit in the redo log, and recovery re-applies them at this same
        offset). Under group commit readers may see them as soon as everything before them
        is visible, without waiting for this partition's fsync. ``gate``: not before the
        gate opens either (nothing after them is shown meanwhile)."""
        if gate is not None:
            # the limit first: without group commit the append itself shows what is below
            # the limit, and the gate may not open in this step (a deferred share behind a
            # put held for a synchronous slave, in another of its partitions)
            start = self.end  # (a roll starts the next segment here)
            self._gates.append((start, gate))
            if start < self._limit:
                self._limit = start
            try:
                offset = self.append(data)
            except BaseException:
                self._gates.pop()
                self.set_limit()
                raise
        else:
            offset = self.append(data)
        if self.group_commit:
            self._covered.append((offset, offset + len(data)))
            if gate is None:
                settle((self,))
        return offset

    @property
    def settled(self) -> bool:
        """Whether an append now would be shown at once: the partition shows all it holds
        (nothing waits for an fsync, a confirmation, a gate or a cut)."""
        end = self.segments[-1].end
        return self.visible_end == end and self._limit >= end

    def begin_sync(self) -> None:
        """An fsync of this partition starts now (its target is the end now)."""
        self._stable = NO_LIMIT

    def mark_flushed(self, target: int) -> None:
        """An fsync covering everything before ``target`` finished: advance the marks and
        tell the visibility hook. Bytes rolled back while it ran (puts a synchronous slave
        refused, taken back) and whatever was appended in their place since are not
        covered by it: the target is cut at the lowest offset rolled back to."""
        if target > self._stable:
            target = self._stable
        if target > self.flushed_end:
            self.flushed_end = target
        settle((self,))

    def _roll(self) -> Segment:
        old = self.segments[-1]
        try:
            old.sync()
            self.flushed_end = max(self.flushed_end, old.end)
            new = Segment.open(self.directory, old.end, create=True, fs=self.fs)
            self.fs.fsync_dir(self.directory)
        except OSError as e:
            raise StoreError(f"cannot roll segment in {self.directory}: {e.strerror}") from e
        self._add(new)
        return new

    # ------------------------------------------------------------------ reading

    def _segment_for(self, offset: int) -> Segment:
        i = bisect.bisect_right(self._starts, offset) - 1
        return self.segments[i]

    def segment_start(self, offset: int) -> int:
        """The first offset of the segment holding ``offset`` (a record boundary)."""
        return self._segment_for(offset).start

    def check_offset(self, offset: int) -> None:
        """Raise OffsetOutOfRangeError (with the nearest valid offset) when ``offset`` is
        outside ``[min_offset, visible_end]``."""
        lo, hi = self.min_offset, self.visible_end
        if offset < lo:
            raise OffsetOutOfRangeError(f"offset {offset} is below the first offset {lo}", lo)
        if offset > hi:
            raise OffsetOutOfRangeError(f"offset {offset} is past the last offset {hi}", hi)

    def slice(self, offset: int, window: int, limit: int) -> Slice | None:
        """What a ``get`` at ``offset`` serves: up to ``window`` bytes, widened to hold the
        first record whole when it is larger than ``window`` but within ``limit`` and
        ``max_record`` (so a read is never larger than ``window`` or one record). None when
        ``offset`` is the visible end (no message yet)."""
        limit = min(limit, self.max_record)
        self.check_offset(offset)
        if offset == self.visible_end:
            return None
        seg = self._segment_for(offset)
        file_pos = offset - seg.start
        avail = min(self.visible_end, seg.end) - offset
        if avail <= 0:  # offset at the end of a rolled segment: the next one starts here
            return None
        length = min(avail, window)
        if length < avail:
            need = records.first_record_size(seg.read(file_pos, 4))
            if need is not None and need > length:
                length = min(avail, max(length, min(need, limit)))
        return Slice(seg, file_pos, length, offset)

    def rollback_to(self, offset: int) -> None:
        """Cut off what was appended at or after ``offset`` in the current synchronous step
        (a transaction whose apply failed on another partition): no reader can have been
        served it, since nothing ran in between."""
        if offset < self.min_offset or offset > self.end:
            raise StoreError(f"{self.topic}-{self.index}: cannot roll back to {offset}")
        removed = False
        while len(self.segments) > 1 and self.segments[-1].start >= offset:
            seg = self.segments.pop()
            self._starts.pop()
            seg.close()
            if not self.memory:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.unlink(seg.path)
                removed = True
        if removed:  # else a crash brings the segment back: its records, or a gap at open
            self.fs.fsync_dir(self.directory)
        seg = self.segments[-1]
        seg.truncate(offset - seg.start)
        self.visible_end = min(self.visible_end, offset)
        self.flushed_end = min(self.flushed_end, offset)
        if offset < self._stable:
            self._stable = offset
        while self._covered and self._covered[-1][0] >= offset:
            self._covered.pop()
        while self._gates and self._gates[-1][0] >= offset:
            self._gates.pop()
        self.set_limit()

    def read_raw(self, offset: int, length: int) -> bytes:
        """Bytes at ``offset`` regardless of visibility (replication compares with them)."""
        seg = self._segment_for(offset)
        return seg.read(offset - seg.start, min(length, seg.end - offset))

    def reset_start(self, offset: int) -> None:
        """Let an empty partition start at ``offset`` (a slave of a master whose first
        segments were deleted by retention)."""
        if self.size_bytes or len(self.segments) != 1:
            raise StoreError(f"{self.topic}-{self.index}: only an empty partition can move")
        old = self.segments.pop()
        self._starts.pop()
        old.close()
        with contextlib.suppress(FileNotFoundError):
            self.fs.unlink(old.path)
        self._add(Segment.open(self.directory, offset, create=True, fs=self.fs))
        self.fs.fsync_dir(self.directory)
        self.flushed_end = self.visible_end = offset

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Bytes of whole-or-partial records at ``offset`` (used by HTTP and tools)."""
        sl = self.slice(offset, max_bytes, max_bytes)
        if sl is None:
            return b""
        return sl.segment.read(sl.file_pos, sl.length)

    def nearest_offset(self, offset: int) -> int:
        """MetaQ's ``getNearestOffset``: start of the segment holding ``offset``; the first
        offset when below the data, the visible end when past it."""
        if offset < self.min_offset:
            return self.min_offset
        if offset >= self.visible_end:
            return self.visible_end
        return self._segment_for(offset).start

    # ------------------------------------------------------------------ retention

    def delete_segments_before(self, offset: int) -> list[Path]:
        """Close and unlink whole read-only segments that end at or before ``offset``."""
        removed: list[Path] = []
        while len(self.segments) > 1 and self.segments[0].end <= offset:
            seg = self.segments.pop(0)
            self._starts.pop(0)
            seg.close()
            if not self.memory:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.unlink(seg.path)
            removed.append(seg.path)
        return removed

    def sync(self) -> None:
        """Synchronous fdatasync of the active segment (shutdown, tests); updates marks."""
        end = self.end
        self.begin_sync()
        self.active.sync()
        self.mark_flushed(end)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if not self.failed:
                self.sync()
        except OSError as e:
            log.error("%s-%d: fsync at close failed: %s", self.topic, self.index, e)
        for seg in self.segments:
            seg.close()
