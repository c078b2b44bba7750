"""Segment files of the log: naming, listing, and reading frames back from them.

Segment files are named ``redo.<N>`` with ``N`` a plain decimal number without padding, as
MetaQ does (``redo.0``, ``redo.1``, ... ``redo.12``); numbers are consecutive. Anything else in
the directory is ignored by the listing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from notify.txlog.fs import OS_FS, FileSystem
from notify.txlog.records import HEADER, CorruptReason, Record, decode, frame_size

__all__ = ["SegmentReader", "fsync_dir", "list_segments", "segment_path"]

_NAME = re.compile(r"redo\.(0|[1-9][0-9]*)")
_CHUNK = 1 << 20


def segment_path(directory: Path, file_no: int) -> Path:
    """Path of segment ``file_no`` in ``directory``."""
    return directory / f"redo.{file_no}"


def list_segments(directory: Path, fs: FileSystem = OS_FS) -> list[int]:
    """Sorted numbers of the ``redo.<N>`` files in ``directory``."""
    numbers = []
    for name in fs.list_files(directory):
        m = _NAME.fullmatch(name)
        if m is not None:
            numbers.append(int(m.group(1)))
    numbers.sort()
    return numbers


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that creations, renames and deletions in it are durable."""
    OS_FS.fsync_dir(directory)


class SegmentReader:
    """Iterate the intact frames of one open segment file between ``start`` and ``limit``.

    Reads in chunks with ``fs.pread`` (the file offset of ``fd`` is not used). After iteration
    ``stop`` is the offset just after the last intact frame and ``error`` is ``None`` if that
    is ``limit``, otherwise the reason the frame at ``stop`` is not intact. Record offsets are
    absolute offsets in the file.
    """

    def __init__(
        self, fd: int, start: int, limit: int, max_record_bytes: int, fs: FileSystem = OS_FS
    ) -> None:
        self._pread = fs.pread
        self._fd = fd
        self._start = start
        self._limit = limit
        self._max = max_record_bytes
        self.stop = start
        self.error: CorruptReason | None = None

    def __iter__(self) -> Iterator[Record]:
        base = self._start  # file offset of buf[0]
        buf = b""
        read_to = self._start  # file offset up to which data was read
        want = _CHUNK
        while True:
            if read_to < self._limit:
                n = min(want, self._limit - read_to)
                data = self._pread(self._fd, n, read_to)
                if not data:  # the file shrank under us: treat as its end
                    self._limit = read_to
                read_to += len(data)
                buf = buf + data if buf else data
            at_limit = read_to >= self._limit
            result = decode(buf, max_record_bytes=self._max)
            for rec in result.records:
                yield Record(base + rec.offset, rec.type, rec.body)
            base += result.consumed
            buf = buf[result.consumed :]
            self.stop = base
            if result.error is None:
                if at_limit:
                    return
                want = _CHUNK
                continue
            incomplete = result.error in (
                CorruptReason.TRUNCATED_HEADER,
                CorruptReason.TRUNCATED_RECORD,
            ) or (result.error is CorruptReason.ZERO_FILLED and len(buf) < HEADER)
            if incomplete and not at_limit:
                size = frame_size(buf) or HEADER
                want = max(_CHUNK, size - len(buf))
                continue
            self.error = result.error
            return
