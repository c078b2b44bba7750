"""The relay's decisions as pure functions: which rows one cycle publishes, to which
partitions, under which sequence numbers; how long to wait when there is nothing to do.

A cycle reads the shard's oldest rows (id order) and publishes a *prefix* of them: each
row joins the sub-batch of its partition until a sub-batch would exceed one ``mput``
(count or bytes) or the cycle its row limit; the first row that does not fit ends the
cycle's batch, so what is published is always every row below some id and a key's rows
go in id order. A partition gets at most one sub-batch per cycle: that keeps one batch
per partition in flight under the shard's identity, which is what the broker's
idempotence deduplicates (it compares a retry with the last batch it stored).

Keyed rows go to ``partitions[khash mod n]`` (the client's by-key selector, unsigned
CRC32); the keyless rows of a topic go together to one partition per cycle, the next one
the cycle after (sticky round robin: one frame instead of one per partition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from notify.protocol.records import HEADER_SIZE

from .rows import SubBatch

#: Most records the broker takes in one ``mput`` (its MAX_BATCH).
MPUT_MAX_COUNT: Final = 4096


#: A row as the relay reads it: (id, topic, khash, flag, payload), the driver's own tuple.
RelayRow = tuple[int, str, int | None, int, bytes]


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one cycle publishes."""

    max_rows: int = 8192
    mput_max_count: int = MPUT_MAX_COUNT
    mput_max_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        if not 1 <= self.mput_max_count <= MPUT_MAX_COUNT:
            raise ValueError(f"mput_max_count must be 1..{MPUT_MAX_COUNT}")
        if self.mput_max_bytes < 1024:
            raise ValueError("mput_max_bytes must be >= 1024")


@dataclass(slots=True)
class Planned:
    """One partition's part of a cycle: the sub-batch and its records."""

    sub: SubBatch
    records: list[tuple[int, bytes]]
    nbytes: int


@dataclass(slots=True)
class Plan:
    """A cycle's batch: sub-batches in first-row order, the rows of topics without
    partitions (unroutable: the topic is unknown to the broker), the rows read but left
    for the next cycle."""

    batches: list[Planned] = field(default_factory=list)
    unroutable: dict[str, list[int]] = field(default_factory=dict)
    left: int = 0

    @property
    def count(self) -> int:
        return sum(p.sub.count for p in self.batches)


def plan_cycle(
    rows: Sequence[RelayRow],
    partitions: Mapping[str, Sequence[str] | None],
    seqs: Mapping[tuple[str, str], int],
    limits: Limits,
    round_robin: int,
) -> Plan:
    """Cut ``rows`` (id order) into this cycle's sub-batches (see the module doc).

    ``partitions[topic]``: the topic's partition names, None when the broker does not
    know the topic (its rows are set aside as unroutable, not cut into the batch: they
    cannot delay the others). ``seqs``: the next sequence number per (topic, partition).
    ``round_robin``: this cycle's pick for keyless rows (the caller advances it)."""
    plan = Plan()
    open_: dict[tuple[str, str], tuple[int, list[int], list[tuple[int, bytes]], list[int]]] = {}
    keyless: dict[str, str] = {}
    total = 0
    taken = 0
    max_count, max_bytes = limits.mput_max_count, limits.mput_max_bytes
    for taken, (rid, topic, khash, flag, payload) in enumerate(rows):  # noqa: B007
        names = partitions.get(topic)
        if not names:
            plan.unroutable.setdefault(topic, []).append(rid)
            continue
        if khash is None:
            part = keyless.get(topic)
            if part is None:
                part = keyless[topic] = names[round_robin % len(names)]
        else:
            part = names[(khash + 4294967296 if khash < 0 else khash) % len(names)]
        key = (topic, part)
        size = len(payload) + HEADER_SIZE
        entry = open_.get(key)
        if entry is None:
            if total >= limits.max_rows:
                break
            entry = open_[key] = (len(open_), [], [], [0])
        _order, ids, recs, nbytes = entry
        if (
            total >= limits.max_rows
            or len(ids) >= max_count
            or (ids and nbytes[0] + size > max_bytes)
        ):
            break
        ids.append(rid)
        recs.append((flag, payload))
        nbytes[0] += size
        total += 1
    else:
        taken = len(rows)
    plan.left = len(rows) - taken
    for (topic, part), (_order, ids, recs, nbytes) in sorted(
        open_.items(), key=lambda kv: kv[1][0]
    ):
        if ids:
            sub = SubBatch(topic, part, seqs.get((topic, part), 0), tuple(ids))
            plan.batches.append(Planned(sub, recs, nbytes[0]))
    return plan


@dataclass(slots=True)
class Backoff:
    """Adaptive polling: the wait after an empty read doubles from ``min_s`` to ``max_s``;
    a read that finds rows resets it (busy: poll again at once)."""

    min_s: float = 0.001
    max_s: float = 0.05
    current: float = 0.0

    def found(self) -> None:
        """A read found rows: no wait before the next."""
        self.current = 0.0

    def empty(self) -> float:
        """A read found nothing: how long to wait before the next."""
        self.current = self.min_s if self.current <= 0 else min(self.max_s, self.current * 2)
        return self.current
