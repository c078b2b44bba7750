"""The coordinator's durable decision log: a txlog directory plus an exclusive lock.

Files in the log directory::

    LOCK                 flock()ed by the one process using the log; holds its pid
    redo.<N>, checkpoint the txlog (records: :mod:`notify.xa.records`)

Writes:

* :meth:`DecisionLog.decide` appends a DECISION record and returns once it is fsynced
  (group commit: concurrent deciders share one fsync). This is the commit point.
* :meth:`DecisionLog.end` applies END to the table at once and queues its record, which goes
  out with the next write (in the same write syscall as the next decision), at a checkpoint,
  on close, or once :data:`END_BATCH` are queued; never fsynced. A lost END only makes
  recovery look at a finished transaction once more (and a reader of the files, ``notify xa``,
  see it as decided a little longer).
* :meth:`DecisionLog.heuristic` / :meth:`DecisionLog.ack` are fsynced.

Every append happens under one short lock together with the update of the in-memory
:class:`~notify.xa.records.DecisionTable`, so a checkpoint (snapshot of the table + the log's
end position, taken under the same lock) never misses a record: replay starts at the
checkpoint and applies what follows. The fsync itself runs outside the lock.

Opening replays the newest checkpoint's snapshot and the records after it. A new log is
given an identity (coordinator id and formatId) stored in every checkpoint; opening an
existing log with a different id is an error.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from notify.errors import ConfigError, TxLogCorruptError, TxLogError
from notify.txlog import Position, TxLog, TxLogConfig
from notify.txlog.checkpoint import read_checkpoints
from notify.txlog.segment import SegmentReader, list_segments, segment_path
from notify.xa import records as rec
from notify.xa.errors import DecisionLogError, LogLockedError, OutcomeUnknownError
from notify.xa.ids import (
    DEFAULT_FORMAT_ID,
    Scope,
    new_coordinator_id,
    validate_coordinator_id,
    validate_format_id,
)

log = logging.getLogger("notify.xa.log")

LOCK_FILE: Final = "LOCK"
DEFAULT_CHECKPOINT_BYTES: Final = 4 * 2**20
#: queued END records written together without waiting for another write
END_BATCH: Final = 64


def _now_ms() -> int:
    return int(time.time() * 1000)


class DecisionLog:
    """The decision log of one coordinator; thread-safe. Create with :meth:`open`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        coordinator_id: str | None = None,
        format_id: int | None = None,
        config: TxLogConfig | None = None,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
    ):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._ckpt_lock = threading.Lock()
        #: END records applied to the table, not yet written (see :meth:`end`)
        self._ends: list[tuple[int, bytes]] = []
        self._closed = False
        self.checkpoint_bytes = checkpoint_bytes
        if coordinator_id is not None:
            validate_coordinator_id(coordinator_id)
        if format_id is not None:
            validate_format_id(format_id)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DecisionLogError(f"cannot create the decision log {self.path}: {e}") from e
        self._lock_fd = _take_lock(self.path)
        try:
            self._log_config = config or TxLogConfig(flush_at_commit=1)
            self._log = TxLog.open(self.path, self._log_config)
        except TxLogError as e:
            _release_lock(self._lock_fd)
            raise DecisionLogError(f"cannot open the decision log {self.path}: {e}") from e
        try:
            self.table, fresh = self._load(coordinator_id, format_id)
            if fresh:
                self.checkpoint(force=True)
        except BaseException:
            self._log.close()
            _release_lock(self._lock_fd)
            raise
        self.scope = Scope(self.table.coordinator_id, self.table.format_id)
        self._ckpt_end = self._log.end_position
        self._closed = False
        #: decisions whose fsync failed: in the table, maybe not on disk
        self._unsynced: set[bytes] = set()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        coordinator_id: str | None = None,
        format_id: int | None = None,
        config: TxLogConfig | None = None,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
    ) -> Self:
        """Lock, open and replay the log in ``path`` (created when missing).

        ``coordinator_id``/``format_id`` must match an existing log's identity; ``None``
        takes the log's (or, for a new log, a random id and :data:`DEFAULT_FORMAT_ID`).
        Raises :class:`LogLockedError` when another process holds the directory,
        :class:`DecisionLogError` when it cannot be read, ConfigError on an identity clash.
        """
        return cls(path, coordinator_id, format_id, config, checkpoint_bytes)

    def _load(
        self, coordinator_id: str | None, format_id: int | None
    ) -> tuple[rec.DecisionTable, bool]:
        latest = self._log.latest_checkpoint()
        if latest is not None and latest.state:
            table = rec.DecisionTable.from_snapshot(latest.state)
            if coordinator_id is not None and coordinator_id != table.coordinator_id:
                raise ConfigError(
                    f"decision log {self.path} belongs to coordinator {table.coordinator_id!r},"
                    f" not {coordinator_id!r}"
                )
            if format_id is not None and format_id != table.format_id:
                raise ConfigError(
                    f"decision log {self.path} uses formatId {table.format_id}, not {format_id}"
                )
            fresh = False
        else:
            has_records = self._log.end_position != self._log.first_position
            if has_records and coordinator_id is None:
                raise DecisionLogError(
                    f"decision log {self.path} has records but no intact checkpoint naming its"
                    " coordinator: pass coordinator_id explicitly"
                )
            table = rec.DecisionTable(
                coordinator_id or new_coordinator_id(), format_id or DEFAULT_FORMAT_ID
            )
            fresh = True
        try:
            for _pos, rtype, body in self._log.replay():
                table.apply(rec.decode(int(rtype), body))
        except TxLogError as e:
            raise DecisionLogError(f"cannot replay the decision log {self.path}: {e}") from e
        return table, fresh

    # ------------------------------------------------------------------ writes

    def _append(self, record: rec.Record) -> Position:
        rtype, body = rec.encode(record)
        with self._lock:
            if self._closed:
                raise DecisionLogError("the decision log is closed")
            if self._ends:  # queued ENDs go out in the same write, before the record
                pos = self._log.append_many([*self._ends, (rtype, body)])[-1]
                self._ends = []  # (kept queued when the write failed: nothing was written)
            else:
                pos = self._log.append(rtype, body)
            self.table.apply(record)
        return pos

    def _write_ends_locked(self) -> None:
        """Write the queued END records (``_lock`` held); a failure is only logged."""
        ends, self._ends = self._ends, []
        if not ends or self._closed:
            return
        try:
            self._log.append_many(ends)
        except TxLogError as e:
            log.warning("%d END records not written (%s): recovery will look again", len(ends), e)

    def _sync(self, pos: Position) -> None:
        self._log.sync(pos)

    def decide(self, decision: rec.Decision) -> None:
        """Write ``decision`` and return once it is durable (the commit point).

        Raises :class:`DecisionLogError` when nothing was written (the caller may still roll
        back) and :class:`OutcomeUnknownError` when the write happened but its fsync failed
        (the decision may or may not survive a crash: leave the branches to recovery).
        """
        try:
            pos = self._append(decision)
        except TxLogError as e:
            raise DecisionLogError(f"decision not written: {e}") from e
        try:
            self._sync(pos)
        except TxLogError as e:
            with self._lock:
                self._unsynced.add(decision.gtrid)
            raise OutcomeUnknownError(f"decision written but not known to be durable: {e}") from e
        if self._unsynced:
            with self._lock:
                self._unsynced.discard(decision.gtrid)

    def durable(self, gtrid: bytes) -> bool:
        """Whether the live decision of ``gtrid`` is known to be on disk; if its fsync
        failed, write it again (a failed fsync may have dropped the first copy from the page
        cache, so a later successful fsync proves nothing about it). Recovery acts only on
        durable decisions: acting on one a crash could still erase would mix outcomes."""
        with self._lock:
            if gtrid not in self._unsynced:
                return True
            d = self.table.decisions.get(gtrid)
        if d is None:
            return True
        try:
            self._reopen_if_failed()
            self._sync(self._append(d))
        except (TxLogError, DecisionLogError) as e:
            log.error("decision of %s still not durable: %s", gtrid.decode(errors="replace"), e)
            return False
        with self._lock:
            self._unsynced.discard(gtrid)
        return True

    def _reopen_if_failed(self) -> None:
        """After a failed fsync the txlog refuses writes until reopened (the kernel may have
        dropped the pages): reopen it, which rewrites its newest segment durably, so the
        decision can be written again. Raises TxLogError when the disk still fails."""
        with self._lock:
            if self._log.failed is None or self._closed:
                return
            old = self._log
            with contextlib.suppress(TxLogError):
                old.close()
            self._log = TxLog.open(self.path, self._log_config)
            log.warning("decision log %s reopened after a failed fsync", self.path)

    def end(self, gtrid: bytes) -> None:
        """Forget the decision of ``gtrid`` (phase 2 done): gone from the table now, its
        record written with the next write (see the module docstring), never fsynced."""
        record = rec.EndRecord(gtrid, _now_ms())
        frame = rec.encode(record)
        with self._lock:
            if self._closed:
                log.warning("END of %s not written (the log is closed)", gtrid)
                return
            self.table.apply(record)
            self._ends.append(frame)
            if len(self._ends) >= END_BATCH:
                self._write_ends_locked()

    def flush_ends(self) -> None:
        """Write the queued END records now (no fsync)."""
        with self._lock:
            self._write_ends_locked()

    def heuristic(self, report: rec.HeuristicRecord) -> None:
        """Record a heuristic outcome durably."""
        self._durable(report)

    def ack(self, gtrid: bytes, by: str) -> None:
        """Durably forget the heuristic reports of ``gtrid``."""
        self._durable(rec.AckRecord(gtrid, _now_ms(), by))

    def _durable(self, record: rec.Record) -> None:
        try:
            self._sync(self._append(record))
        except TxLogError as e:
            raise DecisionLogError(f"record not written durably: {e}") from e

    # ------------------------------------------------------------------ reads

    def decision(self, gtrid: bytes) -> rec.Decision | None:
        """The live decision for ``gtrid``, if any."""
        with self._lock:
            return self.table.decisions.get(gtrid)

    def decisions(self) -> list[rec.Decision]:
        """Every live decision, oldest first."""
        with self._lock:
            return sorted(self.table.decisions.values(), key=lambda d: d.decided_at_ms)

    def heuristics(self) -> list[rec.HeuristicRecord]:
        """Every unacknowledged heuristic report, oldest first."""
        with self._lock:
            out = [h for hs in self.table.heuristics.values() for h in hs]
        return sorted(out, key=lambda h: h.at_ms)

    @property
    def end_position(self) -> Position:
        """End of the underlying txlog."""
        return self._log.end_position

    @property
    def txlog(self) -> TxLog:
        """The underlying txlog (for tests that inject faults into its fsync)."""
        return self._log

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, force: bool = False) -> bool:
        """Snapshot the table into a txlog checkpoint (old segments get deleted).

        Without ``force`` only when at least ``checkpoint_bytes`` were appended since the
        last one. Returns whether a checkpoint was written.
        """
        if not self._ckpt_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                self._write_ends_locked()
                end = self._log.end_position
                if not force and _distance(self._ckpt_end, end) < self.checkpoint_bytes:
                    return False
                state = self.table.snapshot()
            try:
                self._log.checkpoint(end, state)
            except TxLogError as e:
                log.error("decision log checkpoint failed: %s", e)
                return False
            self._ckpt_end = end
            return True
        finally:
            self._ckpt_lock.release()

    def close(self) -> None:
        """Checkpoint, close the txlog and release the directory lock; idempotent."""
        with self._lock:
            if self._closed:
                return
        try:
            self.checkpoint(force=True)
        finally:
            with self._lock:
                self._write_ends_locked()  # when the checkpoint above could not run
                self._closed = True
            try:
                self._log.close()
            except TxLogError as e:
                log.error("closing the decision log: %s", e)
            finally:
                _release_lock(self._lock_fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _distance(a: Position, b: Position) -> int:
    if a.file_no == b.file_no:
        return b.offset - a.offset
    return 1 << 62  # a new segment since: worth a checkpoint


def _take_lock(directory: Path) -> int:
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise DecisionLogError(f"cannot open {path}: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise LogLockedError(
            f"decision log {directory} is in use by process {holder}: stop it first"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _release_lock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def peek(
    path: str | os.PathLike[str], max_record_bytes: int = 16 * 2**20
) -> rec.DecisionTable | None:
    """Read the table of a log without locking or repairing it (it may be in use).

    Returns ``None`` for a directory that holds no decision log. The view may be a moment
    old; a torn tail is ignored, never truncated.
    """
    directory = Path(path)
    if not directory.is_dir():
        return None
    for _attempt in range(3):
        try:
            return _peek(directory, max_record_bytes)
        except FileNotFoundError:
            continue  # a checkpoint deleted a segment meanwhile: read again
    raise DecisionLogError(f"{directory}: the log keeps changing under the reader")


def _peek(directory: Path, max_record_bytes: int) -> rec.DecisionTable | None:
    try:
        checkpoints, _ = read_checkpoints(directory, max_record_bytes)
    except TxLogCorruptError as e:
        raise DecisionLogError(str(e)) from e
    if not checkpoints or not checkpoints[-1].state:
        return None
    cp = checkpoints[-1]
    table = rec.DecisionTable.from_snapshot(cp.state)
    files = [n for n in list_segments(directory) if n >= cp.position.file_no]
    for n in files:
        fd = os.open(segment_path(directory, n), os.O_RDONLY | os.O_CLOEXEC)
        try:
            start = cp.position.offset if n == cp.position.file_no else 0
            reader = SegmentReader(fd, start, os.fstat(fd).st_size, max_record_bytes)
            for r in reader:
                table.apply(rec.decode(int(r.type), r.body))
        finally:
            os.close(fd)
    return table
