"""Where a topic's partitions live: the :class:`BrokerDirectory` interface and its static twin.

A client-side *global partition* is a broker plus that broker's local partition number,
written ``"<brokerId>-<part>"`` as MetaQ does; the wire carries only the local number.
:class:`StaticBrokerDirectory` knows a fixed list of broker addresses (broker id = position
in the list unless a mapping is given) and learns each topic's partition count with the
``stats topics`` command, or takes it from the user. A ZooKeeper directory (cluster issue)
implements the same Protocol. :class:`TopicRouter` caches the answers.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from notify.codec.wire import encode_line
from notify.errors import BrokerError, ClientError, ConnectionLostError, RequestTimeoutError

from ._connection import ConnectionPool


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    """A global partition: broker ``broker_id`` at ``address``, broker-local ``partition``."""

    broker_id: int
    partition: int
    address: str = field(compare=False)

    def __str__(self) -> str:
        return f"{self.broker_id}-{self.partition}"

    @classmethod
    def parse(cls, text: str, address: str) -> Partition:
        """Inverse of ``str()``: ``"<brokerId>-<part>"``."""
        b, sep, p = text.partition("-")
        if not sep:
            raise ValueError(f"not a partition id: {text!r}")
        return cls(int(b), int(p), address)


@runtime_checkable
class BrokerDirectory(Protocol):
    """Answers which global partitions a topic has. Swappable (static list, ZooKeeper)."""

    async def partitions(self, topic: str) -> list[Partition]:
        """All partitions of ``topic``, sorted; raise BrokerError(404) for an unknown topic."""
        ...

    async def close(self) -> None:
        """Release what the directory holds."""
        ...


_PARTS_RE = re.compile(r"(?:^|\s)(?:partitions|numPartitions|num_partitions)=(\d+)")


def parse_stats_topics(body: bytes) -> dict[str, int]:
    """Parse a ``stats topics`` body into ``{topic: partition count}``.

    Lenient: each ``<topic> <value>`` line is read for a ``partitions=N`` field; a bare
    integer value is taken as the count; lines without either are ignored.
    """
    out: dict[str, int] = {}
    for raw in body.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line or line in ("STATS", "END"):
            continue
        topic, _, value = line.partition(" ")
        m = _PARTS_RE.search(value)
        if m:
            out[topic] = int(m.group(1))
        elif value.strip().isdigit():
            out[topic] = int(value.strip())
    return out


class StaticBrokerDirectory:
    """A fixed list of broker addresses; partition counts from the user or ``stats topics``.

    ``brokers`` is a list of ``"host:port"`` (broker id = index) or a mapping
    ``{broker_id: "host:port"}``. ``partitions`` maps topic -> partitions per broker and
    short-circuits discovery for those topics.
    """

    def __init__(
        self,
        brokers: Sequence[str] | Mapping[int, str],
        pool: ConnectionPool,
        request_timeout_s: float,
        partitions: Mapping[str, int] | None = None,
    ):
        if isinstance(brokers, Mapping):
            self.brokers: dict[int, str] = dict(brokers)
        else:
            self.brokers = dict(enumerate(brokers))
        if not self.brokers:
            raise ClientError("no broker address given")
        self._pool = pool
        self._timeout_s = request_timeout_s
        self._given = dict(partitions or {})

    async def partitions(self, topic: str) -> list[Partition]:
        """See :meth:`BrokerDirectory.partitions`."""
        if topic in self._given:
            n = self._given[topic]
            return [Partition(b, p, a) for b, a in sorted(self.brokers.items()) for p in range(n)]
        results = await asyncio.gather(
            *(self._stats_topics(a) for a in self.brokers.values()), return_exceptions=True
        )
        out: list[Partition] = []
        errors: list[BaseException] = []
        for (bid, addr), res in zip(sorted(self.brokers.items()), results, strict=True):
            if isinstance(res, BaseException):
                errors.append(res)
                continue
            out.extend(Partition(bid, p, addr) for p in range(res.get(topic, 0)))
        if not out:
            if errors:
                e = errors[0]
                if isinstance(e, ClientError):
                    raise e
                raise ClientError(f"partition discovery failed: {e}") from e
            raise BrokerError(404, f"unknown topic {topic!r}")
        return sorted(out)

    async def _stats_topics(self, address: str) -> dict[str, int]:
        conn = await self._pool.get(address)
        try:
            r = await conn.request(lambda o: encode_line("stats", "topics", o), self._timeout_s)
        except (ConnectionLostError, RequestTimeoutError):
            self._pool.discard(conn)
            raise
        if r.code != 200:
            raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
        return parse_stats_topics(r.body)

    async def close(self) -> None:
        """Nothing to release (connections belong to the pool)."""
        return None


class TopicRouter:
    """Caches a :class:`BrokerDirectory`'s partition lists for ``ttl_s`` seconds."""

    def __init__(self, directory: BrokerDirectory, ttl_s: float):
        self.directory = directory
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, list[Partition]]] = {}
        self._inflight: dict[str, asyncio.Future[list[Partition]]] = {}

    def cached(self, topic: str) -> list[Partition] | None:
        """The cached partition list when still fresh (no I/O)."""
        hit = self._cache.get(topic)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    async def partitions(self, topic: str) -> list[Partition]:
        """The partitions of ``topic`` from the cache or, once per miss, the directory."""
        hit = self.cached(topic)
        if hit is not None:
            return hit
        fut = self._inflight.get(topic)
        if fut is None:
            fut = asyncio.ensure_future(self._lookup(topic))
            self._inflight[topic] = fut
        return await asyncio.shield(fut)

    async def _lookup(self, topic: str) -> list[Partition]:
        try:
            parts = await self.directory.partitions(topic)
            self._cache[topic] = (time.monotonic() + self._ttl_s, parts)
            return parts
        finally:
            self._inflight.pop(topic, None)

    def invalidate(self, topic: str) -> None:
        """Forget the cached partitions of ``topic`` (e.g. after a 404)."""
        self._cache.pop(topic, None)
