"""The message store of one broker: the partitions of every configured topic.

Recovery points file ``<dataPath>/recovery-points`` (text, rewritten atomically)::

    notify-recovery-points 1
    <topic> <partition> <flushedOffset>
    ...
    END <crc32 of every preceding byte, decimal>

Each offset is one every byte before which was fsynced; on open, only what follows it in
the last segment is scanned. A missing or damaged file just means a full scan of each last
segment.
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Final

from notify.config import ServerConfig, TopicConfig, validate_topic
from notify.errors import StoreError
from notify.fs import OS_FS, FileSystem, ensure_dir, write_file_atomically
from notify.protocol import records
from notify.store.memory import MemoryPartition
from notify.store.partition import RECORD_SLACK, Partition, RecoveryReport

log = logging.getLogger("notify.store")

RECOVERY_FILE: Final = "recovery-points"
_MAGIC: Final = "notify-recovery-points 1"


def encode_checked(magic: str, lines: list[str]) -> bytes:
    """A small text file: ``magic``, the lines, then ``END <crc32 of every preceding byte>``
    (the layout of the recovery points, and of a slave's remembered cut)."""
    body = ("\n".join([magic, *lines]) + "\n").encode()
    return body + b"END %d\n" % zlib.crc32(body)


def read_checked(fs: FileSystem, path: Path, magic: str, instead: str) -> list[str] | None:
    """The lines of ``path`` (written with :func:`encode_checked`); None when it is missing,
    or unreadable or damaged (logged with what is done ``instead``)."""
    try:
        raw = fs.read_file(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("cannot read %s (%s): %s", path, e, instead)
        return None
    lines = decode_checked(raw, magic)
    if lines is None:
        log.warning("%s is damaged: %s", path, instead)
    return lines


def decode_checked(raw: bytes, magic: str) -> list[str] | None:
    """The lines of a file :func:`encode_checked` wrote; None when it is damaged."""
    body, sep, tail = raw.rpartition(b"END ")
    try:
        ok = bool(sep) and int(tail.strip()) == zlib.crc32(body)
    except ValueError:
        ok = False
    lines = body.decode("utf-8", "replace").splitlines()
    if not ok or not lines or lines[0] != magic:
        return None
    return lines[1:]


class MessageStore:
    """Opens, looks up and closes partitions; owns the recovery points file. Every file
    operation goes through ``fs`` (the real file system by default)."""

    def __init__(self, config: ServerConfig, fs: FileSystem = OS_FS):
        self.fs = fs
        self.config = config
        self.data_path = config.system.data_path
        self.topics: dict[str, TopicConfig] = {}
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._by_topic: dict[str, list[Partition]] = {}
        self.reports: list[RecoveryReport] = []
        self._points_written: dict[tuple[str, int], int] = {}

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> list[RecoveryReport]:
        try:
            ensure_dir(self.fs, self.data_path)
        except OSError as e:
            raise StoreError(f"cannot create dataPath {self.data_path}: {e.strerror}") from e
        points = self._read_points()
        for topic in self.config.topics.values():
            self.add_topic(topic, points)
        return self.reports

    def partition_dir(self, topic: TopicConfig, index: int) -> Path:
        base = topic.data_path or self.data_path
        return base / f"{validate_topic(topic.name)}-{index}"

    def add_topic(
        self, topic: TopicConfig, points: dict[tuple[str, int], int] | None = None
    ) -> list[Partition]:
        """Open (creating as needed) the partitions of a topic; safe to call again with a
        changed config (more partitions are opened; flush settings take effect at once)."""
        self.topics[topic.name] = topic
        parts = self._by_topic.setdefault(topic.name, [])
        for part in parts:
            part.group_commit = topic.unflush_threshold == 0
        for i in range(len(parts), topic.num_partitions):
            if topic.store == "memory":
                mp = MemoryPartition(
                    topic.name,
                    i,
                    topic.memory_max_bytes,
                    topic.memory_full_policy == "drop_oldest",
                    max(
                        4096, min(self.config.system.max_segment_size, topic.memory_max_bytes // 8)
                    ),
                )
                parts.append(mp)
                self.partitions[(topic.name, i)] = mp
                continue
            rp = points.get((topic.name, i)) if points else None
            part = Partition.open(
                topic.name,
                i,
                self.partition_dir(topic, i),
                self.config.system.max_segment_size,
                topic.unflush_threshold == 0,
                rp,
                self.fs,
            )
            if part.recovery is not None:
                self.reports.append(part.recovery)
            parts.append(part)
            self.partitions[(topic.name, i)] = part
        max_record = records.HEADER_SIZE + self.config.system.max_message_size + RECORD_SLACK
        for part in parts:
            part.max_record = max_record
        return parts

    def discard_topic(self, name: str) -> None:
        """Forget a topic whose opening failed half-way (closing what was opened); its
        files stay on disk."""
        for part in self._by_topic.pop(name, []):
            self.partitions.pop((name, part.index), None)
            part.close()
        self.topics.pop(name, None)

    def get(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def topic_partitions(self, topic: str) -> list[Partition]:
        return self._by_topic.get(topic, [])

    def all_partitions(self) -> list[Partition]:
        return list(self.partitions.values())

    def close(self, write_points: bool = True) -> None:
        """Close every partition (fsynced), then write the recovery points (unless
        ``write_points`` is False: a store that did not open whole leaves them as they were)."""
        for part in self.partitions.values():
            part.close()
        if write_points:
            self.write_recovery_points(force=True)

    # ------------------------------------------------------------------ recovery points

    def _points_path(self) -> Path:
        return self.data_path / RECOVERY_FILE

    def _read_points(self) -> dict[tuple[str, int], int]:
        lines = read_checked(
            self.fs, self._points_path(), _MAGIC, "scanning every last segment"
        )
        if lines is None:
            return {}
        out: dict[tuple[str, int], int] = {}
        for line in lines:
            t, p, off = line.split(" ")
            out[(t, int(p))] = int(off)
        return out

    def write_recovery_points(self, force: bool = False) -> bool:
        """Persist each partition's flushed offset (atomic replace); skip if unchanged."""
        current = {k: p.flushed_end for k, p in self.partitions.items() if not p.memory}
        if not force and current == self._points_written:
            return False
        data = encode_checked(
            _MAGIC, [f"{t} {i} {off}" for (t, i), off in sorted(current.items())]
        )
        path = self._points_path()
        try:
            write_file_atomically(self.fs, path, data)
        except OSError as e:
            log.warning("cannot write %s: %s (recovery will scan more)", path, e)
            return False
        self._points_written = current
        return True
