"""Half messages without a hand-written checker: markers in the application's database.

A half message's producer writes a *marker* (``notify_outbox_half``: group, transaction
key, state 1) in the same database transaction as the application's rows
(:meth:`HalfMarkers.mark`, at commit like an outbox row). When the broker checks back,
:meth:`HalfMarkers.check` answers from the table alone, from any process of the group:

1. insert a *tombstone* for the key (state 2) unless a row exists: ``INSERT .. ON
   CONFLICT DO NOTHING`` (MySQL ``INSERT IGNORE``, SQLite ``INSERT OR IGNORE``). If the
   application's transaction is committing its marker at that moment, the insert waits
   for it to end (the unique key), so it never decides while the outcome is open;
2. read the row: state 1, the transaction committed: COMMIT; state 2, it had not
   committed (and now never will: its marker would collide with the tombstone and its
   commit fail): ROLLBACK.

A lock wait longer than ``lock_timeout_s`` answers UNKNOWN (the broker asks again).
:meth:`forget` removes markers older than the broker can still ask about; :meth:`tidy`
does it every ``tidy_every_s`` for markers older than ``retention_s`` (7 days by default),
in the background.

:meth:`HalfMarkers.begin` opens the application's side of one half message: a connection
of the engine, its transaction begun and the marker pending (written in the commit's own
round trip on PostgreSQL, just before it elsewhere); ``commit`` and ``rollback`` end it.
A half message's client drives it: PREPARE sent, the block's database work on ``conn``,
PREPARE acknowledged, ``commit`` (the rows and the marker), then COMMIT of the message
(written without waiting for its answer: the committed marker decides).
A marker inserted late (the check-back's tombstone was first: the transaction took longer
than the broker's ``txCheckBackDelay``) fails that commit, so the database transaction and
the message are rolled back together.

Markers on a SQLAlchemy ``AsyncEngine``: :meth:`HalfMarkers.begin_async` opens the same
transaction on an ``AsyncConnection`` of it (awaited); the check-backs and the tidying,
which run on threads, use a blocking engine of their own on the same database.

Crash points (``NOTIFY_CRASHPOINTS``, :mod:`notify.faults`): ``half_before_db_commit``,
``half_after_db_commit`` (the database committed, the message not yet).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from enum import Enum
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from notify.faults import crashpoint

from .aio import blocking_twin, is_sa_engine, sync_engine
from .rows import Marker, OutboxArgumentError, OutboxError, build_marker
from .sql import NOW_MS, dialect_name
from .writer import AppConnection, OutboxConfig, write

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("notify.outbox")

#: How long a marker is kept (``HalfMarkers.retention_s``): the broker may check back on a
#: prepared half message for as long as no producer of its group answers, so keep markers
#: longer than any outage of the group's producers you plan to survive.
DEFAULT_RETENTION_S: Final = 7 * 24 * 3600.0

#: notify_outbox_half.state
COMMITTED = 1
ROLLED_BACK = 2


class HalfMessageCheckedBackError(OutboxError):
    """A half message's database transaction could not commit: the broker's check-back
    found no marker first and answered ROLLBACK (both are rolled back)."""


class HalfState(Enum):
    """A check-back's answer."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


class HalfMarkers:
    """Markers of one producer group's half messages (see the module doc)."""

    def __init__(
        self,
        engine: Engine | AsyncEngine,
        group: str,
        lock_timeout_s: float = 5.0,
        retention_s: float = DEFAULT_RETENTION_S,
        tidy_every_s: float = 600.0,
    ):
        build_marker(group, "k")
        #: the application's AsyncEngine (None: a blocking Engine); see begin_async
        self.async_engine: AsyncEngine | None = None
        if is_sa_engine(engine):
            dialect_name(sync_engine(engine).dialect)
            self.async_engine = engine
            # check-backs and tidying run on threads: a blocking engine on the database
            engine = blocking_twin(engine.sync_engine)
            weakref.finalize(self, engine.dispose)
        elif not isinstance(engine, Engine):
            raise OutboxArgumentError(
                "half-message markers need a SQLAlchemy Engine or AsyncEngine, not "
                f"{type(engine).__name__}"
            )
        if not lock_timeout_s > 0 or not retention_s > 0 or not tidy_every_s > 0:
            raise ValueError("lock_timeout_s, retention_s and tidy_every_s must be > 0")
        #: the blocking engine: the application's, or one of the markers' own
        self.engine: Engine = engine
        self.group = group
        self.d = dialect_name(engine.dialect)
        self.lock_timeout_s = lock_timeout_s
        self.retention_s = retention_s
        self.tidy_every_s = tidy_every_s
        self._cfg = OutboxConfig()
        self._next_tidy = 0.0
        self._tidy_lock = threading.Lock()

    def mark(self, conn: AppConnection, tx_key: str) -> None:
        """Write the marker of ``tx_key`` in ``conn``'s transaction (at its commit)."""
        write(conn, self._cfg, build_marker(self.group, tx_key))

    def begin(self, tx_key: str) -> MarkedTransaction:
        """The database side of half message ``tx_key``: a connection of the engine in a
        transaction with the marker pending (see the module doc). Raises
        :class:`OutboxArgumentError` for a key a marker cannot hold (nothing opened)."""
        if self.async_engine is not None:
            raise OutboxArgumentError(
                "these markers are on an AsyncEngine: await begin_async() (an AsyncProducer's "
                "half_message), not begin()"
            )
        return MarkedTransaction(self, build_marker(self.group, tx_key))

    async def begin_async(self, tx_key: str) -> AsyncMarkedTransaction:
        """:meth:`begin` on the ``AsyncEngine`` these markers were made with: an
        ``AsyncConnection`` in a transaction with the marker pending, awaited."""
        marker = build_marker(self.group, tx_key)
        if self.async_engine is None:
            raise OutboxArgumentError(
                "these markers are on a blocking Engine: begin(), not begin_async()"
            )
        tx = AsyncMarkedTransaction(self, marker)
        await tx.open(self.async_engine)
        return tx

    def check(self, tx_key: str) -> HalfState:
        """The outcome of ``tx_key``'s database transaction, decided for good."""
        build_marker(self.group, tx_key)
        ignore = {"postgresql": "", "mysql": "IGNORE ", "sqlite": "OR IGNORE "}[self.d]
        conflict = " ON CONFLICT DO NOTHING" if self.d == "postgresql" else ""
        params = {"g": self.group, "k": tx_key, "st": ROLLED_BACK}
        # MySQL/MariaDB: a locking read sees the row committed meanwhile, whatever the
        # isolation level's snapshot
        lock = " LOCK IN SHARE MODE" if self.d == "mysql" else ""
        ms = max(1, int(self.lock_timeout_s * 1000))
        try:
            with self.engine.connect() as c:
                restore = self._lock_timeout(c, ms)
                try:
                    with c.begin():
                        if self.d == "postgresql":
                            c.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
                        c.execute(
                            sa.text(
                                f"INSERT {ignore}INTO notify_outbox_half (group_id, tx_key, "
                                f"state) VALUES (:g, :k, :st){conflict}"
                            ),
                            params,
                        )
                        state = c.execute(
                            sa.text(
                                "SELECT state FROM notify_outbox_half WHERE group_id = :g "
                                f"AND tx_key = :k{lock}"
                            ),
                            params,
                        ).scalar()
                finally:
                    if restore is not None and not c.invalidated:
                        c.exec_driver_sql(restore)
                        c.commit()
        except sa_exc.OperationalError:
            return HalfState.UNKNOWN  # a lock wait timed out or the database is away
        if state == COMMITTED:
            return HalfState.COMMIT
        return HalfState.ROLLBACK if state == ROLLED_BACK else HalfState.UNKNOWN

    def _lock_timeout(self, c: sa.Connection, ms: int) -> str | None:
        """MySQL/MariaDB (whole seconds) and SQLite: set the connection's lock wait for
        the check; the statement restoring the pooled connection's own afterwards."""
        if self.d == "mysql":
            var = "@@SESSION.innodb_lock_wait_timeout"
            before = int(c.exec_driver_sql(f"SELECT {var}").scalar_one())
            c.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {max(1, ms // 1000)}")
            c.commit()
            return f"SET SESSION innodb_lock_wait_timeout = {before}"
        if self.d == "sqlite":
            before = int(c.exec_driver_sql("PRAGMA busy_timeout").scalar_one())
            c.exec_driver_sql(f"PRAGMA busy_timeout = {ms}")
            c.commit()
            return f"PRAGMA busy_timeout = {before}"
        return None

    def state(self, tx_key: str) -> int | None:
        """The marker's state of ``tx_key`` (1 committed, 2 tombstone), None without one."""
        with self.engine.connect() as c:
            v = c.execute(
                sa.text(
                    "SELECT state FROM notify_outbox_half WHERE group_id = :g AND tx_key = :k"
                ),
                {"g": self.group, "k": tx_key},
            ).scalar()
        return None if v is None else int(v)

    def tidy(self) -> None:
        """Remove the group's markers older than ``retention_s``, at most once every
        ``tidy_every_s``, on a thread of its own (the caller never waits for it)."""
        now = time.monotonic()
        if now < self._next_tidy:
            return
        with self._tidy_lock:
            if now < self._next_tidy:
                return
            self._next_tidy = now + self.tidy_every_s
        threading.Thread(target=self._tidy, name="notify-half-tidy", daemon=True).start()

    def _tidy(self) -> None:
        try:
            n = self.forget(self.retention_s)
        except sa_exc.SQLAlchemyError as e:
            log.warning("half-message markers of %s not tidied: %s", self.group, e)
            return
        if n:
            log.info(
                "half-message markers of %s: %d older than %.0f s removed",
                self.group,
                n,
                self.retention_s,
            )

    def forget(self, older_than_s: float) -> int:
        """Remove the group's markers older than ``older_than_s``; how many."""
        with self.engine.begin() as c:
            n = c.execute(
                sa.text(
                    "DELETE FROM notify_outbox_half WHERE group_id = :g AND "
                    f"created_ms < {NOW_MS[self.d]} - :ms"
                ),
                {"g": self.group, "ms": int(older_than_s * 1000)},
            ).rowcount
        return int(n)


class MarkedTransaction:
    """The application's database transaction of one half message (made by
    :meth:`HalfMarkers.begin`): ``conn`` is a SQLAlchemy connection of the markers' engine,
    its transaction begun with the marker pending; :meth:`commit` or :meth:`rollback` ends
    it and returns the connection to the pool."""

    def __init__(self, markers: HalfMarkers, marker: Marker):
        self.tx_key = marker.tx_key
        self.markers = markers
        self.conn: Connection = markers.engine.connect()
        try:
            self.conn.begin()
            write(self.conn, markers._cfg, marker)
        except BaseException:
            self.conn.close()
            raise

    def commit(self) -> None:
        """Commit the application's rows and the marker (raises what the commit raises:
        the transaction is then rolled back, the marker with it)."""
        crashpoint("half_before_db_commit")
        try:
            self.conn.commit()
        except sa_exc.IntegrityError as e:
            self.conn.close()
            if self.markers.state(self.tx_key) == ROLLED_BACK:
                raise _checked_back(self.tx_key) from e
            raise
        finally:
            self.conn.close()
        crashpoint("half_after_db_commit")

    def rollback(self) -> None:
        """Roll the application's rows and the marker back."""
        try:
            self.conn.rollback()
        finally:
            self.conn.close()


def _checked_back(tx_key: str) -> HalfMessageCheckedBackError:
    """The error of a commit that lost to the check-back's tombstone."""
    return HalfMessageCheckedBackError(
        f"half message {tx_key}: the broker checked back before this database transaction "
        "committed (it ran longer than txCheckBackDelay) and the answer was ROLLBACK: the "
        "transaction and the message are rolled back"
    )


class AsyncMarkedTransaction:
    """:class:`MarkedTransaction` on an ``AsyncConnection`` (made by
    :meth:`HalfMarkers.begin_async`): ``conn`` in a transaction with the marker pending;
    ``await`` :meth:`commit` or :meth:`rollback` ends it and returns the connection."""

    def __init__(self, markers: HalfMarkers, marker: Marker):
        self.tx_key = marker.tx_key
        self.markers = markers
        self._marker = marker
        self._conn: AsyncConnection | None = None

    @property
    def conn(self) -> AsyncConnection:
        """The application's connection for the block's database work."""
        assert self._conn is not None, "not open"
        return self._conn

    async def open(self, engine: AsyncEngine) -> None:
        conn = await engine.connect()
        try:
            await conn.begin()
            await conn.run_sync(write, self.markers._cfg, self._marker)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def commit(self) -> None:
        """Commit the application's rows and the marker (raises what the commit raises:
        the transaction is then rolled back, the marker with it)."""
        conn = self.conn
        crashpoint("half_before_db_commit")
        try:
            await conn.commit()
        except sa_exc.IntegrityError as e:
            await conn.close()
            state = await asyncio.to_thread(self.markers.state, self.tx_key)
            if state == ROLLED_BACK:
                raise _checked_back(self.tx_key) from e
            raise
        finally:
            await conn.close()
        crashpoint("half_after_db_commit")

    async def rollback(self) -> None:
        """Roll the application's rows and the marker back."""
        conn = self.conn
        try:
            await conn.rollback()
        finally:
            await conn.close()
