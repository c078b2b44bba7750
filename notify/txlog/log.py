"""The append-only, segmented redo transaction log.

Directory layout::

    <dir>/redo.0, redo.1, ...   segment files: frames back to back (see txlog.records);
                                decimal numbers without padding, consecutive, as in MetaQ
    <dir>/checkpoint            the last max_checkpoints checkpoints (see txlog.checkpoint)
    <dir>/checkpoint.tmp        only transiently while a checkpoint is written
    <dir>/fsync-failed          only after a failed fsync, until the next open repaired it

All file I/O goes through a :class:`~txlog.fs.FileSystem` (``fs=``, the real one by default;
a simulated disk in the crash simulation). Writes go through ``pwrite`` at the tracked end of
the newest segment, one syscall per :meth:`TxLog.append` or :meth:`TxLog.append_many`. With
``flush_at_commit=1``, :meth:`TxLog.commit` hands its frame to the group commit leader, which
writes every queued frame with one syscall and covers them with one fsync (see
:mod:`txlog.groupsync`).

When a write would take the segment past ``segment_bytes`` the segment is fsynced and closed
and the next one is created (the directory is fsynced too), so only the newest segment can
ever have a torn tail.

Recovery (in :meth:`TxLog.open`) starts at the newest intact checkpoint's position (or at the
start of the oldest segment when there is none), scans forward, truncates a torn or corrupt tail
of the newest segment (ftruncate + fsync) and reports it in :attr:`TxLog.recovery`. Damage in
an older segment raises :class:`~notify.errors.TxLogCorruptError`.

Retention: :meth:`TxLog.checkpoint` deletes the segments lying entirely before the oldest kept
checkpoint, so the log holds what recovery can still need and recovery time is proportional to
what follows the newest checkpoint. :meth:`TxLog.truncate_before` does the same on demand and
never deletes the current segment nor anything a kept checkpoint still points into.

A failed fsync is fatal to the open log (fail-stop, as PostgreSQL does since "fsyncgate"): on
Linux the kernel may already have dropped the dirty pages it could not write and marked them
clean, so a later fsync would "succeed" over a hole and records acknowledged after it would be
cut off at that hole by recovery. The log therefore refuses every later append, commit and
sync with :class:`~notify.errors.TxLogError`, and leaves an ``fsync-failed`` marker. The
next open sees the marker and, after the usual scan, *rewrites* the newest segment's bytes
(pread + pwrite of the same data, then fdatasync): within the same boot the page cache still
shows the records the disk never got, marked clean, so a plain fsync would not write them and
later records would sit behind a hole. (After a machine crash the page cache, and with it the
illusion, is gone; the scan truncates at the hole as for any torn tail.) A failed *write*
is different: nothing was written, the segment is cut back, and the log stays usable.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self

from notify.errors import TxLogCorruptError, TxLogError
from notify.txlog.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    new_checkpoint,
    read_checkpoints,
    remove_stale_temp,
    write_checkpoints,
)
from notify.txlog.config import FLUSH_ON_COMMIT, FLUSH_PERIODIC, TxLogConfig
from notify.txlog.fs import FSYNC_FAILED, OS_FS, FileSystem, ensure_dir, leave_marker
from notify.txlog.groupsync import FlushCoordinator, FlushFailed
from notify.txlog.position import Position
from notify.txlog.records import RecordType, decode, encode, frame_size
from notify.txlog.segment import SegmentReader, list_segments, segment_path

__all__ = ["LogRecord", "RecoveryReport", "TxLog", "cut_log"]

logger = logging.getLogger(__name__)


class LogRecord(NamedTuple):
    """A record read back by :meth:`TxLog.replay`."""

    position: Position
    type: RecordType | int
    body: bytes


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`TxLog.open` found and repaired.

    ``start``/``end``: the scanned range; ``truncated_bytes`` were cut from segment
    ``truncated_file`` at ``truncated_at`` because of ``reason`` (0 / ``None`` when the tail
    was clean); ``checkpoints_discarded`` counts damaged or unusable checkpoint entries.
    """

    directory: Path
    checkpoint: Checkpoint | None
    checkpoints_discarded: int
    start: Position
    end: Position
    files_scanned: int
    records_scanned: int
    bytes_scanned: int
    truncated_bytes: int
    truncated_file: int | None
    truncated_at: Position | None
    reason: str | None
    duration_s: float


class _SegmentFiles:
    """The log's segment files: the write and fsync seam, and the recovery scan run at
    open. :class:`TxLog` sets the state and builds everything else on it."""

    _fs: FileSystem
    _dir: Path
    _config: TxLogConfig
    _wlock: threading.Lock
    _closed: bool
    _fd: int
    _file_no: int
    _size: int
    _first_file_no: int
    _checkpoints: list[Checkpoint]

    # ------------------------------------------------------------------ the fsync seam

    def _fsync(self, fd: int) -> None:
        """The single place data is made durable (fdatasync). Tests replace it."""
        self._fs.fdatasync(fd)

    def _pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        """The single place log data is written. Tests replace it."""
        return self._fs.pwrite(fd, data, offset)

    def _fsync_dir(self) -> None:
        self._fs.fsync_dir(self._dir)

    def _rewrite_newest(self, size: int) -> None:
        """Make the newest segment's first ``size`` bytes durable even where the page cache
        holds them as clean pages the disk never got (after a failed fsync)."""
        chunk = 1 << 20
        try:
            for off in range(0, size, chunk):
                data = self._fs.pread(self._fd, min(chunk, size - off), off)
                view = memoryview(data)
                done = 0
                while done < len(view):
                    n = self._pwrite(self._fd, view[done:], off + done)
                    if n <= 0:
                        raise OSError(errno.EIO, "write returned 0")
                    done += n
            self._fsync(self._fd)
        except OSError as exc:
            self._fs.close(self._fd)
            raise TxLogError(
                f"{self._dir}: rewriting redo.{self._file_no} after a failed fsync failed: {exc}"
            ) from exc
        logger.warning(
            "%s: rewrote %d bytes of redo.%d after an earlier failed fsync",
            self._dir, size, self._file_no,
        )  # fmt: skip

    def _end(self) -> Position:
        with self._wlock:
            return Position(self._file_no, self._size)

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> RecoveryReport:
        t0 = time.monotonic()
        cfg = self._config
        fs = self._fs
        try:
            ensure_dir(fs, self._dir)
            remove_stale_temp(self._dir, fs)
            files = list_segments(self._dir, fs)
        except OSError as exc:
            raise TxLogError(f"cannot open transaction log {self._dir}: {exc}") from exc
        checkpoints, discarded = read_checkpoints(self._dir, cfg.max_record_bytes, fs)
        if not files:
            if checkpoints:
                raise TxLogCorruptError(f"{self._dir}: a checkpoint file but no redo.<N> files")
            try:
                fd = fs.open(
                    segment_path(self._dir, 0), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
                self._fsync_dir()
            except OSError as exc:
                raise TxLogError(f"cannot create {segment_path(self._dir, 0)}: {exc}") from exc
            self._fd, self._file_no, self._size, self._first_file_no = fd, 0, 0, 0
            start = Position(0, 0)
            return RecoveryReport(
                self._dir, None, discarded, start, start, 0, 0, 0, 0, None, None, None,
                time.monotonic() - t0,
            )  # fmt: skip

        try:
            sizes = {n: fs.size(segment_path(self._dir, n)) for n in files}
        except OSError as exc:
            raise TxLogError(f"cannot open transaction log {self._dir}: {exc}") from exc
        usable: list[Checkpoint] = []
        for cp in checkpoints:
            n, off = cp.position
            if n in sizes and off <= sizes[n]:
                usable.append(cp)
            else:
                discarded += 1
                logger.warning("%s: ignoring checkpoint at %s: no such place", self._dir, cp)
        if discarded:
            logger.warning("%s: %d checkpoint entries unusable", self._dir, discarded)
        self._checkpoints = usable
        chosen = usable[-1] if usable else None
        start = chosen.position if chosen is not None else Position(files[0], 0)
        last = files[-1]
        present = set(files)
        missing = [n for n in range(start.file_no, last + 1) if n not in present]
        if missing:
            raise TxLogCorruptError(f"{self._dir}: segments {missing} are missing")

        records = scanned = truncated = 0
        truncated_at: Position | None = None
        reason: str | None = None
        fd = -1
        for n in range(start.file_no, last + 1):
            path = segment_path(self._dir, n)
            first = start.offset if n == start.file_no else 0
            try:
                fd = fs.open(path, (os.O_RDWR if n == last else os.O_RDONLY) | os.O_CLOEXEC)
            except OSError as exc:
                raise TxLogError(f"cannot open {path}: {exc}") from exc
            try:
                size = fs.fsize(fd)
                reader = SegmentReader(fd, first, size, cfg.max_record_bytes, fs)
                for _ in reader:
                    records += 1
                scanned += reader.stop - first
                if reader.error is not None:
                    if n != last:
                        raise TxLogCorruptError(
                            f"{path}: {reader.error} at offset {reader.stop} of {size};"
                            " only the newest segment may have a torn tail"
                        )
                    truncated = size - reader.stop
                    truncated_at = Position(n, reader.stop)
                    reason = str(reader.error)
                    fs.ftruncate(fd, reader.stop)
                    size = reader.stop
                if n == last:
                    self._fsync(fd)  # what survived the crash is now durable
            except OSError as exc:
                fs.close(fd)
                raise TxLogError(f"recovery of {path} failed: {exc}") from exc
            except BaseException:
                fs.close(fd)
                raise
            if n != last:
                fs.close(fd)
        self._fd, self._file_no, self._size, self._first_file_no = fd, last, size, files[0]
        report = RecoveryReport(
            directory=self._dir,
            checkpoint=chosen,
            checkpoints_discarded=discarded,
            start=start,
            end=Position(last, size),
            files_scanned=last - start.file_no + 1,
            records_scanned=records,
            bytes_scanned=scanned,
            truncated_bytes=truncated,
            truncated_file=truncated_at.file_no if truncated_at is not None else None,
            truncated_at=truncated_at,
            reason=reason,
            duration_s=time.monotonic() - t0,
        )
        marker = self._dir / FSYNC_FAILED
        if fs.exists(marker):
            self._rewrite_newest(size)
            try:
                fs.unlink(marker)
                self._fsync_dir()
            except OSError as exc:
                raise TxLogError(f"cannot remove {marker}: {exc}") from exc
        if truncated:
            logger.warning(
                "%s: truncated %d bytes of redo.%d at offset %d (%s)",
                self._dir, truncated, last, size, reason,
            )  # fmt: skip
        logger.info(
            "%s: recovered %d records in %d files from %s to %s in %.3fs",
            self._dir, records, report.files_scanned, start, report.end, report.duration_s,
        )  # fmt: skip
        return report


class TxLog(_SegmentFiles):
    """An append-only redo log of opaque records; thread-safe, usable from asyncio.

    Create it with :meth:`open`. Every append returns the record's :class:`Position`;
    :meth:`sync` / :meth:`sync_async` make records durable with group commit, and
    :meth:`commit` / :meth:`commit_async` append and apply ``config.flush_at_commit``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: TxLogConfig | None = None,
        *,
        fs: FileSystem = OS_FS,
    ) -> None:
        """Open (creating if needed) and recover the log in ``path``; prefer :meth:`open`."""
        self._fs = fs
        self._dir = Path(path)
        self._config = config if config is not None else TxLogConfig()
        self._max_record = self._config.max_record_bytes
        self._wlock = threading.Lock()  # the segment fd, its number and size
        self._ckpt_lock = threading.Lock()  # the checkpoint list and file; taken before _wlock
        self._close_lock = threading.Lock()
        #: called with ``(position, frames)`` after every write of records, and with
        #: ``(end of the closed segment, b"")`` after a roll, ``_wlock`` held (replication
        #: ships them; it must not write to this log)
        self.on_write: Callable[[Position, bytes], None] | None = None
        self._closed = False
        self._final_synced = False
        self._broken: BaseException | None = None
        self._fd = -1
        self._file_no = 0
        self._size = 0
        self._first_file_no = 0
        self._checkpoints: list[Checkpoint] = []
        self.recovery: RecoveryReport = self._recover()
        self._coord = FlushCoordinator(
            self._flush_batch, self._end, Position(self._file_no, self._size)
        )
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if self._config.flush_at_commit == FLUSH_PERIODIC:
            self._flusher = threading.Thread(
                target=self._run_flusher, name=f"txlog-flusher:{self._dir.name}", daemon=True
            )
            self._flusher.start()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: TxLogConfig | None = None,
        *,
        fs: FileSystem = OS_FS,
    ) -> Self:
        """Open the log in directory ``path`` (created if missing) and recover it.

        ``fs`` is the file system to use (the real one by default).
        Raises :class:`~notify.errors.TxLogCorruptError` if a segment other than the newest is
        damaged or segments are missing, :class:`~notify.errors.TxLogError` on I/O errors.
        """
        return cls(path, config, fs=fs)

    # ------------------------------------------------------------------ properties

    @property
    def path(self) -> Path:
        """Directory of the log."""
        return self._dir

    @property
    def config(self) -> TxLogConfig:
        """The configuration the log was opened with."""
        return self._config

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def end_position(self) -> Position:
        """Position just after the last appended record (where the next one would go)."""
        return self._end()

    @property
    def durable_position(self) -> Position:
        """Every record whose position is before this one is on stable storage."""
        return self._coord.durable

    @property
    def first_position(self) -> Position:
        """Start of the oldest retained segment."""
        return Position(self._first_file_no, 0)

    # ------------------------------------------------------------------ appending

    def append(self, rtype: int, body: bytes) -> Position:
        """Append one record (one write syscall, no fsync) and return its position.

        Raises :class:`~notify.errors.TxLogError` for a type outside 1..255, a body above
        ``max_record_bytes``, a closed log, or a failed write (nothing is left behind then).
        """
        return self._write(encode(rtype, body, max_record_bytes=self._max_record))

    def append_many(self, records: Iterable[tuple[int, bytes]]) -> list[Position]:
        """Append several records with one write syscall; returns their positions.

        All of them land in the same segment (a new one if they do not fit in the current).
        """
        limit = self._config.max_record_bytes
        frames = [encode(t, b, max_record_bytes=limit) for t, b in records]
        if not frames:
            return []
        file_no, offset = self._write(b"".join(frames))
        out = []
        for frame in frames:
            out.append(Position(file_no, offset))
            offset += len(frame)
        return out

    def _write(self, data: bytes) -> Position:
        with self._wlock:
            return self._write_locked(data)

    def _write_locked(self, data: bytes) -> Position:
        """Write ``data`` at the end (rolling first if needed) with ``_wlock`` held.

        On failure the segment is cut back to its previous size and TxLogError raised.
        """
        if self._closed:
            raise TxLogError("the transaction log is closed")
        self._refuse_if_failed()
        if self._size > 0 and self._size + len(data) > self._config.segment_bytes:
            self._roll()
        offset = self._size
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                n = self._pwrite(self._fd, view[done:], offset + done)
                if n <= 0:
                    raise OSError(errno.EIO, "write returned 0")
                done += n
        except OSError as exc:
            try:
                self._fs.ftruncate(self._fd, offset)
                self._fsync(self._fd)  # else a crash can bring the failed frames back
            except OSError as exc2:
                self._fail(f"a partial write could not be removed ({exc2})")
            raise TxLogError(
                f"write to redo.{self._file_no} failed: {exc}; nothing was appended"
            ) from exc
        self._size = offset + len(data)
        pos = Position(self._file_no, offset)
        if self.on_write is not None:
            self.on_write(pos, bytes(data))
        return pos

    def _roll(self) -> None:
        """Close the full segment (fsynced first) and start the next one. ``_wlock`` held."""
        old_no = self._file_no
        try:
            self._fsync(self._fd)
        except OSError as exc:
            self._fail(f"the fsync of redo.{old_no} failed ({exc})")
            raise TxLogError(f"fsync of redo.{old_no} before rolling failed: {exc}") from exc
        path = segment_path(self._dir, old_no + 1)
        try:
            fd = self._fs.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise TxLogError(f"cannot create {path}: {exc}") from exc
        try:
            self._fsync_dir()
        except OSError as exc:
            self._fs.close(fd)
            with contextlib.suppress(OSError):
                self._fs.unlink(path)
            raise TxLogError(f"fsync of {self._dir} failed: {exc}") from exc
        old_fd, self._fd = self._fd, fd
        old_size = self._size
        self._file_no, self._size = old_no + 1, 0
        self._fs.close(old_fd)
        self._coord.advance(Position(old_no + 1, 0))
        if self.on_write is not None:  # no frames: "segment old_no ends at old_size"
            self.on_write(Position(old_no, old_size), b"")

    # ------------------------------------------------------------------ replication

    def append_frames(self, at: Position, data: bytes) -> Position:
        """Append frames another log wrote at ``at`` (a replica keeps the same positions).

        ``at`` must be this log's end, or the start of a later segment (the source rolled):
        the current one is closed and empty segments fill the numbers in between. ``data``
        must be whole intact frames. Not forced: call :meth:`sync`. Returns the new end.
        Raises :class:`~notify.errors.TxLogError` otherwise (nothing is written)."""
        result = decode(data, max_record_bytes=self._max_record)
        if result.error is not None or result.consumed != len(data):
            raise TxLogError(f"frames for {at} are not whole intact records ({result.error})")
        with self._wlock:
            end = Position(self._file_no, self._size)
            if at != end and not (at.offset == 0 and at.file_no > end.file_no):
                raise TxLogError(f"frames at {at} do not continue this log (end {end})")
            while self._file_no < at.file_no:
                self._roll()
            if data:
                self._write_raw_locked(data)
            return Position(self._file_no, self._size)

    def _write_raw_locked(self, data: bytes) -> None:
        """Write at the end without rolling: the source decided the segment boundaries (a
        replica's segment may pass segment_bytes by the source's last frame)."""
        offset = self._size
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                n = self._pwrite(self._fd, view[done:], offset + done)
                if n <= 0:
                    raise OSError(errno.EIO, "write returned 0")
                done += n
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._fs.ftruncate(self._fd, offset)
                self._fsync(self._fd)
            raise TxLogError(f"write to redo.{self._file_no} failed: {exc}") from exc
        self._size = offset + len(data)

    def read_frames(self, at: Position, max_bytes: int) -> tuple[bytes, Position | None]:
        """Whole frames from ``at`` (at most ``max_bytes``, but at least one frame), for a
        replica that pulls. The second value is where to go next when ``at`` is the end of
        an older segment or lies in a segment already deleted: the next segment's start.
        Raises :class:`~notify.errors.TxLogError` past the end or off a frame boundary."""
        end = self._end()
        if at > end:
            raise TxLogError(f"position {at} is past the end of the log ({end})")
        if at.file_no < self._first_file_no:
            return b"", Position(at.file_no + 1, 0)
        if at == end:
            return b"", None
        fs = self._fs
        path = segment_path(self._dir, at.file_no)
        try:
            fd = fs.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return b"", Position(at.file_no + 1, 0)  # deleted meanwhile by a checkpoint
        try:
            limit = end.offset if at.file_no == end.file_no else fs.fsize(fd)
            if at.offset >= limit:
                if at.offset == limit and at.file_no < end.file_no:
                    return b"", Position(at.file_no + 1, 0)
                raise TxLogError(f"position {at} is past the end of {path}")
            want = min(max_bytes, limit - at.offset)
            data = fs.pread(fd, want, at.offset)
            result = decode(data, max_record_bytes=self._max_record)
            if result.consumed == 0:
                need = frame_size(data)
                if need is None or need > limit - at.offset:
                    raise TxLogError(f"position {at} is not the start of a record")
                data = fs.pread(fd, need, at.offset)
                result = decode(data, max_record_bytes=self._max_record)
                if result.consumed == 0:
                    raise TxLogError(f"position {at} is not the start of a record")
            return data[: result.consumed], None
        except OSError as exc:
            raise TxLogError(f"cannot read {path}: {exc}") from exc
        finally:
            fs.close(fd)

    # ------------------------------------------------------------------ durability

    def _flush_batch(self, frames: list[bytes]) -> tuple[Position, Position]:
        """Group commit leader: write ``frames`` with one syscall, then fsync everything.

        Returns where the frames start and the end the fsync covered (see ``FlushFn``).
        """
        with self._wlock:
            self._refuse_if_failed()  # an fsync now could "succeed" over a hole
            if frames:
                start = self._write_locked(frames[0] if len(frames) == 1 else b"".join(frames))
            end = Position(self._file_no, self._size)
            if not frames:
                start = end
            if self._closed:
                if self._final_synced:
                    return start, end
                raise TxLogError("the transaction log is closed")
            fd = self._fs.dup(self._fd)  # a roll may close self._fd while we fsync
        try:
            self._fsync(fd)
        except OSError as exc:
            self._fail(f"the fsync up to {end} failed ({exc})")
            raise FlushFailed(start, end, exc) from exc
        finally:
            self._fs.close(fd)
        return start, end

    def _refuse_if_failed(self) -> None:
        if self._broken is not None:
            raise TxLogError(
                f"the transaction log is unusable since {self._broken}; reopen it "
                "(restart the broker) to recover from what is on disk"
            )

    def _fail(self, what: str) -> None:
        """Stop accepting records: ``what`` may have left a hole in the unsynced tail."""
        if self._broken is None:
            self._broken = TxLogError(what)
            try:
                leave_marker(self._fs, self._dir / FSYNC_FAILED)
            except OSError as exc:
                logger.error("%s: cannot leave the fsync-failed marker: %s", self._dir, exc)
            logger.critical(
                "%s: %s; the redo log refuses writes until it is reopened (restart the broker)",
                self._dir,
                what,
            )

    @property
    def failed(self) -> str | None:
        """Why the log refuses writes (a failed fsync), or None while it is healthy."""
        return None if self._broken is None else str(self._broken)

    def sync(self, pos: Position | None = None) -> None:
        """Block until the record at ``pos`` and all before it are durable.

        ``pos`` defaults to everything appended so far; it may also be an end boundary such as
        :attr:`end_position`. Concurrent callers share fsyncs (group commit). Raises
        :class:`~notify.errors.TxLogError` if the fsync meant to cover ``pos`` failed (the
        record's durability is then unknown).
        """
        self._coord.wait(pos)

    async def sync_async(self, pos: Position | None = None) -> None:
        """:meth:`sync` for asyncio callers: the fsync runs in a small executor.

        Concurrent awaiters share one in-flight fsync, with at most one more queued behind it;
        thread callers of :meth:`sync` share fsyncs with them as well.
        """
        await self._coord.wait_async(pos)

    def commit(self, rtype: int, body: bytes) -> Position:
        """Append a record and apply ``flush_at_commit``; returns its position.

        With 1, returns once the record is durable: concurrent committers are written with one
        syscall and share one fsync. With 2 (background fsync every ``flush_interval_s``) or 0,
        returns right after the write. Raises :class:`~notify.errors.TxLogError` when the
        write failed (nothing was appended) or the fsync failed (outcome unknown).
        """
        if self._config.flush_at_commit == FLUSH_ON_COMMIT:
            # written by the group commit leader together with concurrent commits
            return self._coord.commit(encode(rtype, body, max_record_bytes=self._max_record))
        return self.append(rtype, body)

    async def commit_async(self, rtype: int, body: bytes) -> Position:
        """:meth:`commit` for asyncio callers (the write itself is a page-cache write)."""
        pos = self.append(rtype, body)
        if self._config.flush_at_commit == FLUSH_ON_COMMIT:
            await self._coord.wait_async(pos)
        return pos

    def _run_flusher(self) -> None:
        interval = self._config.flush_interval_s
        while not self._stop.wait(interval):
            if self._coord.durable >= self._end():
                continue
            try:
                self._coord.wait(None)
            except TxLogError as exc:
                logger.error("%s: periodic fsync failed: %s", self._dir, exc)

    # ------------------------------------------------------------------ reading

    def replay(self, start: Position | None = None) -> Iterator[LogRecord]:
        """Iterate ``(position, type, body)`` of every record from ``start`` to the current end.

        ``start`` defaults to the newest checkpoint's position, or the start of the oldest
        segment. Records appended after the call are not included. Raises
        :class:`~notify.errors.TxLogCorruptError` on damage (or a segment deleted meanwhile).
        """
        end = self._end()
        first = self.first_position
        if start is None:
            latest = self.latest_checkpoint()
            start = latest.position if latest is not None else first
        if start < first or start > end:
            raise TxLogError(f"replay start {start} outside the log [{first}, {end}]")
        return self._replay(Position(*start), end)

    def _replay(self, start: Position, end: Position) -> Iterator[LogRecord]:
        fs = self._fs
        for n in range(start.file_no, end.file_no + 1):
            path = segment_path(self._dir, n)
            try:
                fd = fs.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise TxLogCorruptError(f"cannot open {path}: {exc}") from exc
            try:
                limit = end.offset if n == end.file_no else fs.fsize(fd)
                first = start.offset if n == start.file_no else 0
                if first > limit:
                    raise TxLogError(f"position {start} is past the end of {path}")
                reader = SegmentReader(fd, first, limit, self._config.max_record_bytes, fs)
                for rec in reader:
                    yield LogRecord(Position(n, rec.offset), rec.type, rec.body)
                if reader.error is not None:
                    raise TxLogCorruptError(f"{path}: {reader.error} at offset {reader.stop}")
            finally:
                fs.close(fd)

    def _check_boundary(self, pos: Position) -> None:
        """Raise unless ``pos`` is the start of a record or the end of a segment."""
        end = self._end()
        if not self.first_position <= pos <= end:
            raise TxLogError(f"position {pos} outside the log [{self.first_position}, {end}]")
        if pos.offset == 0 or pos == end:
            return
        path = segment_path(self._dir, pos.file_no)
        fs = self._fs
        try:
            fd = fs.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                size = fs.fsize(fd)
                if pos.offset == size:
                    return
                head = fs.pread(fd, 8, pos.offset)
                need = frame_size(head)
                data = fs.pread(fd, need, pos.offset) if need is not None else b""
            finally:
                fs.close(fd)
        except OSError as exc:
            raise TxLogError(f"cannot read {path}: {exc}") from exc
        limit = self._config.max_record_bytes
        if need is None or len(data) != need or decode(data, max_record_bytes=limit).error:
            raise TxLogError(f"position {pos} is not the start of a record")

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, oldest_live: Position, state: bytes = b"") -> Checkpoint:
        """Record that replay may start at ``oldest_live``, with an opaque ``state`` snapshot.

        ``oldest_live`` is the position of the oldest record of any still-live transaction, or
        :attr:`end_position` if there is none; it must be a record start or segment end. The log
        is fsynced first, the checkpoint file replaced atomically keeping the newest
        ``max_checkpoints`` entries, then segments lying entirely before the oldest kept
        checkpoint are deleted.
        """
        oldest_live = Position(*oldest_live)
        if len(state) > self._config.max_record_bytes:
            raise TxLogError(f"checkpoint state of {len(state)} bytes exceeds max_record_bytes")
        self._check_boundary(oldest_live)
        self.sync()
        with self._ckpt_lock:
            if self._closed:
                raise TxLogError("the transaction log is closed")
            cp = new_checkpoint(oldest_live, state)
            kept = [*self._checkpoints, cp][-self._config.max_checkpoints :]
            try:
                write_checkpoints(
                    self._dir,
                    kept,
                    self._config.max_record_bytes,
                    self._fsync,
                    self._fs.fsync_dir,
                    self._fs,
                )
            except OSError as exc:
                raise TxLogError(f"cannot write the checkpoint file: {exc}") from exc
            self._checkpoints = kept
            self._delete_before(min(c.position for c in kept))
        return cp

    def latest_checkpoint(self) -> Checkpoint | None:
        """The newest intact checkpoint, or ``None``."""
        with self._ckpt_lock:
            return self._checkpoints[-1] if self._checkpoints else None

    def checkpoints(self) -> list[Checkpoint]:
        """The kept checkpoints, oldest first."""
        with self._ckpt_lock:
            return list(self._checkpoints)

    def truncate_before(self, pos: Position) -> list[int]:
        """Delete segments whose whole content lies before ``pos``; returns their numbers.

        Never deletes the current segment, nor any segment at or after the oldest kept
        checkpoint's position (the bound is lowered to it), so every kept checkpoint stays
        replayable. :meth:`checkpoint` calls this automatically.
        """
        with self._ckpt_lock:
            bound = Position(*pos)
            if self._checkpoints:
                bound = min(bound, *(c.position for c in self._checkpoints))
            return self._delete_before(bound)

    def _delete_before(self, bound: Position) -> list[int]:
        """Delete segments numbered below ``bound.file_no`` except the current one."""
        with self._wlock:
            first, current = self._first_file_no, self._file_no
        deleted = []
        for n in range(first, min(bound.file_no, current)):
            with contextlib.suppress(FileNotFoundError):
                self._fs.unlink(segment_path(self._dir, n))
            deleted.append(n)
            with self._wlock:
                self._first_file_no = n + 1
        if deleted:
            try:
                self._fsync_dir()
            except OSError as exc:
                logger.warning("%s: fsync after deleting segments failed: %s", self._dir, exc)
            logger.info("%s: deleted segments %d..%d", self._dir, deleted[0], deleted[-1])
        return deleted

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop the background flusher, fsync and close; idempotent.

        Raises :class:`~notify.errors.TxLogError` if the final fsync fails (the log is closed
        anyway).
        """
        with self._close_lock:
            if self._closed:
                return
            self._stop.set()
            if self._flusher is not None:
                self._flusher.join()
            self._coord.shutdown()
            error: OSError | None = None
            with self._wlock:
                self._closed = True
                try:
                    self._fsync(self._fd)
                    self._final_synced = True
                except OSError as exc:
                    error = exc
                self._fs.close(self._fd)
                if self._final_synced:
                    self._coord.advance(Position(self._file_no, self._size))
            if error is not None:
                raise TxLogError(f"final fsync of {self._dir} failed: {error}") from error

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"end={self._end()}"
        return f"<TxLog {str(self._dir)!r} {state}>"


def cut_log(directory: str | os.PathLike[str], at: Position, need_from: int = 0) -> int | None:
    """Cut the (closed) log in ``directory`` at ``at``: later segments are removed, segment
    ``at.file_no`` is truncated to ``at.offset``, and the checkpoint file is removed (a
    checkpoint taken while the log went further may have let go of records that are needed
    again now; recovery then scans from the oldest segment). Returns the bytes removed, or
    None (nothing done) when the log does not hold every segment from ``need_from`` on.
    A log that ends before ``at`` is left as it is (its checkpoints too)."""
    d = Path(directory)
    files = list_segments(d)
    if not files or files[0] > need_from:
        return None
    sizes = {n: (segment_path(d, n)).stat().st_size for n in files}
    end = Position(files[-1], sizes[files[-1]])
    if end <= at:
        return 0
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        (d / CHECKPOINT_FILE).unlink()
    for n in files:
        path = segment_path(d, n)
        if n > at.file_no:
            removed += sizes[n]
            path.unlink()
        elif n == at.file_no and sizes[n] > at.offset:
            removed += sizes[n] - at.offset
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, at.offset)
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return removed
