"""Partition selectors: which partition of a topic a message goes to.

A selector is any callable ``(topic, partitions, key, data) -> Partition``; the partition
list is the topic's sorted global partitions. Round robin is the default; by-key hashing
(CRC32 of the key, stable across processes and runs) keeps every message of a key on one
partition and so in order.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Sequence

from notify.errors import ClientError

from .types import Partition

#: ``(topic, partitions, key, data) -> Partition``: any callable of this shape.
PartitionSelector = Callable[[str, Sequence[Partition], bytes | str | None, bytes], Partition]


class RoundRobinSelector:
    """Cycle over all partitions of all brokers (MetaQ's default)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def __call__(
        self, topic: str, partitions: Sequence[Partition], key: bytes | str | None, data: bytes
    ) -> Partition:
        if not partitions:
            raise ClientError(f"topic {topic!r} has no partition")
        return partitions[next(self._counter) % len(partitions)]

    def next_index(self, n: int) -> int:
        """The next round-robin index among ``n`` partitions (the producer's fast path)."""
        return next(self._counter) % n


def key_hash(key: bytes | str) -> int:
    """The stable hash of a key used by :class:`KeyHashSelector` (CRC32 of its UTF-8 bytes)."""
    raw = key.encode("utf-8") if isinstance(key, str) else key
    return zlib.crc32(raw)


class KeyHashSelector:
    """``partitions[crc32(key) % n]``; messages without a key fall back to round robin."""

    def __init__(self) -> None:
        self._fallback = RoundRobinSelector()

    def __call__(
        self, topic: str, partitions: Sequence[Partition], key: bytes | str | None, data: bytes
    ) -> Partition:
        if not partitions:
            raise ClientError(f"topic {topic!r} has no partition")
        if key is None:
            return self._fallback(topic, partitions, key, data)
        return partitions[key_hash(key) % len(partitions)]

    def next_index(self, n: int) -> int:
        """The index among ``n`` partitions of the next message without a key."""
        return self._fallback.next_index(n)


def select_in_transaction(
    selector: PartitionSelector,
    chosen: dict[str, Partition],
    topic: str,
    partitions: Sequence[Partition],
    key: bytes | str | None,
    data: bytes,
) -> Partition:
    """The partition of one message of a transaction. Under the default selector
    (:class:`KeyHashSelector`) the messages without a key stay on the partition the
    transaction's first keyless message of ``topic`` got (``chosen``, one per transaction),
    so they travel as one ``mput`` and are applied with one append; the next transaction's
    round-robin pick moves on. Other selectors and keyed messages: the selector's choice."""
    if key is None and type(selector) is KeyHashSelector:
        prev = chosen.get(topic)
        if prev is not None:
            for p in partitions:  # the same object, mostly: no dataclass __eq__ calls
                if p is prev:
                    return p
            for p in partitions:
                if p == prev:
                    return p
        if not partitions:
            raise ClientError(f"topic {topic!r} has no partition")
        part = partitions[selector.next_index(len(partitions))]
        chosen[topic] = part
        return part
    return selector(topic, partitions, key, data)
