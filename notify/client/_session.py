"""Session factories: own the connections, create producers and consumers.

:class:`AsyncMessageSessionFactory` is the asyncio API (use it on your own event loop).
:class:`MessageSessionFactory` is the synchronous API: it starts a background event-loop
thread, builds the same asyncio core there and waits for each call with
``run_coroutine_threadsafe``; its :class:`Producer` and :class:`Consumer` are thin wrappers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from notify.errors import ClientError

from ._config import ClientConfig, ConsumerConfig, ProducerConfig
from ._connection import ConnectionPool
from ._consumer import AsyncConsumer, ConsumerStats, MessageFilter, MessageListener
from ._loopthread import LoopThread
from ._message import Message, SendResult
from ._offsets import OffsetStore
from ._producer import AsyncProducer
from ._routing import BrokerDirectory, Partition, StaticBrokerDirectory, TopicRouter
from ._selectors import PartitionSelector

Brokers = Sequence[str] | Mapping[int, str]


class AsyncMessageSessionFactory:
    """Connections to the brokers plus the producers and consumers using them (asyncio).

    ``brokers``: ``["host:port", ...]`` (broker id = position) or ``{brokerId: "host:port"}``.
    ``partitions``: ``{topic: partitions per broker}`` to skip ``stats topics`` discovery.
    ``directory``: any :class:`BrokerDirectory` instead of the static one. Use as
    ``async with AsyncMessageSessionFactory([...]) as session:``; every object it created
    is closed with it.
    """

    def __init__(
        self,
        brokers: Brokers | None = None,
        *,
        config: ClientConfig | None = None,
        partitions: Mapping[str, int] | None = None,
        directory: BrokerDirectory | None = None,
    ):
        self.config = config or ClientConfig()
        self.pool = ConnectionPool(
            self.config.connect_timeout_s,
            self.config.reconnect_backoff_min_s,
            self.config.reconnect_backoff_max_s,
        )
        if directory is None:
            if brokers is None:
                raise ClientError("give broker addresses or a BrokerDirectory")
            directory = StaticBrokerDirectory(
                brokers, self.pool, self.config.request_timeout_s, partitions
            )
        self.directory = directory
        self.router = TopicRouter(directory, self.config.metadata_ttl_s)
        self._producers: list[AsyncProducer] = []
        self._consumers: list[AsyncConsumer] = []
        self._closed = False

    def create_producer(
        self,
        config: ProducerConfig | None = None,
        selector: PartitionSelector | None = None,
    ) -> AsyncProducer:
        """A producer; ``selector`` picks partitions (default round robin)."""
        self._check_open()
        p = AsyncProducer(self.pool, self.router, self.config, config or ProducerConfig(), selector)
        self._producers.append(p)
        return p

    def create_consumer(
        self,
        config: ConsumerConfig | str,
        offset_store: OffsetStore | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> AsyncConsumer:
        """A pull consumer of a group (``config`` may be just the group name).

        ``offset_store`` defaults to a :class:`FileOffsetStore` under ``config.data_dir``;
        ``executor`` runs plain-callable listeners (default: a pool of
        ``config.listener_threads`` threads).
        """
        self._check_open()
        cfg = ConsumerConfig(group=config) if isinstance(config, str) else config
        c = AsyncConsumer(self.pool, self.router, self.config, cfg, offset_store, executor)
        self._consumers.append(c)
        return c

    async def partitions(self, topic: str) -> list[Partition]:
        """The global partitions of ``topic``."""
        return await self.router.partitions(topic)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError("session is closed")

    async def close(self) -> None:
        """Shut down consumers, flush and close producers, close connections."""
        if self._closed:
            return
        self._closed = True
        for c in self._consumers:
            await c.shutdown()
        for p in self._producers:
            await p.close()
        await self.directory.close()
        await self.pool.close()

    async def __aenter__(self) -> AsyncMessageSessionFactory:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Producer:
    """Synchronous producer over the asyncio core (thread-safe).

    ``send`` blocks until the broker acknowledged (or the send failed: ``success`` False);
    ``send_future`` returns at once with a ``concurrent.futures.Future``; messages sent from
    one thread to one partition keep their order either way.
    """

    def __init__(self, core: AsyncProducer, lt: LoopThread):
        self.core = core
        self._lt = lt

    def send(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Send one message and wait for its :class:`SendResult`."""
        return self.send_future(topic, data, attribute, key).result(timeout_s)

    def send_future(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message; the future resolves to its :class:`SendResult`."""
        core = self.core
        return self._lt.call(lambda: core.send_nowait(topic, data, attribute, key))

    async def send_async(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
    ) -> SendResult:
        """Awaitable send usable from any event loop."""
        return await asyncio.wrap_future(self.send_future(topic, data, attribute, key))

    def publish(self, topic: str) -> list[Partition]:
        """Look up and cache the partitions of ``topic``."""
        return self._lt.run(self.core.publish(topic))

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued message has its result."""
        self._lt.run(self.core.flush(), timeout_s)

    def close(self) -> None:
        """Flush and stop the producer."""
        self._lt.run(self.core.close())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """Synchronous pull consumer over the asyncio core."""

    def __init__(self, core: AsyncConsumer, lt: LoopThread):
        self.core = core
        self._lt = lt

    @property
    def group(self) -> str:
        """The group used on the wire (``<group>-<instanceId>`` in broadcast mode)."""
        return self.core.group

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the consumer's counters."""
        return self.core.stats

    def subscribe(
        self,
        topic: str,
        listener: MessageListener | None = None,
        max_size: int = 1 << 20,
        filter: MessageFilter | None = None,
    ) -> Consumer:
        """See :meth:`AsyncConsumer.subscribe`; returns self."""
        self.core.subscribe(topic, listener, max_size, filter)
        return self

    def complete_subscribe(self) -> None:
        """Start consuming the subscribed topics."""
        self._lt.run(self.core.complete_subscribe())

    start = complete_subscribe

    def fetch(self, topic: str, max_wait_s: float = 1.0) -> list[Message]:
        """See :meth:`AsyncConsumer.fetch`."""
        return self._lt.run(self.core.fetch(topic, max_wait_s))

    def messages(self, topic: str, idle_timeout_s: float | None = None) -> Iterator[Message]:
        """Iterate ``topic``; each message counts as processed when the next is asked."""
        last_msg = time.monotonic()
        while not self.core._closed:
            batch = self.fetch(topic, max_wait_s=0.5)
            if not batch:
                if idle_timeout_s is not None and time.monotonic() - last_msg >= idle_timeout_s:
                    return
                continue
            last_msg = time.monotonic()
            yield from batch

    def commit(self) -> None:
        """Store offsets of everything handled so far."""
        self._lt.run(self.core.commit())

    def recover_now(self) -> int:
        """Run one recover-store re-delivery round now."""
        return self._lt.run(self.core.recover_now())

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop, commit offsets and release resources."""
        self._lt.run(self.core.shutdown(timeout_s))

    close = shutdown

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class MessageSessionFactory:
    """Synchronous session factory (MetaQ's MessageSessionFactory).

    Same arguments as :class:`AsyncMessageSessionFactory`; runs the asyncio core on a
    background event-loop thread. Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        brokers: Brokers | None = None,
        *,
        config: ClientConfig | None = None,
        partitions: Mapping[str, int] | None = None,
        directory: BrokerDirectory | None = None,
    ):
        cfg = config or ClientConfig()
        self._lt = LoopThread(cfg.use_uvloop)

        async def build() -> AsyncMessageSessionFactory:
            return AsyncMessageSessionFactory(
                brokers, config=cfg, partitions=partitions, directory=directory
            )

        try:
            self.core = self._lt.run(build())
        except BaseException:
            self._lt.stop()
            raise
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The background event loop running the core."""
        return self._lt.loop

    def create_producer(
        self,
        config: ProducerConfig | None = None,
        selector: PartitionSelector | None = None,
    ) -> Producer:
        """A synchronous producer (see :meth:`AsyncMessageSessionFactory.create_producer`)."""
        return Producer(self.core.create_producer(config, selector), self._lt)

    def create_consumer(
        self,
        config: ConsumerConfig | str,
        offset_store: OffsetStore | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> Consumer:
        """A synchronous consumer (see :meth:`AsyncMessageSessionFactory.create_consumer`)."""
        return Consumer(self.core.create_consumer(config, offset_store, executor), self._lt)

    def partitions(self, topic: str) -> list[Partition]:
        """The global partitions of ``topic``."""
        return self._lt.run(self.core.partitions(topic))

    def run(self, coro: Any, timeout_s: float | None = None) -> Any:
        """Run a coroutine on the session's loop (to use the asyncio objects directly)."""
        return self._lt.run(coro, timeout_s)

    def close(self) -> None:
        """Close everything the factory created and stop its loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self.core.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> MessageSessionFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    brokers: Brokers,
    *,
    config: ClientConfig | None = None,
    partitions: Mapping[str, int] | None = None,
) -> MessageSessionFactory:
    """Open a synchronous session: ``with connect(["127.0.0.1:8123"]) as session: ...``."""
    return MessageSessionFactory(brokers, config=config, partitions=partitions)
