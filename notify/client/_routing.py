"""Where a topic's partitions live: the :class:`BrokerDirectory` interface and its static twin.

A client-side *global partition* is a broker plus that broker's local partition number,
written ``"<brokerId>-<part>"`` as MetaQ does; the wire carries only the local number.
:class:`StaticBrokerDirectory` knows a fixed list of broker addresses (broker id = position
in the list unless a mapping is given) and learns each topic's partition count with the
``stats topics`` command, or takes it from the user. :class:`ZkBrokerDirectory` reads the
configserver (ZooKeeper or embedded, :mod:`configserver`) and keeps a live view per topic
through watches: a broker joining or leaving changes the answer within moments, without a
restart. :class:`TopicRouter` caches the answers (a live directory's view wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol, runtime_checkable

from notify.configserver import (
    ConfigServer,
    ConfigServerError,
    ConfigServerUnavailableError,
    PartitionInfo,
)
from notify.errors import BrokerError, ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol.frames import encode_line
from notify.protocol.replies import parse_stats_dict, parse_stats_topics

from ._connection import ConnectionPool
from .core.types import Partition as Partition

log = logging.getLogger("notify.client")


@runtime_checkable
class BrokerDirectory(Protocol):
    """Answers which global partitions a topic has. Swappable (static list, ZooKeeper)."""

    async def partitions(self, topic: str) -> list[Partition]:
        """All partitions of ``topic``, sorted; raise BrokerError(404) for an unknown topic."""
        ...

    async def close(self) -> None:
        """Release what the directory holds."""
        ...


@runtime_checkable
class LiveBrokerDirectory(BrokerDirectory, Protocol):
    """A directory that keeps its answers current by itself (watches)."""

    def current(self, topic: str) -> list[Partition] | None:
        """The live partition list of ``topic`` if known (no I/O), else None."""
        ...


class StaticBrokerDirectory:
    """A fixed list of broker addresses; partition counts from the user or ``stats topics``.

    ``brokers`` is a list of ``"host:port"`` or a mapping ``{broker_id: "host:port"}``. With a
    list, each broker's id is asked once (its ``brokerId``, from ``stats``), so global
    partitions, and the offsets stored under them, do not depend on the order of the list
    (a broker that does not report its id keeps its position, with a warning).
    ``partitions`` maps topic -> partitions per broker and short-circuits discovery for
    those topics.
    """

    def __init__(
        self,
        brokers: Sequence[str] | Mapping[int, str],
        pool: ConnectionPool,
        request_timeout_s: float,
        partitions: Mapping[str, int] | None = None,
    ):
        #: ``{position in the list: address}`` (list form) or the given ids.
        self.brokers: dict[int, str]
        if isinstance(brokers, Mapping):
            self.brokers = dict(brokers)
            self._ids: dict[str, int] | None = {a: b for b, a in self.brokers.items()}
        else:
            self.brokers = dict(enumerate(brokers))
            self._ids = None  # learnt per address with ``stats``
        if not self.brokers:
            raise ClientError("no broker address given")
        self._learnt: dict[str, int] = {}
        self._positional = False  # brokers sharing an id: keyed by position (legacy)
        self._pool = pool
        self._timeout_s = request_timeout_s
        self._given = dict(partitions or {})

    def legacy_ids(self) -> dict[int, int] | None:
        """``{position in the list: broker id}`` of the brokers whose id is known (the old
        keys of offsets stored when the id was the position), or None for a mapping."""
        if self._ids is not None or self._positional:
            return None
        return {i: self._learnt[a] for i, a in self.brokers.items() if a in self._learnt}

    async def broker_id(self, position: int) -> int:
        """The id of the broker at ``position`` of the list (asked once, then cached)."""
        addr = self.brokers[position]
        if self._ids is not None:
            return self._ids[addr]
        bid = self._learnt.get(addr)
        if bid is None:
            conn = await self._pool.get(addr)
            try:
                r = await conn.request(lambda o: encode_line("stats", o), self._timeout_s)
            except (ConnectionLostError, RequestTimeoutError):
                self._pool.discard(conn)
                raise
            if r.code != 200:
                raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
            st = parse_stats_dict(r.body)
            value = st.get("broker_id")
            if isinstance(value, int):
                bid = value
                epoch = st.get("failover_epoch")  # a group that fails over automatically:
                if isinstance(epoch, int) and epoch > 0:  # declare its epochs (``epoch``)
                    self._pool.bind_group(addr, value, epoch)
            else:
                log.warning("broker %s does not report its broker_id: keyed as %d", addr, position)
                bid = position
            self._learnt[addr] = bid
        if self._positional or len(set(self._learnt.values())) < len(self._learnt):
            if not self._positional:
                self._positional = True
                log.warning(
                    "brokers %s do not have distinct brokerIds %s: partitions keyed by "
                    "their position in the list instead (set brokerId on each broker)",
                    list(self._learnt),
                    list(self._learnt.values()),
                )
            return position
        return bid

    async def _with_ids(self) -> list[tuple[int, str] | BaseException]:
        ids: list[int | BaseException] = await asyncio.gather(
            *(self.broker_id(i) for i in sorted(self.brokers)), return_exceptions=True
        )
        if self._positional:  # found out while asking: every broker by position
            ids = [
                pos if not isinstance(b, BaseException) else b
                for pos, b in zip(sorted(self.brokers), ids, strict=True)
            ]
        return [
            bid if isinstance(bid, BaseException) else (bid, self.brokers[i])
            for i, bid in zip(sorted(self.brokers), ids, strict=True)
        ]

    async def partitions(self, topic: str) -> list[Partition]:
        """See :meth:`BrokerDirectory.partitions`."""
        known = await self._with_ids()
        if topic in self._given:
            # given partitions work without the brokers (an ordered producer spools for a
            # broker that is down): one whose id cannot be asked now keeps its position
            n = self._given[topic]
            pairs = []
            for pos, k in zip(sorted(self.brokers), known, strict=True):
                if isinstance(k, BaseException):
                    log.warning(
                        "broker %s: id unknown (%s); its partitions are keyed %d-<n> for now",
                        self.brokers[pos],
                        k,
                        pos,
                    )
                    k = (pos, self.brokers[pos])
                pairs.append(k)
            return sorted(Partition(b, p, a) for b, a in pairs for p in range(n))
        results = await asyncio.gather(
            *(
                self._stats_topics(k[1])
                if not isinstance(k, BaseException)
                else _raise(k)
                for k in known
            ),
            return_exceptions=True,
        )
        out: list[Partition] = []
        errors: list[BaseException] = []
        for k, res in zip(known, results, strict=True):
            if isinstance(k, BaseException):
                errors.append(k)
                continue
            if isinstance(res, BaseException):
                errors.append(res)
                continue
            bid, addr = k
            out.extend(Partition(bid, p, addr) for p in range(res.get(topic, 0)))
        if not out and not errors and _NAMEABLE.fullmatch(topic):
            # a broker may create the topic when it is named (``autoCreateTopics``): ask
            # ``stats <topic>`` (MetaQ's per-topic stats; partitions 0 when unknown)
            for bid, addr in (k for k in known if not isinstance(k, BaseException)):
                try:
                    st = parse_stats_dict(await self._request(addr, ("stats", topic)))
                except (BrokerError, ConnectionLostError, RequestTimeoutError):
                    continue  # cannot tell: the topic stays unknown (404 below)
                count = st.get("partitions", 0)
                n = count if isinstance(count, int) else 0
                out.extend(Partition(bid, p, addr) for p in range(n))
        if not out:
            if errors:
                e = errors[0]
                if isinstance(e, ClientError):
                    raise e
                raise ClientError(f"partition discovery failed: {e}") from e
            raise BrokerError(404, f"unknown topic {topic!r}")
        return sorted(out)

    async def _stats_topics(self, address: str) -> dict[str, int]:
        return parse_stats_topics(await self._request(address, ("stats", "topics")))

    async def _request(self, address: str, words: tuple[str, ...]) -> bytes:
        """The body of a 200 answer to the command line ``words`` (else a BrokerError)."""
        conn = await self._pool.get(address)
        try:
            r = await conn.request(lambda o: encode_line(*words, o), self._timeout_s)
        except (ConnectionLostError, RequestTimeoutError):
            self._pool.discard(conn)
            raise
        if r.code != 200:
            raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
        return r.body

    async def close(self) -> None:
        """Nothing to release (connections belong to the pool)."""
        return None


#: a topic a broker may create when named (``autoCreateTopics``): its legal user names
_NAMEABLE: Final = re.compile(r"(?!__)[A-Za-z0-9._-]{1,249}")


async def _raise(e: BaseException) -> dict[str, int]:
    raise e


class TopicRouter:
    """Caches a :class:`BrokerDirectory`'s partition lists for ``ttl_s`` seconds."""

    def __init__(self, directory: BrokerDirectory, ttl_s: float):
        self.directory = directory
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, list[Partition]]] = {}
        self._inflight: dict[str, asyncio.Future[list[Partition]]] = {}
        self._live_of: tuple[BrokerDirectory, LiveBrokerDirectory | None] | None = None

    def _live(self) -> LiveBrokerDirectory | None:
        """The directory when it is live; the (slow, Protocol) isinstance check once per
        directory object, not once per message."""
        d = self.directory
        lo = self._live_of
        if lo is None or lo[0] is not d:
            lo = self._live_of = (d, d if isinstance(d, LiveBrokerDirectory) else None)
        return lo[1]

    def cached(self, topic: str) -> list[Partition] | None:
        """The cached partition list when still fresh (no I/O)."""
        lo = self._live_of  # _live() inline: this runs once per message sent
        live_dir = lo[1] if lo is not None and lo[0] is self.directory else self._live()
        if live_dir is not None:  # configserver
            live = live_dir.current(topic)
            if live is not None:
                return live or None
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


# ---------------------------------------------------------------------------- configserver


class ZkBrokerDirectory:
    """Brokers and partitions from a :class:`configserver.ConfigServer`, kept live.

    Producers read ``topics-pub`` (``subscribe=False``), consumers ``topics-sub``. The first
    :meth:`partitions` call of a topic reads the configserver and arms a watch; every change
    (a broker joins or leaves the topic, its partition count or address changes) re-reads
    it, so :meth:`current` follows the cluster. The list is sorted by (broker id, partition):
    while the set is unchanged, ``crc32(key) % n`` keeps every key on its partition.
    While the configserver is unreachable the last view is kept. ``own_server``: close the
    configserver with the directory. ``pool``: after each read, the failover epoch of every
    broker group in the view that fails over automatically is read and handed to the pool
    (its connections declare it, README "Protocol notes" ``epoch``); a broker answering that
    it is a stale master makes every view be read again.
    """

    def __init__(
        self,
        server: ConfigServer,
        *,
        subscribe: bool = False,
        own_server: bool = False,
        pool: ConnectionPool | None = None,
    ):
        self.server = server
        self._pool = pool
        self._epoch_reads: dict[int, asyncio.Task[None]] = {}
        if pool is not None:
            pool.on_stale = lambda _address: self.rediscover()
        self.subscribe = subscribe
        self._own = own_server
        self._views: dict[str, list[Partition]] = {}
        self._watches: dict[str, Callable[[], None]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        self._stale: set[str] = set()
        self._seen: set[str] = set()  # topics that had partitions once
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self.refreshes = 0

    def current(self, topic: str) -> list[Partition] | None:
        """See :meth:`LiveBrokerDirectory.current`."""
        return self._views.get(topic)

    async def partitions(self, topic: str) -> list[Partition]:
        """See :meth:`BrokerDirectory.partitions`."""
        view = self._views.get(topic)
        if view is None:
            async with self._lock(topic):  # reads of a topic are serialized: last one wins
                if topic not in self._views:
                    await self._read(topic)
            view = self._views.get(topic)
        if not view:
            if topic in self._seen:  # its brokers are gone for now (restarting?): retriable
                raise ConnectionLostError(f"no broker of topic {topic!r} is registered now")
            raise BrokerError(404, f"unknown topic {topic!r}: no broker registered it")
        return view

    async def _read(self, topic: str) -> None:
        watch = self._watches.get(topic)
        if watch is None:
            watch = self._watches[topic] = lambda: self._changed(topic)
        try:
            if not self.server.started:
                await self.server.start()
            infos = await self.server.topic_partitions(
                topic, publish=not self.subscribe, watch=watch
            )
        except ConfigServerUnavailableError as e:
            raise ConnectionLostError(f"configserver unavailable: {e}") from e
        except ConfigServerError as e:
            raise ClientError(f"configserver: {e}") from e
        self.refreshes += 1
        self._views[topic] = view = _to_partitions(infos)
        if infos:
            self._seen.add(topic)
        if self._pool is not None:
            for bid in {p.broker_id for p in view}:
                task = self._epoch_reads.get(bid)
                if task is None or task.done():
                    addrs = sorted({p.address for p in view if p.broker_id == bid})
                    self._epoch_reads[bid] = asyncio.ensure_future(self._read_epoch(bid, addrs))

    async def _read_epoch(self, broker_id: int, addresses: list[str]) -> None:
        """Automatic failover: the group's epoch from ZooKeeper, to the pool."""
        try:
            epoch = await self.server.failover_epoch(broker_id)
        except ConfigServerError as e:
            log.debug("failover epoch of broker %d not read: %s", broker_id, e)
            return
        if epoch is not None and self._pool is not None and not self._closed:
            for a in addresses:
                self._pool.bind_group(a, broker_id, epoch)

    def rediscover(self) -> None:
        """Read every topic's view again (a broker said it is no longer the master)."""
        for topic in list(self._views):
            self._changed(topic)

    def _lock(self, topic: str) -> asyncio.Lock:
        lock = self._locks.get(topic)
        if lock is None:
            lock = self._locks[topic] = asyncio.Lock()
        return lock

    def _changed(self, topic: str) -> None:
        if self._closed:
            return
        self._stale.add(topic)  # a change during a read: read once more after it
        task = self._refreshing.get(topic)
        if task is None or task.done():
            self._refreshing[topic] = asyncio.ensure_future(self._refresh(topic))

    async def _refresh(self, topic: str) -> None:
        backoff = 0.1
        while topic in self._stale and not self._closed:
            self._stale.discard(topic)
            try:
                async with self._lock(topic):
                    await self._read(topic)
                backoff = 0.1
                continue
            except ClientError as e:  # keep the last view meanwhile
                log.debug("configserver view of %s not refreshed: %s", topic, e)
                self._stale.add(topic)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def close(self) -> None:
        """Stop following topics (and close the configserver when owned)."""
        self._closed = True
        for watch in self._watches.values():
            self.server.forget_watch(watch)
        for t in [*self._refreshing.values(), *self._epoch_reads.values()]:
            t.cancel()
        for t in [*self._refreshing.values(), *self._epoch_reads.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._own:
            await self.server.close()


def _to_partitions(infos: Sequence[PartitionInfo]) -> list[Partition]:
    return sorted(Partition(i.broker_id, i.partition, i.address) for i in infos)
