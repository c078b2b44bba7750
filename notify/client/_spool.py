"""The ordered producer's local spool: messages of an unavailable partition, kept in order.

One spool per global partition, replayed in order when the partition is back::

    <spool_dir>/<topic>/<brokerId>-<part>.spool   records in the on-disk layout
                                                  (records.py), msgId 0, appended
    <spool_dir>/<topic>/<brokerId>-<part>.pos     decimal byte position already replayed,
                                                  replaced atomically

An append is one write plus one fsync (a spooled send is acknowledged to the application).
A torn tail (crash during an append) is cut at the last whole, checksum-correct record on
open. When everything is replayed both files are deleted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from notify.errors import ClientError
from notify.protocol.records import decode_all, encode, scan


class Spool:
    """One partition's spool file and its replay position."""

    def __init__(self, path: Path):
        self.path = path
        self.pos_path = path.with_suffix(".pos")
        self._pos = 0
        self._size = 0
        self._open()

    def _open(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._pos = self._size = 0
            return
        except OSError as e:
            raise ClientError(f"cannot read spool {self.path}: {e}") from e
        valid, _reason = scan(data, reject_zero_id=False)
        if valid < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(valid)
                self._fsync(f.fileno())
        self._size = valid
        try:
            self._pos = min(int(self.pos_path.read_text().strip() or 0), valid)
        except FileNotFoundError:
            self._pos = 0
        except (OSError, ValueError) as e:
            raise ClientError(f"cannot read spool position {self.pos_path}: {e}") from e

    @property
    def empty(self) -> bool:
        return self._pos >= self._size

    @property
    def pending_bytes(self) -> int:
        return self._size - self._pos

    def append(self, messages: Sequence[tuple[int, bytes]]) -> None:
        """Durably append ``(flag, payload)`` messages."""
        data = b"".join(encode(0, flag, payload) for flag, payload in messages)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                self._fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise ClientError(f"cannot append to spool {self.path}: {e}") from e
        self._size += len(data)

    def peek(self, max_count: int, max_bytes: int) -> tuple[list[tuple[int, bytes]], int]:
        """Up to ``max_count`` messages from the replay position; returns them and the end."""
        if self.empty:
            return [], self._pos
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                buf = f.read(max(max_bytes, 1))
        except OSError as e:
            raise ClientError(f"cannot read spool {self.path}: {e}") from e
        recs = decode_all(buf)[0]
        if not recs:  # one record larger than max_bytes
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                buf = f.read(self._size - self._pos)
            recs = decode_all(buf)[0][:1]
        recs = recs[:max_count]
        end = self._pos + sum(r.size for r in recs)
        return [(r.flag, r.payload) for r in recs], end

    def advance(self, end: int) -> None:
        """Mark everything before ``end`` as replayed; delete the files when all is."""
        self._pos = end
        try:
            if self._pos >= self._size:
                self.pos_path.unlink(missing_ok=True)
                self.path.unlink(missing_ok=True)
                self._pos = self._size = 0
                return
            tmp = self.pos_path.with_name(self.pos_path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, str(end).encode())
                self._fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.pos_path)
        except OSError as e:
            raise ClientError(f"cannot update spool {self.path}: {e}") from e

    def _fsync(self, fd: int) -> None:
        """The one durability call (replace in tests to inject faults)."""
        os.fsync(fd)


def existing_spools(spool_dir: Path) -> Iterator[tuple[str, str, Path]]:
    """``(topic, "<brokerId>-<part>", path)`` of every spool file left under ``spool_dir``."""
    if not spool_dir.is_dir():
        return
    for tdir in sorted(spool_dir.iterdir()):
        if tdir.is_dir():
            for f in sorted(tdir.glob("*.spool")):
                yield tdir.name, f.stem, f
