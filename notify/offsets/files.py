"""Tooling over the client's :class:`~notify.client.FileOffsetStore` directory.

:class:`FileOffsets` is a :class:`~notify.offsets.base.ManagedOffsetStore`: ``load`` and
``commit`` go to the client's store unchanged; ``list_offsets`` and ``delete`` work on the
documented file format (``<dir>/<group>.offsets.json``, version 2) under the same
``flock`` (``<group>.offsets.lock``) and with the same atomic replace, so they are safe next
to running consumers.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from notify.client.offsets import FileOffsetStore, TopicPartitionOffset, offsets_document
from notify.fs import OS_FS, write_file_atomically

from .base import OffsetStoreError, StoredOffset, sort_key

__all__ = ["FileOffsets"]

_SUFFIX = ".offsets.json"


class FileOffsets:
    """A :class:`FileOffsetStore` directory that can also be listed and edited."""

    def __init__(self, directory: Path | str | FileOffsetStore) -> None:
        self.store = (
            directory if isinstance(directory, FileOffsetStore) else FileOffsetStore(directory)
        )
        self.directory = self.store.directory

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """See :meth:`FileOffsetStore.load`."""
        return self.store.load(group, topic, partition)

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """See :meth:`FileOffsetStore.commit`."""
        self.store.commit(group, offsets)

    def close(self) -> None:
        """See :meth:`FileOffsetStore.close`."""
        self.store.close()

    def groups(self) -> list[str]:
        """Groups with an offset file in the directory."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise OffsetStoreError(f"cannot list {self.directory}: {e}") from e
        return sorted(n[: -len(_SUFFIX)] for n in names if n.endswith(_SUFFIX))

    def _read(self, group: str) -> tuple[dict[str, dict[str, list[int]]], datetime | None]:
        path = self.store.path(group)
        try:
            raw = path.read_bytes()
            mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        except FileNotFoundError:
            return {}, None
        except OSError as e:
            raise OffsetStoreError(f"cannot read offset file {path}: {e}") from e
        try:
            doc: Any = json.loads(raw)
            data = {
                str(t): {str(p): [int(v[0]), int(v[1])] for p, v in parts.items()}
                for t, parts in doc["offsets"].items()
            }
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise OffsetStoreError(f"offset file {path} is not readable: {e}") from e
        return data, mtime

    def list_offsets(
        self, group: str | None = None, topic: str | None = None
    ) -> list[StoredOffset]:
        """Offsets in the directory's files (``updated_at`` is the file's mtime)."""
        out: list[StoredOffset] = []
        for g in [group] if group is not None else self.groups():
            data, mtime = self._read(g)
            for t, parts in data.items():
                if topic is not None and t != topic:
                    continue
                for p, (offset, msg_id) in parts.items():
                    out.append(StoredOffset(g, t, p, offset, msg_id, mtime))
        return sorted(out, key=sort_key)

    def delete(
        self, group: str, topic: str | None = None, partitions: Sequence[str] | None = None
    ) -> int:
        """Remove offsets from ``group``'s file, under its lock, atomically."""
        path = self.store.path(group)
        if not path.exists():
            return 0
        try:
            lock_fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OffsetStoreError(f"cannot lock offset file {path}: {e}") from e
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            data, _ = self._read(group)
            n = 0
            for t in list(data):
                if topic is not None and t != topic:
                    continue
                for p in list(data[t]):
                    if partitions is None or p in partitions:
                        del data[t][p]
                        n += 1
                if not data[t]:
                    del data[t]
            if n:
                doc = offsets_document(group, data)
                _write_atomic(path, json.dumps(doc, sort_keys=True).encode())
            return n
        finally:
            os.close(lock_fd)

    def __repr__(self) -> str:
        return f"FileOffsets({str(self.directory)!r})"


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        write_file_atomically(OS_FS, path, data)
    except OSError as e:
        raise OffsetStoreError(f"cannot write offset file {path}: {e}") from e
