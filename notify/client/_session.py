"""Session factories: own the connections, create producers and consumers.

:class:`AsyncMessageSessionFactory` is the asyncio API (use it on your own event loop).
:class:`MessageSessionFactory` is the synchronous API: it starts a background event-loop
thread, builds the same asyncio core there and waits for each call with
``run_coroutine_threadsafe``; its :class:`Producer` and :class:`Consumer` are thin wrappers.

Cluster mode (issue #7): ``zk="127.0.0.1:2181/meta"`` (or a :class:`configserver.ConfigServer`)
instead of broker addresses: producers find brokers and partitions in the configserver
(:class:`~._routing.ZkBrokerDirectory`, live), consumers join their group there and
rebalance, and their offsets default to ZooKeeper (MetaQ's ``consumers/<group>/offsets``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

from configserver import ConfigServer, ConfigServerError
from notify.errors import ClientError, ConnectionLostError

from ._config import ClientConfig, ConsumerConfig, ProducerConfig
from ._connection import ConnectionPool
from ._consumer import (
    AsyncConsumer,
    ConsumerStats,
    MessageFilter,
    MessageListener,
    signal_list,
)
from ._direct import DirectPool, send_direct
from ._directtx import DirectTransaction, direct_eligible
from ._errors import ClientTransactionError
from ._loopthread import LoopThread, ThreadFuture
from ._message import BatchSendResult, Headers, Message, PostFailure, SendResult
from ._producer import AsyncProducer
from ._publisher import SessionPublisher
from ._queue import AsyncQueueConsumer, BatchListener, QueueConsumer, QueueListener
from ._routing import (
    BrokerDirectory,
    Partition,
    StaticBrokerDirectory,
    TopicRouter,
    ZkBrokerDirectory,
)
from ._selectors import PartitionSelector
from ._transaction import (
    LocalTransaction,
    Transaction,
    TransactionChecker,
    TransactionSendResult,
    as_state,
)
from .offsets import OffsetStore

log = logging.getLogger("notify.client")

Brokers = Sequence[str] | Mapping[int, str]
T = TypeVar("T")

def with_security(config: ClientConfig, overrides: Mapping[str, Any]) -> ClientConfig:
    """``config`` with the given (not None) ``secret``/``tls*`` keyword arguments applied."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(config, **given) if given else config


class AsyncMessageSessionFactory:
    """Connections to the brokers plus the producers and consumers using them (asyncio).

    ``brokers``: ``["host:port", ...]`` (broker id = position) or ``{brokerId: "host:port"}``.
    ``partitions``: ``{topic: partitions per broker}`` to skip ``stats topics`` discovery.
    ``directory``: any :class:`BrokerDirectory` instead of the static one. ``secret`` and
    ``tls*`` override the same fields of ``config`` (see :class:`ClientConfig`; the secret
    defaults to ``NOTIFY_SECRET``). ``zk``: a
    configserver address (``"127.0.0.1:2181/meta"``, ``"zookeeper://h1,h2/meta"``) or a
    :class:`configserver.ConfigServer` (cluster mode; ``await session.start()`` or ``async
    with`` connects it, else the first use does). Use as ``async with
    AsyncMessageSessionFactory([...]) as session:``; every object it created is closed with it.
    """

    def __init__(
        self,
        brokers: Brokers | None = None,
        *,
        config: ClientConfig | None = None,
        partitions: Mapping[str, int] | None = None,
        directory: BrokerDirectory | None = None,
        zk: str | ConfigServer | None = None,
        secret: str | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_verify: bool | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
    ):
        security = {
            "secret": secret,
            "tls": tls,
            "tls_ca_file": tls_ca_file,
            "tls_verify": tls_verify,
            "tls_cert_file": tls_cert_file,
            "tls_key_file": tls_key_file,
        }
        self.config = with_security(config or ClientConfig(), security)
        self.pool = ConnectionPool(
            self.config.connect_timeout_s,
            self.config.reconnect_backoff_min_s,
            self.config.reconnect_backoff_max_s,
            self.config.transport_options(),
        )
        # configserver (issue #7): cluster membership and discovery
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
                brokers, self.pool, self.config.request_timeout_s, partitions
            )
        self.directory = directory
        self.router = TopicRouter(directory, self.config.metadata_ttl_s)
        self._cluster_stores: list[OffsetStore] = []
        self._producers: list[AsyncProducer] = []
        self._consumers: list[AsyncConsumer] = []
        self._queue_consumers: list[AsyncQueueConsumer] = []
        self._closed = False

    async def create_queue_consumer(
        self,
        topic: str,
        group: str,
        credit: int = 100,
        listener: QueueListener | None = None,
        start: str = "earliest",
        batch_listener: BatchListener | None = None,
    ) -> AsyncQueueConsumer:
        """A consumer of queue group ``group`` of ``topic``, subscribed on every broker of
        the topic: the brokers push messages (at most ``credit`` unacknowledged per broker)
        and each is acknowledged (README "Queues"). ``start`` places a new group. A
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
        self,
        group: str,
        checker: TransactionChecker,
        config: ProducerConfig | None = None,
        selector: PartitionSelector | None = None,
    ) -> AsyncProducer:
        """A producer of the producer group ``group`` for half messages (call on the loop).

        ``checker(msg) -> LocalTxState`` answers the broker's check-backs of the group's
        prepared half messages whose producer did not decide (it died, or answered
        UNKNOWN); it runs on ``config.check_threads`` threads (``async def``: on the loop).
        The producer registers with the brokers at once so check-backs reach it::

            producer = session.create_transactional_producer("shop", checker)
            result = await producer.send_in_transaction("orders", b"o-1", local_tx)
        """
        self._check_open()
        _check_group(group)
        cfg = dataclasses.replace(config or ProducerConfig(), producer_group=group)
        p = AsyncProducer(self.pool, self.router, self.config, cfg, selector, checker)
        self._producers.append(p)
        p.start_check_backs()
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
        for c in self._consumers:
            await c.shutdown()
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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


#: a blocking-API post waiting for the loop: (topic, data, attribute, key, headers)
_Posted = tuple[str, bytes, str | None, bytes | str | None, Headers | None]


def _retrieve_thread(f: concurrent.futures.Future[Any]) -> None:
    """Mark a posted message's future (inside a transaction) as seen: its failure is
    the transaction's."""
    if not f.cancelled():
        f.exception()


def _gather_sync(
    futs: list[concurrent.futures.Future[SendResult]],
) -> concurrent.futures.Future[BatchSendResult]:
    """One batch result for messages sent one by one (inside a transaction)."""
    out: concurrent.futures.Future[BatchSendResult] = concurrent.futures.Future()
    left = [len(futs)]
    lock = threading.Lock()

    def done(_f: concurrent.futures.Future[SendResult]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            results = [f.result() for f in futs]
        except BaseException as e:
            out.set_exception(e)
            return
        ok = [r for r in results if r.success]
        bad = next((r.error for r in results if not r.success), None)
        part = results[0].partition if results else None
        ids = [r.msg_id for r in ok]
        offs = [r.offset for r in ok]
        out.set_result(BatchSendResult(bad is None, part, ids, offs, error=bad))

    if not futs:
        out.set_result(BatchSendResult(True, None))
    for f in futs:
        f.add_done_callback(done)
    return out


class Producer:
    """Synchronous producer over the asyncio core (thread-safe).

    ``send`` blocks until the broker acknowledged (or the send failed: ``success`` False);
    ``send_future`` returns at once with a ``concurrent.futures.Future``; messages sent from
    one thread to one partition keep their order either way.

    Transactions are per producer and per thread: between :meth:`begin_transaction` (or
    ``with producer.transaction():``) and its commit/rollback, ``send`` from that thread
    joins the transaction; other threads are not affected::

        with producer.transaction(timeout=10):
            producer.send("orders", b"o-1")
            producer.send("audit", b"o-1 created")
    """

    def __init__(
        self,
        core: AsyncProducer,
        lt: LoopThread,
        direct: DirectPool | None = None,
        direct_tx: DirectPool | None = None,
    ):
        self.core = core
        self._lt = lt
        self._thread_tx: dict[int, Transaction] = {}
        self._tx_lock = threading.Lock()
        #: ``send()`` goes over the calling thread's own socket while this is 0 (_direct).
        self._direct = direct
        #: transactions go over the calling thread's own socket (_directtx) when eligible
        self._direct_tx = direct_tx if direct_tx is not None and direct_eligible(core) else None
        self._in_flight = 0  # batch futures not done yet
        self._in_flight_lock = threading.Lock()
        #: one entry per send_future() not yet queued in the core (then core.outstanding
        #: counts it): deque append/pop are atomic, no lock per message
        self._posted: collections.deque[None] = collections.deque()
        #: post(): messages not handed to the core yet, and whether a drain is scheduled
        self._post_buf: list[_Posted] = []
        self._post_wake = False
        self._post_lock = threading.Lock()

    def send(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout_s: float | None = None,
        *,
        headers: Headers | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> SendResult:
        """Send one message and wait for its :class:`SendResult` (see
        :meth:`AsyncProducer.send`: failures, ``raise_on_error``, ``key`` and typed
        ``headers`` kept on the message, ``delay``/``deliver_at``).

        When none of the producer's messages is in flight the message goes straight over
        a socket of the calling thread (no hop to the loop thread; see ``_direct``)."""
        if delay is not None or deliver_at is not None:
            return self._lt.run(
                self.core.send_delayed(
                    topic, data, delay, deliver_at, attribute, key, headers=headers
                ),
                timeout_s,
            )
        if (
            self._direct is not None
            and not self._in_flight
            and not self._posted
            and not self.core.outstanding
            and self.current_transaction() is None
        ):
            core, direct = self.core, self._direct
            r = send_direct(core, direct, topic, data, attribute, key, headers, timeout_s)
            if r is not None:
                return core._checked(r)
        return self.send_future(topic, data, attribute, key, headers=headers).result(timeout_s)

    def send_future(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message; the future resolves to its :class:`SendResult`.

        Joins this thread's transaction when one is open."""
        tx = self.current_transaction()
        if tx is not None:
            return tx.send_future(topic, data, attribute, key, headers=headers)
        self._seal_posts()
        out: ThreadFuture[SendResult] = ThreadFuture()
        posted = self._posted
        posted.append(None)  # until the core counts it (core.outstanding); atomic, no lock
        try:
            self._lt.post(
                functools.partial(self._send_into, out, topic, data, attribute, key, headers),
                out,
            )
        except BaseException:
            posted.pop()
            raise
        return out

    def post(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> None:
        """Queue one message without a future (see :meth:`AsyncProducer.post`): the
        calling thread appends it to a buffer the loop thread drains, one wake-up per
        burst instead of a hop per message. Results: :attr:`posts_acked`,
        :attr:`posts_failed`, :meth:`post_failures`; :meth:`flush` waits for all. Order
        per partition is kept with this thread's other sends. Joins this thread's
        transaction when one is open."""
        tx = self.current_transaction()
        if tx is not None:
            tx.send_future(topic, data, attribute, key, headers=headers).add_done_callback(
                _retrieve_thread
            )
            return
        if type(data) is not bytes and not isinstance(data, bytes | bytearray | memoryview):
            raise ClientError(f"message data must be bytes, not {type(data).__name__}")
        self._posted.append(None)  # send() takes the loop's way until the core has these
        with self._post_lock:
            buf = self._post_buf
            buf.append((topic, data, attribute, key, headers))
            if self._post_wake:
                return
            self._post_wake = True
        try:
            self._lt.post(functools.partial(self._drain_posts, buf), ThreadFuture())
        except BaseException:
            with self._post_lock:
                if self._post_buf is buf:
                    self._post_buf, self._post_wake = [], False
            for _ in buf:
                self._posted.pop()
            raise

    def _seal_posts(self) -> None:
        """A send queued on the loop after posts: later posts go in a new buffer drained
        after it (the pending drain takes only the posts made before it)."""
        if self._post_wake:
            with self._post_lock:
                if self._post_wake:
                    self._post_buf, self._post_wake = [], False

    def _drain_posts(self, items: list[_Posted]) -> None:
        """On the loop: hand one buffer of posts to the core, in order."""
        with self._post_lock:
            if self._post_buf is items:
                self._post_buf, self._post_wake = [], False
        core = self.core
        posted = self._posted
        for topic, data, attribute, key, headers in items:
            try:
                core.post(topic, data, attribute, key, headers=headers)
            except ClientError as e:  # closed meanwhile: a failure, not lost silently
                core.post_failed(topic, bytes(data), e)
            finally:
                posted.pop()

    @property
    def posts_acked(self) -> int:
        """Messages of :meth:`post` stored so far."""
        return self.core.posts_acked

    @property
    def posts_failed(self) -> int:
        """Messages of :meth:`post` not stored (after the retries) so far."""
        return self.core.posts_failed

    def post_failures(self) -> list[PostFailure]:
        """Take the kept failures of :meth:`post` (see :meth:`AsyncProducer.post_failures`)."""
        return self.core.post_failures()

    @property
    def outstanding(self) -> int:
        """Messages queued (also those posted and not yet handed to the loop) or in flight."""
        return self.core.outstanding + len(self._posted)

    def _send_into(
        self,
        out: ThreadFuture[SendResult],
        topic: str,
        data: bytes,
        attribute: str | None,
        key: bytes | str | None,
        headers: Headers | None,
    ) -> None:
        """On the loop: queue the message in the core, which resolves ``out`` itself."""
        try:
            self.core.send_into(out, topic, data, attribute, key, headers)
        finally:
            self._posted.pop()

    def send_batch(
        self,
        topic: str,
        datas: Sequence[bytes],
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout_s: float | None = None,
    ) -> BatchSendResult:
        """Send many messages to one partition and wait for their one
        :class:`BatchSendResult` (see :meth:`AsyncProducer.send_batch_nowait`)."""
        return self.send_batch_future(topic, datas, attribute, key).result(timeout_s)

    def send_batch_future(
        self,
        topic: str,
        datas: Sequence[bytes],
        attribute: str | None = None,
        key: bytes | str | None = None,
    ) -> concurrent.futures.Future[BatchSendResult]:
        """Queue many messages for one partition; one future for all of them.

        One hop to the client's loop thread for the whole batch. Joins this thread's
        transaction when one is open (the messages then go one by one)."""
        tx = self.current_transaction()
        if tx is not None:
            futs = [tx.send_future(topic, d, attribute, key) for d in datas]
            return _gather_sync(futs)
        core = self.core
        self._seal_posts()
        return self._track(
            lambda: self._lt.call(lambda: core.send_batch_nowait(topic, datas, attribute, key))
        )

    def _track(
        self, call: Callable[[], concurrent.futures.Future[T]]
    ) -> concurrent.futures.Future[T]:
        """``call()``, counted in flight until its future is done (the direct path of
        ``send()`` waits for none, so messages of one thread stay in order)."""
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            fut = call()
        except BaseException:
            self._untrack(None)
            raise
        fut.add_done_callback(self._untrack)
        return fut

    def _untrack(self, _fut: object) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1

    @property
    def session_id(self) -> str:
        """The producer's id in its transaction keys ``TX:<session_id>:<n>``."""
        return self.core.session_id

    @property
    def producer_id(self) -> str | None:
        """The idempotent producer's id (``ProducerConfig(idempotent=True)``), else None."""
        return self.core.producer_id

    def transaction(self, timeout: float | None = None) -> Transaction:
        """Begin a local transaction for a ``with`` block (commit on exit, rollback on
        error); same as :meth:`begin_transaction`.

        ::

            with producer.transaction(timeout=10) as tx:
                producer.send("orders", b"o-1")
                producer.send("audit", b"o-1 created")
            print(tx.status)   # "committed"
        """
        return self.begin_transaction(timeout)

    def begin_transaction(self, timeout: float | None = None) -> Transaction:
        """Begin a local transaction, current for this thread until commit or rollback.

        ``timeout`` in seconds (the broker caps it at ``maxTxTimeoutInSeconds``; None: the
        cap). Raises :class:`ClientTransactionError` when this thread already has one open
        on this producer. See :class:`~notify.client.AsyncTransaction` for the semantics::

            tx = producer.begin_transaction(timeout=10)
            try:
                producer.send("orders", b"o-1")
                tx.commit()
            except Exception:
                tx.rollback()
                raise
        """
        cur = self.current_transaction()
        if cur is not None:
            raise ClientTransactionError(
                f"transaction {cur.key} is still open on this thread: transactions of one "
                "producer do not nest",
                cur.key,
            )
        core = self.core._new_transaction(timeout)
        if self._direct_tx is not None:
            tx: Transaction = DirectTransaction(
                core, self._lt, self.core, self._direct_tx, self._tx_finished
            )
        else:
            tx = Transaction(core, self._lt, self._tx_finished)
        with self._tx_lock:
            self._thread_tx[tx.thread_id] = tx
        return tx

    def current_transaction(self) -> Transaction | None:
        """This thread's open transaction on this producer, if any."""
        tx = self._thread_tx.get(threading.get_ident())
        return tx if tx is not None and not tx.finished else None

    def _tx_finished(self, tx: Transaction) -> None:
        with self._tx_lock:
            if self._thread_tx.get(tx.thread_id) is tx:
                del self._thread_tx[tx.thread_id]

    def send_in_transaction(
        self,
        topic: str,
        data: bytes,
        local_tx: LocalTransaction,
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout: float | None = None,
        *,
        headers: Headers | None = None,
    ) -> TransactionSendResult:
        """Send a half message, run ``local_tx(msg)`` in this thread, then commit or roll
        back the message as it answers (needs a producer group).

        ::

            def local_tx(msg: Message) -> LocalTxState:
                with db.begin():
                    db.insert_order(msg.data)
                return LocalTxState.COMMIT

            producer = session.create_transactional_producer("shop", checker)
            result = producer.send_in_transaction("orders", b"o-1", local_tx)
            assert result.state is LocalTxState.COMMIT

        UNKNOWN (or an exception from ``local_tx``, which propagates) leaves the decision
        to the broker's check-back. See :meth:`AsyncProducer.send_in_transaction`.
        """
        core = self.core
        half = self._lt.run(core._send_half(topic, data, attribute, key, timeout, headers))
        try:
            res: object = local_tx(half.message)
        except BaseException as e:
            log.warning(
                "local transaction of %s raised %r: UNKNOWN, left to check-back", half.tx_key, e
            )
            raise
        if asyncio.iscoroutine(res):
            res.close()
            raise ClientTransactionError(
                "local_tx of the synchronous producer must not be async", half.tx_key
            )
        state = as_state(res, half.tx_key)
        err = self._lt.run(core._end_half(half, state))
        return TransactionSendResult(half.tx_key, state, half.result, err)

    def send_delayed(
        self,
        topic: str,
        data: bytes,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout_s: float | None = None,
        *,
        headers: Headers | None = None,
    ) -> SendResult:
        """A message visible no earlier than ``delay`` s from now or at ``deliver_at``
        (aware datetime or Unix seconds); see :meth:`AsyncProducer.send_delayed`."""
        return self._lt.run(
            self.core.send_delayed(
                topic, data, delay, deliver_at, attribute, key, headers=headers
            ),
            timeout_s,
        )

    async def send_async(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> SendResult:
        """Awaitable send usable from any event loop."""
        return await asyncio.wrap_future(
            self.send_future(topic, data, attribute, key, headers=headers)
        )

    def publish(self, topic: str) -> list[Partition]:
        """Look up and cache the partitions of ``topic``."""
        return self._lt.run(self.core.publish(topic))

    def producer_sequences(self, topic: str) -> dict[Partition, int]:
        """Idempotent producer: the last sequence its brokers stored for its identity per
        partition of ``topic`` (claiming it there; see
        :meth:`AsyncProducer.producer_sequences`)."""
        return self._lt.run(self.core.producer_sequences(topic))

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
        """Iterate ``topic``; each message counts as processed when the next is asked.

        All partitions are polled concurrently; with ``idle_timeout_s`` the iteration ends
        once that long passed without a message (see :meth:`AsyncConsumer.messages`)."""
        core = self.core
        last = time.monotonic()
        while not core._closed:
            wait = 0.5
            if idle_timeout_s is not None:
                wait = min(wait, idle_timeout_s - (time.monotonic() - last))
                if wait <= 0:
                    return
            got = self._lt.run(core.next_batch(topic, wait))
            if got is None:
                continue
            cur, out, end = got
            for m in out:
                yield m
                cur.acked = m.next_offset  # the next one is asked: m is processed
            cur.acked = end
            last = time.monotonic()

    def commit(self) -> None:
        """Store offsets of everything handled so far."""
        self._lt.run(self.core.commit())

    def seek(
        self,
        topic: str,
        partitions: Partition | str | Iterable[Partition | str] | None = None,
        *,
        offset: int | str | None = None,
        timestamp: float | datetime | None = None,
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
        """Make :meth:`run` return after a clean shutdown (thread-safe)."""
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
        zk: str | ConfigServer | None = None,
        secret: str | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_verify: bool | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
    ):
        security = {
            "secret": secret,
            "tls": tls,
            "tls_ca_file": tls_ca_file,
            "tls_verify": tls_verify,
            "tls_cert_file": tls_cert_file,
            "tls_key_file": tls_key_file,
        }
        cfg = with_security(config or ClientConfig(), security)
        self._lt = LoopThread(cfg.use_uvloop)

        async def build() -> AsyncMessageSessionFactory:
            core = AsyncMessageSessionFactory(
                brokers, config=cfg, partitions=partitions, directory=directory, zk=zk
            )  # cfg already carries the security overrides
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
        #: The callers' own sockets for ``Producer.send()`` one at a time (_direct).
        self._direct = DirectPool(
            self.core.pool.options, cfg.request_timeout_s, self.core.pool.epoch_of
        )
        #: ... and for transactions of a synchronous producer (_directtx)
        self._direct_tx = DirectPool(
            self.core.pool.options, cfg.request_timeout_s, self.core.pool.epoch_of
        )

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
        return Producer(core, self._lt, self._direct, self._direct_tx)

    def create_transactional_producer(
        self,
        group: str,
        checker: TransactionChecker,
        config: ProducerConfig | None = None,
        selector: PartitionSelector | None = None,
    ) -> Producer:
        """A synchronous producer of producer group ``group`` for half messages.

        ``checker(msg) -> LocalTxState`` answers check-backs, on a pool of
        ``config.check_threads`` threads (see
        :meth:`AsyncMessageSessionFactory.create_transactional_producer`)::

            def checker(msg: Message) -> LocalTxState:
                return LocalTxState.COMMIT if db.has_order(msg.data) else LocalTxState.ROLLBACK

            producer = session.create_transactional_producer("shop", checker)
        """
        core = self.core

        async def make() -> AsyncProducer:
            return core.create_transactional_producer(group, checker, config, selector)

        return Producer(self._lt.run(make()), self._lt, self._direct)

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

    def publisher(self) -> SessionPublisher:
        """The transactional outbox's publisher over this session: the relay's way to the
        brokers (``outbox.relay(session)`` takes it; see :mod:`notify.outbox`)."""
        self.core._check_open()
        timeout = self.core.config.request_timeout_s
        direct = DirectPool(self.core.pool.options, timeout, self.core.pool.epoch_of)
        return SessionPublisher(self.core.router, self._lt, direct, timeout)

    def create_queue_consumer(
        self,
        topic: str,
        group: str,
        credit: int = 100,
        listener: QueueListener | None = None,
        start: str = "earliest",
        batch_listener: BatchListener | None = None,
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
        self._direct.close()
        self._direct_tx.close()
        try:
            self._lt.run(self.core.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> MessageSessionFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_group(group: str) -> None:
    if not group or any(c.isspace() for c in group):
        raise ClientError(f"invalid producer group {group!r}: a non-empty word")


def connect(
    brokers: Brokers | None = None,
    *,
    config: ClientConfig | None = None,
    partitions: Mapping[str, int] | None = None,
    zk: str | ConfigServer | None = None,
    secret: str | None = None,
    tls: bool | None = None,
    tls_ca_file: str | None = None,
    tls_verify: bool | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
) -> MessageSessionFactory:
    """Open a synchronous session: ``with connect(["127.0.0.1:8123"]) as session: ...``,
    or in a cluster ``with connect(zk="127.0.0.1:2181/meta") as session: ...`` (brokers and
    partitions from ZooKeeper, consumer groups rebalanced there).

    ``secret`` (default: the ``NOTIFY_SECRET`` environment variable) authenticates every
    connection to brokers that set ``authSecret``; ``tls*`` turn on TLS (see
    :class:`ClientConfig`). Given here they override the same fields of ``config``."""
    return MessageSessionFactory(
        brokers,
        config=config,
        partitions=partitions,
        zk=zk,
        secret=secret,
        tls=tls,
        tls_ca_file=tls_ca_file,
        tls_verify=tls_verify,
        tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file,
    )
