"""Partition assignment strategies of a consumer group (pure functions, no I/O).

A strategy maps the sorted members subscribed to a topic and the topic's sorted partitions
to each member's share. Every member computes the whole map from what it read in the
configserver and claims its own share; owner nodes settle any disagreement.

* :class:`ContiguousStrategy` (default, MetaQ's ``DefaultLoadBalanceStrategy``): member
  ``i`` of ``C`` takes a contiguous run; the first ``P % C`` members get one more.
  Membership changes move many partitions, but shares differ by at most one.
* :class:`ConsistentHashStrategy` (MetaQ's ``ConsisHashStrategy`` idea): members own
  ``vnodes`` points each on an MD5 ring, a partition goes to the next point clockwise.
  A join or leave moves only about ``P / C`` partitions; shares are less even.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

__all__ = [
    "AssignmentStrategy",
    "ConsistentHashStrategy",
    "ContiguousStrategy",
    "get_strategy",
]

P = TypeVar("P")


@runtime_checkable
class AssignmentStrategy(Protocol):
    """``assign(members, partitions) -> {member: [partitions]}``; pure and deterministic."""

    name: str

    def assign(self, members: Sequence[str], partitions: Sequence[P]) -> dict[str, list[P]]:
        """Every member of ``members`` (any order) mapped to its share of ``partitions``
        (taken in the order given: callers pass them sorted)."""
        ...


class ContiguousStrategy:
    """Sorted members take contiguous runs of the partitions; the first ``P % C`` one more."""

    name = "contiguous"

    def assign(self, members: Sequence[str], partitions: Sequence[P]) -> dict[str, list[P]]:
        ordered = sorted(set(members))
        out: dict[str, list[P]] = {m: [] for m in ordered}
        if not ordered:
            return out
        per, extra = divmod(len(partitions), len(ordered))
        for i, m in enumerate(ordered):
            start = i * per + min(i, extra)
            out[m] = list(partitions[start : start + per + (1 if i < extra else 0)])
        return out


def _point(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode(), usedforsecurity=False).digest()[:8], "big")


class ConsistentHashStrategy:
    """Members on an MD5 ring with ``vnodes`` points each; a partition (by ``str()``) goes
    to the first member point at or after its own point."""

    name = "consistent_hash"

    def __init__(self, vnodes: int = 160):
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        self.vnodes = vnodes

    def assign(self, members: Sequence[str], partitions: Sequence[P]) -> dict[str, list[P]]:
        ordered = sorted(set(members))
        out: dict[str, list[P]] = {m: [] for m in ordered}
        if not ordered:
            return out
        ring = sorted((_point(f"{m}#{i}"), m) for m in ordered for i in range(self.vnodes))
        points = [pt for pt, _ in ring]
        for p in partitions:
            i = bisect.bisect_left(points, _point(str(p))) % len(ring)
            out[ring[i][1]].append(p)
        return out


_STRATEGIES: dict[str, type[ContiguousStrategy] | type[ConsistentHashStrategy]] = {
    ContiguousStrategy.name: ContiguousStrategy,
    ConsistentHashStrategy.name: ConsistentHashStrategy,
}


def get_strategy(strategy: str | AssignmentStrategy) -> AssignmentStrategy:
    """A strategy by name (``contiguous``, ``consistent_hash``) or the object itself."""
    if not isinstance(strategy, str):
        return strategy
    cls = _STRATEGIES.get(strategy)
    if cls is None:
        known = ", ".join(sorted(_STRATEGIES))
        raise ValueError(f"unknown assignment strategy {strategy!r} (known: {known})")
    return cls()
