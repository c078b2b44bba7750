"""PostgreSQL as an XA participant, through psycopg 3's two-phase API.

``start`` is ``tpc_begin``, ``prepare`` is ``PREPARE TRANSACTION`` (``tpc_prepare``),
``commit``/``rollback`` are ``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` (``tpc_commit`` /
``tpc_rollback``, with the xid when the branch was prepared by another connection), and
``recover`` reads ``pg_prepared_xacts`` (``tpc_recover``) keeping the branches of this
database that the scope owns. The server needs ``max_prepared_transactions > 0``.

Read-only vote (``detect_read_only=True``): before preparing, one query of
``pg_current_xact_id_if_assigned()`` tells whether the branch wrote anything; if not, it is
simply ended and votes READ_ONLY (no prepared transaction, no phase 2). Worth it for
read-mostly branches; it costs a round trip on every writing one, hence off by default.
A branch whose transaction is in error votes rollback (PostgreSQL would silently turn its
PREPARE into a ROLLBACK).
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg.pq import TransactionStatus

from notify.errors import TransactionError
from notify.protocol.keys import Xid
from notify.xa.errors import (
    ParticipantError,
    ParticipantUnavailableError,
    UnknownXidError,
    VoteRollbackError,
)
from notify.xa.ids import Scope
from notify.xa.participant import Vote
from notify.xa.resources._alive import peer_closed


def conninfo_of(url: str) -> str:
    """Accept a libpq URL/conninfo or an SQLAlchemy URL (``postgresql+psycopg://...``)."""
    if url.startswith("postgresql+") or url.startswith("postgres+"):
        return "postgresql://" + url.split("://", 1)[1]
    return url


def _pg_xid(xid: Xid) -> psycopg.Xid:
    return psycopg.Xid.from_parts(xid.format_id, xid.gtrid.decode(), xid.bqual.decode())


def translate(e: psycopg.Error, what: str) -> Exception:
    """A psycopg error as a :mod:`notify.xa.errors` exception."""
    if isinstance(e, pgerr.UndefinedObject):
        return UnknownXidError(f"{what}: {e}")
    if isinstance(e, pgerr.TransactionRollback):  # SQLSTATE 40xxx: serialization, deadlock
        return VoteRollbackError(f"{what}: {e}", 102)
    if isinstance(e, pgerr.QueryCanceled | pgerr.LockNotAvailable):
        return ParticipantError(f"{what}: {e}")
    if isinstance(e, psycopg.OperationalError | psycopg.InterfaceError):
        return ParticipantUnavailableError(f"{what}: {e}")
    return ParticipantError(f"{what}: {e}")


class PostgresParticipant:
    """An XA participant for one PostgreSQL database (``conninfo`` or URL).

    :attr:`handle` is the :class:`psycopg.Connection` to run the branch's SQL on.
    ``connect_kwargs`` go to :func:`psycopg.connect`.
    """

    def __init__(self, conninfo: str, *, detect_read_only: bool = False, **connect_kwargs: Any):
        self.conninfo = conninfo_of(conninfo)
        self.detect_read_only = detect_read_only
        self.connect_kwargs = connect_kwargs
        self._conn: psycopg.Connection[Any] | None = None
        self._xid: Xid | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        idle = conn is not None and self._xid is None and not conn.closed
        if idle and conn is not None and peer_closed(conn.fileno()):
            self._discard()  # closed by the server (restart); checked between branches only
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.conninfo, **self.connect_kwargs)
            except psycopg.Error as e:
                raise translate(e, "connect") from e
        return self._conn

    def _fail(self, e: psycopg.Error, what: str) -> Exception:
        err = translate(e, what)
        if isinstance(err, ParticipantUnavailableError):
            self._discard()
        return err

    def _discard(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        self._xid = None

    @property
    def handle(self) -> psycopg.Connection[Any]:
        """The connection of the current branch."""
        if self._xid is None or self._conn is None:
            raise ParticipantError("no active branch")
        return self._conn

    def start(self, xid: Xid, timeout_s: int) -> None:
        """``tpc_begin``."""
        if self._xid is not None:
            self._discard()  # a branch left prepared here: closing leaves it in the server
        conn = self._connection()
        try:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            conn.tpc_begin(_pg_xid(xid))
        except psycopg.Error as e:
            raise self._fail(e, "tpc_begin") from e
        self._xid = xid

    def end(self, xid: Xid, success: bool) -> None:
        """Nothing to do: PostgreSQL has no separate end."""

    def _mine(self, xid: Xid) -> bool:
        return self._xid == xid and self._conn is not None

    def prepare(self, xid: Xid) -> Vote:
        """``PREPARE TRANSACTION``, or READ_ONLY when the branch wrote nothing."""
        if not self._mine(xid):
            raise ParticipantError("prepare of a branch this connection does not hold")
        conn = self._connection()
        try:
            if conn.info.transaction_status == TransactionStatus.INERROR:
                conn.tpc_rollback()
                self._xid = None
                raise VoteRollbackError("the branch's transaction failed: rolled back")
            if self.detect_read_only:
                row = conn.execute("SELECT pg_current_xact_id_if_assigned() IS NULL").fetchone()
                if row is not None and row[0]:
                    conn.tpc_rollback()  # nothing written: ending it either way is the same
                    self._xid = None
                    return Vote.READ_ONLY
            conn.tpc_prepare()
        except psycopg.Error as e:
            raise self._fail(e, "PREPARE TRANSACTION") from e
        return Vote.OK

    def commit(self, xid: Xid, one_phase: bool) -> None:
        """``COMMIT PREPARED`` (or a plain COMMIT with ``one_phase``)."""
        try:
            if self._mine(xid):
                assert self._conn is not None
                if one_phase and self._conn.info.transaction_status == TransactionStatus.INERROR:
                    self._conn.tpc_rollback()
                    self._xid = None
                    raise VoteRollbackError("the branch's transaction failed: rolled back")
                self._conn.tpc_commit()
                self._xid = None
                return
            if one_phase:
                raise UnknownXidError("one-phase commit of a branch this connection does not hold")
            if self._xid is not None:
                self._discard()
            conn = self._connection()
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            conn.tpc_commit(_pg_xid(xid))
        except psycopg.Error as e:
            raise self._fail(e, "COMMIT PREPARED") from e

    def rollback(self, xid: Xid) -> None:
        """``ROLLBACK`` / ``ROLLBACK PREPARED``."""
        try:
            if self._mine(xid):
                assert self._conn is not None
                self._conn.tpc_rollback()
                self._xid = None
                return
            if self._xid is not None:
                self._discard()
            conn = self._connection()
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            conn.tpc_rollback(_pg_xid(xid))
        except psycopg.Error as e:
            raise self._fail(e, "ROLLBACK PREPARED") from e

    def recover(self, scope: Scope) -> list[Xid]:
        """Prepared branches of this database owned by ``scope``."""
        if self._xid is not None:
            self._discard()
        conn = self._connection()
        try:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            found = conn.tpc_recover()
            dbname = conn.info.dbname
            conn.rollback()
        except psycopg.Error as e:
            raise self._fail(e, "tpc_recover") from e
        out = []
        for x in found:
            if x.format_id is None or x.database != dbname or x.bqual is None:
                continue
            try:
                xid = Xid(x.format_id, x.gtrid.encode(), x.bqual.encode())
            except TransactionError:  # parts too long for XA: not ours
                continue
            if scope.owns(xid):
                out.append(xid)
        return out

    def forget(self, xid: Xid) -> None:
        """Nothing to do: PostgreSQL keeps no heuristic outcomes."""

    def close(self) -> None:
        """Close the connection."""
        self._discard()

    def __repr__(self) -> str:
        return f"<PostgresParticipant {self.conninfo}>"
