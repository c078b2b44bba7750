"""An SQLAlchemy engine or connection as an XA participant (``begin_twophase``).

SQLAlchemy names a two-phase transaction with one string, so the branch id is
:func:`~notify.xa.ids.xid_to_text` (``<gtrid>:<bqual>``): PostgreSQL's ``PREPARE
TRANSACTION '<it>'``, MySQL's ``XA BEGIN '<it>'`` (formatID 1, empty bqual). Recovery lists
``pg_prepared_xacts`` of the current database, or ``XA RECOVER``, and keeps the ids that
parse as this coordinator's.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from notify.protocol.keys import Xid
from notify.xa.errors import ParticipantError, ParticipantUnavailableError
from notify.xa.ids import Scope, xid_from_text, xid_to_text
from notify.xa.participant import Vote
from notify.xa.resources.mysql import translate as my_translate
from notify.xa.resources.postgres import translate as pg_translate


def _driver_translate(orig: BaseException | None, what: str) -> Exception | None:
    mod = type(orig).__module__
    if mod.startswith("psycopg") and isinstance(orig, psycopg.Error):
        return pg_translate(orig, what)
    if mod.startswith("pymysql") and isinstance(orig, Exception):
        return my_translate(orig, what)
    return None


def translate(e: Exception, what: str) -> Exception:
    """An SQLAlchemy (or raw driver) error as a :mod:`notify.xa.errors` exception."""
    if isinstance(e, DBAPIError):
        if e.connection_invalidated:
            return ParticipantUnavailableError(f"{what}: {e.orig}")
        return _driver_translate(e.orig, what) or ParticipantError(f"{what}: {e}")
    return _driver_translate(e, what) or ParticipantError(f"{what}: {e}")


def _is_db_error(e: Exception) -> bool:
    """SQLAlchemy errors and the driver errors some dialect paths let through unwrapped."""
    mod = type(e).__module__
    return isinstance(e, SQLAlchemyError) or mod.startswith(("psycopg", "pymysql"))


class SQLAlchemyParticipant:
    """An XA participant over SQLAlchemy.

    ``bind`` is an :class:`~sqlalchemy.engine.Engine` (the participant checks out one
    connection and returns it on :meth:`close`) or a :class:`~sqlalchemy.engine.Connection`
    (used as is and never closed). :attr:`handle` is the Connection.
    """

    def __init__(self, bind: Engine | Connection):
        self._engine = bind if isinstance(bind, Engine) else None
        self._conn: Connection | None = bind if isinstance(bind, Connection) else None
        self._tx: Any = None
        self._xid: Xid | None = None
        self._prepared = False

    def _connection(self) -> Connection:
        if self._conn is None:
            assert self._engine is not None
            try:
                conn = self._engine.connect()
                if conn.dialect.name in ("mysql", "mariadb"):
                    # outside XA branches, no implicit local transaction may block XA verbs
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                self._conn = conn
            except SQLAlchemyError as e:
                raise translate(e, "connect") from e
        return self._conn

    def _fail(self, e: Exception, what: str) -> Exception:
        err = translate(e, what)
        if isinstance(err, ParticipantUnavailableError) and self._engine is not None:
            self._discard()
        return err

    def _detach(self) -> None:
        """Drop a prepared branch's session without touching the branch: closing or rolling
        back SQLAlchemy's TwoPhaseTransaction would run ROLLBACK PREPARED, so the DBAPI
        connection is invalidated first (the prepared branch lives on in the server)."""
        if self._tx is None or not self._prepared or self._conn is None:
            return
        conn = self._conn
        with contextlib.suppress(Exception):
            conn.invalidate()
        with contextlib.suppress(Exception):
            conn.rollback()  # clears the transaction object; no statement on an invalid conn
        self._tx, self._xid, self._prepared = None, None, False
        if self._engine is not None:
            with contextlib.suppress(Exception):
                conn.close()
            self._conn = None

    def _discard(self) -> None:
        self._tx = None
        self._xid = None
        if self._engine is not None and self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    @property
    def handle(self) -> Connection:
        """The connection of the current branch."""
        if self._xid is None:
            raise ParticipantError("no active branch")
        return self._connection()

    def _idle(self, conn: Connection) -> None:
        if conn.in_transaction():
            conn.rollback()

    def start(self, xid: Xid, timeout_s: int) -> None:
        """``begin_twophase(<gtrid>:<bqual>)``."""
        self._detach()
        conn = self._connection()
        try:
            self._idle(conn)
            self._tx = conn.begin_twophase(xid_to_text(xid))
        except Exception as e:
            if not _is_db_error(e):
                raise
            raise self._fail(e, "begin_twophase") from e
        self._xid, self._prepared = xid, False

    def end(self, xid: Xid, success: bool) -> None:
        """Nothing to do."""

    def prepare(self, xid: Xid) -> Vote:
        """``TwoPhaseTransaction.prepare()``."""
        if self._xid != xid or self._tx is None:
            raise ParticipantError("prepare of a branch this connection does not hold")
        try:
            self._tx.prepare()
        except Exception as e:
            if not _is_db_error(e):
                raise
            raise self._fail(e, "prepare") from e
        self._prepared = True
        return Vote.OK

    def commit(self, xid: Xid, one_phase: bool) -> None:
        """Commit the branch (``commit_prepared(..., recover=True)`` for foreign ones)."""
        try:
            if self._xid == xid and self._tx is not None:
                tx, self._tx, self._xid = self._tx, None, None
                tx.commit()
                self._prepared = False
                return
            self._detach()
            conn = self._connection()
            self._idle(conn)
            conn.commit_prepared(xid_to_text(xid), recover=True)
            self._idle(conn)
        except Exception as e:
            if not _is_db_error(e):
                raise
            raise self._fail(e, "commit") from e

    def rollback(self, xid: Xid) -> None:
        """Roll the branch back (``rollback_prepared(..., recover=True)`` for foreign ones)."""
        try:
            if self._xid == xid and self._tx is not None:
                tx, self._tx, self._xid = self._tx, None, None
                tx.rollback()
                self._prepared = False
                return
            self._detach()
            conn = self._connection()
            self._idle(conn)
            conn.rollback_prepared(xid_to_text(xid), recover=True)
            self._idle(conn)
        except Exception as e:
            if not _is_db_error(e):
                raise
            raise self._fail(e, "rollback") from e

    def recover(self, scope: Scope) -> list[Xid]:
        """Prepared ids of this database that parse as ``scope``'s."""
        self._detach()
        conn = self._connection()
        try:
            self._idle(conn)
            if conn.dialect.name == "postgresql":
                ids = list(
                    conn.scalars(
                        text(
                            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                        )
                    )
                )
            else:
                ids = [
                    g.decode("latin-1") if isinstance(g, bytes) else str(g)
                    for g in conn.recover_twophase()
                ]
            self._idle(conn)
        except Exception as e:
            if not _is_db_error(e):
                raise
            raise self._fail(e, "recover") from e
        out = []
        for gid in ids:
            xid = xid_from_text(str(gid), scope.format_id)
            if xid is not None and scope.owns(xid):
                out.append(xid)
        return out

    def forget(self, xid: Xid) -> None:
        """Nothing to do."""

    def close(self) -> None:
        """Return the connection to the engine (if the participant checked it out)."""
        self._detach()
        if self._tx is not None:
            with contextlib.suppress(Exception):
                self._tx.rollback()
        self._tx = self._xid = None
        if self._engine is not None and self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def __repr__(self) -> str:
        return f"<SQLAlchemyParticipant {self._engine or self._conn}>"
