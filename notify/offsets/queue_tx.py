"""Transactional acknowledgement of queue messages: the application's rows and the fact
that a message was applied, in ONE database transaction.

Each queue message is named for good by ``(group, topic, partition, offset)``. A
:meth:`QueueInbox.transaction` first *claims* its messages in the application's database
(one row each in ``notify_queue_done``, created by ``notify db upgrade``), then yields the
ones not claimed before; the application writes its effects on the same connection; on exit
everything commits together and only then are the messages accepted on the broker::

    inbox = QueueInbox(engine)
    for msg in consumer.messages():
        with inbox.transaction([msg]) as tx:      # BEGIN + claim
            for m in tx.messages:                 # empty for a redelivery of a done one
                tx.connection.execute(insert(invoices).values(data=m.data))
        # COMMIT (rows + claims), then the broker ack

A crash anywhere:

* before the commit: nothing of the transaction exists; the broker still holds the message
  as acquired and gives it again (at once when the connection drops, else after
  ``queueLockTimeout``): applied then, once;
* between the commit and the broker's answer to the ack: the message comes back, its claim
  is there, so it is acknowledged without being applied again;
* after the ack: the broker never gives it again.

Two consumers holding the same message (the first one's lock ran out while it worked):
the claim is a primary key, so the second transaction's claim waits for the first one and
then finds it done (or fails and is retried once the first one committed).

Claims are kept for ``retention`` (default :data:`DEFAULT_RETENTION`, 7 days): at most
every ``prune_interval`` (default 1 hour) a transaction, after its ack, deletes the claims
older than that (:meth:`QueueInbox.prune`; see its doc for what "old" must cover).
``retention=None`` keeps them all (prune by hand).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from notify.client import SyncQueueMessage, settle_all
from notify.faults import crashpoint

from .base import OffsetStoreError, OffsetStoreUnavailableError
from .schema import QUEUE_DONE_TABLE, queue_done_table
from .sql import is_missing_table, translate_db_error

__all__ = ["QueueInbox", "QueueTransaction"]

log = logging.getLogger("notify.offsets")

#: Claim attempts when a concurrent transaction claimed the same message first.
CLAIM_ATTEMPTS = 3
#: How long claims are kept by default (the Queues guide: longer than a message can come back).
DEFAULT_RETENTION = dt.timedelta(days=7)
#: How often, at most, a transaction prunes the claims past the retention.
DEFAULT_PRUNE_INTERVAL = dt.timedelta(hours=1)


class QueueTransaction:
    """The messages of one :meth:`QueueInbox.transaction` that this transaction applies,
    and the connection to write their effects on."""

    def __init__(
        self,
        connection: Connection,
        messages: list[SyncQueueMessage],
        duplicates: list[SyncQueueMessage],
    ) -> None:
        #: The application's connection, inside the transaction.
        self.connection = connection
        #: The messages to apply (not claimed by an earlier transaction).
        self.messages = messages
        #: Redeliveries of messages an earlier transaction applied: only acknowledged.
        self.duplicates = duplicates
        #: After the block: per message (applied ones first, then duplicates), whether the
        #: broker accepted the ack (False: the lock was lost; it comes back as a duplicate).
        self.acked: list[bool] = []

    def __iter__(self) -> Iterator[SyncQueueMessage]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)


def _key(m: SyncQueueMessage) -> tuple[str, str, str, int]:
    return (m.group, m.topic, m.partition_key, m.offset)


class QueueInbox:
    """Claims of applied queue messages in the application's database (``engine``, with
    ``notify db upgrade`` run on it; ``table`` names the claims table). Claims older than
    ``retention`` are deleted at most every ``prune_interval`` after a transaction's ack
    (``retention=None``: never, call :meth:`prune` yourself)."""

    def __init__(
        self,
        engine: Engine,
        table: str = QUEUE_DONE_TABLE,
        retention: dt.timedelta | None = DEFAULT_RETENTION,
        prune_interval: dt.timedelta = DEFAULT_PRUNE_INTERVAL,
    ) -> None:
        if retention is not None and retention <= dt.timedelta(0):
            raise OffsetStoreError(f"retention must be positive (or None), got {retention}")
        if prune_interval < dt.timedelta(0):
            raise OffsetStoreError(f"prune_interval must be >= 0, got {prune_interval}")
        self.engine = engine
        self.table = queue_done_table(sa.MetaData(), table)
        self._url = engine.url.render_as_string(hide_password=True)
        self.retention = retention
        self.prune_interval = prune_interval
        self._next_prune = 0.0  # time.monotonic() of the next automatic prune
        #: claims deleted by the automatic pruning so far
        self.pruned = 0

    @contextlib.contextmanager
    def transaction(self, messages: Sequence[SyncQueueMessage]) -> Iterator[QueueTransaction]:
        """BEGIN, claim ``messages``, yield the ones to apply; COMMIT on normal exit, then
        accept all of them on the broker (one frame per broker). On an exception (in the
        block or the commit) the transaction rolls back, the messages are released for
        redelivery and the exception propagates; a failed COMMIT raises
        :class:`~notify.offsets.base.OffsetStoreUnavailableError` (its outcome is unknown:
        the redelivery finds out, by the claim)."""
        msgs = list(messages)
        conn, tx, qt = self._claim(msgs)
        try:
            try:
                yield qt
            except BaseException:
                with contextlib.suppress(sa_exc.SQLAlchemyError):
                    tx.rollback()
                settle_all(msgs, accept=False)
                raise
            try:
                tx.commit()
            except sa_exc.SQLAlchemyError as e:
                settle_all(msgs, accept=False)
                err = translate_db_error(e, self._url)
                raise OffsetStoreUnavailableError(
                    f"commit of the transaction failed (outcome unknown): {err}"
                ) from e
        finally:
            conn.close()
        crashpoint("queue_tx_committed")
        qt.acked = settle_all(qt.messages + qt.duplicates, accept=True)
        crashpoint("queue_tx_acked")
        self._auto_prune()

    def _auto_prune(self) -> None:
        """Delete the claims past ``retention``, at most once per ``prune_interval``; a
        failure is logged (the claims stay until the next attempt), never raised."""
        if self.retention is None:
            return
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + self.prune_interval.total_seconds()
        try:
            self.pruned += self.prune(self.retention)
        except OffsetStoreError as e:
            log.warning("queue inbox: pruning claims older than %s failed: %s",
                        self.retention, e)

    def _claim(
        self, msgs: list[SyncQueueMessage]
    ) -> tuple[Connection, sa.RootTransaction, QueueTransaction]:
        """A connection in a transaction that holds the claims of the new messages."""
        for attempt in range(CLAIM_ATTEMPTS):
            conn = self.engine.connect()
            tx = conn.begin()
            try:
                done = self._done_in(conn, msgs)
                fresh = [m for m in msgs if _key(m) not in done]
                if fresh:
                    conn.execute(
                        sa.insert(self.table),
                        [
                            {"group_id": m.group, "topic": m.topic, "partition": m.partition_key,
                             "offset": m.offset, "msg_id": m.msg_id}
                            for m in fresh
                        ],
                    )
                dups = [m for m in msgs if _key(m) in done]
                return conn, tx, QueueTransaction(conn, fresh, dups)
            except sa_exc.IntegrityError:
                # another transaction claimed one of them first (it held the same message):
                # now it committed, so the next attempt sees its claim
                tx.rollback()
                conn.close()
                log.info("queue claim raced with another transaction (attempt %d)", attempt + 1)
            except sa_exc.SQLAlchemyError as e:
                with contextlib.suppress(sa_exc.SQLAlchemyError):
                    tx.rollback()
                conn.close()
                settle_all(msgs, accept=False)
                raise translate_db_error(e, self._url) from e
            except BaseException:
                with contextlib.suppress(sa_exc.SQLAlchemyError):
                    tx.rollback()
                conn.close()
                settle_all(msgs, accept=False)
                raise
        settle_all(msgs, accept=False)
        raise OffsetStoreUnavailableError(
            f"could not claim {len(msgs)} queue messages after {CLAIM_ATTEMPTS} attempts "
            "(other transactions kept claiming them): released for redelivery"
        )

    def _done_in(
        self, conn: Connection, msgs: list[SyncQueueMessage]
    ) -> set[tuple[str, str, str, int]]:
        """The keys among ``msgs`` already claimed (committed)."""
        t = self.table
        out: set[tuple[str, str, str, int]] = set()
        by_gt: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for m in msgs:
            by_gt.setdefault((m.group, m.topic), []).append((m.partition_key, m.offset))
        for (group, topic), keys in by_gt.items():
            rows = conn.execute(
                sa.select(t.c.partition, t.c.offset).where(
                    t.c.group_id == group,
                    t.c.topic == topic,
                    sa.tuple_(t.c.partition, t.c.offset).in_(keys),
                )
            )
            out.update((group, topic, p, int(o)) for p, o in rows)
        return out

    def is_done(self, message: SyncQueueMessage) -> bool:
        """Whether a committed transaction applied ``message``."""
        try:
            with self.engine.connect() as conn:
                return _key(message) in self._done_in(conn, [message])
        except sa_exc.SQLAlchemyError as e:
            raise translate_db_error(e, self._url) from e

    def prune(self, older_than: dt.timedelta, group: str | None = None) -> int:
        """Delete the claims committed more than ``older_than`` ago (of ``group``, or all);
        returns how many. A message whose claim is gone is applied again if the broker
        gives it again, so ``older_than`` must cover every way it can come back: a message
        is given again only until the broker answered its ack (minutes at most: lock
        timeout and retries), or when an admin replays it from the dead-letter queue
        (a message applied but never acknowledged until ``queueMaxDeliveries``), or after
        a failover to an asynchronous slave that missed the last acks. Days are safe."""
        cutoff = dt.datetime.now(dt.UTC) - older_than
        if self.engine.dialect.name != "postgresql":
            cutoff = cutoff.replace(tzinfo=None)
        t = self.table
        stmt = sa.delete(t).where(t.c.done_at < cutoff)
        if group is not None:
            stmt = stmt.where(t.c.group_id == group)
        try:
            with self.engine.begin() as conn:
                return int(conn.execute(stmt).rowcount)
        except sa_exc.SQLAlchemyError as e:
            raise translate_db_error(e, self._url) from e

    def check_table(self) -> None:
        """Raise :class:`~notify.offsets.base.OffsetStoreError` unless the claims table
        exists (run ``notify db upgrade``)."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.select(self.table.c.offset).limit(1))
        except sa_exc.SQLAlchemyError as e:
            if is_missing_table(e):
                raise OffsetStoreError(
                    f"{self._url}: table {self.table.name} is missing: run "
                    "`notify db upgrade --url ...`"
                ) from e
            raise translate_db_error(e, self._url) from e
