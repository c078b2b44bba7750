"""The blocking producer: a thread-safe facade over the asyncio core (:class:`AsyncProducer`)
running on the session's loop thread, with two shortcuts that skip the thread hop: ``send()``
one at a time over the calling thread's socket (:mod:`._direct`) and transactions over it
(:mod:`._directtx`). Where a ``send()`` goes is decided in one place,
:meth:`Producer._route`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import enum
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Final, TypeVar

from notify.errors import ClientError

from ._batch import merge_results
from ._connection import ConnectionPool
from ._direct import DirectPlan, DirectSender
from ._directtx import DirectBackend, direct_eligible
from ._errors import ClientTransactionError
from ._facade import Closes, Delegated
from ._halfdb import DbHalfMessageBlock
from ._halfmsg import (
    HalfMessageBlock,
    LocalTransaction,
    SyncHalfMessage,
    TransactionSendResult,
    as_state,
    decide,
    local_tx_raised,
)
from ._loopthread import LoopThread, ThreadFuture
from ._message import BatchSendResult, Draft, Headers, Key, PostFailure
from ._outboxtx import outbox_of
from ._producer import AsyncProducer
from ._transaction import Transaction
from ._txbackend import SyncBackend, outbox_backend
from ._txloop import LoopBackend
from .core.types import Partition, SendResult

log = logging.getLogger("notify.client")
T = TypeVar("T")



class Route(enum.Enum):
    """Where one blocking ``send()`` goes."""

    DELAYED = "delayed"  # a delayed message (dput), on the loop
    TRANSACTION = "transaction"  # this thread's open transaction
    DIRECT = "direct"  # one put over this thread's own socket
    LOOP = "loop"  # queued on the loop thread (batching, retries, ordering)


# the members as globals (per send: a member read through its class costs ~8x on 3.11)
_DELAYED: Final = Route.DELAYED
_TRANSACTION: Final = Route.TRANSACTION
_DIRECT: Final = Route.DIRECT
_LOOP: Final = Route.LOOP


def _retrieve_thread(f: concurrent.futures.Future[SendResult]) -> None:
    """Mark a posted message's future (inside a transaction) as seen: its failure is
    the transaction's."""
    if not f.cancelled():
        f.exception()


def _gather_sync(
    futs: list[concurrent.futures.Future[SendResult]], raise_on_error: bool
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
        results: list[SendResult | BaseException] = []
        for f in futs:
            exc = f.exception()
            results.append(exc if exc is not None else f.result())
        r = merge_results(results, len(futs), per_message=True)
        if raise_on_error and r.error is not None:
            out.set_exception(r.error)
        else:
            out.set_result(r)

    if not futs:
        out.set_result(BatchSendResult(True, None))
    for f in futs:
        f.add_done_callback(done)
    return out


class Producer(Closes):
    """Synchronous producer over the asyncio core (thread-safe).

    ``send`` blocks until the broker acknowledged (a failure raises its error; with
    ``ProducerConfig(raise_on_error=False)`` it is a result with ``success`` False);
    ``send_future`` returns at once with a ``concurrent.futures.Future``; messages sent from
    one thread to one partition keep their order either way.

    Transactions are per producer and per thread: between :meth:`begin_transaction` (or
    ``with producer.transaction():``) and its commit/rollback, ``send`` from that thread
    joins the transaction; other threads are not affected::

        with producer.transaction(timeout=10):
            producer.send("orders", b"o-1")
            producer.send("audit", b"o-1 created")
    """

    def __init__(self, core: AsyncProducer, lt: LoopThread, pool: ConnectionPool | None = None):
        self.core = core
        self._lt = lt
        self._pool = pool
        self._thread_tx: dict[int, Transaction] = {}
        self._tx_lock = threading.Lock()
        #: ``send()`` over the calling thread's own socket (None: never)
        self._direct = DirectSender(core, pool) if pool is not None else None
        #: transactions over the calling thread's own socket when the settings allow
        self._direct_tx = pool is not None and direct_eligible(core)
        self._in_flight = 0  # batch futures not done yet
        self._in_flight_lock = threading.Lock()
        #: one entry per send_future() not yet queued in the core (then core.outstanding
        #: counts it): deque append/pop are atomic, no lock per message
        self._posted: collections.deque[None] = collections.deque()
        #: post(): messages not handed to the core yet, and whether a drain is scheduled
        self._post_buf: list[Draft] = []
        self._post_wake = False
        self._post_lock = threading.Lock()

    # -- sends

    def _route(self, msg: Draft, delayed: bool) -> tuple[Route, Transaction | DirectPlan | None]:
        """Where a ``send()`` goes: the one decision. A delayed message is a ``dput`` on the
        loop (outside any transaction); this thread's open transaction takes the others;
        then the direct path when nothing of the producer is in flight and it can take the
        message (see :meth:`DirectSender.plan`), else the loop."""
        if delayed:
            return _DELAYED, None
        tx = self.current_transaction()
        if tx is not None:
            return _TRANSACTION, tx
        direct = self._direct
        if (
            direct is not None
            and not self._in_flight
            and not self._posted
            and not self.core.delivery.outstanding
        ):
            plan = direct.plan(msg)
            if plan is not None:
                return _DIRECT, plan
        return _LOOP, None

    def send(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None,
        timeout_s: float | None = None, *, headers: Headers | None = None,
        delay: float | None = None, deliver_at: datetime | float | None = None,
    ) -> SendResult:
        """Send one message and wait for its :class:`SendResult` (see
        :meth:`AsyncProducer.send`: failures raise unless ``raise_on_error`` is off,
        ``key`` and typed ``headers`` kept on the message, ``delay``/``deliver_at``).

        When none of the producer's messages is in flight the message goes straight over
        a socket of the calling thread (no hop to the loop thread; see ``_direct``)."""
        msg = (topic, data, attribute, key, headers)
        direct = self._direct
        if (  # the common case first: _route's direct branch, without its call
            direct is not None
            and delay is None
            and deliver_at is None
            and not self._in_flight
            and not self._posted
            and not self.core.delivery.outstanding
            and self.current_transaction() is None
            and (plan := direct.plan(msg)) is not None
        ):
            r = direct.send(plan, timeout_s)
            if r is not None:
                return self.core.checked(r)
            return self._queue(msg).result(timeout_s)
        delayed = delay is not None or deliver_at is not None
        if delayed:
            rows = outbox_of(self.current_transaction())
            if rows is not None:  # transaction(db=...): a delayed row in it
                return rows.add(msg, delay, deliver_at)
        route, via = self._route(msg, delayed)
        if route is _DELAYED:
            return self.send_delayed(
                topic, data, delay, deliver_at, attribute, key, timeout_s, headers=headers
            )
        if route is _TRANSACTION:
            assert isinstance(via, Transaction)
            return via.send(topic, data, attribute, key, timeout_s, headers=headers)
        if route is _DIRECT:
            assert isinstance(via, tuple) and self._direct is not None
            r = self._direct.send(via, timeout_s)
            if r is not None:
                return self.core.checked(r)
        return self._queue(msg).result(timeout_s)

    def send_future(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message; the future resolves to its :class:`SendResult` (or fails with
        its error, as :meth:`send`).

        Joins this thread's transaction when one is open."""
        tx = self.current_transaction()
        if tx is not None:
            return tx.send_future(topic, data, attribute, key, headers=headers)
        return self._queue((topic, data, attribute, key, headers))

    def _queue(self, msg: Draft) -> concurrent.futures.Future[SendResult]:
        """Queue one message on the loop; the core resolves the future itself."""
        self._seal_posts()
        out: ThreadFuture[SendResult] = ThreadFuture()
        posted = self._posted
        posted.append(None)  # until the core counts it (core.outstanding); atomic, no lock
        try:
            self._lt.post(functools.partial(self._send_into, out, msg), out)
        except BaseException:
            posted.pop()
            raise
        return out

    def _send_into(self, out: ThreadFuture[SendResult], msg: Draft) -> None:
        """On the loop: queue the message in the core, which resolves ``out`` itself."""
        try:
            self.core.accumulator.send_into(out, msg)
        finally:
            self._posted.pop()

    def post(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
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

    def _drain_posts(self, items: list[Draft]) -> None:
        """On the loop: hand one buffer of posts to the core, in order."""
        with self._post_lock:
            if self._post_buf is items:
                self._post_buf, self._post_wake = [], False
        core = self.core
        post = core.accumulator.post
        posted = self._posted
        for msg in items:
            try:
                post(msg)
            except ClientError as e:  # closed meanwhile: a failure, not lost silently
                core.post_failed(msg[0], bytes(msg[1]), e)
            finally:
                posted.pop()

    posts_acked = Delegated[int]("core.delivery.posts_acked", "Messages of post() stored so far.")
    posts_failed = Delegated[int](
        "core.delivery.posts_failed", "Messages of post() not stored (after the retries) so far."
    )

    def post_failures(self) -> list[PostFailure]:
        """Take the kept failures of :meth:`post` (see :meth:`AsyncProducer.post_failures`)."""
        return self.core.post_failures()

    @property
    def outstanding(self) -> int:
        """Messages queued (also those posted and not yet handed to the loop) or in flight."""
        return self.core.outstanding + len(self._posted)

    def send_batch(
        self, topic: str, datas: Sequence[bytes], attribute: str | None = None,
        key: Key | None = None, timeout_s: float | None = None,
    ) -> BatchSendResult:
        """Send many messages to one partition and wait for their one
        :class:`BatchSendResult` (see :meth:`AsyncProducer.send_batch_nowait`)."""
        return self.send_batch_future(topic, datas, attribute, key).result(timeout_s)

    def send_batch_future(
        self, topic: str, datas: Sequence[bytes], attribute: str | None = None,
        key: Key | None = None,
    ) -> concurrent.futures.Future[BatchSendResult]:
        """Queue many messages for one partition; one future for all of them.

        One hop to the client's loop thread for the whole batch. Joins this thread's
        transaction when one is open (the messages then go one by one)."""
        tx = self.current_transaction()
        if tx is not None:
            futs = [tx.send_future(topic, d, attribute, key) for d in datas]
            return _gather_sync(futs, self.core.config.raise_on_error)
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

    def send_delayed(
        self, topic: str, data: bytes, delay: float | None = None,
        deliver_at: datetime | float | None = None, attribute: str | None = None,
        key: Key | None = None, timeout_s: float | None = None, *, headers: Headers | None = None,
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
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> SendResult:
        """Awaitable send usable from any event loop."""
        return await asyncio.wrap_future(
            self.send_future(topic, data, attribute, key, headers=headers)
        )

    session_id = Delegated[str](
        "core.session_id", "The producer's id in its transaction keys TX:<session_id>:<n>."
    )
    producer_id = Delegated[str | None](
        "core.accumulator.producer_id",
        "The idempotent producer's id (ProducerConfig(idempotent=True)), else None.",
    )

    # -- transactions

    def transaction(self, timeout: float | None = None, db: object = None) -> Transaction:
        """Begin a local transaction for a ``with`` block (commit on exit, rollback on
        error); same as :meth:`begin_transaction`.

        ::

            with producer.transaction(timeout=10) as tx:
                producer.send("orders", b"o-1")
                producer.send("audit", b"o-1 created")
            print(tx.status)   # "committed"
        """
        return self.begin_transaction(timeout, db)

    def begin_transaction(self, timeout: float | None = None, db: object = None) -> Transaction:
        """Begin a local transaction, current for this thread until commit or rollback.

        ``timeout`` in seconds (the broker caps it at ``maxTxTimeoutInSeconds``; None: the
        cap). ``db``: the application's database connection, for a transaction whose sends
        are outbox rows in its current transaction (see :mod:`notify.client._txbackend`).
        Raises :class:`ClientTransactionError` when this thread already has one open on
        this producer. See :class:`~notify.client.AsyncTransaction` for the semantics::

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
        tx = Transaction(self._backend(timeout, db), self._tx_finished)
        with self._tx_lock:
            self._thread_tx[tx.thread_id] = tx
        return tx

    def _backend(self, timeout: float | None, db: object) -> SyncBackend:
        """The backend of a new transaction, chosen here once (see ``_txbackend``)."""
        core = self.core
        core.check_open()
        key = core.next_tx_key()
        if db is not None:
            return outbox_backend(db, key, core.session_id, core.config.raise_on_error)
        if self._pool is None or not self._direct_tx:
            return LoopBackend(core.loop_transaction(timeout, key), self._lt)

        def loop_path(failure: Exception | None) -> SyncBackend:
            tx = core.loop_transaction(timeout, key)
            if failure is not None:  # a send failed before the route was known
                tx.core.mark(failure)
            return LoopBackend(tx, self._lt)

        return DirectBackend(core, key, timeout, self._pool, self._lt, loop_path, self._quiet)

    def _quiet(self) -> bool:
        """None of the producer's messages is queued or in flight."""
        return not self._in_flight and not self._posted and not self.core.delivery.outstanding

    def current_transaction(self) -> Transaction | None:
        """This thread's open transaction on this producer, if any."""
        tx = self._thread_tx.get(threading.get_ident())
        return tx if tx is not None and not tx.finished else None

    def _tx_finished(self, tx: Transaction) -> None:
        with self._tx_lock:
            if self._thread_tx.get(tx.thread_id) is tx:
                del self._thread_tx[tx.thread_id]

    # -- half messages

    def half_message(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None,
        timeout: float | None = None, *, headers: Headers | None = None,
    ) -> AbstractContextManager[Any]:
        """A half message around a ``with`` block (a transactional producer's)::

            with producer.half_message("orders", b"o-1", key="user-7") as half:
                half.prepared()              # optional: PREPARE acknowledged
                save_order()
            # normal exit: COMMIT after PREPARE's ack; an exception: ROLLBACK

        A producer made with ``db=engine`` yields a connection of the engine, in a
        transaction committed with the half message's marker (:mod:`._halfdb`)::

            producer = session.create_transactional_producer("shop", db=engine)
            with producer.half_message("orders", b"paid 7") as conn:
                conn.execute(update(accounts).where(accounts.c.id == 7).values(paid=True))

        See :meth:`AsyncProducer.half_message`."""
        core = self.core
        if core.markers is not None:
            return DbHalfMessageBlock(
                core, (topic, data, attribute, key, headers), timeout, self._lt, core.markers
            )
        return HalfMessageBlock(
            lambda: core.start_half((topic, data, attribute, key, headers), timeout),
            self._lt,
            lambda half: SyncHalfMessage(half, self._lt),
        )

    def send_in_transaction(
        self, topic: str, data: bytes, local_tx: LocalTransaction, attribute: str | None = None,
        key: Key | None = None, timeout: float | None = None, *, headers: Headers | None = None,
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
        msg = (topic, data, attribute, key, headers)
        self.core.check_callback_api()
        half = self._lt.run(self.core.prepare_half(msg, timeout))
        try:
            res: object = local_tx(half.message)
        except BaseException as e:
            local_tx_raised(half, e)
            raise
        if asyncio.iscoroutine(res):
            res.close()
            raise ClientTransactionError(
                "local_tx of the synchronous producer must not be async", half.tx_key
            )
        return self._lt.run(decide(half, as_state(res, half.tx_key)))

    # -- lifecycle

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

