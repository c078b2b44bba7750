"""One segment file of a partition: an append-only run of records.

File layout: ``<partitionDir>/<startOffset:020d>.meta`` holding whole records back to back
(layout in :mod:`notify.protocol.records`); the file's byte ``i`` is partition offset
``start + i``. Only the last segment of a partition is written; older ones are read-only.

This module owns the file descriptor: appends (``pwrite`` at the tracked size, truncated
back on failure so a failed append leaves no partial record), positional reads and the
fsync, which sits in :meth:`Segment.sync` alone so tests can replace it to inject faults.
Every call goes through the segment's :class:`~notify.fs.FileSystem` (``fs``, the real one
by default); ``fd`` is a real descriptor only with the real one (sendfile needs it).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Final

from notify.errors import StoreError, StoreFullError
from notify.fs import OS_FS, FileSystem

SUFFIX: Final = ".meta"
NAME_DIGITS: Final = 20


def segment_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """Start offset of a segment file name, or None for any other file."""
    if not name.endswith(SUFFIX):
        return None
    stem = name[: -len(SUFFIX)]
    if len(stem) != NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


class Segment:
    """An open segment file. ``size`` is the byte length of the whole records it holds."""

    __slots__ = ("fd", "fs", "path", "size", "start")

    def __init__(self, path: Path, start: int, fd: int, size: int, fs: FileSystem = OS_FS):
        self.path = path
        self.start = start
        self.fd = fd
        self.size = size
        self.fs = fs

    @classmethod
    def open(
        cls, directory: Path, start: int, create: bool = False, fs: FileSystem = OS_FS
    ) -> Segment:
        path = directory / segment_name(start)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            fd = fs.open(path, flags, 0o644)
        except OSError as e:
            raise StoreError(f"cannot open segment {path}: {e.strerror}") from e
        try:
            size = fs.fsize(fd)
        except OSError as e:
            fs.close(fd)
            raise StoreError(f"cannot open segment {path}: {e.strerror}") from e
        return cls(path, start, fd, size, fs)

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the end; return the partition offset it starts at.

        On any failure the file is cut back to its previous size (and synced, so that a crash
        cannot bring a failed record back) and StoreFullError (disk full / quota) or
        StoreError is raised: no partial record is left behind.
        """
        pos = self.size
        view = memoryview(data)
        written = 0
        pwrite = self.fs.pwrite
        try:
            while written < len(view):
                n = pwrite(self.fd, view[written:], pos + written)
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                written += n
        except OSError as e:
            with contextlib.suppress(OSError):
                self.fs.ftruncate(self.fd, pos)
                self.fs.fdatasync(self.fd)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"disk full writing {self.path}: {e.strerror}") from e
            raise StoreError(f"write to {self.path} failed: {e.strerror}") from e
        self.size = pos + written
        return self.start + pos

    def read(self, file_pos: int, length: int) -> bytes:
        """Read ``length`` bytes at file position ``file_pos`` (fewer at end of file)."""
        return self.fs.pread(self.fd, length, file_pos)

    def rewrite(self, file_pos: int) -> int:
        """Write the bytes from ``file_pos`` to the end again, then fdatasync: after a failed
        fsync the page cache may hold them as clean pages the disk never got, which no plain
        fsync would write. Returns the number of bytes rewritten."""
        chunk = 1 << 20
        for pos in range(file_pos, self.size, chunk):
            view = memoryview(self.fs.pread(self.fd, min(chunk, self.size - pos), pos))
            done = 0
            while done < len(view):
                n = self.fs.pwrite(self.fd, view[done:], pos + done)
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                done += n
        self.sync()
        return max(0, self.size - file_pos)

    def truncate(self, size: int) -> None:
        self.fs.ftruncate(self.fd, size)
        self.size = size
        self.sync()

    def sync(self) -> None:
        """fdatasync this segment (the one place the store forces data to disk)."""
        self.fs.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            try:
                self.fs.close(self.fd)
            finally:
                self.fd = -1


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new or renamed files) durable (real file system)."""
    OS_FS.fsync_dir(path)
