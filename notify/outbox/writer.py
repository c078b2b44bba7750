"""Writing outbox rows in the application's own transaction.

:meth:`Outbox.send` checks its arguments at once (a clear :class:`OutboxArgumentError`,
nothing written) and builds the row; *when* the row goes to the database depends on the
connection it is given:

* a SQLAlchemy ``Connection`` or ORM ``Session``: the row waits on the connection and is
  written at commit, in the commit's own round trip where the driver allows it. On
  PostgreSQL with psycopg the commit sends one simple query, straight through libpq: the
  rows (``SELECT notify_outbox_put(...)``: the key's lock, the insert, the relay's
  wake-up) and ``COMMIT`` (so the outbox costs no extra round trip, and a key's lock is
  held only for the commit itself, never while the transaction does other work: no
  deadlock with the application's own locks).
  Elsewhere the rows are inserted just before the COMMIT. A rolled-back transaction or
  savepoint drops its rows; a two-phase transaction writes them before PREPARE. A
  connection in autocommit mode (``isolation_level="AUTOCOMMIT"``, the engine's or the
  connection's) has no commit to wait for: the row is written at once, a commit of its own.
* a psycopg 3 connection: the row is inserted at once (psycopg has no commit hook), its
  key lock held until the transaction ends; send last in such transactions.
* their asyncio counterparts, with :meth:`Outbox.send_async` (:mod:`.aio`): a SQLAlchemy
  ``AsyncConnection``/``AsyncSession`` as the connection under it (the commit hook runs in
  SQLAlchemy's greenlet; on PostgreSQL with psycopg the rows and ``COMMIT`` are still one
  query, awaited), a psycopg ``AsyncConnection`` as a psycopg connection, awaited.

Order: a key's rows get their ids under that key's lock (PostgreSQL advisory lock,
MySQL/MariaDB ``notify_outbox_keylock`` row, SQLite's single writer) held to the end of
the transaction, so a key's ids follow the order its transactions commit in: the relay,
which publishes rows in id order and deletes them once acknowledged, can neither skip a
row that commits late nor publish a key's messages out of commit order.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from notify.protocol.properties import HeaderValue

from . import aio
from .publisher import Publisher
from .relay import Relay, RelayConfig
from .rows import (
    DEFAULT_MAX_DELAY_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    Marker,
    OutboxArgumentError,
    Row,
    build_row,
)
from .sql import (
    CHANNEL,
    DEFAULT_PG_LOCK_BASE,
    KEYLOCK_SLOTS,
    MISSING_TABLES,
    OutboxDatabaseError,
    OutboxTablesMissingError,
    dialect_name,
)
from .status import OutboxStatus, outbox_status, sampled_status

log = logging.getLogger("notify.outbox")

_INFO_KEY: Final = "notify.outbox.pending"

AppConnection = Connection | Session | psycopg.Connection[Any]

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    #: What :meth:`Outbox.send_async` takes: an asyncio connection, or a blocking one.
    AsyncAppConnection = (
        AsyncConnection | AsyncSession | psycopg.AsyncConnection[Any] | AppConnection
    )


class HasPublisher(Protocol):
    """A client session: it makes the relay's publisher (``session.publisher()``)."""

    def publisher(self) -> Publisher: ...


@dataclass(frozen=True, slots=True)
class OutboxConfig:
    """Settings of an :class:`Outbox` (writer side).

    ``max_message_bytes``: largest payload ``send`` accepts (keep it <= the broker's
    ``maxMessageSize``); ``max_delay_s``: longest ``delay``; ``pg_lock_base``: first of
    the three PostgreSQL advisory lock classes (:mod:`notify.outbox.sql`; change it only
    if the application uses two-int advisory locks of these classes, and give the relay
    the same)."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    pg_lock_base: int = DEFAULT_PG_LOCK_BASE

    def __post_init__(self) -> None:
        if not 1 <= self.max_message_bytes <= 1 << 30:
            raise ValueError("max_message_bytes must be 1..1 GiB")
        if not self.max_delay_s > 0:
            raise ValueError("max_delay_s must be > 0")
        if not 0 <= self.pg_lock_base <= (1 << 31) - 3:
            raise ValueError("pg_lock_base must be a non-negative int4 (room for 3 classes)")


@dataclass(slots=True)
class _Pending:
    """The rows a SQLAlchemy connection's transaction will write at commit."""

    tx: object
    # the psycopg connection of the one-query commit, if any (an AsyncConnection under a
    # SQLAlchemy AsyncConnection: awaited in SQLAlchemy's greenlet)
    dc: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None
    rows: list[tuple[OutboxConfig, Row | Marker]] = field(default_factory=list)
    marks: list[tuple[str | None, int]] = field(default_factory=list)  # savepoint, rows


# ------------------------------------------------------------------ statements per dialect


def _pg_literal_bytes(data: bytes) -> bytes:
    return b"decode('" + data.hex().encode() + b"','hex')"


def _int_or_null(v: int | None) -> bytes:
    return b"NULL" if v is None else b"%d" % v


Entries = Sequence[tuple[OutboxConfig, Row | Marker]]


def _rows(entries: Entries) -> list[tuple[OutboxConfig, Row]]:
    return [(c, r) for c, r in entries if isinstance(r, Row)]


def _marker_sql(m: Marker) -> str:
    # group and key are checked ([A-Za-z0-9:._@-]): safe as literals
    return (
        "INSERT INTO notify_outbox_half (group_id, tx_key, state) "
        f"VALUES ('{m.group}', '{m.tx_key}', 1)"
    )


def pg_statements(entries: Entries) -> bytes:
    """The statements (``;``-separated, no COMMIT) writing ``entries`` on PostgreSQL.

    One row, one statement: ``notify_outbox_put`` (created by the migration; PL/pgSQL
    plans it once per session, nothing to prepare or to lose) takes the key's lock,
    inserts, and wakes the shard's relay if it waits. Several keys: their locks first,
    sorted (two transactions sending the same keys in another order cannot deadlock),
    then the rows in send order; the last row of each shard wakes its relay."""
    if len(entries) == 1:
        cfg, r = entries[0]
        if isinstance(r, Row) and r.due_ms is None:  # the common case, without the loops
            base = cfg.pg_lock_base
            return b"SELECT notify_outbox_put(%d::int2,'%s',%s,%d,decode('%s','hex'),%s,%d)" % (
                r.shard,
                r.topic.encode(),
                b"NULL" if r.khash is None else b"%d" % r.khash,
                r.flag,
                r.payload.hex().encode(),
                b"NULL" if r.khash is None else b"%d" % base,
                base + 1,
            )
    out: list[bytes] = []
    rows = _rows(entries)
    keys = sorted({(c.pg_lock_base, r.khash) for c, r in rows if r.khash is not None})
    lock_each = len(keys) <= 1
    if not lock_each:
        for base, khash in keys:
            out.append(b"SELECT pg_advisory_xact_lock(%d,%d)" % (base, khash))
    for m in (r for _c, r in entries if isinstance(r, Marker)):
        out.append(_marker_sql(m).encode())
    last = {r.shard: i for i, (_c, r) in enumerate(rows) if r.due_ms is None}
    for i, (cfg, r) in enumerate(rows):
        args = b"%d::int2,'%s',%s,%d,%s" % (
            r.shard,
            r.topic.encode(),
            _int_or_null(r.khash),
            r.flag,
            _pg_literal_bytes(r.payload),
        )
        if r.due_ms is not None:
            out.append(
                b"INSERT INTO notify_outbox_delayed (shard,topic,khash,flag,payload,due_ms) "
                b"VALUES (" + args + b",%d)" % r.due_ms
            )
            continue
        lock = b"%d" % cfg.pg_lock_base if lock_each and r.khash is not None else b"NULL"
        wake = b"%d" % (cfg.pg_lock_base + 1) if last[r.shard] == i else b"NULL"
        out.append(b"SELECT notify_outbox_put(" + args + b"," + lock + b"," + wake + b")")
    return b";".join(out)


_INSERT_COLUMNS: Final = "shard, topic, khash, flag, payload"


def _params(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [
        {"s": r.shard, "t": r.topic, "k": r.khash, "f": r.flag, "p": r.payload, "d": r.due_ms}
        for r in rows
    ]


def _write_driver(conn: Connection, d: str, entries: Entries) -> None:
    """MySQL/MariaDB and SQLite: insert ``entries`` with the driver's own cursor in
    ``conn``'s transaction (errors raised as SQLAlchemy raises them)."""
    rows = _rows(entries)
    mark = "%s" if d == "mysql" else "?"
    stmts: list[tuple[str, list[tuple[Any, ...]]]] = []
    for m in (r for _c, r in entries if isinstance(r, Marker)):
        stmts.append((_marker_sql(m), []))
    keyed = sorted({r.khash % KEYLOCK_SLOTS for _c, r in rows if r.khash is not None})
    if d == "mysql" and keyed:
        listed = ",".join(map(str, keyed))
        lock = f"SELECT slot FROM notify_outbox_keylock WHERE slot IN ({listed}) "
        stmts.append((lock + "ORDER BY slot FOR UPDATE", []))
    cols = ", ".join([mark] * 5)
    now = [(r.shard, r.topic, r.khash, r.flag, r.payload) for _c, r in rows if r.due_ms is None]
    later = [
        (r.shard, r.topic, r.khash, r.flag, r.payload, r.due_ms)
        for _c, r in rows
        if r.due_ms is not None
    ]
    if now:
        stmts.append((f"INSERT INTO notify_outbox ({_INSERT_COLUMNS}) VALUES ({cols})", now))
    if later:
        ins = f"INSERT INTO notify_outbox_delayed ({_INSERT_COLUMNS}, due_ms) "
        stmts.append((ins + f"VALUES ({cols}, {mark})", later))
    dbapi = conn.dialect.loaded_dbapi
    cur = conn.connection.cursor()
    try:
        for sql, params in stmts:
            if len(params) > 1:
                cur.executemany(sql, params)
            elif params:
                cur.execute(sql, params[0])
            else:
                cur.execute(sql)
                if cur.description is not None:
                    cur.fetchall()
    except dbapi.Error as e:
        raise sa_exc.DBAPIError.instance(
            None, None, e, dbapi.Error, dialect=conn.dialect
        ) from e
    finally:
        cur.close()


def _write_generic(conn: Connection, entries: Entries) -> None:
    """Insert ``entries`` in ``conn``'s transaction (statements before the commit)."""
    d = dialect_name(conn)
    if d != "postgresql":
        _write_driver(conn, d, entries)
        return
    rows = _rows(entries)
    for m in (r for _c, r in entries if isinstance(r, Marker)):
        conn.exec_driver_sql(_marker_sql(m))
    keyed = sorted({(c.pg_lock_base, r.khash) for c, r in rows if r.khash is not None})
    for base, khash in keyed:
        conn.exec_driver_sql(
            "SELECT pg_advisory_xact_lock(%(c)s, %(k)s)", {"c": base, "k": khash}
        )
    now = [r for _c, r in rows if r.due_ms is None]
    later = [r for _c, r in rows if r.due_ms is not None]
    mark, close = "%(", ")s"
    cols = ", ".join(f"{mark}{n}{close}" for n in "stkfp")
    if now:
        conn.exec_driver_sql(
            f"INSERT INTO notify_outbox ({_INSERT_COLUMNS}) VALUES ({cols})", _params(now)
        )
    if later:
        conn.exec_driver_sql(
            f"INSERT INTO notify_outbox_delayed ({_INSERT_COLUMNS}, due_ms) "
            f"VALUES ({cols}, {mark}d{close})",
            _params(later),
        )
    for base, shard in sorted({(c.pg_lock_base, r.shard) for c, r in rows}):
        conn.exec_driver_sql(
            "SELECT pg_notify(%(ch)s, %(s)s) "
            "WHERE NOT pg_try_advisory_xact_lock_shared(%(c)s, %(n)s)",
            {"ch": f"{CHANNEL}{shard}", "s": "", "c": base + 1, "n": shard},
        )


# ------------------------------------------------------------------ PostgreSQL fast path


def _raise_pg(conn: Connection, dc: psycopg.Connection[Any], res: Any, sql: bytes) -> None:
    err = pg_errors.error_from_result(res, encoding=dc.info.encoding)
    raise sa_exc.DBAPIError.instance(
        sql[:500].decode("utf-8", "replace"), None, err, psycopg.Error, dialect=conn.dialect
    ) from err


def _pg_driver(
    conn: Connection,
) -> psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None:
    """The psycopg connection under ``conn`` when the one-query commit can use it: a
    blocking one, or the ``AsyncConnection`` under a SQLAlchemy ``AsyncConnection`` (its
    commit hook runs in SQLAlchemy's greenlet, where it is awaited)."""
    try:
        dc = conn.connection.driver_connection
    except sa_exc.SQLAlchemyError:
        return None
    if not isinstance(dc, psycopg.Connection | psycopg.AsyncConnection):
        return None
    if dc.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return None
    return dc


def _fast_driver(conn: Connection) -> psycopg.Connection[Any] | None:
    """The blocking psycopg connection under ``conn`` when the fast path can use it."""
    dc = _pg_driver(conn)
    return dc if isinstance(dc, psycopg.Connection) else None


def _pg_exec(
    conn: Connection | None, dc: psycopg.Connection[Any], rows: Entries, tail: bytes
) -> None:
    """One simple query on ``dc``: the rows' statements + ``tail``.

    ``conn`` None: the application's own psycopg connection, through psycopg (it begins
    the transaction its way and raises its own errors); else libpq directly, in the
    commit of ``conn``'s transaction (no Python-level driver work on the hot path)."""
    sql = pg_statements(rows) + tail
    if conn is None:
        dc.execute(sql, prepare=False)
        return
    res = dc.pgconn.exec_(sql)
    if res.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        if dc.pgconn.transaction_status == pq.TransactionStatus.INERROR:
            # the commit failed: end the transaction here (SQLAlchemy counts the commit as
            # its end and returns the connection to its pool without a rollback)
            dc.pgconn.exec_(b"ROLLBACK")
        _raise_pg(conn, dc, res, sql)


# ------------------------------------------------------------------ SQLAlchemy hooks

_hooked: weakref.WeakSet[Engine] = weakref.WeakSet()
_hook_lock = threading.Lock()


def _pending(conn: Connection, create: bool) -> _Pending | None:
    if conn.invalidated:
        return None
    tx = conn.get_transaction()
    p: _Pending | None = conn.info.get(_INFO_KEY)
    if p is not None and p.tx is not tx:
        p = None  # left by a transaction that ended without our events: stale
        conn.info.pop(_INFO_KEY, None)
    if p is None and create:
        p = conn.info[_INFO_KEY] = _Pending(tx, _pg_driver(conn))
    return p


def _take(conn: Connection) -> _Pending | None:
    p: _Pending | None = conn.info.pop(_INFO_KEY, None)
    if p is None or p.tx is not conn.get_transaction() or not p.rows:
        return None
    return p


def _on_commit(conn: Connection) -> None:
    p = _take(conn)
    if p is None:
        return
    dc = p.dc
    if dc is not None and dc.pgconn.pipeline_status == pq.PipelineStatus.OFF:
        # the rows and COMMIT in one round trip; the driver's own commit then finds the
        # connection idle and sends nothing (psycopg skips COMMIT outside a transaction)
        if isinstance(dc, psycopg.AsyncConnection):  # in SQLAlchemy's greenlet: awaited
            aio.pg_exec_in_greenlet(conn, dc, pg_statements(p.rows) + b";COMMIT")
        else:
            _pg_exec(conn, dc, p.rows, b";COMMIT")
    else:
        _write_or_roll_back(conn, p.rows)


def _on_prepare(conn: Connection, _xid: object) -> None:
    p = _take(conn)
    if p is not None:
        _write_or_roll_back(conn, p.rows)


def _write_or_roll_back(conn: Connection, entries: Entries) -> None:
    """Write the rows before the commit; when that fails, end the transaction here:
    SQLAlchemy counts the failed commit as its end and returns the connection to its pool
    without a rollback, the application's statements still pending in it."""
    try:
        _write_generic(conn, entries)
    except BaseException:
        try:
            conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
        except Exception as e:  # the connection is gone: nothing is pending on it
            log.info("rollback after a failed outbox write: %s", e)
        raise


def _on_rollback(conn: Connection) -> None:
    if conn.invalidated:  # its info is out of reach; a stale entry is recognised later
        return
    conn.info.pop(_INFO_KEY, None)


def _on_savepoint(conn: Connection, name: str | None) -> None:
    p = _pending(conn, create=False)
    if p is not None:
        p.marks.append((name, len(p.rows)))


def _mark_index(p: _Pending, name: str) -> int | None:
    """The mark of savepoint ``name``: by name, else the innermost unnamed one (SQLAlchemy
    names its savepoints after the event; savepoints nest, so that is the one)."""
    for i in range(len(p.marks) - 1, -1, -1):
        if p.marks[i][0] == name:
            return i
    for i in range(len(p.marks) - 1, -1, -1):
        if p.marks[i][0] is None:
            return i
    return None


def _on_rollback_savepoint(conn: Connection, name: str, _ctx: object) -> None:
    p = _pending(conn, create=False)
    i = None if p is None else _mark_index(p, name)
    if p is not None and i is not None:
        del p.rows[p.marks[i][1] :]
        del p.marks[i:]


def _on_release_savepoint(conn: Connection, name: str, _ctx: object) -> None:
    p = _pending(conn, create=False)
    i = None if p is None else _mark_index(p, name)
    if p is not None and i is not None:
        del p.marks[i:]


def install_hooks(engine: Engine) -> None:
    """Listen to ``engine``'s transactions (once per engine)."""
    if engine in _hooked:
        return
    with _hook_lock:
        if engine in _hooked:
            return
        event.listen(engine, "commit", _on_commit)
        event.listen(engine, "rollback", _on_rollback)
        event.listen(engine, "savepoint", _on_savepoint)
        event.listen(engine, "rollback_savepoint", _on_rollback_savepoint)
        event.listen(engine, "release_savepoint", _on_release_savepoint)
        event.listen(engine, "prepare_twophase", _on_prepare)
        _hooked.add(engine)


def write(conn: AppConnection, cfg: OutboxConfig, entry: Row | Marker) -> None:
    """Write ``entry`` in ``conn``'s transaction: at its commit (SQLAlchemy) or now
    (psycopg, or a connection in autocommit mode: then it commits on its own)."""
    write_entries(conn, [(cfg, entry)])


def write_entries(conn: AppConnection, entries: Entries) -> None:
    """Write ``entries`` (in order) in ``conn``'s transaction, as :func:`write` does one:
    a psycopg connection gets them in one round trip."""
    if not entries:
        return
    if isinstance(conn, Session):
        conn = conn.connection()
    if isinstance(conn, psycopg.Connection):
        _pg_exec(None, conn, entries, b"")
        return
    if not isinstance(conn, Connection):
        raise check_connection(conn)
    p = _pending(conn, create=False)
    if p is not None:  # not the first row of this transaction: nothing more to check
        p.rows.extend(entries)
        return
    install_hooks(conn.engine)
    if _autocommit(conn):
        dc = _fast_driver(conn)
        if dc is not None:
            _pg_exec(conn, dc, entries, b"")
        else:
            _write_generic(conn, entries)
        return
    if not conn.in_transaction():
        conn.begin()
    p = _pending(conn, create=True)
    assert p is not None
    p.rows.extend(entries)


def _autocommit(conn: Connection) -> bool:
    """Whether ``conn`` commits each statement: SQLAlchemy's ``AUTOCOMMIT`` isolation level
    (the engine's or the connection's; the only sign on SQLite, whose Python 3.11 driver
    has no ``autocommit`` flag) or the driver's own flag."""
    is_auto = getattr(conn, "_is_autocommit_isolation", None)  # SQLAlchemy 2's own test
    if is_auto is not None and is_auto():
        return True
    try:
        dc = conn.connection.driver_connection
    except sa_exc.SQLAlchemyError:
        return False
    flag = getattr(dc, "autocommit", False)
    if callable(flag):  # PyMySQL: autocommit() sets, get_autocommit() tells
        getter = getattr(dc, "get_autocommit", None)
        flag = getter() if getter is not None else False
    return flag is True


# ------------------------------------------------------------------ the writer


class Outbox:
    """The application's outbox: messages written as rows in its own transactions and
    published by a relay (:meth:`relay`, ``notify outbox relay``), exactly once.

    ``engine``: the application's SQLAlchemy engine, or its ``AsyncEngine`` (the relay and
    :meth:`status` use it; ``send`` works with the connection it is given). The tables come
    from ``notify db upgrade``::

        outbox = Outbox(engine)
        with engine.begin() as conn:
            conn.execute(insert(orders).values(id=42))
            outbox.send(conn, "orders", b"order 42", key="42", headers={"type": "created"})

    From asyncio, :meth:`send_async` on the application's ``AsyncConnection``,
    ``AsyncSession`` or psycopg ``AsyncConnection``::

        async with async_engine.begin() as conn:
            await conn.execute(insert(orders).values(id=42))
            await outbox.send_async(conn, "orders", b"order 42", key="42")

    Thread-safe: one instance serves every thread (and event loop) of the application.
    """

    def __init__(
        self, engine: Engine | AsyncEngine | None = None, *, config: OutboxConfig | None = None
    ):
        if aio.is_sa_engine(engine):
            engine = aio.sync_engine(engine)
        elif engine is not None and not isinstance(engine, Engine):
            raise OutboxArgumentError(
                f"Outbox takes a SQLAlchemy Engine or AsyncEngine, not {type(engine).__name__}"
            )
        #: The application's engine (an AsyncEngine's ``sync_engine``).
        self.engine: Engine | None = engine
        self.config = config or OutboxConfig()
        self._shards: int | None = None
        self._rr = itertools.count()
        self._twin: Engine | None = None
        self._twin_lock = threading.Lock()
        if engine is not None:
            dialect_name(engine.dialect)
            aio.check_driver(engine)
            install_hooks(engine)
            _outboxes.setdefault(engine, self)

    # -- writing

    def send(
        self,
        conn: AppConnection,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Mapping[str, HeaderValue] | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> None:
        """Write a message in ``conn``'s transaction: published once that transaction
        commits, never if it rolls back.

        ``conn``: a SQLAlchemy ``Connection`` or ``Session`` (its transaction begins if
        it has not) or a psycopg 3 connection. The other arguments are those of
        ``producer.send``: ``key`` picks the partition (the producer's by-key hash) and
        keeps the key's messages in commit order, ``headers`` are typed
        (``{str: str | int | float | bool | bytes}``), ``delay`` seconds (or
        ``deliver_at``) publishes no earlier than that. Raises
        :class:`OutboxArgumentError` for bad arguments (nothing written) and
        :class:`OutboxTablesMissingError` before ``notify db upgrade``."""
        conn, row = self.build(conn, topic, data, attribute, key, headers, delay, deliver_at)
        write(conn, self.config, row)

    async def send_async(
        self,
        conn: AsyncAppConnection,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Mapping[str, HeaderValue] | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> None:
        """:meth:`send` for asyncio applications: write a message in ``conn``'s
        transaction, published once it commits, never if it rolls back.

        ``conn``: a SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` (the rows wait on
        it and are written at its commit, as :meth:`send`'s on a ``Connection``; the first
        send reads the shard count, awaited), or a psycopg ``AsyncConnection`` (the row is
        inserted at once, awaited). A blocking connection is written as :meth:`send` does.
        Arguments and errors: :meth:`send`'s."""
        if isinstance(conn, psycopg.AsyncConnection):
            shards = await self._shard_count_pg_async(conn)
            row = self._row(topic, data, shards, attribute, key, headers, delay, deliver_at)
            await conn.execute(pg_statements([(self.config, row)]), prepare=False)
            return
        send = functools.partial(
            self.send, topic=topic, data=data, attribute=attribute, key=key,
            headers=headers, delay=delay, deliver_at=deliver_at,
        )  # fmt: skip
        if aio.is_sa_connection(conn) or aio.is_sa_session(conn):
            aio.require_greenlet()
            await conn.run_sync(send)  # in SQLAlchemy's greenlet: its I/O is awaited
        else:
            send(conn)  # type: ignore[arg-type]

    def build(
        self,
        conn: AppConnection,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        headers: Mapping[str, HeaderValue] | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> tuple[Connection | psycopg.Connection[Any], Row]:
        """Check :meth:`send`'s arguments and build its row, writing nothing: the
        connection to write it on (a Session's connection) and the row. Raises as
        :meth:`send` does."""
        conn, shards = self._shard_count_on(conn)
        return conn, self._row(topic, data, shards, attribute, key, headers, delay, deliver_at)

    def build_row(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        headers: Mapping[str, HeaderValue] | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> Row:
        """Check :meth:`send`'s arguments and build its row with the shard count already
        read (:meth:`shard_count_async`), writing nothing and doing no I/O."""
        shards = self._shards
        if shards is None:
            raise OutboxArgumentError("the shard count is not read yet: shard_count_async()")
        return self._row(topic, data, shards, attribute, key, headers, delay, deliver_at)

    def sends(self, conn: AsyncAppConnection) -> OutboxSends:
        """A batch of messages for ``conn``'s transaction, written together: each
        :meth:`OutboxSends.add` checks and builds its row at once (nothing written), then
        :meth:`OutboxSends.write` writes them all in ``conn``'s transaction as
        :meth:`send` would (``producer.transaction(db=conn)`` is built on it). An asyncio
        connection: :meth:`OutboxSends.prepare` first, :meth:`OutboxSends.write_async`."""
        return OutboxSends(self, conn)

    def _row(
        self,
        topic: str,
        data: bytes,
        shards: int,
        attribute: str | None,
        key: bytes | str | None,
        headers: Mapping[str, HeaderValue] | None,
        delay: float | None,
        deliver_at: datetime | float | None,
    ) -> Row:
        cfg = self.config
        return build_row(
            topic,
            data,
            shards,
            next(self._rr) if key is None else 0,
            attribute=attribute,
            key=key,
            headers=headers,
            delay=delay,
            deliver_at=deliver_at,
            max_message_bytes=cfg.max_message_bytes,
            max_delay_s=cfg.max_delay_s,
        )

    # -- the shard count (rows of notify_outbox_relay), read once

    def _shard_count_on(
        self, conn: object
    ) -> tuple[Connection | psycopg.Connection[Any], int]:
        """The connection to write on (a Session's) and the shard count, read on it."""
        if isinstance(conn, Session):
            conn = conn.connection()
        if isinstance(conn, Connection):
            return conn, self._shard_count_sa(conn)
        if isinstance(conn, psycopg.Connection):
            return conn, self._shard_count_pg(conn)
        raise check_connection(conn)

    def _shard_count_sa(self, conn: Connection) -> int:
        if self._shards is None:
            self._shards = _shard_count_on(conn)
        return self._shards

    async def shard_count_async(self, conn: AsyncAppConnection) -> int:
        """The shard count, read (once) on asyncio connection ``conn``, awaited."""
        if self._shards is not None:
            return self._shards
        if aio.is_sa_connection(conn):
            aio.require_greenlet()
            return await conn.run_sync(self._shard_count_sa)
        if aio.is_sa_session(conn):
            aio.require_greenlet()
            return await conn.run_sync(lambda s: self._shard_count_sa(s.connection()))
        if isinstance(conn, psycopg.AsyncConnection):
            return await self._shard_count_pg_async(conn)
        return self._shard_count_on(conn)[1]

    async def _shard_count_pg_async(self, conn: psycopg.AsyncConnection[Any]) -> int:
        if self._shards is None:
            self._shards = _checked_shards(await aio.pg_shard_count(conn))
        return self._shards

    def _shard_count_pg(self, conn: psycopg.Connection[Any]) -> int:
        if self._shards is None:
            found = conn.execute(
                "SELECT to_regclass('notify_outbox_relay') IS NOT NULL", prepare=False
            ).fetchone()
            if not found or not found[0]:
                raise OutboxTablesMissingError(MISSING_TABLES)
            n = conn.execute("SELECT count(*) FROM notify_outbox_relay", prepare=False).fetchone()
            self._shards = _checked_shards(int(n[0]) if n else 0)
        return self._shards

    # -- the relay and the status

    def relay(self, source: Publisher | HasPublisher, config: RelayConfig | None = None) -> Relay:
        """Start a relay publishing this outbox through ``source``: a client session
        (``connect([...])``: its :meth:`publisher`) or a :class:`Publisher`. Returns the
        running :class:`Relay`; use it as a context manager or call ``stop()``::

            with connect(["127.0.0.1:8123"]) as session, outbox.relay(session):
                ...   # the application runs; its outbox rows are published

        An outbox made on an ``AsyncEngine`` relays through a blocking engine of its own
        on the same database (psycopg, PyMySQL or sqlite3: the relay runs in threads).
        """
        engine = self._blocking_engine("Outbox(engine) is needed to run a relay")
        if isinstance(source, Publisher):
            return Relay(engine, source, config, self.config.pg_lock_base).start()
        publisher = source.publisher()
        return Relay(
            engine, publisher, config, self.config.pg_lock_base, own_publisher=True
        ).start()

    def status(self, interval_s: float = 0.0) -> OutboxStatus:
        """Backlog, oldest row's age, shards and leaders; with ``interval_s`` > 0 also
        the rows published per second over that interval (blocking: from asyncio,
        ``await asyncio.to_thread(outbox.status)``)."""
        engine = self._blocking_engine("Outbox(engine) is needed for the status")
        if interval_s > 0:
            return sampled_status(engine, interval_s)
        return outbox_status(engine)

    @property
    def shards(self) -> int:
        """The outbox's shard count (read from the database once)."""
        if self._shards is None:
            engine = self._blocking_engine("this Outbox has no engine: send once first")
            self._shards = read_shard_count(engine)
        return self._shards

    def _blocking_engine(self, missing: str) -> Engine:
        """The engine, or for an async one a blocking engine on its database (made once,
        disposed with this outbox)."""
        if self.engine is None:
            raise OutboxArgumentError(missing)
        if not self.engine.dialect.is_async:
            return self.engine
        with self._twin_lock:
            if self._twin is None:
                self._twin = aio.blocking_twin(self.engine)
                weakref.finalize(self, self._twin.dispose)
            return self._twin


class OutboxSends:
    """Messages of one block for one connection's transaction (see :meth:`Outbox.sends`).

    Thread-safe to :meth:`add` from several threads; :meth:`write` once, on the
    connection's own thread. Nothing is written before :meth:`write`; :meth:`discard`
    drops what was added. On an asyncio connection: ``await`` :meth:`prepare` (it reads
    the shard count once per outbox) before :meth:`add`, and :meth:`write_async`."""

    def __init__(self, outbox: Outbox, conn: AsyncAppConnection):
        self.is_async = aio.is_async_connection(conn)
        if not self.is_async and not isinstance(conn, Connection | Session | psycopg.Connection):
            raise check_connection(conn)
        if self.is_async and not isinstance(conn, psycopg.AsyncConnection):
            aio.require_greenlet()
        self.outbox = outbox
        self.conn = conn
        self._rows: list[tuple[OutboxConfig, Row | Marker]] = []
        self._target: AsyncAppConnection = conn

    @property
    def ready(self) -> bool:
        """Whether :meth:`add` can build rows now (a blocking connection, or the shard
        count already read): else ``await`` :meth:`prepare` first."""
        return not self.is_async or self.outbox._shards is not None

    async def prepare(self) -> None:
        """Read the shard count on the asyncio connection (once per outbox), awaited."""
        if not self.ready:
            await self.outbox.shard_count_async(self.conn)

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Mapping[str, HeaderValue] | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> None:
        """Check and build one message's row (:class:`OutboxArgumentError` when its
        arguments are bad: nothing added)."""
        if self.is_async:
            row = self.outbox.build_row(topic, data, attribute, key, headers, delay, deliver_at)
        else:
            target, row = self.outbox.build(
                self.conn,  # type: ignore[arg-type]
                topic,
                data,
                attribute,
                key,
                headers,
                delay,
                deliver_at,
            )
            self._target = target
        self._rows.append((self.outbox.config, row))

    def write(self) -> int:
        """Write the rows added so far in the connection's transaction (at its commit,
        through SQLAlchemy; at once on a psycopg connection); how many."""
        if self.is_async:
            raise aio.wrong_api(self.conn)
        rows, self._rows = self._rows, []
        write_entries(self._target, rows)  # type: ignore[arg-type]
        return len(rows)

    async def write_async(self) -> int:
        """:meth:`write`, awaited on an asyncio connection (a SQLAlchemy one: in its
        greenlet, the rows then wait for its commit; a psycopg one: inserted now); how
        many. A blocking connection is written as :meth:`write` does."""
        if not self.is_async:
            return self.write()
        rows, self._rows = self._rows, []
        if not rows:
            return 0
        conn = self.conn
        if isinstance(conn, psycopg.AsyncConnection):
            await conn.execute(pg_statements(rows), prepare=False)
        elif aio.is_sa_connection(conn) or aio.is_sa_session(conn):
            await conn.run_sync(write_entries, rows)
        return len(rows)

    def discard(self) -> int:
        """Drop the rows added so far; how many."""
        n = len(self._rows)
        self._rows = []
        return n


def check_connection(conn: object) -> OutboxArgumentError:
    """The error for what is not a connection the outbox writes on."""
    if isinstance(conn, Engine) or aio.is_sa_engine(conn):
        return OutboxArgumentError(
            "the outbox takes the connection of a transaction (engine.begin()), not an "
            f"{type(conn).__name__}"
        )
    if aio.is_async_connection(conn):
        return aio.wrong_api(conn)
    return OutboxArgumentError(
        "the outbox takes a SQLAlchemy Connection or Session, or a psycopg connection, "
        f"not {type(conn).__name__}"
    )


#: The Outbox of each engine (and of each psycopg connection used without one).
_outboxes: weakref.WeakKeyDictionary[object, Outbox] = weakref.WeakKeyDictionary()
_outboxes_lock = threading.Lock()


def outbox_for(conn: AsyncAppConnection | Engine) -> Outbox:
    """The :class:`Outbox` of ``conn``'s engine: the one the application made with
    ``Outbox(engine)`` (its settings), else one with the default settings, kept for the
    engine's life (a psycopg connection: for the connection's). Asyncio connections too
    (an ``AsyncConnection``'s engine is the ``sync_engine`` ``Outbox(async_engine)`` keeps);
    nothing here does I/O."""
    anchor: object
    if aio.is_sa_connection(conn):
        anchor = aio.sync_engine(conn.engine)
    elif aio.is_sa_session(conn):
        anchor = _session_anchor(conn.sync_session)
    elif isinstance(conn, Session):
        anchor = conn.connection().engine
    elif isinstance(conn, Connection):
        anchor = conn.engine
    elif isinstance(conn, Engine | psycopg.Connection | psycopg.AsyncConnection):
        anchor = conn
    else:
        raise check_connection(conn)
    found = _outboxes.get(anchor)
    if found is None:
        with _outboxes_lock:
            found = _outboxes.get(anchor)
            if found is None:
                engine = anchor if isinstance(anchor, Engine) else None
                found = Outbox(engine)
                _outboxes.setdefault(anchor, found)
    return found


def _session_anchor(s: Session) -> Engine:
    """The engine of Session ``s`` (no connection checked out: an AsyncSession's cannot
    be outside SQLAlchemy's greenlet)."""
    bind = s.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    aio.check_driver(engine)
    return engine


def _checked_shards(n: int) -> int:
    if n < 1:
        raise OutboxDatabaseError("notify_outbox_relay has no shard: run `notify db upgrade`")
    return n


#: Whether notify_outbox_relay exists, per dialect: a query that cannot fail (so the
#: look-up never aborts the application's transaction on PostgreSQL).
_HAS_TABLE: Final = {
    "postgresql": "SELECT count(*) FROM pg_catalog.pg_class "
    "WHERE oid = to_regclass('notify_outbox_relay')",
    "mysql": "SELECT count(*) FROM information_schema.tables "
    "WHERE table_schema = DATABASE() AND table_name = 'notify_outbox_relay'",
    "sqlite": "SELECT count(*) FROM sqlite_master "
    "WHERE type = 'table' AND name = 'notify_outbox_relay'",
}


def _shard_count_on(conn: Connection) -> int:
    """Rows of ``notify_outbox_relay``, read in ``conn``'s own transaction (no second
    connection: the application's pool may have none to spare)."""
    if not conn.exec_driver_sql(_HAS_TABLE[dialect_name(conn)]).scalar():
        raise OutboxTablesMissingError(MISSING_TABLES)
    return _checked_shards(
        int(conn.exec_driver_sql("SELECT count(*) FROM notify_outbox_relay").scalar_one())
    )


def read_shard_count(engine: Engine) -> int:
    """Rows of ``notify_outbox_relay``."""
    with engine.connect() as c:
        return _shard_count_on(c)
