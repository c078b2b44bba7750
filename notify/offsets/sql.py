"""Consumer offsets in a SQL table (PostgreSQL, MySQL/MariaDB, SQLite), SQLAlchemy 2.

The table is MetaQ's ``meta_topic_partition_group_offset`` (see :mod:`notify.offsets.schema`),
created by ``notify db upgrade --url URL``. A commit is one transaction holding one upsert
statement per 500 partitions, in the dialect's own form: ``INSERT .. ON CONFLICT DO UPDATE``
(PostgreSQL, SQLite) or ``INSERT .. ON DUPLICATE KEY UPDATE`` (MySQL, MariaDB).

Errors: a missing table raises :class:`~notify.offsets.base.OffsetTableMissingError` naming
the command to run; an unreachable database, a dropped connection or a deadlock raises the
retriable :class:`~notify.offsets.base.OffsetStoreUnavailableError` (nothing may be assumed
stored; commits are idempotent, so the caller simply commits again later).

:meth:`SqlOffsetStore.commit_in` writes offsets inside a transaction the application owns:
that is what makes consumption exactly-once (see :mod:`notify.offsets.tx`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine

from notify.client.offsets import TopicPartitionOffset
from notify.dbengine import (
    DEFAULT_CONNECT_TIMEOUT_S,
    SUPPORTED_DIALECTS,
    create_offset_engine,
    safe_url,
)
from notify.migrations import upgrade

from .base import (
    OffsetConflictError,
    OffsetStoreError,
    OffsetStoreUnavailableError,
    OffsetTableMissingError,
    StoredOffset,
    dedupe_offsets,
    sort_key,
)
from .schema import OFFSET_TABLE, offsets_table

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "SUPPORTED_DIALECTS",
    "SqlOffsetStore",
    "create_offset_engine",
    "safe_url",
    "translate_db_error",
]

log = logging.getLogger("notify.offsets")

_ROWS_PER_STATEMENT = 500
_DEADLOCK_RETRIES = 3


def _orig(e: BaseException) -> BaseException:
    orig = getattr(e, "orig", None)
    return orig if isinstance(orig, BaseException) else e


def _first_line(e: BaseException) -> str:
    text = str(_orig(e)).strip() or type(_orig(e)).__name__
    return text.splitlines()[0]


def _mysql_code(e: BaseException) -> int | None:
    args = getattr(_orig(e), "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def _sqlstate(e: BaseException) -> str | None:
    state = getattr(_orig(e), "sqlstate", None)
    return state if isinstance(state, str) else None


def is_missing_table(e: BaseException) -> bool:
    """Whether a driver error says a table does not exist (PostgreSQL, MySQL, SQLite)."""
    return (
        _sqlstate(e) == "42P01"
        or _mysql_code(e) == 1146
        or "no such table" in str(_orig(e)).lower()
    )


def is_transient_conflict(e: BaseException) -> bool:
    """Deadlock, serialization failure, lock wait timeout or a locked SQLite database."""
    return (
        _sqlstate(e) in ("40P01", "40001")
        or _mysql_code(e) in (1213, 1205)
        or "database is locked" in str(_orig(e)).lower()
    )


def translate_db_error(e: sa_exc.SQLAlchemyError, url: str) -> OffsetStoreError:
    """The :mod:`notify.offsets` error for a SQLAlchemy/driver error."""
    if is_missing_table(e):
        return OffsetTableMissingError(f"offset table missing: run `notify db upgrade --url {url}`")
    msg = _first_line(e)
    unavailable = (
        isinstance(e, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError)
        or (isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated)
        or is_transient_conflict(e)
    )
    if unavailable:
        return OffsetStoreUnavailableError(f"offset database {url} unavailable: {msg}")
    return OffsetStoreError(f"offset database {url}: {msg}")


def _utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _now(dialect: str) -> datetime:
    now = datetime.now(UTC)
    # Only PostgreSQL keeps the zone (timestamptz); MySQL DATETIME and SQLite store naive UTC.
    return now if dialect == "postgresql" else now.replace(tzinfo=None)


class SqlOffsetStore:
    """Offsets in MetaQ's SQL table; implements the client's ``OffsetStore`` Protocol.

    ``bind``: a URL (``postgresql+psycopg://``, ``mysql+pymysql://``, ``sqlite:///path``;
    the store then owns and disposes the engine) or an :class:`~sqlalchemy.engine.Engine`
    (shared, e.g. the application's own; not disposed by :meth:`close`). ``table``: another
    table name with the same columns. ``create_table``: run the migrations to head first
    (handy for an embedded SQLite file; servers should use ``notify db upgrade``).

    Thread-safe: every call takes its own pooled connection.
    """

    def __init__(
        self,
        bind: str | URL | Engine,
        *,
        table: str = OFFSET_TABLE,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        create_table: bool = False,
    ) -> None:
        if isinstance(bind, Engine):
            self.engine = bind
            self._own_engine = False
        else:
            self.engine = create_offset_engine(bind, connect_timeout_s)
            self._own_engine = True
        self.dialect = self.engine.dialect.name
        self.url = safe_url(self.engine.url)
        if self.dialect not in SUPPORTED_DIALECTS:
            self.close()
            raise OffsetStoreError(f"unsupported database dialect {self.dialect!r}")
        self.table = offsets_table(sa.MetaData(), table)
        self._closed = False
        if create_table:
            try:
                upgrade(self.engine)
            except BaseException:
                self.close()
                raise

    # -- OffsetStore

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """The committed offset of ``group`` in ``topic``/``partition``, or None."""
        self._check_open()
        t = self.table
        stmt = sa.select(t.c.offset, t.c.msg_id).where(
            t.c.group_id == group, t.c.topic == topic, t.c.partition == partition
        )
        with self._translated(), self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        if row is None:
            return None
        return TopicPartitionOffset(topic, partition, int(row[0]), int(row[1]))

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """Store ``offsets`` of ``group`` in one transaction (all or nothing).

        Retries deadlocks itself; raises the retriable
        :class:`~notify.offsets.base.OffsetStoreUnavailableError` when the database cannot
        be reached or the commit's outcome is unknown.
        """
        offs = dedupe_offsets(offsets)
        if not offs:
            return
        self._check_open()
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                with self.engine.begin() as conn:
                    self._upsert(conn, group, offs)
                return
            except sa_exc.SQLAlchemyError as e:
                if is_transient_conflict(e) and attempt + 1 < _DEADLOCK_RETRIES:
                    log.info("offset commit of %s hit %s; retrying", group, _first_line(e))
                    time.sleep(0.01 * (attempt + 1))
                    continue
                raise translate_db_error(e, self.url) from e

    def close(self) -> None:
        """Dispose the engine (when the store created it). Idempotent."""
        self._closed = True
        if self._own_engine:
            self.engine.dispose()

    # -- inside the application's transaction

    def commit_in(
        self,
        conn: Connection,
        group: str,
        offsets: Sequence[TopicPartitionOffset],
        expected: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """Write ``offsets`` on ``conn`` inside its current transaction (no commit).

        ``expected`` maps ``(topic, partition)`` to the offset the work started from (the
        first message's offset). When given, the stored rows are locked (``SELECT .. FOR
        UPDATE``) and checked: if another consumer already stored an offset beyond the
        start, or inserts a first row concurrently, :class:`OffsetConflictError` is raised
        and the caller must roll back. That fences a stale consumer of the same group.
        """
        offs = dedupe_offsets(offsets)
        if not offs:
            return
        self._check_open()
        try:
            if expected is None:
                self._upsert(conn, group, offs)
                return
            stored = self._lock_rows(conn, group, [(o.topic, o.partition) for o in offs])
            for o in offs:
                key = (o.topic, o.partition)
                have, start = stored.get(key), expected.get(key)
                if have is not None and start is not None and have > start:
                    raise OffsetConflictError(
                        f"group {group} already committed {o.topic} {o.partition} up to "
                        f"{have}, beyond this batch's start {start}"
                    )
            old = [o for o in offs if (o.topic, o.partition) in stored]
            new = [o for o in offs if (o.topic, o.partition) not in stored]
            if old:
                self._upsert(conn, group, old)
            if new:
                now = _now(conn.dialect.name)
                conn.execute(sa.insert(self.table).values(self._rows(group, new, now)))
        except sa_exc.IntegrityError as e:
            if expected is None:
                raise translate_db_error(e, self.url) from e
            raise OffsetConflictError(
                f"group {group}: another consumer committed the same partitions first"
            ) from e
        except sa_exc.SQLAlchemyError as e:
            raise translate_db_error(e, self.url) from e

    def load_in(self, conn: Connection, group: str, topic: str) -> dict[str, int]:
        """``{partition: offset}`` of ``group`` in ``topic``, read on ``conn``."""
        t = self.table
        stmt = sa.select(t.c.partition, t.c.offset).where(t.c.group_id == group, t.c.topic == topic)
        with self._translated():
            return {str(p): int(o) for p, o in conn.execute(stmt)}

    # -- tooling (ManagedOffsetStore)

    def list_offsets(
        self, group: str | None = None, topic: str | None = None
    ) -> list[StoredOffset]:
        """All stored offsets, optionally of one group and/or topic."""
        self._check_open()
        t = self.table
        stmt = sa.select(
            t.c.group_id, t.c.topic, t.c.partition, t.c.offset, t.c.msg_id, t.c.updated_at
        )
        if group is not None:
            stmt = stmt.where(t.c.group_id == group)
        if topic is not None:
            stmt = stmt.where(t.c.topic == topic)
        with self._translated(), self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        out = [
            StoredOffset(str(g), str(tp), str(p), int(o), int(m), _utc(u))
            for g, tp, p, o, m, u in rows
        ]
        return sorted(out, key=sort_key)

    def delete(
        self, group: str, topic: str | None = None, partitions: Sequence[str] | None = None
    ) -> int:
        """Remove stored offsets of ``group`` (optionally one topic / some partitions)."""
        self._check_open()
        t = self.table
        stmt = sa.delete(t).where(t.c.group_id == group)
        if topic is not None:
            stmt = stmt.where(t.c.topic == topic)
        if partitions is not None:
            stmt = stmt.where(t.c.partition.in_(list(partitions)))
        with self._translated(), self.engine.begin() as conn:
            return int(conn.execute(stmt).rowcount)

    def check_table(self) -> None:
        """Raise :class:`OffsetTableMissingError` (or unavailable) unless the table is usable."""
        self._check_open()
        t = self.table
        with self._translated(), self.engine.connect() as conn:
            conn.execute(sa.select(t.c.offset).limit(1)).all()

    # -- internals

    def _check_open(self) -> None:
        if self._closed:
            raise OffsetStoreError("offset store is closed")

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sa_exc.SQLAlchemyError as e:
            raise translate_db_error(e, self.url) from e

    @staticmethod
    def _rows(
        group: str, offs: Sequence[TopicPartitionOffset], now: datetime
    ) -> list[dict[str, Any]]:
        return [
            {
                "group_id": group,
                "topic": o.topic,
                "partition": o.partition,
                "offset": o.offset,
                "msg_id": o.msg_id,
                "updated_at": now,
            }
            for o in offs
        ]

    def _lock_rows(
        self, conn: Connection, group: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], int]:
        t = self.table
        stmt = (
            sa.select(t.c.topic, t.c.partition, t.c.offset)
            .where(t.c.group_id == group, sa.tuple_(t.c.topic, t.c.partition).in_(keys))
            .with_for_update()
        )
        return {(str(tp), str(p)): int(o) for tp, p, o in conn.execute(stmt)}

    def _upsert(self, conn: Connection, group: str, offs: Sequence[TopicPartitionOffset]) -> None:
        """One upsert statement per chunk of rows, in ``conn``'s dialect."""
        dialect = conn.dialect.name
        now = _now(dialect)
        t = self.table
        for i in range(0, len(offs), _ROWS_PER_STATEMENT):
            rows = self._rows(group, offs[i : i + _ROWS_PER_STATEMENT], now)
            stmt: sa.Executable
            if dialect in ("postgresql", "sqlite"):
                if dialect == "postgresql":
                    ins: Any = pg_insert(t).values(rows)
                else:
                    ins = sqlite_insert(t).values(rows)
                stmt = ins.on_conflict_do_update(
                    index_elements=[t.c.group_id, t.c.topic, t.c.partition],
                    set_={
                        "offset": ins.excluded["offset"],
                        "msg_id": ins.excluded["msg_id"],
                        "updated_at": ins.excluded["updated_at"],
                    },
                )
            elif dialect in ("mysql", "mariadb"):
                mins = mysql_insert(t).values(rows)
                stmt = mins.on_duplicate_key_update(
                    {
                        "offset": mins.inserted["offset"],
                        "msg_id": mins.inserted["msg_id"],
                        "updated_at": mins.inserted["updated_at"],
                    }
                )
            else:  # pragma: no cover - rejected in __init__
                raise OffsetStoreError(f"unsupported database dialect {dialect!r}")
            conn.execute(stmt)

    def __enter__(self) -> SqlOffsetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlOffsetStore({self.url!r}, table={self.table.name!r})"
