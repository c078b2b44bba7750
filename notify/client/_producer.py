"""The producer (asyncio). The synchronous :class:`Producer` runs this same code.

:class:`AsyncProducer` is the API; the work is done by its parts, as in aiokafka's
``producer/``: the :class:`~._accumulator.Accumulator` queues messages per partition, the
:class:`~._sender.Sender` sends them (``mput``, or pipelined ``put`` to brokers without it),
retries and delivers their results, an ordered producer's partitions spool
(:mod:`._spool`), and transactions run on the client's transaction core: local ones
(:mod:`._transaction`, :mod:`._txloop`), half messages (:mod:`._halfmsg`) with the group's
check-backs (:mod:`._checkback`).

A failed send raises its error (``send()``, the future of ``send_nowait``); with
``ProducerConfig(raise_on_error=False)`` it is a :class:`SendResult` with ``success``
False instead. Programming errors (bad arguments, an exception other than
:class:`~notify.errors.ClientError` in a custom selector) always raise; posts are counted,
never raised (see :meth:`AsyncProducer.post`).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from notify.errors import ClientError
from notify.protocol import records as rec
from notify.protocol.keys import local_key

from ._accumulator import Accumulator
from ._batch import BatchItem, chunks, merge_results
from ._checkback import TxChannel
from ._config import ClientConfig, ProducerConfig
from ._connection import ConnectionPool
from ._errors import ClientTransactionError
from ._facade import Delegated
from ._halfdb import AsyncDbHalfMessageBlock
from ._halfmsg import (
    AsyncHalfMessageBlock,
    HalfMessage,
    LocalTransaction,
    TransactionChecker,
    TransactionSendResult,
    decide,
    run_local,
)
from ._identity import ProducerIdentity
from ._message import BatchSendResult, Draft, Headers, Key, PostFailure, build_payload
from ._outboxtx import AsyncOutboxBackend, outbox_of
from ._routing import TopicRouter
from ._sender import Delivery, Sender
from ._transaction import AsyncTransaction
from ._txbackend import AsyncBackend, async_outbox_backend
from ._txloop import LoopTransaction
from .core import wire
from .core.selectors import KeyHashSelector, PartitionSelector
from .core.types import Partition, SendResult
from .transport import AsyncConnection

if TYPE_CHECKING:
    from notify.outbox.half import HalfMarkers

log = logging.getLogger("notify.client")


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (a posted message joined to a transaction: the
    commit reports the failure)."""
    if not f.cancelled():
        f.exception()


class AsyncProducer:
    """Sends messages to a topic's partitions (asyncio API).

    Create it with :meth:`AsyncMessageSessionFactory.create_producer` (or
    ``create_transactional_producer`` for half messages). All methods must be called on the
    session's event loop. Transactions::

        async with producer.transaction(timeout=10):
            await producer.send("orders", b"o-1")   # joins the transaction of this task
        async with producer.half_message("orders", b"o-2") as half:   # a group's producer
            await half.prepared()
    """

    def __init__(
        self, pool: ConnectionPool, router: TopicRouter, client_config: ClientConfig,
        config: ProducerConfig, selector: PartitionSelector | None = None,
        checker: TransactionChecker | None = None, markers: HalfMarkers | None = None,
    ):
        self.pool = pool
        self.router = router
        self.client_config = client_config
        self.config = config
        if (config.ordered or config.idempotent) and config.max_in_flight_per_partition != 1:
            config.max_in_flight_per_partition = 1
        self.selector: PartitionSelector = selector or KeyHashSelector()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Idempotent mode: this producer's identity (claimed on each connection before its
        #: first put, :mod:`._identity`), its id and next sequence number per partition.
        self.identity: ProducerIdentity | None = None
        if config.idempotent:
            self.identity = ProducerIdentity(
                config.producer_name, config.producer_secret, config.producer_epoch
            )
        elif config.producer_name is not None:
            raise ClientError("producer_name needs ProducerConfig(idempotent=True)")
        self.sender = Sender(pool, router, client_config, config, lambda: self.loop, self.identity)
        self.delivery: Delivery = self.sender.delivery
        #: brokers that answered ``mput`` with "unknown command" (sends and transactions)
        self.no_mput = self.sender.no_mput
        self.accumulator = Accumulator(self.sender, self.selector, self.identity)
        #: True once :meth:`close` was called (later sends raise ClientError)
        self.closed = False
        #: Unique per producer instance: local transaction keys are ``TX:<session_id>:<n>``.
        self.session_id = uuid.uuid4().hex[:12]
        self.checker = checker
        #: ``db=``: the group's half-message markers (the check-back's answers)
        self.markers = markers
        self._tx_seq = itertools.count(1)
        self._tx_var: contextvars.ContextVar[AsyncTransaction | None] = contextvars.ContextVar(
            f"notify_tx_{self.session_id}", default=None
        )
        self._channel: TxChannel | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the producer runs on (the running one at first use)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    producer_id = Delegated[str | None](
        "accumulator.producer_id",
        "Idempotent mode: this producer's id (in every message's attribute block).",
    )
    posts_acked = Delegated[int]("delivery.posts_acked", "Messages of post() stored so far.")
    posts_failed = Delegated[int](
        "delivery.posts_failed", "Messages of post() not stored (after the retries) so far."
    )
    stats_spool_replayed = Delegated[int](
        "sender.spool_replayed", "Messages an ordered producer's spools replayed so far."
    )

    # -- public API

    async def publish(self, topic: str) -> list[Partition]:
        """Look up (and cache) the partitions of ``topic``; optional warm-up."""
        self.accumulator.restore_spools()
        return await self.router.partitions(topic)

    async def send(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None, delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> SendResult:
        """Send one message and wait for its result.

        A failed send raises its error (``ProducerConfig(raise_on_error=False)``: returns
        a :class:`SendResult` with ``success`` False); programming errors (bad arguments,
        an exception other than :class:`~notify.errors.ClientError` in a custom selector)
        always raise. ``delay`` (seconds) or ``deliver_at``: see :meth:`send_delayed`.
        ``key`` picks the partition and stays on the message with the typed ``headers``
        (``{name: str | int | float | bool | bytes}``), in MetaQ's attribute block.
        """
        if delay is not None or deliver_at is not None:
            rows = outbox_of(self._tx_var.get())
            if isinstance(rows, AsyncOutboxBackend):  # transaction(db=...): a delayed row
                msg = (topic, data, attribute, key, headers)
                return await rows.send_later(msg, delay, deliver_at)
            return await self.send_delayed(
                topic, data, delay, deliver_at, attribute, key, headers=headers
            )
        return await self.send_nowait(topic, data, attribute, key, headers=headers)

    def send_nowait(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue one message; the future resolves to its :class:`SendResult` (or fails with
        its error, see :meth:`send`).

        Messages queued one after the other for the same partition are sent in that order.
        Raises :class:`ClientError` when the producer is closed. Inside a transaction of
        the current context (:meth:`transaction`) the message joins it.
        """
        tx = self._tx_var.get()
        if tx is not None and not tx.finished:
            return tx.send_nowait(topic, data, attribute, key, headers=headers)
        fut: asyncio.Future[SendResult] = (self._loop or self.loop).create_future()
        self.accumulator.send_into(fut, (topic, data, attribute, key, headers))
        return fut

    def post(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> None:
        """Queue one message without a future: the fastest way to send messages one at a
        time (fire and forget, results reported in bulk).

        Same routing, order, batching and retries as :meth:`send_nowait`. Results are
        counted: :attr:`posts_acked` (stored) and :attr:`posts_failed` (not stored after
        the retries); each failure is kept as a :class:`PostFailure` (topic, partition,
        the record, the error) until :meth:`post_failures` takes them (at most
        ``ProducerConfig.max_post_failures``, the oldest dropped first). ``await flush()``
        waits for every result. Data that is not bytes or a closed producer raise here;
        an exception in a custom selector is a failure like the others (its error is the
        exception). Inside a transaction of the current context the message joins it (as
        with ``send_nowait``; the transaction's commit reports its failure).
        """
        tx = self._tx_var.get()
        if tx is not None and not tx.finished:
            tx.send_nowait(topic, data, attribute, key, headers=headers).add_done_callback(
                _retrieve
            )
            return
        self.accumulator.post((topic, data, attribute, key, headers))

    def post_failures(self) -> list[PostFailure]:
        """Take the kept failures of :meth:`post` (oldest first); see ``posts_failed``.
        Safe from another thread (the blocking API's)."""
        return self.delivery.take_post_failures()

    def post_failed(self, topic: str, payload: bytes, err: Exception) -> None:
        """Count and keep a post that never reached a queue (e.g. the producer closed
        before the blocking API's buffer was drained)."""
        self.delivery.post_failed(topic, payload, err)

    async def send_batch(
        self, topic: str, datas: Sequence[bytes], attribute: str | None = None,
        key: Key | None = None,
    ) -> BatchSendResult:
        """Send many messages to one partition and wait for one :class:`BatchSendResult`.

        See :meth:`send_batch_nowait`."""
        return await self.send_batch_nowait(topic, datas, attribute, key)

    def send_batch_nowait(
        self, topic: str, datas: Sequence[bytes], attribute: str | None = None,
        key: Key | None = None,
    ) -> asyncio.Future[BatchSendResult]:
        """Queue many messages (same ``attribute``) for one partition (chosen once, by
        ``key`` or round robin); one future resolves to their :class:`BatchSendResult`
        (or fails with the error, as :meth:`send`). A ``key`` is kept on every message
        (:attr:`Message.key`), like :meth:`send`'s.

        The fast way to produce: the records are encoded in bulk into ``mput`` frames of
        at most ``batch_max_count`` messages / ``batch_max_bytes``, no object per message.
        Order is kept with other sends to the same partition. Inside a transaction of the
        current context the messages join it one by one. Raises :class:`ClientError` when
        the producer is closed or an element is not bytes.
        """
        tx = self._tx_var.get()
        if tx is not None and not tx.finished:
            futs = [tx.send_nowait(topic, d, attribute, key) for d in datas]
            return self._merge(futs, len(futs), per_message=True)
        self.check_open()
        payloads = list(datas)
        if not all(type(d) is bytes for d in payloads):
            if not all(isinstance(d, bytes | bytearray | memoryview) for d in payloads):
                raise ClientError("message data must be bytes")
            payloads = [bytes(d) for d in payloads]
        flag = 0
        if key is not None:  # the key stays on every message (attribute block), as with send()
            flag = build_payload(b"", attribute, key)[1]
            payloads = [build_payload(d, attribute, key)[0] for d in payloads]
        elif attribute is not None:
            flag = rec.make_payload(b"", attribute)[1]
            payloads = [rec.make_payload(d, attribute)[0] for d in payloads]
        loop = self.loop
        if not payloads:
            done: asyncio.Future[BatchSendResult] = loop.create_future()
            done.set_result(BatchSendResult(True, None))
            return done
        cfg = self.config
        parts: list[asyncio.Future[BatchSendResult]] = []
        items: list[BatchItem] = []
        for chunk in chunks(payloads, cfg.batch_max_count, cfg.batch_max_bytes):
            f: asyncio.Future[BatchSendResult] = loop.create_future()
            parts.append(f)
            items.append(BatchItem(chunk, flag, f))
        self.accumulator.add_batch(topic, items, key, payloads[0])
        return parts[0] if len(parts) == 1 else self._merge(parts, len(payloads))

    def _merge(
        self,
        futs: Sequence[asyncio.Future[BatchSendResult]] | Sequence[asyncio.Future[SendResult]],
        total: int,
        per_message: bool = False,
    ) -> asyncio.Future[BatchSendResult]:
        """One batch result for a batch that went as several frames (or, ``per_message``,
        one by one in a transaction); its error raised unless ``raise_on_error`` is off."""

        async def merge() -> BatchSendResult:
            results = await asyncio.gather(*futs, return_exceptions=True)
            out = merge_results(results, total, per_message)
            return out.raise_for_error() if self.config.raise_on_error else out

        return asyncio.ensure_future(merge(), loop=self.loop)

    async def send_delayed(
        self, topic: str, data: bytes, delay: float | None = None,
        deliver_at: datetime | float | None = None, attribute: str | None = None,
        key: Key | None = None, *, headers: Headers | None = None,
    ) -> SendResult:
        """Send a message consumers see no earlier than ``delay`` seconds from now or at
        ``deliver_at`` (an aware datetime or Unix seconds), in due order per partition.

        The broker keeps it durably until then (the ``dput`` extension); the result's
        offset is -1 because the message gets its offset when it is delivered.
        """
        if (delay is None) == (deliver_at is None):
            raise ClientError("give exactly one of delay= or deliver_at=")
        if delay is not None:
            due_ms = int((time.time() + delay) * 1000)
        elif isinstance(deliver_at, datetime):
            if deliver_at.tzinfo is None:
                raise ClientError("deliver_at must be timezone-aware (e.g. UTC)")
            due_ms = int(deliver_at.timestamp() * 1000)
        else:
            assert deliver_at is not None
            due_ms = int(float(deliver_at) * 1000)
        return self.checked(await self._send_delayed(topic, data, due_ms, attribute, key, headers))

    def checked(self, result: SendResult) -> SendResult:
        """``result``, or its error raised (unless ``raise_on_error`` is off)."""
        if not result.success and self.config.raise_on_error and result.error is not None:
            raise result.error
        return result

    async def _send_delayed(
        self, topic: str, data: bytes, due_ms: int, attribute: str | None, key: Key | None,
        headers: Headers | None,
    ) -> SendResult:
        payload, flag = build_payload(data, attribute, key, headers)
        try:
            parts = await self.router.partitions(topic)
            part = self.selector(topic, parts, key, payload)
        except ClientError as e:
            return SendResult(False, None, error=e)
        try:
            conn = await self.pool.get(part.address)
            r = await conn.request(
                wire.dput(topic, part.partition, payload, flag, due_ms),
                self.client_config.request_timeout_s,
            )
        except ClientError as e:
            return SendResult(False, part, error=e)
        ack = wire.put_ack(r)
        if isinstance(ack, ClientError):
            return SendResult(False, part, error=ack)
        return SendResult(True, part, -1, ack[0])

    async def producer_sequences(
        self, topic: str, parts: Sequence[Partition] | None = None
    ) -> dict[Partition, int]:
        """Idempotent producer: claim the identity on the brokers of ``topic`` and return
        the last sequence each stored for it per partition (a partition it never wrote to
        is absent). Raises :class:`~notify.errors.ProducerFencedError` when a newer
        instance holds the (named) identity."""
        if parts is None:
            parts = await self.router.partitions(topic)
        return await self.sender.producer_sequences(topic, parts)

    async def flush(self) -> None:
        """Wait until every queued message has its result (and every half message's COMMIT
        written without waiting has its reply)."""
        await self.delivery.drain(0)
        if self._channel is not None:
            await self._channel.settled()

    async def drain(self, limit: int = 0) -> None:
        """Wait until at most ``limit`` messages are queued or in flight (back-pressure for
        :meth:`post` and :meth:`send_nowait` loops: ``await producer.drain(50_000)``)."""
        await self.delivery.drain(limit)

    async def close(self, timeout_s: float | None = 30.0) -> None:
        """Flush (up to ``timeout_s``), then stop; later sends raise ClientError."""
        if self.closed:
            return
        self.closed = self.accumulator.closed = True
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush()
        except TimeoutError:
            log.warning(
                "producer closed with %d messages unacknowledged", self.delivery.outstanding
            )
        await self.sender.cancel_tasks()
        if self._channel is not None:
            await self._channel.close()

    @property
    def outstanding(self) -> int:
        """Messages queued or in flight."""
        return self.delivery.outstanding

    def check_open(self) -> None:
        """Raise :class:`ClientError` once the producer is closed."""
        if self.closed:
            raise ClientError("producer is closed")

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        """Run ``coro`` as one of the producer's tasks (cancelled when it closes)."""
        return self.sender.spawn(coro)

    # -- transactions

    def transaction(self, timeout: float | None = None, db: object = None) -> AsyncTransaction:
        """Begin a local transaction for ``async with`` (commit on exit, rollback on error).

        ::

            async with producer.transaction(timeout=10) as tx:
                await producer.send("orders", b"o-1")
                await producer.send("audit", b"o-1 created")

        Same as :meth:`begin_transaction`; see :class:`AsyncTransaction`.
        """
        return self.begin_transaction(timeout, db)

    def begin_transaction(
        self, timeout: float | None = None, db: object = None
    ) -> AsyncTransaction:
        """Begin a local transaction and make it current in this context (task).

        ``timeout`` (seconds, rounded up) is enforced by the broker, capped at its
        ``maxTxTimeoutInSeconds``; None: the cap. BEGIN goes out with the first message.
        ``db``: the application's database connection, for a transaction whose sends are
        outbox rows in it (see :mod:`notify.client._txbackend`). Raises
        :class:`ClientTransactionError` if this context already has an open one.
        """
        cur = self._tx_var.get()
        if cur is not None and not cur.finished:
            raise ClientTransactionError(
                f"transaction {cur.key} is still open in this context: transactions of one "
                "producer do not nest",
                cur.key,
            )
        self.check_open()
        key = self.next_tx_key()
        backend: AsyncBackend
        if db is not None:
            backend = async_outbox_backend(db, key, self.session_id, self.config.raise_on_error)
        else:
            backend = LoopTransaction(self, key, timeout)
        tx = AsyncTransaction(backend, self.tx_ended)
        self._tx_var.set(tx)
        return tx

    def current_transaction(self) -> AsyncTransaction | None:
        """The open transaction of the current context, if any."""
        tx = self._tx_var.get()
        return tx if tx is not None and not tx.finished else None

    def loop_transaction(self, timeout: float | None, key: str | None = None) -> LoopTransaction:
        """A broker transaction on the loop bound to no context (the blocking API's loop
        path; thread-safe: no loop work)."""
        self.check_open()
        return LoopTransaction(self, key or self.next_tx_key(), timeout)

    def next_tx_key(self) -> str:
        """A fresh transaction key ``TX:<session_id>:<n>``."""
        return local_key(self.session_id, next(self._tx_seq))

    def tx_ended(self, tx: AsyncTransaction) -> None:
        """``tx`` committed or rolled back: no longer current in its context."""
        if self._tx_var.get() is tx:
            self._tx_var.set(None)

    def _tx_channel(self) -> TxChannel:
        if self._channel is None:
            self._channel = TxChannel(self)
        return self._channel

    async def tx_connection(self, address: str) -> AsyncConnection:
        """One of the producer's own connections to ``address`` (registered with its group)."""
        return await self._tx_channel().get(address)

    def ready_tx_connection(self, address: str) -> AsyncConnection | None:
        """:meth:`tx_connection` when it is open and registered already (no I/O), else None."""
        return self._tx_channel().ready(address)

    def track_second_phase(self, fut: asyncio.Future[Any]) -> None:
        """Let ``flush`` and ``close`` wait for this reply of a half message's second phase."""
        self._tx_channel().track(fut)

    def start_check_backs(self) -> None:
        """Register the producer group with the brokers now (on the loop) so check-backs
        reach this producer before it sends anything; done by
        ``create_transactional_producer``. With a non-static directory, brokers are
        registered as the producer first uses them."""
        if self.config.producer_group is None:
            raise ClientError("start_check_backs needs ProducerConfig.producer_group")
        self._tx_channel().start()

    # -- half messages

    def half_message(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None,
        timeout: float | None = None, *, headers: Headers | None = None,
    ) -> AbstractAsyncContextManager[Any]:
        """A half message around an ``async with`` block (needs a producer group)::

            async with producer.half_message("orders", b"o-1", key="user-7") as half:
                await half.prepared()        # optional: PREPARE acknowledged
                await save_order()
            # normal exit: COMMIT after PREPARE's ack; an exception: ROLLBACK

        BEGIN, the put and PREPARE are written on entry, not awaited; see
        :mod:`notify.client._halfmsg` for the order of events and the check-back.

        A producer made with ``db=engine`` yields a connection of the engine instead, in a
        transaction committed with the half message's marker (:mod:`._halfdb`)::

            async with producer.half_message("orders", b"o-3") as conn:
                conn.execute(text("UPDATE accounts SET paid = true WHERE id = 7"))
        """
        if self.markers is not None:
            return AsyncDbHalfMessageBlock(
                self, (topic, data, attribute, key, headers), timeout, self.markers
            )
        return AsyncHalfMessageBlock(
            lambda: self.start_half((topic, data, attribute, key, headers), timeout),
            lambda half: half,
        )

    async def start_half(self, msg: Draft, timeout: float | None = None) -> HalfMessage:
        """BEGIN + put + PREPARE written, their replies not awaited."""
        return await HalfMessage.send(self, msg, timeout)

    async def prepare_half(self, msg: Draft, timeout: float | None = None) -> HalfMessage:
        """BEGIN + put + PREPARE, acknowledged: the prepared half message (raises when it
        was not prepared)."""
        half = await self.start_half(msg, timeout)
        await half.prepared()
        return half

    async def send_in_transaction(
        self, topic: str, data: bytes, local_tx: LocalTransaction, attribute: str | None = None,
        key: Key | None = None, timeout: float | None = None, *, headers: Headers | None = None,
    ) -> TransactionSendResult:
        """Send a half message, run ``local_tx(msg)``, then commit or roll the message back.

        ::

            async def local_tx(msg: Message) -> LocalTxState:
                ok = await db.insert_order(msg.data)
                return LocalTxState.COMMIT if ok else LocalTxState.ROLLBACK

            result = await producer.send_in_transaction("orders", b"o-1", local_tx)

        BEGIN, the put and PREPARE are pipelined on a registered connection; then
        ``local_tx`` (plain or ``async def``; a plain one runs on the loop) decides:
        COMMIT -> COMMIT_TWO_PHASE, ROLLBACK -> ROLLBACK, UNKNOWN -> nothing (the broker asks
        the group's checker after ``txCheckBackDelay``). If ``local_tx`` raises, the state
        is UNKNOWN and the exception propagates. Raises (without running ``local_tx``) when
        the half message could not be prepared. Needs a producer group.
        """
        self.check_callback_api()
        half = await self.prepare_half((topic, data, attribute, key, headers), timeout)
        return await decide(half, await run_local(half, local_tx))

    def check_callback_api(self) -> None:
        """Refuse ``send_in_transaction`` on a producer whose check-backs are answered from
        its marker table: its local transaction writes no marker."""
        if self.markers is not None:
            raise ClientTransactionError(
                "this producer (db=...) answers check-backs from its marker table, which "
                "send_in_transaction does not write: use half_message(...) as conn"
            )
