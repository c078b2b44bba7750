"""What the outbox needs to know about asyncio connections (:meth:`Outbox.send_async`).

An asyncio application hands the outbox one of:

* a SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` (an ``AsyncEngine`` to
  ``Outbox(engine)``): the outbox works on the synchronous objects under them
  (``sync_connection``, ``sync_session``, ``sync_engine``), inside SQLAlchemy's greenlet
  (``run_sync``), where their blocking calls are awaited on the application's loop. The rows
  wait on the connection and are written by the commit hooks, which SQLAlchemy runs in that
  greenlet too: on PostgreSQL with psycopg, the rows and the ``COMMIT`` as one query, awaited
  through psycopg's ``AsyncConnection`` (:func:`pg_exec_in_greenlet`);
* a psycopg 3 ``AsyncConnection``: the rows are inserted at once, awaited.

SQLAlchemy's asyncio support needs ``greenlet`` (``pip install 'notify[asyncio]'``): this
module never imports ``sqlalchemy.ext.asyncio`` (an application with an ``AsyncEngine`` has
loaded it already; one without keeps the outbox free of it), it recognises the objects by
the loaded module's classes.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any, Final, TypeGuard

import psycopg
from psycopg import pq
from sqlalchemy import create_engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.util.concurrency import await_

from .rows import OutboxArgumentError
from .sql import MISSING_TABLES, OutboxTablesMissingError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

SA_ASYNCIO: Final = "sqlalchemy.ext.asyncio"
EXTRA: Final = "pip install 'notify[asyncio]'"

#: The async SQLAlchemy drivers the outbox writes through, per dialect, and the blocking
#: driver its relay and status use on the same database.
ASYNC_DRIVERS: Final = {
    ("postgresql", "psycopg"): "psycopg",
    ("postgresql", "psycopg_async"): "psycopg",
    ("mysql", "asyncmy"): "pymysql",
    ("mysql", "aiomysql"): "pymysql",
    ("mariadb", "asyncmy"): "pymysql",
    ("mariadb", "aiomysql"): "pymysql",
    ("sqlite", "aiosqlite"): "pysqlite",
}


def _is(obj: object, name: str) -> bool:
    m = sys.modules.get(SA_ASYNCIO)
    # not loaded: nothing can be one of its objects (and nothing loads it here)
    return m is not None and isinstance(obj, getattr(m, name))


def is_sa_connection(obj: object) -> TypeGuard[AsyncConnection]:
    """Whether ``obj`` is a SQLAlchemy ``AsyncConnection``."""
    return _is(obj, "AsyncConnection")


def is_sa_session(obj: object) -> TypeGuard[AsyncSession]:
    """Whether ``obj`` is a SQLAlchemy ``AsyncSession``."""
    return _is(obj, "AsyncSession")


def is_sa_engine(obj: object) -> TypeGuard[AsyncEngine]:
    """Whether ``obj`` is a SQLAlchemy ``AsyncEngine``."""
    return _is(obj, "AsyncEngine")


def is_async_connection(obj: object) -> bool:
    """Whether ``obj`` is an asyncio connection (SQLAlchemy ``AsyncConnection`` or
    ``AsyncSession``, psycopg ``AsyncConnection``): one for :meth:`Outbox.send_async`."""
    return (
        isinstance(obj, psycopg.AsyncConnection) or is_sa_connection(obj) or is_sa_session(obj)
    )


def require_greenlet() -> None:
    """Raise a clear error when SQLAlchemy's asyncio support cannot run (no greenlet)."""
    if importlib.util.find_spec("greenlet") is None:
        raise OutboxArgumentError(
            f"SQLAlchemy's asyncio objects need greenlet: {EXTRA} (sqlalchemy[asyncio])"
        )


def sync_engine(engine: AsyncEngine) -> Engine:
    """The blocking engine under an ``AsyncEngine`` (its commit hooks are the outbox's),
    after checking its driver is one the outbox writes through."""
    require_greenlet()
    sync = engine.sync_engine
    check_driver(sync)
    return sync


def check_driver(engine: Engine) -> None:
    """Raise for an async driver the outbox does not write through."""
    d = engine.dialect
    if not d.is_async:
        return
    if (d.name, d.driver) not in ASYNC_DRIVERS:
        known = ", ".join(sorted({f"{n}+{drv}" for n, drv in ASYNC_DRIVERS}))
        raise OutboxArgumentError(
            f"the outbox writes through the async drivers {known}, not {d.name}+{d.driver}"
        )
    if d.driver == "aiomysql" and not _aiomysql_sends_bytes():
        raise OutboxArgumentError(
            "aiomysql cannot send bytes parameters with PyMySQL >= 1.2 (it imports the "
            "escape_bytes_prefixed that PyMySQL 1.2 replaced): use mysql+asyncmy, or PyMySQL "
            "< 1.2 under aiomysql"
        )


def _aiomysql_sends_bytes() -> bool:
    """Whether aiomysql's escaping of bytes works with the PyMySQL it loaded (PyMySQL 1.2
    left a string where aiomysql 0.3 expects a function)."""
    conv = sys.modules.get("pymysql.converters")
    return conv is None or callable(getattr(conv, "escape_bytes_prefixed", None))


def blocking_twin(engine: Engine) -> Engine:
    """A blocking engine on the database of ``engine`` (the engine itself unless its
    driver is an async one): the relay's threads and the status cannot await."""
    d = engine.dialect
    if not d.is_async:
        return engine
    check_driver(engine)
    driver = ASYNC_DRIVERS[(d.name, d.driver)]
    url = engine.url.set(drivername=f"{engine.url.get_backend_name()}+{driver}")
    return create_engine(url, pool_pre_ping=True)


def wrong_api(conn: object) -> OutboxArgumentError:
    """The error for an asyncio connection handed to a blocking call."""
    return OutboxArgumentError(
        f"{type(conn).__name__} is an asyncio connection: use "
        "`await outbox.send_async(conn, ...)`, or an AsyncProducer's "
        "`transaction(db=conn)` (the blocking send takes a Connection, a Session or a "
        "psycopg.Connection)"
    )


# ------------------------------------------------------------------ psycopg AsyncConnection

#: The shard count, read on the application's connection: whether the table exists (a
#: query that cannot fail, so the transaction is never aborted by the look-up), its rows.
HAS_RELAY_TABLE: Final = (
    "SELECT count(*) FROM pg_catalog.pg_class WHERE oid = to_regclass('notify_outbox_relay')"
)
COUNT_SHARDS: Final = "SELECT count(*) FROM notify_outbox_relay"


async def pg_shard_count(conn: psycopg.AsyncConnection[Any]) -> int:
    """Rows of ``notify_outbox_relay`` read on ``conn`` (0: none)."""
    cur = await conn.execute(HAS_RELAY_TABLE, prepare=False)
    found = await cur.fetchone()
    if not found or not found[0]:
        raise OutboxTablesMissingError(MISSING_TABLES)
    cur = await conn.execute(COUNT_SHARDS, prepare=False)
    n = await cur.fetchone()
    return int(n[0]) if n else 0


def pg_exec_in_greenlet(conn: Connection, dc: psycopg.AsyncConnection[Any], sql: bytes) -> None:
    """Run ``sql`` (the rows' statements and ``COMMIT``) on ``dc`` as one simple query,
    awaited from SQLAlchemy's greenlet (the commit hook of an ``AsyncConnection``).

    On failure the transaction is ended here (SQLAlchemy counts the failed commit as its end
    and returns the connection to its pool without a rollback) and the error raised as
    SQLAlchemy raises a driver's."""
    try:
        await_(dc.execute(sql, prepare=False))
    except psycopg.Error as e:
        if dc.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            try:
                await_(dc.rollback())
            except psycopg.Error as gone:  # the connection is gone: nothing pending on it
                e.add_note(f"rollback after the failed outbox write: {gone}")
        raise sa_exc.DBAPIError.instance(
            sql[:500].decode("utf-8", "replace"), None, e, psycopg.Error, dialect=conn.dialect
        ) from e
