"""Broker counters behind the ``stats`` command (and later HTTP ``/stats`` and ``/metrics``).

Counters are plain ints bumped on the event loop; ``realtime`` rates are computed from a
ring of one-second snapshots covering the last minute.
"""

from __future__ import annotations

import os
import resource
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

REALTIME_WINDOW_S = 60


@dataclass
class TopicCounters:
    put_messages: int = 0
    put_bytes: int = 0
    put_failed: int = 0
    get_requests: int = 0
    get_misses: int = 0
    get_bytes: int = 0


@dataclass
class BrokerStats:
    """All counters of one broker process."""

    started: float = field(default_factory=time.time)
    cmd_put: int = 0
    cmd_mput: int = 0
    cmd_get: int = 0
    cmd_offset: int = 0
    cmd_other: int = 0
    put_messages: int = 0
    put_bytes: int = 0
    put_failed: int = 0
    get_misses: int = 0
    parked_gets: int = 0
    get_bytes: int = 0
    protocol_errors: int = 0
    connections_total: int = 0
    connections_current: int = 0
    connections_refused: int = 0
    connections_timed_out: int = 0
    parked_refused: int = 0
    denied: int = 0
    epoch_declared: int = 0  # ``epoch`` requests (producers' failover epochs)
    epoch_refused: int = 0  # writes refused: a producer saw a newer failover epoch
    topics: dict[str, TopicCounters] = field(default_factory=dict)
    _ring: deque[tuple[float, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=REALTIME_WINDOW_S + 1)
    )

    def topic(self, name: str) -> TopicCounters:
        tc = self.topics.get(name)
        if tc is None:
            tc = self.topics[name] = TopicCounters()
        return tc

    def snapshot(self) -> None:
        """Record a point for the realtime rates (called once a second)."""
        self._ring.append((time.monotonic(), self.put_messages, self.cmd_get, self.put_bytes))

    def realtime(self) -> list[tuple[str, object]]:
        if len(self._ring) < 2:
            return [("put_tps", 0.0), ("get_tps", 0.0), ("put_bytes_per_sec", 0.0)]
        t0, p0, g0, b0 = self._ring[0]
        t1, p1, g1, b1 = self._ring[-1]
        dt = max(t1 - t0, 1e-9)
        return [
            ("window_seconds", round(dt, 1)),
            ("put_tps", round((p1 - p0) / dt, 1)),
            ("get_tps", round((g1 - g0) / dt, 1)),
            ("put_bytes_per_sec", round((b1 - b0) / dt, 1)),
        ]

    def reset(self) -> None:
        keep_started = self.started
        current = self.connections_current
        self.__init__()  # type: ignore[misc]
        self.started = keep_started
        self.connections_current = current

    def system(self) -> list[tuple[str, object]]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return [
            ("pid", os.getpid()),
            ("uptime", int(time.time() - self.started)),
            ("curr_connections", self.connections_current),
            ("total_connections", self.connections_total),
            ("refused_connections", self.connections_refused),
            ("timed_out_connections", self.connections_timed_out),
            ("refused_parked_gets", self.parked_refused),
            ("denied_requests", self.denied),
            ("cmd_put", self.cmd_put),
            ("cmd_mput", self.cmd_mput),
            ("cmd_get", self.cmd_get),
            ("cmd_offset", self.cmd_offset),
            ("cmd_other", self.cmd_other),
            ("put_messages", self.put_messages),
            ("put_bytes", self.put_bytes),
            ("put_failed", self.put_failed),
            ("get_miss", self.get_misses),
            ("parked_gets", self.parked_gets),
            ("get_bytes", self.get_bytes),
            ("protocol_errors", self.protocol_errors),
            ("epoch_declared", self.epoch_declared),
            ("epoch_refused", self.epoch_refused),
            ("rusage_user", round(ru.ru_utime, 3)),
            ("rusage_system", round(ru.ru_stime, 3)),
            ("max_rss_kb", ru.ru_maxrss),
        ]


Position = tuple[int, float]
PartitionKey = tuple[str, int]


class ConsumerPositions:
    """Where each consumer group last fetched, per partition, bounded and expiring.

    ``(topic, partition) -> group -> (offset, monotonic time)``, read by retention (keep what
    a live consumer has not read), ``/api/groups`` and ``/metrics``. At most ``max_groups``
    distinct group names are remembered: a new name beyond that forgets the one seen least
    recently; a group not seen for ``expiry_s`` is forgotten. Memory therefore stays bounded
    whatever names clients invent (``maxConsumerGroups``, ``consumerGroupExpiry``).
    """

    def __init__(self, max_groups: int = 10_000, expiry_s: float = 86_400.0):
        self.max_groups = max_groups
        self.expiry_s = expiry_s
        self._by_part: dict[PartitionKey, dict[str, Position]] = {}
        #: group -> (last seen, partitions it fetched), least recently seen first
        self._groups: OrderedDict[str, tuple[float, set[PartitionKey]]] = OrderedDict()
        self.evicted = 0
        self.expired = 0

    def record(self, topic: str, partition: int, group: str, offset: int) -> None:
        """A fetch by ``group`` at ``offset`` of ``topic-partition`` (on the event loop)."""
        now = time.monotonic()
        key = (topic, partition)
        entry = self._groups.get(group)
        if entry is None:
            self._expire(now)
            while len(self._groups) >= self.max_groups:
                self._forget(next(iter(self._groups)))
                self.evicted += 1
            parts: set[PartitionKey] = set()
        else:
            parts = entry[1]
            self._groups.move_to_end(group)
        parts.add(key)
        self._groups[group] = (now, parts)
        seen = self._by_part.get(key)
        if seen is None:
            seen = self._by_part[key] = {}
        seen[group] = (offset, now)

    def _forget(self, group: str) -> None:
        _t, parts = self._groups.pop(group)
        for key in parts:
            seen = self._by_part.get(key)
            if seen is not None:
                seen.pop(group, None)
                if not seen:
                    del self._by_part[key]

    def _expire(self, now: float) -> None:
        limit = now - self.expiry_s
        while self._groups:
            group, (seen_at, _parts) = next(iter(self._groups.items()))
            if seen_at >= limit:
                break
            self._forget(group)
            self.expired += 1

    def get(
        self, key: PartitionKey, default: dict[str, Position] | None = None
    ) -> dict[str, Position]:
        """The groups seen on one partition (do not modify)."""
        return self._by_part.get(key, {} if default is None else default)

    def items(self) -> list[tuple[PartitionKey, dict[str, Position]]]:
        """A snapshot of every partition's groups, expired ones dropped first."""
        self._expire(time.monotonic())
        return [(k, dict(v)) for k, v in self._by_part.items()]

    def __len__(self) -> int:
        """Distinct group names remembered."""
        return len(self._groups)
