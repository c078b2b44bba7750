"""Local transactions (MetaQ's ``beginTransaction``/``commit``): what the application holds.

::

    with producer.transaction(timeout=10):   # commit on normal exit, rollback on exception
        producer.send("orders", b"order-1")
        producer.send("audit", b"order-1 created")

    async with aproducer.transaction(timeout=10):
        await aproducer.send("orders", b"order-1")

A transaction's key is ``TX:<sessionId>:<seq>`` (``sessionId`` unique per producer
instance). Nothing is sent until the first message: that send picks a partition as usual
and binds the transaction to that partition's **broker** and to one of the producer's own
connections to it; BEGIN and the put are pipelined. Later sends pick among that broker's
partitions of their topic (:class:`ClientTransactionError` when it has none). Each send's
:class:`~notify.client.SendResult` has the message id and offset -1 (the message becomes
visible at commit). A failed send raises its error (or, with
``ProducerConfig(raise_on_error=False)``, is a result with ``success`` False) and makes the
transaction *rollback-only*: ``commit()`` then rolls back and raises. If the connection
drops the broker rolls the transaction back and the client reports
:class:`TransactionConnectionError`; it never retries a transaction on a new connection.

The current transaction is per producer and per thread (blocking API) or per
:mod:`contextvars` context, i.e. per task (asyncio API): ``producer.send`` joins it only
there; other threads and tasks keep sending outside it.

The objects here are handles: the sends and the end of a transaction are carried out by the
backend chosen when it began (:mod:`._txbackend`: the broker, or with ``db=`` the outbox).
Their ``status`` is the client transaction state's value (:mod:`.core.states`): active,
rollback_only, committing, committed, rolling_back, rolled_back or failed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._facade import Delegated
from ._message import Headers, Key
from ._txbackend import AsyncBackend, SyncBackend, TxInfo
from .core.states import FINISHED, OPEN, TxState
from .core.types import SendResult

log = logging.getLogger("notify.client")
B = TypeVar("B", bound=TxInfo)


class _Handle(Generic[B]):
    """What both handles tell about their transaction (from its backend)."""

    key = Delegated[str]("_backend.core.key", "The transaction key TX:<sessionId>:<n>.")
    state = Delegated[TxState]("_backend.core.state", "Where the transaction is.")
    broker = Delegated[str | None](
        "_backend.core.address",
        "Address of the broker the transaction is bound to (None before the first send).",
    )

    def __init__(self, backend: B, on_end: Callable[[Any], None] | None = None):
        self._backend = backend
        self._on_end = on_end

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key} {self.status} broker={self.broker}>"

    @property
    def status(self) -> str:
        """active, rollback_only, committing, committed, rolling_back, rolled_back, failed."""
        return self._backend.core.state.value

    @property
    def active(self) -> bool:
        """True until commit or rollback starts (also when rollback-only)."""
        return self._backend.core.state in OPEN

    @property
    def finished(self) -> bool:
        """Committed, rolled back or failed."""
        return self._backend.core.state in FINISHED

    @property
    def rollback_only(self) -> bool:
        """True when a send failed: commit() will roll back and raise."""
        return self._backend.core.failure is not None

    def _rollback_after(self, exc: BaseException | None, e: Exception) -> None:
        log.warning("transaction %s: rollback after %r failed: %s", self.key, exc, e)


class AsyncTransaction(_Handle[AsyncBackend]):
    """One local transaction of an :class:`AsyncProducer` (asyncio API).

    Get it from :meth:`AsyncProducer.transaction` / :meth:`AsyncProducer.begin_transaction`
    (which also make it the current transaction of the calling context, so
    ``producer.send`` joins it)::

        async with producer.transaction(timeout=10) as tx:
            await producer.send("orders", b"o-1")       # same as: await tx.send(...)
        # committed here; an exception in the block rolls back instead

        tx = producer.begin_transaction()
        await producer.send("orders", b"o-2")
        await tx.commit()                               # or: await tx.rollback()
    """

    async def send(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> SendResult:
        """Send one message in the transaction and wait for the broker to record it.

        A failed send raises its error (a result with ``success`` False under
        ``raise_on_error=False``) and makes the transaction rollback-only; a topic without
        a partition on the transaction's broker raises :class:`ClientTransactionError`.
        """
        return await self._backend.send_nowait((topic, data, attribute, key, headers))

    def send_nowait(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue one message of the transaction (sent in call order); future of its result."""
        return self._backend.send_nowait((topic, data, attribute, key, headers))

    async def commit(self) -> None:
        """Commit: COMMIT_ONE_PHASE right behind the puts (one round trip in all).

        The COMMIT is written as soon as every queued send is written, without waiting
        for their acknowledgements; it carries the number of messages written
        (``msgs=<n>``), so the broker rolls the transaction back when a put was refused
        (``ProducerConfig.pipeline_commit=False``: wait for the acks first, for brokers
        without this extension).

        Raises :class:`TransactionAbortedError` (rolled back because a send failed),
        :class:`TransactionTimeoutError` (the broker timed it out: rolled back),
        :class:`TransactionConnectionError` (connection dropped: rolled back),
        :class:`TransactionOutcomeUnknownError` (no reply to COMMIT) or :class:`XAError`.
        A transaction without messages commits without talking to the broker.
        """
        try:
            await self._backend.commit()
        finally:
            self._ended()

    async def rollback(self) -> None:
        """Roll back (ROLLBACK): sends not yet written are dropped, none becomes visible.

        Quiet when the broker already rolled it back (timeout, dropped connection) and a
        no-op once rolled back or after a failed commit; raises
        :class:`ClientTransactionError` after a successful commit.
        """
        try:
            await self._backend.rollback()
        finally:
            self._ended()

    def _ended(self) -> None:
        if self._on_end is not None:
            self._on_end(self)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object
    ) -> None:
        if not self.active:  # committed or rolled back explicitly inside the block
            return
        if exc_type is None:
            await self.commit()
            return
        try:
            await self.rollback()
        except Exception as e:  # keep the block's exception
            self._rollback_after(exc, e)


class Transaction(_Handle[SyncBackend]):
    """One local transaction of a synchronous :class:`Producer` (thread-safe handle).

    ::

        with producer.transaction(timeout=10) as tx:   # commit on exit, rollback on error
            producer.send("orders", b"o-1")             # joins: same producer, same thread
            tx.send("audit", b"o-1 created")            # explicit form, any thread

        tx = producer.begin_transaction(timeout=10)
        producer.send("orders", b"o-2")
        tx.commit()                                     # or tx.rollback()

    ``send_future`` pipelines: ``[tx.send_future(...) for ...]`` then ``tx.commit()``.
    See :class:`AsyncTransaction` for the semantics and errors.
    """

    def __init__(self, backend: SyncBackend, on_end: Callable[[Any], None] | None = None):
        self._backend = backend
        self._on_end = on_end
        #: the thread that began it (its sends join it)
        self.thread_id = threading.get_ident()

    def send(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None,
        timeout_s: float | None = None, *, headers: Headers | None = None,
    ) -> SendResult:
        """Send one message in the transaction and wait for its result (offset -1)."""
        return self.send_future(topic, data, attribute, key, headers=headers).result(timeout_s)

    def send_future(
        self, topic: str, data: bytes, attribute: str | None = None, key: Key | None = None, *,
        headers: Headers | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message of the transaction (kept in call order); future of its result."""
        return self._backend.send_future((topic, data, attribute, key, headers))

    def commit(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncTransaction.commit`."""
        try:
            self._backend.commit(timeout_s)
        finally:
            self._ended()

    def rollback(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncTransaction.rollback`."""
        try:
            self._backend.rollback(timeout_s)
        finally:
            self._ended()

    def _ended(self) -> None:
        if self._on_end is not None and self.finished:
            self._on_end(self)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object
    ) -> None:
        if not self.active:
            return
        if exc_type is None:
            self.commit()
            return
        try:
            self.rollback()
        except Exception as e:  # keep the block's exception
            self._rollback_after(exc, e)
