"""Consumer offset stores: the :class:`OffsetStore` Protocol and its embedded twins.

An offset is the byte offset of the next record to consume in a partition, stored per
``(group, topic, partition)`` with the message id of the last consumed record (MetaQ's
``<msgId>-<offset>``). Partitions are global ids ``"<brokerId>-<part>"``.

:class:`FileOffsetStore` (the default) keeps one JSON file per group::

    <dir>/<group>.offsets.json
    {"version": 2, "group": "<group>",
     "offsets": {"<topic>": {"<brokerId>-<part>": [<offset>, <msgId>], ...}, ...}}

Version 2 files are keyed by the brokers' own ids (``brokerId``). Version 1 files, written
when a broker given in a list to ``connect()`` was keyed by its position in that list, are
migrated once by the first consumer of the group (:meth:`FileOffsetStore.migrate_keys`).

The commit point is one small write to ``<file>.tmp`` plus one fsync, then ``os.replace``
and an fsync of the directory: a reader sees either the old or the new file, never a mix.
The fsync sits in :meth:`FileOffsetStore._fsync` so tests can inject faults.
:class:`MemoryOffsetStore` is the in-memory twin. SQL and ZooKeeper stores come later.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from notify.errors import ClientError

from ._files import write_all

log = logging.getLogger("notify.client")

#: The offset file format: 2 = partitions keyed ``<brokerId>-<part>`` by the broker's own id.
FILE_VERSION = 2


def offsets_document(group: str, offsets: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    """The JSON document of a group's offset file (the one writer of its layout)."""
    return {"version": FILE_VERSION, "group": group, "offsets": offsets}


@dataclass(frozen=True, slots=True)
class TopicPartitionOffset:
    """The committed position of a group in one partition."""

    topic: str
    partition: str
    offset: int
    msg_id: int = -1


@runtime_checkable
class OffsetStore(Protocol):
    """Where a consumer group's offsets live. Methods may block (they run off the loop)."""

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """The committed offset, or None when the group never committed one."""
        ...

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """Durably store ``offsets`` (all or nothing)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


class MemoryOffsetStore:
    """In-memory twin of :class:`FileOffsetStore` (tests, throwaway consumers)."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str, str], TopicPartitionOffset] = {}
        self._lock = threading.Lock()

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """See :meth:`OffsetStore.load`."""
        with self._lock:
            return self._data.get((group, topic, partition))

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """See :meth:`OffsetStore.commit`."""
        with self._lock:
            for o in offsets:
                self._data[(group, o.topic, o.partition)] = o

    def close(self) -> None:
        """Nothing to release."""
        return None


def _safe_name(group: str) -> str:
    if not group or any(c in group for c in "/\\\0") or group in (".", ".."):
        raise ClientError(f"invalid group name {group!r}")
    return group


_PATH_LOCKS: dict[Path, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _path_lock(path: Path) -> threading.Lock:
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(path.resolve(), threading.Lock())


class FileOffsetStore:
    """Offsets in a local JSON file per group, replaced atomically (tmp + fsync + rename).

    Every commit re-reads the file and merges into it under a lock (a thread lock per path
    plus ``flock`` on ``<group>.offsets.lock``), so several consumers of one group sharing a
    ``data_dir`` (each owning some partitions) do not overwrite each other's offsets.
    """

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)
        self._closed = False

    def path(self, group: str) -> Path:
        """The offset file of ``group``."""
        return self.directory / f"{_safe_name(group)}.offsets.json"

    def _read(self, group: str) -> dict[str, dict[str, list[int]]]:
        return self._read_versioned(group)[0]

    def _read_versioned(self, group: str) -> tuple[dict[str, dict[str, list[int]]], int]:
        p = self.path(group)
        version = FILE_VERSION
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            data: dict[str, dict[str, list[int]]] = {}
        except OSError as e:
            raise ClientError(f"cannot read offset file {p}: {e}") from e
        else:
            try:
                doc: Any = json.loads(raw)
                data = {
                    str(t): {str(k): [int(v[0]), int(v[1])] for k, v in parts.items()}
                    for t, parts in doc["offsets"].items()
                }
                version = int(doc.get("version", 1))
            except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
                raise ClientError(f"offset file {p} is not readable: {e}") from e
        return data, version

    def migrate_keys(self, group: str, positions: Mapping[int, int] | None) -> bool:
        """Rewrite a version 1 file of ``group`` keyed by broker position to broker ids.

        ``positions`` maps the old key (a broker's position in the list given to
        ``connect()``) to that broker's id; None when the old keys were already ids (brokers
        given as ``{id: address}``). Partitions of positions not in ``positions`` keep their
        key. Done once, under the file lock; True when the file was rewritten.
        """
        path = self.path(group)
        if not path.exists():
            return False
        with _path_lock(path), self._locked(path):
            data, version = self._read_versioned(group)
            if version >= FILE_VERSION:
                return False
            moved: dict[str, dict[str, list[int]]] = {}
            changes: list[str] = []
            for topic, parts in data.items():
                for key, value in parts.items():
                    new_key = key
                    b, sep, part = key.partition("-")
                    if positions is not None and sep and b.isdigit() and int(b) in positions:
                        new_key = f"{positions[int(b)]}-{part}"
                    if new_key != key:
                        changes.append(f"{topic} {key}->{new_key}")
                    moved.setdefault(topic, {})[new_key] = value
            self._write_atomic(path, json.dumps(offsets_document(group, moved)).encode())
        log.warning(
            "offset file %s migrated to broker-id keys (format %d)%s",
            path,
            FILE_VERSION,
            ": " + ", ".join(changes) if changes else " (keys unchanged)",
        )
        return True

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ClientError(f"cannot lock offset file {path}: {e}") from e
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock_fd)  # releases the flock

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """See :meth:`OffsetStore.load`."""
        with _path_lock(self.path(group)):
            v = self._read(group).get(topic, {}).get(partition)
        return None if v is None else TopicPartitionOffset(topic, partition, v[0], v[1])

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """See :meth:`OffsetStore.commit` (merged into the file, atomically replaced)."""
        if not offsets:
            return
        if self._closed:
            raise ClientError("offset store is closed")
        path = self.path(group)
        with _path_lock(path), self._locked(path):
            new = self._read(group)
            for o in offsets:
                new.setdefault(o.topic, {})[o.partition] = [o.offset, o.msg_id]
            doc = offsets_document(group, new)
            self._write_atomic(path, json.dumps(doc, sort_keys=True).encode())

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, data)
                self._fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                self._fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise ClientError(f"cannot write offset file {path}: {e}") from e

    def _fsync(self, fd: int) -> None:
        """The one durability call (replace in tests to inject faults)."""
        os.fsync(fd)

    def close(self) -> None:
        """Refuse further commits."""
        self._closed = True
