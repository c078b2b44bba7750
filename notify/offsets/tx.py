"""Exactly-once consumption: the application's writes and the offsets in ONE transaction.

Keep the group's offsets in the application's own database (the offsets table, created by
``notify db upgrade``) and commit them in the same database transaction as the effects of
the messages. A crash anywhere then leaves either both (the batch is done and will not be
fetched again) or neither (the batch is fetched again and applied once)::

    engine = sqlalchemy.create_engine("postgresql+psycopg://app@db/app")
    with connect(["broker:8123"]) as session, \\
         TransactionalConsumer(session, "billing", engine) as consumer:
        while running:
            with consumer.transaction(engine, "orders") as batch:
                for msg in batch:
                    batch.connection.execute(insert(charges).values(...))
            # committed here: the charges and the new offsets together

:func:`offsets_tx` is the lower-level form for messages obtained any other way::

    with offsets_tx(store, engine, "billing", messages=msgs) as batch:
        ...

Fencing: before the offsets are written, their rows are locked (``SELECT .. FOR UPDATE``)
and compared with where the batch started; if another consumer of the group already went
past, or wrote the first row concurrently, :class:`~notify.offsets.base.OffsetConflictError`
is raised and everything is rolled back. So even two live consumers of one partition never
apply a message twice.

How the consumer is driven: it is an ordinary :class:`notify.client.Consumer` using
``fetch``, created with :class:`CommittedOffsets` as its offset store (loads from the table,
ignores the consumer's own commits: only transactions move offsets). When a transaction
fails the consumer is replaced by a fresh one, which reloads the committed offsets: that is
the "seek back" (the client has no public seek yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from notify.client import Consumer, ConsumerConfig, Message, MessageSessionFactory
from notify.client.offsets import TopicPartitionOffset
from notify.errors import ClientError

from .base import OffsetStoreUnavailableError
from .sql import SqlOffsetStore, translate_db_error

__all__ = ["AppBind", "CommittedOffsets", "OffsetBatch", "TransactionalConsumer", "offsets_tx"]

log = logging.getLogger("notify.offsets")

AppBind = Engine | Connection | Session
"""Where the application's transaction runs: an engine (a connection is taken and
returned), a connection or an ORM session that is not already in a transaction."""


class CommittedOffsets:
    """The consumer-facing view of a :class:`SqlOffsetStore` for transactional use.

    ``load`` reads the committed offsets; ``commit`` does nothing, because offsets move only
    inside the application's transactions (:func:`offsets_tx`). ``close`` leaves the store
    open (it belongs to the caller).
    """

    def __init__(self, store: SqlOffsetStore) -> None:
        self.store = store

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """The committed offset (see :meth:`SqlOffsetStore.load`)."""
        return self.store.load(group, topic, partition)

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """Ignored: offsets are committed by transactions only."""
        return None

    def close(self) -> None:
        """Nothing to release (the store stays open)."""
        return None


class OffsetBatch:
    """The messages of one transaction and the connection to write their effects on."""

    def __init__(self, group: str, connection: Connection, messages: Iterable[Message] = ()):
        self.group = group
        #: The application's connection, inside the transaction.
        self.connection = connection
        self.messages: list[Message] = list(messages)

    def add(self, *messages: Message) -> None:
        """Count ``messages`` as handled in this transaction."""
        self.messages.extend(messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def offsets(self) -> list[TopicPartitionOffset]:
        """Per partition: the offset after the last message, with that message's id."""
        last: dict[tuple[str, str], Message] = {}
        for m in self.messages:
            key = (m.topic, str(m.partition))
            cur = last.get(key)
            if cur is None or m.offset > cur.offset:
                last[key] = m
        return [TopicPartitionOffset(t, p, m.next_offset, m.msg_id) for (t, p), m in last.items()]

    def starts(self) -> dict[tuple[str, str], int]:
        """Per partition: the offset of the first message (where this batch started)."""
        out: dict[tuple[str, str], int] = {}
        for m in self.messages:
            key = (m.topic, str(m.partition))
            out[key] = min(out.get(key, m.offset), m.offset)
        return out


class _AppTx:
    """Begin/commit/rollback over an engine, a connection or a session."""

    def __init__(self, bind: AppBind) -> None:
        self._close: Connection | None = None
        self._tx: Any
        if isinstance(bind, Engine):
            self.conn = self._close = bind.connect()
            try:
                self._tx = self.conn.begin()
            except BaseException:
                self.conn.close()
                raise
        elif isinstance(bind, Connection):
            if bind.in_transaction():
                raise ClientError(
                    "the connection is already in a transaction: offsets_tx must begin and "
                    "commit the transaction itself (commit or roll back first)"
                )
            self.conn = bind
            self._tx = bind.begin()
        elif isinstance(bind, Session):
            if bind.in_transaction():
                raise ClientError(
                    "the session is already in a transaction: offsets_tx must begin and "
                    "commit the transaction itself (commit or roll back first)"
                )
            self._tx = bind.begin()
            self.conn = bind.connection()
        else:
            raise TypeError(f"expected an Engine, Connection or Session, not {type(bind)!r}")

    def commit(self) -> None:
        self._tx.commit()

    def rollback(self) -> None:
        try:
            self._tx.rollback()
        except sa_exc.SQLAlchemyError as e:  # the connection may be gone: nothing committed
            log.debug("rollback failed: %s", e)

    def close(self) -> None:
        if self._close is not None:
            self._close.close()


@contextlib.contextmanager
def offsets_tx(
    target: SqlOffsetStore | TransactionalConsumer,
    bind: AppBind,
    group: str | None = None,
    *,
    messages: Iterable[Message] = (),
    topic: str | None = None,
    max_wait_s: float = 1.0,
) -> Iterator[OffsetBatch]:
    """A transaction on ``bind`` that also commits the offsets of the batch's messages.

    With a :class:`SqlOffsetStore`: ``group`` is required; the batch starts with
    ``messages`` and more can be :meth:`OffsetBatch.add`-ed. With a
    :class:`TransactionalConsumer`: same as ``consumer.transaction(bind, topic)``.

    On normal exit the offsets are written (fenced, see the module doc) and the transaction
    commits; on an exception it rolls back and the exception propagates. A commit that fails
    raises the retriable :class:`~notify.offsets.base.OffsetStoreUnavailableError` (the
    outcome may be unknown: re-read the offsets before going on, as
    :class:`TransactionalConsumer` does).
    """
    if isinstance(target, TransactionalConsumer):
        if topic is None:
            raise ClientError("offsets_tx with a consumer needs topic=")
        with target.transaction(bind, topic, max_wait_s) as batch:
            yield batch
        return
    if group is None:
        raise ClientError("offsets_tx with a store needs the consumer group")
    store = target
    try:
        tx = _AppTx(bind)
    except sa_exc.SQLAlchemyError as e:
        raise translate_db_error(e, store.url) from e
    try:
        batch = OffsetBatch(group, tx.conn, messages)
        try:
            yield batch
            store.commit_in(tx.conn, group, batch.offsets(), expected=batch.starts())
        except BaseException:
            tx.rollback()
            raise
        try:
            tx.commit()
        except sa_exc.SQLAlchemyError as e:
            err = translate_db_error(e, store.url)
            raise OffsetStoreUnavailableError(
                f"commit of the transaction failed (outcome unknown): {err}"
            ) from e
    finally:
        tx.close()


class TransactionalConsumer:
    """A pull consumer whose offsets move only with the application's transactions.

    ``store``: the :class:`SqlOffsetStore` in the application's database, or the
    application's :class:`~sqlalchemy.engine.Engine` (a store is made over it). ``config``:
    the group name or a :class:`~notify.client.ConsumerConfig` (not broadcast). Each
    :meth:`transaction` fetches one window of one partition (at most ``max_size`` bytes,
    so ``max_size`` bounds the batch).
    """

    def __init__(
        self,
        session: MessageSessionFactory,
        config: ConsumerConfig | str,
        store: SqlOffsetStore | Engine,
        *,
        max_size: int = 1 << 20,
    ) -> None:
        cfg = ConsumerConfig(group=config) if isinstance(config, str) else config
        if cfg.broadcast:
            raise ClientError("a broadcast consumer keeps its offsets locally: not transactional")
        self.config = dataclasses.replace(cfg, listener_threads=0, commit_interval_s=0)
        self.session = session
        self._own_store = isinstance(store, Engine)
        self.store = SqlOffsetStore(store) if isinstance(store, Engine) else store
        self.max_size = max_size
        self._view = CommittedOffsets(self.store)
        self._consumer: Consumer | None = None
        self._subscribed: set[str] = set()
        self._closed = False
        #: How many times the consumer was replaced to re-read committed offsets.
        self.rewinds = 0

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.config.group

    def _fetch(self, topic: str, max_wait_s: float) -> list[Message]:
        if self._closed:
            raise ClientError("transactional consumer is closed")
        if self._consumer is None:
            self._consumer = self.session.create_consumer(self.config, offset_store=self._view)
            self._subscribed = set()
        if topic not in self._subscribed:
            self._consumer.subscribe(topic, None, max_size=self.max_size)
            self._subscribed.add(topic)
        return self._consumer.fetch(topic, max_wait_s)

    @contextlib.contextmanager
    def transaction(
        self, bind: AppBind, topic: str, max_wait_s: float = 1.0
    ) -> Iterator[OffsetBatch]:
        """Fetch the next messages of ``topic`` and yield them in a transaction on ``bind``.

        The batch may be empty (nothing arrived within ``max_wait_s``). On normal exit the
        application's writes and the offsets commit together; on any error everything rolls
        back, the consumer re-reads the committed offsets and the error propagates.
        """
        try:
            msgs = self._fetch(topic, max_wait_s)
            with offsets_tx(self.store, bind, self.group, messages=msgs) as batch:
                yield batch
        except BaseException:
            self.rewind()
            raise

    def rewind(self) -> None:
        """Forget in-memory positions: the next fetch starts at the committed offsets."""
        if self._consumer is not None:
            self.rewinds += 1
        self._drop_consumer()

    def _drop_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.shutdown()
            except Exception as e:  # its commit is a no-op; anything else is noise now
                log.debug("shutdown of replaced consumer: %s", e)

    def close(self) -> None:
        """Stop the consumer (offsets are already committed by the transactions)."""
        self._drop_consumer()
        self._closed = True
        if self._own_store:
            self.store.close()

    def __enter__(self) -> TransactionalConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
