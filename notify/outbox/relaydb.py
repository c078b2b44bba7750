"""The relay's database side, per dialect: leadership of a shard, its cycles, wake-ups,
delayed rows, instance heartbeats.

A shard's relay holds two connections: the *control* connection (autocommit) holds the
shard's leadership lock for as long as the session lives (PostgreSQL advisory lock,
MySQL/MariaDB ``GET_LOCK``, SQLite an exclusive ``flock`` on a file beside the database)
and, on PostgreSQL, LISTENs; the *work* connection runs the cycles. Leadership is an
election hint; safety comes from the epoch: every write of a leader is conditional on
``notify_outbox_relay.epoch`` still being the one it set when it took over (its row lock
orders it against the next leader's take-over), so a relay that lost its lock and does
not know it yet cannot record or remove anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from .plan import RelayRow
from .publisher import Identity
from .rows import OutboxError, PendingBatch, Seqs, decode_pending, decode_seqs
from .sql import CHANNEL, NOW_MS, dialect_name

log = logging.getLogger("notify.outbox")

#: Rows per statement when ids are listed (MySQL/SQLite ``IN``).
ID_CHUNK = 1000


class FencedError(OutboxError):
    """Another relay took the shard over (its epoch moved): stop leading it."""


@dataclass(frozen=True, slots=True)
class ShardState:
    """A shard's relay row as a new leader finds it."""

    epoch: int
    identity: Identity
    seqs: Seqs
    pending: PendingBatch | None
    published: int


@dataclass(slots=True)
class Done:
    """What the last cycle's publishing ended with: rows the broker stored (to delete) and
    rows it refused for good (to move to notify_outbox_dead, with the reason)."""

    acked: list[int]
    dead: list[tuple[list[int], str]]

    @property
    def count(self) -> int:
        return len(self.acked)


def _ids_param(name: str) -> sa.BindParameter[Any]:
    return sa.bindparam(name, expanding=True)


class ShardDB:
    """One shard's connections and statements (see the module doc)."""

    def __init__(self, engine: Engine, shard: int, pg_lock_base: int, lock_dir: Path | None):
        self.engine = engine
        self.shard = shard
        self.d = dialect_name(engine.dialect)
        self.now = NOW_MS[self.d]
        self.pg_lock_base = pg_lock_base
        self._lock_dir = lock_dir
        self._control: Connection | None = None
        self._work: Connection | None = None
        self._pg: Any = None  # PostgreSQL: a psycopg connection of our own, autocommit
        self._lock_file: IO[bytes] | None = None
        self._mem_lock: threading.Lock | None = None
        self._idle_held = False

    # ------------------------------------------------------------------ connections

    def _work_conn(self) -> Connection:
        if self._work is None or self._work.closed or self._work.invalidated:
            conn = self.engine.connect()
            if self.d == "mysql":
                conn = conn.execution_options(isolation_level="READ COMMITTED")
            self._work = conn
        return self._work

    def _pg_conn(self) -> psycopg.Connection[Any]:
        """PostgreSQL: the cycles' own psycopg connection in autocommit mode (out of the
        pool for good: it never goes back to the application with that setting)."""
        if self._pg is None or self._pg.closed:
            raw = self.engine.raw_connection()
            dc = raw.driver_connection
            raw.detach()
            if not isinstance(dc, psycopg.Connection):
                raise OutboxError("the relay runs on PostgreSQL through psycopg 3")
            dc.autocommit = True
            dc.prepare_threshold = None  # statements differ (literals): nothing to prepare
            self._pg = dc
        conn: psycopg.Connection[Any] = self._pg
        return conn

    def close(self) -> None:
        """Give up leadership and close the connections (never raises)."""
        self.release()
        for c in (self._work, self._control):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._work = self._control = None

    def _close_pg(self) -> None:
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.close()
            self._pg = None
        self._idle_held = False

    # ------------------------------------------------------------------ leadership

    def try_lead(self, name: str) -> bool:
        """Take the shard's leadership lock if free (non-blocking)."""
        if self.d == "sqlite":
            return self._flock()
        if self.d == "postgresql":
            pg = self._pg_conn()
            row = pg.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (self.pg_lock_base + 2, self.shard)
            ).fetchone()
            if row and row[0]:
                pg.execute(f"LISTEN {CHANNEL}{int(self.shard)}")
                return True
            self._close_pg()
            return False
        if self._control is None or self._control.closed:
            self._control = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        got = self._control.execute(
            sa.text("SELECT GET_LOCK(:n, 0)"), {"n": f"notify_outbox.{name}"}
        ).scalar_one()
        return bool(got)

    def _flock(self) -> bool:
        path = self._lock_path()
        if path is None:  # an in-memory database: one process, a lock per engine and shard
            lock = _memory_lock(self.engine, self.shard)
            if not lock.acquire(blocking=False):
                return False
            self._mem_lock = lock
            return True
        f = open(path, "ab")  # noqa: SIM115 - held open while leading
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._lock_file = f
        return True

    def _lock_path(self) -> Path | None:
        db = self.engine.url.database
        if not db or db == ":memory:" or db.startswith("file:"):
            return None
        base = Path(db).expanduser()
        folder = self._lock_dir or base.parent
        return folder / f"{base.name}.notify-relay-{self.shard}.lock"

    def release(self) -> None:
        """Give up the leadership lock (closing the control connection does it too)."""
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None
        if self._mem_lock is not None:
            self._mem_lock.release()
            self._mem_lock = None
        self._close_pg()  # PostgreSQL: the session holding the lock, LISTEN, waiting
        if self._control is not None:
            with contextlib.suppress(Exception):
                # closed for real, not returned to the pool: the session ends, and its
                # locks and LISTEN with it
                self._control.invalidate()
                self._control.close()
            self._control = None
            self._idle_held = False

    def alive(self) -> bool:
        """Whether the control connection (holding the lock) still answers."""
        if self.d == "sqlite":
            return self._lock_file is not None or self._mem_lock is not None
        if self.d == "postgresql":
            if self._pg is None or self._pg.closed:
                return False
            try:
                self._pg.execute("SELECT 1")
                return True
            except psycopg.Error:
                return False
        if self._control is None or self._control.closed:
            return False
        try:
            self._control.exec_driver_sql("SELECT 1")
            return True
        except sa_exc.SQLAlchemyError:
            return False

    # ------------------------------------------------------------------ take-over

    def take_over(self, owner: str) -> ShardState:
        """Become the shard's leader in the table: a new epoch, the recorded state."""
        conn = self._work_conn()
        with conn.begin():
            n = conn.execute(
                sa.text(
                    "UPDATE notify_outbox_relay SET epoch = epoch + 1, owner = :o, "
                    f"updated_ms = {self.now} WHERE shard = :s"
                ),
                {"o": owner[:255], "s": self.shard},
            ).rowcount
            if n != 1:
                raise OutboxError(f"shard {self.shard} is not in notify_outbox_relay")
            row = conn.execute(
                sa.text(
                    "SELECT epoch, producer_name, producer_secret, seqs, pending, published "
                    "FROM notify_outbox_relay WHERE shard = :s"
                ),
                {"s": self.shard},
            ).one()
        return ShardState(
            int(row[0]),
            Identity(str(row[1]), str(row[2]), int(row[0])),
            decode_seqs(row[3]),
            decode_pending(row[4]),
            int(row[5]),
        )

    # ------------------------------------------------------------------ cycles

    @contextlib.contextmanager
    def cycle(self, epoch: int, wait: bool = False) -> Iterator[Cycle | PgCycle]:
        """One cycle: finish, read, record (see :class:`Cycle`, :class:`PgCycle`).
        ``wait`` (PostgreSQL): take the shard's waiting lock before reading, so a read
        that finds nothing can sleep until a writer NOTIFYs."""
        if self.d == "postgresql":
            if self._pg is None or self._pg.closed:
                raise FencedError(f"shard {self.shard}: the session holding its lock is gone")
            try:
                yield PgCycle(self, self._pg, epoch, wait and not self._idle_held)
            except psycopg.Error as e:
                self._close_pg()  # whatever state it was left in: the shard is given up
                raise sa_exc.DBAPIError.instance(
                    None, None, e, psycopg.Error, dialect=self.engine.dialect
                ) from e
            return
        conn = self._work_conn()
        with conn.begin():
            yield Cycle(self, conn)

    def fetch(self, ids: Sequence[int]) -> dict[int, RelayRow]:
        """The rows of ``ids`` still in the table (a pending batch being sent again)."""
        conn = self._work_conn()
        out: dict[int, RelayRow] = {}
        with conn.begin():
            for chunk in _chunks(ids):
                for r in conn.execute(
                    sa.text(
                        "SELECT id, topic, khash, flag, payload FROM notify_outbox "
                        "WHERE shard = :s AND id IN :ids"
                    ).bindparams(_ids_param("ids")),
                    {"s": self.shard, "ids": chunk},
                ):
                    out[int(r[0])] = (int(r[0]), r[1], r[2], int(r[3]), bytes(r[4]))
        return out

    def move_due(self, epoch: int, limit: int) -> int:
        """Move delayed rows that are due into the outbox (in due order, new ids)."""
        conn = self._work_conn()
        with conn.begin():
            ids = [
                int(r[0])
                for r in conn.execute(
                    sa.text(
                        "SELECT id FROM notify_outbox_delayed WHERE shard = :s AND "
                        f"due_ms <= {self.now} ORDER BY due_ms, id LIMIT :n"
                    ),
                    {"s": self.shard, "n": limit},
                )
            ]
            if not ids:
                return 0
            self._check_epoch(conn, epoch)
            for chunk in _chunks(ids):
                conn.execute(
                    sa.text(
                        "INSERT INTO notify_outbox (shard, topic, khash, flag, payload, "
                        "created_ms) SELECT shard, topic, khash, flag, payload, created_ms "
                        "FROM notify_outbox_delayed WHERE id IN :ids ORDER BY due_ms, id"
                    ).bindparams(_ids_param("ids")),
                    {"ids": chunk},
                )
                conn.execute(
                    sa.text("DELETE FROM notify_outbox_delayed WHERE id IN :ids").bindparams(
                        _ids_param("ids")
                    ),
                    {"ids": chunk},
                )
        return len(ids)

    def next_due_ms(self) -> int | None:
        """Milliseconds until the shard's next delayed row is due (None: none)."""
        conn = self._work_conn()
        with conn.begin():
            v = conn.execute(
                sa.text(
                    f"SELECT min(due_ms) - {self.now} FROM notify_outbox_delayed WHERE shard = :s"
                ),
                {"s": self.shard},
            ).scalar()
        return None if v is None else max(0, int(v))

    def _check_epoch(self, conn: Connection, epoch: int) -> None:
        n = conn.execute(
            sa.text(
                f"UPDATE notify_outbox_relay SET updated_ms = {self.now} "
                "WHERE shard = :s AND epoch = :e"
            ),
            {"s": self.shard, "e": epoch},
        ).rowcount
        if n != 1:
            raise FencedError(f"shard {self.shard}: another relay took over (epoch {epoch})")

    # ------------------------------------------------------------------ waiting (PostgreSQL)

    @property
    def waiting(self) -> bool:
        """PostgreSQL: whether this relay holds the shard's waiting lock (writers
        committing rows of the shard NOTIFY it)."""
        return self._idle_held

    def wait_notified(self, timeout_s: float, stop: threading.Event) -> bool:
        """PostgreSQL, the waiting lock held (taken by the cycle that read nothing): sleep
        until a writer of the shard commits (its NOTIFY: True), ``timeout_s`` passes or
        ``stop`` is set. The lock stays held: the next cycle that reads rows gives it
        back with its record. False at once on other databases."""
        if self.d != "postgresql" or self._pg is None or not self._idle_held:
            return False
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for _n in self._pg.notifies(timeout=min(left, 0.25), stop_after=1):
                return True
        return False

    def end_wait(self) -> None:
        """Give the waiting lock back (writers stop notifying)."""
        if self._idle_held and self._pg is not None:
            self._pg.execute(
                "SELECT pg_advisory_unlock(%s, %s)", (self.pg_lock_base + 1, self.shard)
            )
        self._idle_held = False


class Cycle:
    """The statements of one cycle's transaction."""

    def __init__(self, db: ShardDB, conn: Connection):
        self.db = db
        self.conn = conn

    def finish(self, done: Done | None) -> None:
        """Remove the rows the broker acknowledged; move the refused ones aside."""
        if done is None:
            return
        db, conn = self.db, self.conn
        for ids, error in done.dead:
            ignore = {"postgresql": "", "mysql": "IGNORE ", "sqlite": "OR IGNORE "}[db.d]
            conflict = " ON CONFLICT DO NOTHING" if db.d == "postgresql" else ""
            for chunk in _chunks(ids):
                conn.execute(
                    sa.text(
                        f"INSERT {ignore}INTO notify_outbox_dead (shard, id, topic, khash, "
                        "flag, payload, created_ms, error) SELECT shard, id, topic, khash, "
                        "flag, payload, created_ms, :err FROM notify_outbox "
                        f"WHERE shard = :s AND id IN :ids{conflict}"
                    ).bindparams(_ids_param("ids")),
                    {"s": db.shard, "ids": chunk, "err": error[:4000]},
                )
                self._delete(chunk)
        for chunk in _chunks(done.acked, 10_000 if db.d == "postgresql" else ID_CHUNK):
            self._delete(chunk)

    def _delete(self, ids: list[int]) -> None:
        # ids are ints: written into the statement (one string join, no per-id adaptation)
        listed = ",".join(map(str, ids))
        if self.db.d == "postgresql":
            where = f"id = ANY('{{{listed}}}'::bigint[])"
        else:  # the bounds keep InnoDB on the shard's own key range (no scan of others')
            where = f"id BETWEEN {min(ids)} AND {max(ids)} AND id IN ({listed})"
        self._raw(f"DELETE FROM notify_outbox WHERE shard = {int(self.db.shard)} AND {where}")

    def _raw(self, sql: str) -> list[Any]:
        """``sql`` (no parameters: ints and checked topic names only) on the driver's own
        cursor, in the cycle's transaction; its rows as the driver's tuples."""
        cur = self.conn.connection.cursor()
        dbapi = self.conn.dialect.loaded_dbapi
        try:
            if self.db.d == "postgresql":
                cur.execute(sql, binary=True)  # type: ignore[call-arg]  # bytea as bytes
            else:
                cur.execute(sql)
            return list(cur.fetchall()) if cur.description is not None else []
        except dbapi.Error as e:  # as SQLAlchemy would have raised it
            raise sa_exc.DBAPIError.instance(
                sql[:200], None, e, dbapi.Error, dialect=self.conn.dialect
            ) from e
        finally:
            cur.close()

    def read(self, limit: int, exclude: Sequence[str] = ()) -> list[RelayRow]:
        """The shard's oldest rows (id order), topics in ``exclude`` left out (topic names
        are checked ``[A-Za-z0-9._-]`` when written: safe to quote)."""
        sql = (
            "SELECT id, topic, khash, flag, payload FROM notify_outbox "
            f"WHERE shard = {int(self.db.shard)}"
        )
        if exclude:
            sql += " AND topic NOT IN (" + ",".join(f"'{t}'" for t in exclude) + ")"
        return self._raw(sql + f" ORDER BY id LIMIT {int(limit)}")

    def rows_of_topic(self, topic: str, limit: int) -> list[int]:
        """Ids of the shard's rows of ``topic`` (unroutable rows to move aside)."""
        return [
            int(r[0])
            for r in self.conn.execute(
                sa.text(
                    "SELECT id FROM notify_outbox WHERE shard = :s AND topic = :t "
                    "ORDER BY id LIMIT :n"
                ),
                {"s": self.db.shard, "t": topic, "n": limit},
            )
        ]

    def record(
        self,
        epoch: int,
        pending: bytes | None,
        seqs: str | None,
        published: int,
        durable: bool = True,
    ) -> None:
        """Record the batch about to be published (None: nothing) and the sequences;
        :class:`FencedError` when the shard's epoch is no longer ``epoch``. ``durable``
        False: the commit need not wait for its WAL flush (PostgreSQL)."""
        if not durable and self.db.d == "postgresql":
            self.conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
        sets = "pending = :p, published = published + :n"
        params: dict[str, Any] = {"p": pending, "n": published, "s": self.db.shard, "e": epoch}
        if seqs is not None:
            sets += ", seqs = :q"
            params["q"] = seqs
        n = self.conn.execute(
            sa.text(
                f"UPDATE notify_outbox_relay SET {sets}, updated_ms = {self.db.now} "
                "WHERE shard = :s AND epoch = :e"
            ),
            params,
        ).rowcount
        if n != 1:
            raise FencedError(f"shard {self.db.shard}: another relay took over (epoch {epoch})")


class PgCycle:
    """PostgreSQL's cycle in two round trips, with :class:`Cycle`'s interface.

    ``read`` sends one simple query: (with rows to finish) ``SET LOCAL
    synchronous_commit TO OFF; UPDATE notify_outbox_relay ... pending = NULL ...; DELETE
    ...;`` then the ``SELECT``: one implicit transaction whose commit does not wait for
    its WAL flush (what it removes the broker has; lost in a crash, it is sent again and
    answered from what the broker stored). ``record`` of a batch sends ``BEGIN; UPDATE
    notify_outbox_relay SET pending = ...; COMMIT``, a commit waited for: the batch is
    sent only once it is durable. Both updates are conditional on the epoch.
    Everything written into the statements is ints, checked topic names, hex or the
    sequences' JSON (names and ints only)."""

    def __init__(self, db: ShardDB, conn: psycopg.Connection[Any], epoch: int, lock: bool):
        self.db = db
        self.conn = conn
        self.epoch = epoch
        self.lock = lock  # take the waiting lock in the read's round trip
        self._done: Done | None = None

    def finish(self, done: Done | None) -> None:
        """Rows to remove with the next read; refused rows move aside at once."""
        if done is not None and done.dead:
            cycle = Cycle(self.db, self.db._work_conn())
            with cycle.conn.begin():
                cycle.finish(Done([], done.dead))
        self._done = done

    def _where(self) -> str:
        return f"shard = {int(self.db.shard)} AND epoch = {int(self.epoch)}"

    def read(self, limit: int, exclude: Sequence[str] = ()) -> list[RelayRow]:
        sql = (
            "SELECT id, topic, khash, flag, payload FROM notify_outbox "
            f"WHERE shard = {int(self.db.shard)}"
        )
        if exclude:
            sql += " AND topic NOT IN (" + ",".join(f"'{t}'" for t in exclude) + ")"
        sql += f" ORDER BY id LIMIT {int(limit)}"
        done = self._done
        db = self.db
        cur = self.conn.cursor()
        try:
            head = ""
            if self.lock:  # before the read: a row committed later finds the lock held
                head = f"SELECT pg_try_advisory_lock({db.pg_lock_base + 1}, {int(db.shard)});"
            if done is None and not head:
                cur.execute(sql, binary=True)
                return cur.fetchall()
            if self.lock:
                for _ in self.conn.notifies(timeout=0):
                    pass  # notifications of rows this read sees
            n = len(done.acked) if done is not None else 0
            if done is not None:
                head += (
                "SET LOCAL synchronous_commit TO OFF;"
                f"UPDATE notify_outbox_relay SET pending = NULL, published = published + {n}, "
                f"updated_ms = {self.db.now} WHERE {self._where()};"
                )
                if done.acked:
                    listed = ",".join(map(str, done.acked))
                    head += (
                        f"DELETE FROM notify_outbox WHERE shard = {int(self.db.shard)} "
                        f"AND id = ANY('{{{listed}}}'::bigint[]);"
                    )
            cur.execute(head + sql)
            if self.lock:
                got = cur.fetchone()
                db._idle_held = bool(got and got[0])
                cur.nextset()
            if done is not None:
                cur.nextset()  # SET
                if cur.rowcount != 1:
                    raise FencedError(f"shard {self.db.shard}: another relay took over")
                while cur.nextset():
                    pass
            return [(i, t, k, f, bytes(p)) for i, t, k, f, p in cur.fetchall()]
        finally:
            cur.close()

    def rows_of_topic(self, topic: str, limit: int) -> list[int]:
        cur = self.conn.cursor()
        try:
            cur.execute(
                "SELECT id FROM notify_outbox WHERE shard = %s AND topic = %s ORDER BY id LIMIT %s",
                (self.db.shard, topic, limit),
            )
            return [int(r[0]) for r in cur.fetchall()]
        finally:
            cur.close()

    def record(
        self,
        epoch: int,
        pending: bytes | None,
        seqs: str | None,
        published: int,
        durable: bool = True,
    ) -> None:
        """Record a batch (durably); without one, :meth:`read` did the rest."""
        if pending is None:
            return
        assert seqs is not None and "'" not in seqs and "\\" not in seqs
        db = self.db
        unlock = ""
        if db._idle_held:  # rows to publish: writers need not wake the relay now
            unlock = f";SELECT pg_advisory_unlock({db.pg_lock_base + 1}, {int(db.shard)})"
            db._idle_held = False
        cur = self.conn.cursor()
        try:
            cur.execute(
                "BEGIN;UPDATE notify_outbox_relay SET "
                f"pending = decode('{pending.hex()}', 'hex'), seqs = '{seqs}', "
                f"updated_ms = {self.db.now} WHERE {self._where()};COMMIT" + unlock
            )
            cur.nextset()
            if cur.rowcount != 1:
                raise FencedError(f"shard {self.db.shard}: another relay took over (epoch {epoch})")
        finally:
            cur.close()


def transient(e: BaseException) -> bool:
    """A deadlock, lock wait timeout or serialization failure: the same transaction may
    simply be run again (PostgreSQL 40P01/40001, MySQL 1213/1205)."""
    orig = getattr(e, "orig", None)
    if getattr(orig, "sqlstate", None) in ("40P01", "40001"):
        return True
    args: tuple[object, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] in (1213, 1205)


def _chunks(ids: Sequence[int], size: int = ID_CHUNK) -> Iterator[list[int]]:
    for i in range(0, len(ids), size):
        yield list(ids[i : i + size])


#: PostgreSQL: a relay process vacuums notify_outbox after this many deletions ...
VACUUM_AFTER_ROWS = 500
#: ... at most this often (see :class:`Vacuum`).
VACUUM_EVERY_S = 0.5
#: Without truncation: truncating the heap's empty tail takes the table's ACCESS
#: EXCLUSIVE lock, which stalls every writer's INSERT and every relay's read meanwhile.
#: Autovacuum still gives the space back after a large backlog.
VACUUM_SQL = "VACUUM (SKIP_LOCKED, TRUNCATE false) notify_outbox"
_vacuum_state: dict[str, list[Any]] = {}
_vacuum_guard = threading.Lock()


class Vacuum:
    """PostgreSQL: VACUUMs ``notify_outbox`` once enough rows were deleted, at most every
    :data:`VACUUM_EVERY_S` per process, while the table is small (a read returned less
    than a full batch), and no sooner after the last one than it took (a slow VACUUM
    under load never runs back to back). The rows deleted stay in the index as dead
    entries the oldest-first read walks through until a vacuum (12,000 of them: 1.1 ms a
    read instead of 0.08), and autovacuum looks at a database once a minute at best.

    The VACUUM runs on a thread and a connection of its own (:meth:`run`), never on a
    shard's thread: a batch recorded and waiting to be sent, or the rows committed
    meanwhile, never wait for it (under load it takes from milliseconds to a second)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._key = engine.url.render_as_string(hide_password=False)
        self._due = threading.Event()
        self._closed = False
        self.runs = 0

    def note(self, deleted: int, table_small: bool) -> bool:
        """``deleted`` rows were removed; True when that made a VACUUM due (it runs on
        the vacuum thread)."""
        with _vacuum_guard:
            st = _vacuum_state.setdefault(self._key, [0, 0.0])
            st[0] += deleted
            now = time.monotonic()
            if not table_small or st[0] < VACUUM_AFTER_ROWS or now - st[1] < VACUUM_EVERY_S:
                return False
            st[0], st[1] = 0, now
        self._due.set()
        return True

    def run(self) -> None:
        """The vacuum thread: a VACUUM each time one is due, until :meth:`close`."""
        while True:
            self._due.wait()
            if self._closed:
                return
            self._due.clear()
            t0 = time.monotonic()
            try:
                with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                    c.exec_driver_sql(VACUUM_SQL)
                self.runs += 1
            except sa_exc.SQLAlchemyError as e:  # the next one will do
                log.info("outbox relay: vacuum of notify_outbox failed: %s", e)
            end = time.monotonic()
            # the next one due no sooner than max(VACUUM_EVERY_S, this one's time) from now
            with _vacuum_guard:
                st = _vacuum_state.setdefault(self._key, [0, 0.0])
                st[1] = max(st[1], end + max(0.0, end - t0 - VACUUM_EVERY_S))

    def close(self) -> None:
        """End :meth:`run` (after the VACUUM under way, if any)."""
        self._closed = True
        self._due.set()


_mem_locks: dict[tuple[int, int], threading.Lock] = {}
_mem_guard = threading.Lock()


def _memory_lock(engine: Engine, shard: int) -> threading.Lock:
    with _mem_guard:
        return _mem_locks.setdefault((id(engine), shard), threading.Lock())


# ---------------------------------------------------------------------------- instances


class Instances:
    """The relay instances alive (``notify_outbox_instances``): each writes a heartbeat;
    the live ones, sorted, share the shards (instance ``i`` of ``k`` leads the shards
    ``s`` with ``s mod k == i``)."""

    def __init__(self, engine: Engine, instance: str):
        self.engine = engine
        self.instance = instance
        self.d = dialect_name(engine.dialect)
        self.now = NOW_MS[self.d]

    def beat(self, led: Sequence[int]) -> None:
        """Write this instance's heartbeat and the shards it leads."""
        host = os.uname().nodename[:255]
        params = {"i": self.instance, "h": host, "p": os.getpid(), "l": ",".join(map(str, led))}
        cols = "(instance, host, pid, heartbeat_ms, led_shards) VALUES (:i, :h, :p, {now}, :l)"
        if self.d == "mysql":
            sql = (
                "INSERT INTO notify_outbox_instances "
                + cols.format(now=self.now)
                + f" ON DUPLICATE KEY UPDATE heartbeat_ms = {self.now}, led_shards = :l"
            )
        else:
            sql = (
                "INSERT INTO notify_outbox_instances "
                + cols.format(now=self.now)
                + f" ON CONFLICT (instance) DO UPDATE SET heartbeat_ms = {self.now}, "
                "led_shards = :l"
            )
        with self.engine.begin() as c:
            c.execute(sa.text(sql), params)

    def live(self, ttl_s: float) -> list[str]:
        """Instances whose heartbeat is younger than ``ttl_s`` (sorted); stale ones are
        removed."""
        ms = int(ttl_s * 1000)
        with self.engine.begin() as c:
            c.execute(
                sa.text(
                    f"DELETE FROM notify_outbox_instances WHERE heartbeat_ms < {self.now} - :t"
                ),
                {"t": 10 * ms},
            )
            return [
                str(r[0])
                for r in c.execute(
                    sa.text(
                        "SELECT instance FROM notify_outbox_instances "
                        f"WHERE heartbeat_ms >= {self.now} - :t ORDER BY instance"
                    ),
                    {"t": ms},
                )
            ]

    def leave(self) -> None:
        """Remove this instance (stopping): the others take its shards at once."""
        with self.engine.begin() as c:
            c.execute(
                sa.text("DELETE FROM notify_outbox_instances WHERE instance = :i"),
                {"i": self.instance},
            )


def assigned(shard: int, live: Sequence[str], me: str) -> bool:
    """Whether instance ``me`` should lead ``shard`` among the ``live`` instances."""
    ordered = sorted(set(live) | {me})
    return shard % len(ordered) == ordered.index(me)
