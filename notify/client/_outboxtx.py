"""``producer.transaction(db=conn)``: the block's sends are outbox rows in ``conn``'s
transaction (the transaction backend of :mod:`._txbackend`).

::

    with engine.begin() as conn:                       # the application's transaction
        conn.execute(insert(orders).values(id=42))
        with producer.transaction(db=conn):
            producer.send("orders", b"order 42", key="42")
    # committed: the order and the message; rolled back: neither

Each send is checked and its row built at once (bad arguments raise there, and the
transaction is rollback-only, as a refused send of a broker transaction makes it); nothing
goes to the broker. The block's normal exit hands the rows to ``conn``'s transaction (a
SQLAlchemy ``Connection`` or ``Session``: written at its commit, in the commit's round trip
on PostgreSQL; a psycopg 3 connection: inserted at once); an exception drops them. The
messages are published by the outbox's relay (``outbox.relay(session)``, ``notify outbox
relay``) once, and only if, ``conn``'s transaction commits. The transaction's ``status`` is
``committed`` once the rows are in ``conn``'s transaction. A send's result has no partition
and offset -1 (the relay picks the partition: the key's, as the producer's key hash would).
A send with ``delay``/``deliver_at`` joins the transaction too (a delayed row, published
when due), unlike in a broker transaction.

The asyncio producer also takes the application's asyncio connections (a SQLAlchemy
``AsyncConnection`` or ``AsyncSession``, a psycopg ``AsyncConnection``)::

    async with engine.begin() as conn:                 # engine: an AsyncEngine
        await conn.execute(insert(orders).values(id=42))
        async with producer.transaction(db=conn):
            await producer.send("orders", b"order 42", key="42")

There the first send of an outbox reads its shard count, awaited (the sends of the block
stay in call order), and the block's exit hands the rows over, awaited; the blocking
producer refuses an asyncio connection with a :class:`ClientTransactionError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from datetime import datetime
from typing import TYPE_CHECKING

from notify import outbox
from notify.outbox.rows import OutboxError

from ._errors import ClientTransactionError
from ._message import Draft
from .core.states import TxEvent
from .core.transaction import TxCore
from .core.types import SendResult

if TYPE_CHECKING:
    from notify.outbox.writer import OutboxSends


class OutboxTransaction:
    """What both APIs' outbox backends share: the core (key and state) and the rows."""

    def __init__(self, db: object, key: str, session_id: str, raise_on_error: bool):
        self.core: TxCore[None] = TxCore(key, session_id)
        try:  # notify.outbox loads the writer (and the database drivers) on first use
            self.sends: OutboxSends = outbox.outbox_for(db).sends(db)  # type: ignore[arg-type]
        except OutboxError as e:
            raise ClientTransactionError(f"transaction(db=...): {e}", key) from e
        self._raise = raise_on_error

    def add(
        self, msg: Draft, delay: float | None = None, deliver_at: datetime | float | None = None
    ) -> SendResult:
        """Check ``msg`` and build its row (raises, or a failed result, when it is bad:
        the transaction is then rollback-only). ``delay``/``deliver_at``: a delayed
        message, published when due (the outbox keeps it until then)."""
        core = self.core
        core.check_open()
        refused = core.refusal()
        if refused is not None:  # rollback-only: later sends are refused too
            return self._failed(refused)
        topic, data, attribute, key, headers = msg
        try:
            self.sends.add(
                topic, data, attribute, key, headers=headers, delay=delay, deliver_at=deliver_at
            )
        except OutboxError as e:
            core.mark(e)
            return self._failed(e)
        return SendResult(True, None)

    def _failed(self, err: Exception) -> SendResult:
        if self._raise:
            raise err
        return SendResult(False, None, error=err)

    def hand_over(self) -> None:
        """Commit: hand the rows to the database transaction (or roll back and raise when
        a send failed)."""
        self.start_hand_over()
        try:
            self.sends.write()
        except BaseException:
            self.core.fire(TxEvent.ERROR)
            raise
        self.core.fire(TxEvent.COMMITTED)

    def start_hand_over(self) -> None:
        """Start the commit: roll back and raise when a send failed."""
        core = self.core
        core.start_commit()
        if core.failure is not None:
            self.sends.discard()
            core.fire(TxEvent.ROLLBACK)
            raise core.abort()

    def drop(self) -> None:
        """Roll back: drop the rows not handed over yet."""
        if self.core.start_rollback():
            self.sends.discard()
            self.core.rolled_back()


class OutboxBackend(OutboxTransaction):
    """The blocking API's backend of ``transaction(db=...)``."""

    def __init__(self, db: object, key: str, session_id: str, raise_on_error: bool):
        if outbox.is_async_connection(db):
            raise ClientTransactionError(
                f"transaction(db=...): {type(db).__name__} is an asyncio connection: the "
                "blocking producer takes a Connection, a Session or a psycopg.Connection; "
                "use an AsyncProducer's `async with producer.transaction(db=conn)`",
                key,
            )
        super().__init__(db, key, session_id, raise_on_error)

    def send_future(self, msg: Draft) -> concurrent.futures.Future[SendResult]:
        fut: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        try:
            fut.set_result(self.add(msg))
        except Exception as e:
            fut.set_exception(e)
        return fut

    def commit(self, timeout_s: float | None = None) -> None:
        self.hand_over()

    def rollback(self, timeout_s: float | None = None) -> None:
        self.drop()


class AsyncOutboxBackend(OutboxTransaction):
    """The asyncio API's backend of ``transaction(db=...)``.

    ``db`` an asyncio connection: a send waits for the outbox's shard count when it is
    not read yet (one read per outbox, awaited), sends queued meanwhile wait behind it (a
    chain: rows are added in call order), and the block's exit awaits the hand-over.
    ``db`` a blocking connection: handing rows to a SQLAlchemy connection does no I/O; a
    psycopg connection inserts them at commit, on the loop."""

    def __init__(self, db: object, key: str, session_id: str, raise_on_error: bool):
        super().__init__(db, key, session_id, raise_on_error)
        #: the last send still waiting for the shard count (None: none waits)
        self._last: asyncio.Task[SendResult] | None = None

    def send_nowait(self, msg: Draft) -> asyncio.Future[SendResult]:
        return self.send_later(msg, None, None)

    def send_later(
        self, msg: Draft, delay: float | None, deliver_at: datetime | float | None
    ) -> asyncio.Future[SendResult]:
        """Add ``msg`` (a delayed row with ``delay``/``deliver_at``): now when the rows can
        be built, else once the shard count is read, after the sends before it."""
        if self._last is None and self.sends.ready:
            fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
            try:
                fut.set_result(self.add(msg, delay, deliver_at))
            except Exception as e:
                fut.set_exception(e)
            return fut
        self.core.check_open()
        task = asyncio.ensure_future(self._add_after(self._last, msg, delay, deliver_at))
        self._last = task
        task.add_done_callback(self._settled)
        # a caller cancelled while it waits does not take the send back (as a queued send
        # of a broker transaction): the row is added all the same, in its place
        return asyncio.shield(task)

    async def _add_after(
        self,
        before: asyncio.Task[SendResult] | None,
        msg: Draft,
        delay: float | None,
        deliver_at: datetime | float | None,
    ) -> SendResult:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own caller's
        try:
            await self.sends.prepare()
        except OutboxError as e:  # e.g. the tables are missing: as a refused send
            self.core.mark(e)
            return self._failed(e)
        return self.add(msg, delay, deliver_at)

    def _settled(self, task: asyncio.Task[SendResult]) -> None:
        if self._last is task:
            self._last = None
        if not task.cancelled():
            task.exception()  # retrieved: a caller that did not await it is not warned

    async def _queued(self) -> None:
        """Wait for the sends still waiting for the shard count."""
        last = self._last
        if last is not None:
            await asyncio.wait([last])

    async def commit(self) -> None:
        await self._queued()
        if not self.sends.is_async:
            self.hand_over()
            return
        self.start_hand_over()
        try:
            await self.sends.write_async()
        except BaseException:
            self.core.fire(TxEvent.ERROR)
            raise
        self.core.fire(TxEvent.COMMITTED)

    async def rollback(self) -> None:
        await self._queued()
        self.drop()


def outbox_of(tx: object) -> OutboxTransaction | None:
    """The outbox backend of transaction handle ``tx`` (None: not one, or none)."""
    backend = getattr(tx, "_backend", None)
    return backend if isinstance(backend, OutboxTransaction) else None
