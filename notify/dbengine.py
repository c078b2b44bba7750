"""SQLAlchemy engines for the offset stores and the migrations: URL defaults, timeouts,
masked URLs, and :class:`OffsetStoreError`. Below both :mod:`notify.offsets` and
:mod:`notify.migrations` (which uses it without importing the offsets package)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine, make_url

from notify.errors import ClientError


class OffsetStoreError(ClientError):
    """An offset store failed (permanent unless ``retriable``)."""

DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: Socket read/write timeout for MySQL connections (a hung server must not hang a commit).
MYSQL_IO_TIMEOUT_S = 30
#: SQLite busy timeout (another writer holds the database lock).
SQLITE_BUSY_TIMEOUT_S = 30.0
#: Dialects with a one-statement upsert.
SUPPORTED_DIALECTS = frozenset({"postgresql", "mysql", "mariadb", "sqlite"})


def safe_url(url: str | URL) -> str:
    """``url`` with its password masked (for messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return "<invalid url>"


def with_default_driver(url: URL) -> URL:
    """``postgresql://`` -> ``postgresql+psycopg://``, ``mysql://`` -> ``mysql+pymysql://``
    (the drivers notify installs)."""
    if url.drivername == "postgresql":
        return url.set(drivername="postgresql+psycopg")
    if url.drivername in ("mysql", "mariadb"):
        return url.set(drivername=f"{url.drivername}+pymysql")
    return url


def create_offset_engine(
    url: str | URL, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, **kwargs: Any
) -> Engine:
    """An engine for ``url`` with bounded connect (and, for MySQL, I/O) timeouts.

    ``pool_pre_ping`` replaces connections that died with a restarted server. For a SQLite
    file the parent directory is created. Raises :class:`OffsetStoreError` for a URL that
    names no installed driver.
    """
    try:
        u = with_default_driver(make_url(url))
        backend = u.get_backend_name()
    except sa_exc.ArgumentError as e:
        raise OffsetStoreError(f"invalid database URL {safe_url(url)}: {e}") from e
    if backend not in SUPPORTED_DIALECTS:
        raise OffsetStoreError(
            f"unsupported database {backend!r} in {safe_url(u)}: "
            "use postgresql+psycopg://, mysql+pymysql:// or sqlite:///"
        )
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", {}))
    timeout = max(1, round(connect_timeout_s))
    if backend == "postgresql":
        connect_args.setdefault("connect_timeout", timeout)
    elif backend in ("mysql", "mariadb"):
        connect_args.setdefault("connect_timeout", timeout)
        connect_args.setdefault("read_timeout", MYSQL_IO_TIMEOUT_S)
        connect_args.setdefault("write_timeout", MYSQL_IO_TIMEOUT_S)
        connect_args.setdefault("charset", "utf8mb4")
    elif backend == "sqlite":
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
        if u.database and u.database != ":memory:" and not u.database.startswith("file:"):
            with contextlib.suppress(OSError):
                Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if backend != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)
    try:
        return sa.create_engine(u, connect_args=connect_args, **kwargs)
    except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as e:
        raise OffsetStoreError(f"cannot use database URL {safe_url(u)}: {e}") from e
