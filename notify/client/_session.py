"""Session factories: own the connections, create producers and consumers.

:class:`AsyncMessageSessionFactory` is the asyncio API (use it on your own event loop).
:class:`MessageSessionFactory` is the synchronous API: it starts a background event-loop
thread, builds the same asyncio core there and waits for each call with
``run_coroutine_threadsafe``; its :class:`Producer` and :class:`Consumer` are thin wrappers.

Cluster mode: ``zk="127.0.0.1:2181/meta"`` (or a :class:`configserver.ConfigServer`)
instead of broker addresses: producers find brokers and partitions in the configserver
(:class:`~._routing.ZkBrokerDirectory`, live), consumers join their group there and
rebalance, and their offsets default to ZooKeeper (MetaQ's ``consumers/<group>/offsets``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypedDict, TypeVar, Unpack

from notify import outbox
from notify.configserver import ConfigServer, ConfigServerError
from notify.errors import ClientError, ConnectionLostError

from ._config import ClientConfig, ConsumerConfig, ProducerConfig
from ._connection import ConnectionPool
from ._consumer import (
    AsyncConsumer,
    ConsumerStats,
    MessageFilter,
    MessageListener,
    next_wait,
    signal_list,
    sigterm_is_default,
    warn_never_started,
)
from ._errors import ClientTransactionError
from ._facade import Closes
from ._halfmsg import TransactionChecker
from ._loopthread import LoopThread
from ._message import Message
from ._producer import AsyncProducer
from ._queue import AsyncQueueConsumer, BatchListener, QueueConsumer, QueueListener
from ._routing import (
    BrokerDirectory,
    Partition,
    StaticBrokerDirectory,
    TopicRouter,
    ZkBrokerDirectory,
)
from ._sync_producer import Producer
from .core.selectors import PartitionSelector
from .offsets import OffsetStore

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from notify.outbox.half import HalfMarkers

    from ._publisher import SessionPublisher

log = logging.getLogger("notify.client")

Brokers = Sequence[str] | Mapping[int, str]
T = TypeVar("T")

class SessionOptions(TypedDict, total=False):
    """The keyword arguments of a session (:func:`connect` and both factories).

    ``config``: the :class:`ClientConfig`; ``partitions``: ``{topic: partitions per
    broker}`` to skip ``stats topics`` discovery; ``directory``: any
    :class:`BrokerDirectory` instead of the static one; ``zk``: a configserver address
    (``"127.0.0.1:2181/meta"``, ``"zookeeper://h1,h2/meta"``) or a
    :class:`configserver.ConfigServer` (cluster mode). ``secret`` and ``tls*`` override the
    same fields of ``config`` (the secret defaults to ``NOTIFY_SECRET``).
    """

    config: ClientConfig | None
    partitions: Mapping[str, int] | None
    directory: BrokerDirectory | None
    zk: str | ConfigServer | None
    secret: str | None
    tls: bool | None
    tls_ca_file: str | None
    tls_verify: bool | None
    tls_cert_file: str | None
    tls_key_file: str | None


#: The options that override fields of the ClientConfig (secret and TLS).
SECURITY_OPTIONS: Final = (
    "secret",
    "tls",
    "tls_ca_file",
    "tls_verify",
    "tls_cert_file",
    "tls_key_file",
)


def session_config(options: SessionOptions) -> ClientConfig:
    """The session's :class:`ClientConfig`: ``config`` (default one) with the given (not
    None) ``secret``/``tls*`` options applied."""
    config = options.get("config") or ClientConfig()
    given: dict[str, Any] = {
        k: v for k in SECURITY_OPTIONS if (v := options.get(k)) is not None
    }
    return dataclasses.replace(config, **given) if given else config


class AsyncMessageSessionFactory:
    """Connections to the brokers plus the producers and consumers using them (asyncio).

    ``brokers``: ``["host:port", ...]`` (broker id = position) or ``{brokerId: "host:port"}``;
    the keyword arguments are :class:`SessionOptions` (``config``, ``partitions``,
    ``directory``, ``zk``, ``secret``, ``tls*``). In cluster mode (``zk``) ``await
    session.start()`` or ``async with`` connects the configserver, else the first use does.
    Use as ``async with AsyncMessageSessionFactory([...]) as session:``; every object it
    created is closed with it.
    """

    def __init__(self, brokers: Brokers | None = None, **options: Unpack[SessionOptions]):
        self.config = session_config(options)
        zk = options.get("zk")
        directory = options.get("directory")
        self.pool = ConnectionPool(
            self.config.connect_timeout_s,
            self.config.reconnect_backoff_min_s,
            self.config.reconnect_backoff_max_s,
            self.config.transport_options(),
            self.config.request_timeout_s,
        )
        # configserver: cluster membership and discovery
        self.cluster: ConfigServer | None = None
        self._own_cluster = False
        if zk is not None:
            if isinstance(zk, ConfigServer):
                self.cluster = zk
            else:
                self.cluster = ConfigServer.from_url(
                    zk, session_timeout_s=self.config.zk_session_timeout_s
                )
                self._own_cluster = True
            if directory is None:
                directory = ZkBrokerDirectory(self.cluster, pool=self.pool)
        if directory is None:
            if brokers is None:
                raise ClientError("give broker addresses, zk= or a BrokerDirectory")
            directory = StaticBrokerDirectory(
                brokers, self.pool, self.config.request_timeout_s, options.get("partitions")
            )
        self.directory = directory
        self.router = TopicRouter(directory, self.config.metadata_ttl_s)
        self._cluster_stores: list[OffsetStore] = []
        self._producers: list[AsyncProducer] = []
        self._consumers: list[AsyncConsumer] = []
        self._queue_consumers: list[AsyncQueueConsumer] = []
        self._closed = False

    async def create_queue_consumer(
        self, topic: str, group: str, credit: int = 100, listener: QueueListener | None = None,
        start: str = "earliest", batch_listener: BatchListener | None = None,
    ) -> AsyncQueueConsumer:
        """A consumer of queue group ``group`` of ``topic``, subscribed on every broker of
        the topic: the brokers push messages (at most ``credit`` unacknowledged per broker)
        and each is acknowledged (the Queues guide). ``start`` places a new group. A
        ``batch_listener`` gets the messages of each pushed frame in one list: its return
        accepts them all, an exception releases them all."""
        self._check_open()
        cluster = self.cluster
        if cluster is not None and cluster.embedded_backend:
            cluster = None  # brokers in other processes cannot see an in-process tree
        elif cluster is not None:
            await self.start()
        c = AsyncQueueConsumer(
            self.router, self.pool.options, topic, group, credit, listener, start, cluster,
            batch_listener,
        )
        self._queue_consumers.append(c)
        await c.start_consuming(self.config.request_timeout_s)
        return c

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

    def create_transactional_producer(
        self, group: str, checker: TransactionChecker | None = None,
        config: ProducerConfig | None = None, selector: PartitionSelector | None = None, *,
        db: Engine | AsyncEngine | HalfMarkers | None = None,
    ) -> AsyncProducer:
        """A producer of the producer group ``group`` for half messages (call on the loop).

        ``checker(msg) -> LocalTxState`` answers the broker's check-backs of the group's
        prepared half messages whose producer did not decide (it died, or answered
        UNKNOWN); it runs on ``config.check_threads`` threads (``async def``: on the loop).
        The producer registers with the brokers at once so check-backs reach it::

            producer = session.create_transactional_producer("shop", checker)
            result = await producer.send_in_transaction("orders", b"o-1", local_tx)

        Or, instead of a checker, ``db=engine`` (a SQLAlchemy engine of a database with the
        outbox's tables, ``notify db upgrade``; or :class:`notify.outbox.HalfMarkers` for
        its settings): ``half_message`` then yields a connection of the engine whose
        transaction commits with the half message's marker, and check-backs are answered
        from the marker table (:mod:`notify.client._halfdb`). An ``AsyncEngine`` yields an
        ``AsyncConnection``::

            producer = session.create_transactional_producer("shop", db=async_engine)
            async with producer.half_message("orders", b"paid 7") as conn:
                await conn.execute(update(accounts).where(accounts.c.id == 7).values(paid=True))
        """
        self._check_open()
        _check_group(group)
        markers = _markers(group, checker, db)
        cfg = dataclasses.replace(config or ProducerConfig(), producer_group=group)
        p = AsyncProducer(self.pool, self.router, self.config, cfg, selector, checker, markers)
        self._producers.append(p)
        p.start_check_backs()
        return p

    def create_consumer(
        self, config: ConsumerConfig | str, offset_store: OffsetStore | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> AsyncConsumer:
        """A pull consumer of a group (``config`` may be just the group name).

        ``offset_store`` defaults to a :class:`FileOffsetStore` under ``config.data_dir``;
        ``executor`` runs plain-callable listeners (default: a pool of
        ``config.listener_threads`` threads).
        """
        self._check_open()
        cfg = ConsumerConfig(group=config) if isinstance(config, str) else config
        if self.cluster is not None and offset_store is None and not cfg.broadcast:
            offset_store = self.cluster.offset_store()  # ZooKeeper: shared by the group
            if offset_store is not None:
                self._cluster_stores.append(offset_store)
        c = AsyncConsumer(
            self.pool, self.router, self.config, cfg, offset_store, executor, self.cluster
        )
        self._consumers.append(c)
        return c

    async def start(self) -> None:
        """Connect to the configserver now (cluster mode; idempotent). Raises
        :class:`~notify.errors.ConnectionLostError` when it cannot be reached in
        ``config.zk_connect_timeout_s``."""
        if self.cluster is None or self.cluster.started:
            return
        try:
            await self.cluster.start(self.config.zk_connect_timeout_s)
        except ConfigServerError as e:
            raise ConnectionLostError(f"configserver: {e}") from e

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
        consumers = [c for c in self._consumers if not c.closed]  # (closed ones warned)
        for c in consumers:
            await c.shutdown(warn=False)
        try:
            await self._close_rest()
        finally:
            warn_never_started(consumers)

    async def _close_rest(self) -> None:
        for q in self._queue_consumers:
            await q.close()
        for p in self._producers:
            await p.close()
        await self.directory.close()
        for s in self._cluster_stores:
            s.close()
        if self.cluster is not None and self._own_cluster:
            await self.cluster.close()
        await self.pool.close()

    async def __aenter__(self) -> AsyncMessageSessionFactory:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


#: Seconds the commit at the end of a ``messages()`` iteration may take.
COMMIT_AT_END_TIMEOUT_S: Final = 10.0


class Consumer(Closes):
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
        self, topic: str, listener: MessageListener | None = None, max_size: int = 1 << 20,
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
        """Iterate ``topic``; each message counts as processed when the next is asked.

        All partitions are polled concurrently; with ``idle_timeout_s`` the iteration ends
        once that long passed without a message (see :meth:`AsyncConsumer.messages`).
        It also ends after :meth:`request_stop` and, while iterated in the main thread,
        on SIGTERM (unless the application set a SIGTERM handler of its own: the default
        one would kill the process). However it ends (also by Ctrl-C, another exception
        or ``break``), what was processed is committed::

            for msg in consumer.messages("orders"):   # `systemctl stop`: the loop ends,
                handle(msg)                           # handled messages are committed
        """
        core = self.core
        last = time.monotonic()
        previous = signal.signal(signal.SIGTERM, self._signalled) if sigterm_is_default() else None
        try:
            while core.iterating:
                wait = next_wait(idle_timeout_s, time.monotonic() - last)
                if wait <= 0:
                    return
                got = self._lt.run(core.next_batch(topic, wait))
                if got is not None:
                    yield from core.handed_out(got)
                    last = time.monotonic()
        finally:
            if previous is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
            self._commit_at_end()

    def _commit_at_end(self) -> None:
        """The commit of an iteration's end: never from the loop thread or while the
        interpreter shuts down (the loop thread may be gone), bounded in time."""
        lt = self._lt
        if lt.in_loop_thread or lt.loop.is_closed() or sys.is_finalizing():
            return
        try:
            lt.run(self.core.commit_quietly(), COMMIT_AT_END_TIMEOUT_S)
        except (ClientError, TimeoutError, concurrent.futures.TimeoutError) as e:
            log.error("offset commit of group %s at the end of messages(): %s", self.group, e)

    def commit(self) -> None:
        """Store offsets of everything handled so far."""
        self._lt.run(self.core.commit())

    def seek(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None = None, *,
        offset: int | str | None = None, timestamp: float | datetime | None = None,
    ) -> dict[str, int]:
        """Move to ``offset`` (bytes, ``"earliest"``, ``"latest"``) or to the first message
        at or after ``timestamp``; see :meth:`AsyncConsumer.seek`::

            consumer.seek("orders", offset="earliest")                   # replay everything
            consumer.seek("orders", "0-1", timestamp=time.time() - 3600)  # the last hour
        """
        return self._lt.run(
            self.core.seek(topic, partitions, offset=offset, timestamp=timestamp)
        )

    def pause(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None = None
    ) -> None:
        """Stop fetching ``partitions`` of ``topic`` (default all) until :meth:`resume`."""
        self._on_loop(lambda: self.core.pause(topic, partitions))

    def resume(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None = None
    ) -> None:
        """Fetch paused partitions of ``topic`` again (default all)."""
        self._on_loop(lambda: self.core.resume(topic, partitions))

    def paused(self, topic: str | None = None) -> list[str]:
        """The paused partitions, as ``"<brokerId>-<part>"``."""
        return self.core.paused(topic)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        async def call() -> None:
            fn()

        self._lt.run(call())

    def request_stop(self) -> None:
        """Make :meth:`run` return after a clean shutdown and end :meth:`messages`
        iterations (thread-safe; safe in signal handlers)."""
        self.core.stop_requested = True
        self._lt.loop.call_soon_threadsafe(self.core.request_stop)

    def run(self, timeout_s: float | None = None, signals: Iterable[int] | None = None) -> None:
        """Block consuming with the subscribed listeners until SIGTERM/SIGINT (``signals``),
        :meth:`request_stop` or ``timeout_s``; then shut down cleanly (running listeners
        finish, offsets are committed) and return::

            consumer.subscribe("orders", handle)
            consumer.run()          # e.g. under systemd: `systemctl stop` commits and exits

        Signal handlers are installed only when called from the main thread, and the
        previous ones are restored on return.
        """
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signal_list(signals):
                previous[sig] = signal.signal(sig, self._signalled)
        try:
            self._lt.run(self.core.run(timeout_s, signals=()))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    run_forever = run

    def _signalled(self, sig: int, _frame: object) -> None:
        log.info("consumer %s: signal %d, shutting down", self.core.group, sig)
        self.request_stop()

    def recover_now(self) -> int:
        """Run one recover-store re-delivery round now."""
        return self._lt.run(self.core.recover_now())

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop, commit offsets and release resources."""
        self._lt.run(self.core.shutdown(timeout_s))

    close = shutdown



class MessageSessionFactory(Closes):
    """Synchronous session factory (MetaQ's MessageSessionFactory).

    Same arguments as :class:`AsyncMessageSessionFactory`; runs the asyncio core on a
    background event-loop thread. Use as a context manager or call :meth:`close`.
    """

    def __init__(self, brokers: Brokers | None = None, **options: Unpack[SessionOptions]):
        cfg = session_config(options)
        self._lt = LoopThread(cfg.use_uvloop)

        async def build() -> AsyncMessageSessionFactory:
            core = AsyncMessageSessionFactory(brokers, **options)
            try:
                await core.start()
            except BaseException:
                await core.close()
                raise
            return core

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
        core = self.core.create_producer(config, selector)
        return Producer(core, self._lt, self.core.pool)

    def create_transactional_producer(
        self, group: str, checker: TransactionChecker | None = None,
        config: ProducerConfig | None = None, selector: PartitionSelector | None = None, *,
        db: Engine | AsyncEngine | HalfMarkers | None = None,
    ) -> Producer:
        """A synchronous producer of producer group ``group`` for half messages.

        ``checker(msg) -> LocalTxState`` answers check-backs, on a pool of
        ``config.check_threads`` threads (see
        :meth:`AsyncMessageSessionFactory.create_transactional_producer`)::

            def checker(msg: Message) -> LocalTxState:
                return LocalTxState.COMMIT if db.has_order(msg.data) else LocalTxState.ROLLBACK

            producer = session.create_transactional_producer("shop", checker)

        Or ``db=engine`` instead of a checker: no checker to write (see
        :mod:`notify.client._halfdb`)::

            producer = session.create_transactional_producer("shop", db=engine)
            with producer.half_message("orders", b"paid 7") as conn:
                conn.execute(update(accounts).where(accounts.c.id == 7).values(paid=True))
        """
        core = self.core
        _check_group(group)
        markers = _markers(group, checker, db)
        if markers is not None and markers.async_engine is not None:
            raise ClientTransactionError(
                "db=: the blocking producer's half_message runs on a blocking Engine, not an "
                "AsyncEngine: make the producer from an AsyncMessageSessionFactory"
            )

        async def make() -> AsyncProducer:
            return core.create_transactional_producer(
                group, checker, config, selector, db=markers
            )

        return Producer(self._lt.run(make()), self._lt, self.core.pool)

    def create_consumer(
        self, config: ConsumerConfig | str, offset_store: OffsetStore | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> Consumer:
        """A synchronous consumer (see :meth:`AsyncMessageSessionFactory.create_consumer`)."""
        return Consumer(self.core.create_consumer(config, offset_store, executor), self._lt)

    def partitions(self, topic: str) -> list[Partition]:
        """The global partitions of ``topic``."""
        return self._lt.run(self.core.partitions(topic))

    def publisher(self) -> SessionPublisher:
        """The transactional outbox's publisher over this session: the relay's way to the
        brokers (``outbox.relay(session)`` takes it; see :mod:`notify.outbox`)."""
        self.core._check_open()
        # the outbox (SQLAlchemy, the database drivers) is loaded only here: brokers (whose
        # replication uses the client's transport) and plain clients never load it
        from ._publisher import SessionPublisher

        timeout = self.core.config.request_timeout_s
        return SessionPublisher(self.core.router, self._lt, self.core.pool, timeout)

    def create_queue_consumer(
        self, topic: str, group: str, credit: int = 100, listener: QueueListener | None = None,
        start: str = "earliest", batch_listener: BatchListener | None = None,
    ) -> QueueConsumer:
        """A synchronous queue consumer (see
        :meth:`AsyncMessageSessionFactory.create_queue_consumer`); a plain ``listener``
        (or ``batch_listener``) runs on threads, its return accepts the message (the batch)
        and an exception releases it."""
        core = self.core.create_queue_consumer(
            topic, group, credit, listener, start, batch_listener
        )
        return QueueConsumer(self._lt.run(core), self._lt)

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



def _markers(
    group: str, checker: TransactionChecker | None, db: Engine | AsyncEngine | HalfMarkers | None
) -> HalfMarkers | None:
    """The group's marker table for ``db=`` (None with a checker); exactly one of them."""
    if (checker is None) == (db is None):
        raise ClientTransactionError(
            "a transactional producer needs a checker or db=engine (one of them): the "
            "broker's check-backs are answered by one or the other"
        )
    if db is None:
        return None
    # notify.outbox loads a module (and the database drivers) on its first use: here
    if isinstance(db, outbox.HalfMarkers):
        if db.group != group:
            raise ClientTransactionError(f"HalfMarkers of group {db.group!r}, not {group!r}")
        return db
    try:
        return outbox.HalfMarkers(db, group)
    except outbox.OutboxError as e:
        raise ClientTransactionError(f"db=: {e}") from e


def _check_group(group: str) -> None:
    if not group or any(c.isspace() for c in group):
        raise ClientError(f"invalid producer group {group!r}: a non-empty word")


def connect(
    brokers: Brokers | None = None, **options: Unpack[SessionOptions]
) -> MessageSessionFactory:
    """Open a synchronous session: ``with connect(["127.0.0.1:8123"]) as session: ...``,
    or in a cluster ``with connect(zk="127.0.0.1:2181/meta") as session: ...`` (brokers and
    partitions from ZooKeeper, consumer groups rebalanced there).

    The keyword arguments are :class:`SessionOptions`. ``secret`` (default: the
    ``NOTIFY_SECRET`` environment variable) authenticates every connection to brokers that
    set ``authSecret``; ``tls*`` turn on TLS (see :class:`ClientConfig`). Given here they
    override the same fields of ``config``."""
    return MessageSessionFactory(brokers, **options)
