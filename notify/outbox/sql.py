"""SQL the outbox runs, per dialect, in one place (the tables: :mod:`notify.outbox.rows`).

PostgreSQL advisory locks (two-int form, so the application's one-bigint locks never
collide) use three classes from ``lock_base`` (:attr:`OutboxConfig.pg_lock_base`):

    lock_base + 0   (class, khash)   held by a writing transaction until it ends: the rows
                                     of one key take their ids in commit order
    lock_base + 1   (class, shard)   held by a waiting relay: a writer that cannot take it
                                     shared knows the relay sleeps and wakes it (NOTIFY on
                                     channel notify_outbox_<shard>)
    lock_base + 2   (class, shard)   held by the shard's leading relay (its session)

MySQL/MariaDB: a writer locks ``notify_outbox_keylock`` row ``khash mod 4096`` (FOR
UPDATE) for the same purpose; leaders hold ``GET_LOCK('notify_outbox.<shard>')``.
SQLite has one writer at a time: ids are in commit order without a lock.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Dialect

from .rows import OutboxError

#: LISTEN/NOTIFY channel of a shard's waiting relay: this prefix and the shard number (one
#: channel per shard: a commit wakes only its shard's relay).
CHANNEL: Final = "notify_outbox_"
#: Default first class of the outbox's PostgreSQL advisory locks (see module doc).
DEFAULT_PG_LOCK_BASE: Final = 0x6E6F7400
#: MySQL/MariaDB: rows of notify_outbox_keylock.
KEYLOCK_SLOTS: Final = 4096

#: Unix milliseconds from the database's clock.
NOW_MS: Final = {
    "postgresql": "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint",
    "mysql": "ROUND(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
}

SUPPORTED: Final = ("postgresql", "mysql", "sqlite")


class OutboxDatabaseError(OutboxError):
    """The outbox's database refused or failed (the message says how)."""


class OutboxTablesMissingError(OutboxDatabaseError):
    """The outbox's tables are not in the database: run ``notify db upgrade``."""


def dialect_name(dialect: Dialect | Connection) -> str:
    """``postgresql``, ``mysql`` (also MariaDB) or ``sqlite``; OutboxDatabaseError else."""
    d = dialect.dialect if isinstance(dialect, Connection) else dialect
    name = "mysql" if d.name in ("mysql", "mariadb") else d.name
    if name not in SUPPORTED:
        raise OutboxDatabaseError(
            f"the outbox runs on PostgreSQL, MySQL/MariaDB or SQLite, not {d.name}"
        )
    return name


MISSING_TABLES: Final = (
    "the outbox's tables are missing: run `notify db upgrade --url <this database>`"
)


def is_missing_table(e: sa_exc.SQLAlchemyError) -> bool:
    """Whether ``e`` says a table does not exist (PostgreSQL 42P01, MySQL 1146, SQLite)."""
    orig = getattr(e, "orig", None)
    if getattr(orig, "sqlstate", None) == "42P01":
        return True
    args = getattr(orig, "args", ())
    if args and args[0] == 1146:
        return True
    return "no such table" in str(orig)
