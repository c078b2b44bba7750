"""What every offset store of :mod:`notify.offsets` shares: errors, rows, the admin Protocol.

The stores implement the client's :class:`~notify.client.OffsetStore` Protocol (``load``,
``commit``, ``close``) and, for tooling (``notify offsets show/reset/copy``), the superset
:class:`ManagedOffsetStore` (``list_offsets``, ``delete``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from notify.client.offsets import OffsetStore, TopicPartitionOffset
from notify.dbengine import OffsetStoreError as OffsetStoreError  # defined below the package

__all__ = [
    "ManagedOffsetStore",
    "OffsetConflictError",
    "OffsetStoreError",
    "OffsetStoreUnavailableError",
    "OffsetTableMissingError",
    "StoredOffset",
    "dedupe_offsets",
    "parse_partition",
]


class OffsetStoreUnavailableError(OffsetStoreError):
    """The database or ZooKeeper could not be reached or dropped the call.

    Nothing may be assumed stored: try the same commit again later (commits are idempotent).
    """

    retriable = True


class OffsetTableMissingError(OffsetStoreError):
    """The offsets table does not exist in the database (run ``notify db upgrade``)."""


class OffsetConflictError(OffsetStoreError):
    """Another consumer of the group committed these partitions first (transactional use).

    The transaction was rolled back; re-read the committed offsets and fetch again.
    """

    retriable = True


@dataclass(frozen=True, slots=True)
class StoredOffset:
    """One stored row: a group's committed position in one partition."""

    group: str
    topic: str
    partition: str
    offset: int
    msg_id: int = -1
    updated_at: datetime | None = None

    @property
    def tpo(self) -> TopicPartitionOffset:
        """As the client's :class:`TopicPartitionOffset`."""
        return TopicPartitionOffset(self.topic, self.partition, self.offset, self.msg_id)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form (``updated_at`` as ISO 8601 or None)."""
        return {
            "group": self.group,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "msg_id": self.msg_id,
            "updated_at": None if self.updated_at is None else self.updated_at.isoformat(),
        }


@runtime_checkable
class ManagedOffsetStore(OffsetStore, Protocol):
    """An :class:`OffsetStore` that can also be listed and edited (tooling)."""

    def list_offsets(
        self, group: str | None = None, topic: str | None = None
    ) -> list[StoredOffset]:
        """Every stored offset, optionally of one group and/or topic, sorted."""
        ...

    def delete(
        self, group: str, topic: str | None = None, partitions: Sequence[str] | None = None
    ) -> int:
        """Remove stored offsets of ``group`` (all, one topic, or some partitions of it);
        returns how many were removed. The consumer then starts at its ``initial_offset``."""
        ...


def dedupe_offsets(offsets: Iterable[TopicPartitionOffset]) -> list[TopicPartitionOffset]:
    """The last offset given per (topic, partition), sorted by key (a stable lock order)."""
    last: dict[tuple[str, str], TopicPartitionOffset] = {}
    for o in offsets:
        last[(o.topic, o.partition)] = o
    return [last[k] for k in sorted(last)]


def parse_partition(text: str) -> tuple[int, int]:
    """``"<brokerId>-<part>"`` -> ``(brokerId, part)``; raises ValueError otherwise."""
    b, sep, p = text.partition("-")
    if not sep:
        raise ValueError(f"not a partition id (<brokerId>-<part>): {text!r}")
    return int(b), int(p)


def sort_key(o: StoredOffset) -> tuple[str, str, int, int, str]:
    """Sort by group, topic, then numeric partition id where possible."""
    try:
        b, p = parse_partition(o.partition)
    except ValueError:
        b, p = -1, -1
    return (o.group, o.topic, b, p, o.partition)
