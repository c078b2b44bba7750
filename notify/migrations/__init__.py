"""Schema migrations of notify's SQL tables (Alembic), and a small Python API over them.

The Alembic environment lives in this package (``env.py``, ``script.py.mako``,
``versions/``) so an installed ``notify`` finds it next to its code; revision ids are stable
(``0001``, ``0002``, ...). The version table is ``notify_alembic_version`` so notify's
tables can share a database with the application's own Alembic history.

``bind`` arguments take a URL, an :class:`~sqlalchemy.engine.Engine` or a
:class:`~sqlalchemy.engine.Connection`::

    from notify.migrations import upgrade, status
    upgrade("postgresql+psycopg://app@db/app")          # idempotent
    status("postgresql+psycopg://app@db/app").state    # "current"
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Engine

from notify.dbengine import create_offset_engine
from notify.errors import NotifyError

__all__ = [
    "SCRIPT_LOCATION",
    "VERSION_TABLE",
    "DatabaseUnreachableError",
    "MigrationError",
    "RevisionInfo",
    "SchemaAheadError",
    "SchemaStatus",
    "current",
    "downgrade",
    "head",
    "history",
    "status",
    "upgrade",
]

VERSION_TABLE: Final = "notify_alembic_version"
SCRIPT_LOCATION: Final = Path(__file__).resolve().parent

Bind = str | URL | Engine | Connection


class MigrationError(NotifyError):
    """A migration could not be run (the message says why)."""


class DatabaseUnreachableError(MigrationError):
    """The database did not accept a connection."""

    retriable = True


class SchemaAheadError(MigrationError):
    """The database carries a revision this notify does not know: a newer notify migrated it."""


@dataclass(frozen=True, slots=True)
class RevisionInfo:
    """One migration: id, parent, one-line description."""

    revision: str
    down_revision: str | None
    message: str
    is_head: bool


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database stands: ``state`` is ``empty``, ``behind``, ``current`` or ``ahead``."""

    current: tuple[str, ...]
    head: str
    state: Literal["empty", "behind", "current", "ahead"]
    unknown: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {
            "current": list(self.current),
            "head": self.head,
            "state": self.state,
            "unknown": list(self.unknown),
        }


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic :class:`Config` for this package (no ini file; output captured)."""
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def script() -> ScriptDirectory:
    """The revisions shipped with this notify."""
    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    """The newest revision id."""
    h = script().get_current_head()
    assert h is not None
    return h


def history() -> list[RevisionInfo]:
    """All revisions, oldest first."""
    sd = script()
    heads = set(sd.get_heads())
    out = []
    for s in sd.walk_revisions():
        down = s.down_revision
        out.append(
            RevisionInfo(
                s.revision,
                down if isinstance(down, str) or down is None else ",".join(down),
                (s.doc or "").strip().splitlines()[0] if s.doc else "",
                s.revision in heads,
            )
        )
    return list(reversed(out))


def _first_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


@contextlib.contextmanager
def _connection(bind: Bind, transaction: bool) -> Iterator[Connection]:
    """A connection for ``bind``; connection errors -> :class:`DatabaseUnreachableError`."""
    if isinstance(bind, Connection):
        yield bind
        return
    if isinstance(bind, Engine):
        engine, own = bind, False
    else:
        try:
            engine, own = create_offset_engine(bind, poolclass=sa.pool.NullPool), True
        except NotifyError as e:
            raise MigrationError(str(e)) from e
    try:
        try:
            conn = engine.connect()
        except sa_exc.SQLAlchemyError as e:
            raise DatabaseUnreachableError(
                f"cannot connect to {_safe(engine.url)}: {_first_line(e)}"
            ) from e
        with conn:
            if transaction:
                with conn.begin():
                    yield conn
            else:
                yield conn
    finally:
        if own:
            engine.dispose()


def _current(conn: Connection) -> tuple[str, ...]:
    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return tuple(sorted(ctx.get_current_heads()))


def _status(conn: Connection) -> SchemaStatus:
    sd = script()
    h = head()
    cur = _current(conn)
    unknown = []
    for rev in cur:
        try:
            if sd.get_revision(rev) is None:
                unknown.append(rev)
        except CommandError:
            unknown.append(rev)
    if unknown:
        return SchemaStatus(cur, h, "ahead", tuple(unknown))
    if not cur:
        return SchemaStatus(cur, h, "empty")
    return SchemaStatus(cur, h, "current" if cur == (h,) else "behind")


def current(bind: Bind) -> tuple[str, ...]:
    """The revision(s) the database is at (empty: never migrated)."""
    return status(bind).current


def status(bind: Bind) -> SchemaStatus:
    """Compare the database's revision with this notify's head."""
    with _connection(bind, transaction=False) as conn:
        try:
            st = _status(conn)
        except sa_exc.SQLAlchemyError as e:
            raise MigrationError(f"cannot read the schema revision: {_first_line(e)}") from e
        if conn.in_transaction() and not isinstance(bind, Connection):
            conn.rollback()
        return st


def _ahead_error(st: SchemaStatus, url: str) -> SchemaAheadError:
    return SchemaAheadError(
        f"database {url} is at revision {', '.join(st.unknown)}, newer than this notify "
        f"(head {st.head}): upgrade notify instead"
    )


def upgrade(bind: Bind, revision: str = "head") -> tuple[SchemaStatus, SchemaStatus]:
    """Migrate up to ``revision`` (idempotent); returns the status before and after.

    Raises :class:`SchemaAheadError` when the database is newer than this notify.
    """
    with _connection(bind, transaction=True) as conn:
        before = _status(conn)
        if before.state == "ahead":
            raise _ahead_error(before, _safe(conn.engine.url))
        try:
            command.upgrade(alembic_config(conn), revision)
        except CommandError as e:
            raise MigrationError(f"upgrade to {revision}: {e}") from e
        except sa_exc.SQLAlchemyError as e:
            raise MigrationError(f"upgrade to {revision} failed: {_first_line(e)}") from e
        return before, _status(conn)


def downgrade(bind: Bind, revision: str) -> tuple[SchemaStatus, SchemaStatus]:
    """Migrate down to ``revision`` (``base`` removes every notify table)."""
    with _connection(bind, transaction=True) as conn:
        before = _status(conn)
        if before.state == "ahead":
            raise _ahead_error(before, _safe(conn.engine.url))
        try:
            command.downgrade(alembic_config(conn), revision)
        except CommandError as e:
            raise MigrationError(f"downgrade to {revision}: {e}") from e
        except sa_exc.SQLAlchemyError as e:
            raise MigrationError(f"downgrade to {revision} failed: {_first_line(e)}") from e
        return before, _status(conn)
