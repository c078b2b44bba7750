"""MySQL / MariaDB as an XA participant, with PyMySQL and the ``XA`` statements.

::

    XA START  X'<gtrid>',X'<bqual>',<formatId>     start
    XA END    ...                                   end (also before PREPARE / ROLLBACK)
    XA PREPARE ...                                  prepare (always votes OK)
    XA COMMIT ... [ONE PHASE]                       commit
    XA ROLLBACK ...                                 rollback
    XA RECOVER                                      recover: formatID, gtrid_length,
                                                    bqual_length, data (gtrid + bqual)

The connection runs in autocommit mode outside branches, so no implicit local transaction
ever blocks ``XA START``. A prepared branch survives a disconnect and a server crash
(MariaDB >= 10.5) and can be finished from any connection; until then it stays attached to
the session that prepared it, which can run no other XA statement: the participant
reconnects before using such a session for anything else.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql

from notify.errors import ConfigError, TransactionError
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

ER_XAER_NOTA: Final = 1397
_ROLLED_BACK: Final = frozenset({1402, 1613, 1614, 1213})  # XA_RB*, deadlock
_GONE: Final = frozenset({2003, 2006, 2013, 2055, 1927, 1053})  # lost / refused / shutdown


def connect_args(url: str) -> dict[str, Any]:
    """``pymysql.connect`` keyword arguments for ``mysql[+pymysql]://user:pw@host:port/db``
    (``mariadb://`` too; query parameters are passed through as strings)."""
    u = urlsplit(url)
    if u.scheme.split("+", 1)[0] not in ("mysql", "mariadb"):
        raise ConfigError(f"not a MySQL/MariaDB URL: {url!r}")
    args: dict[str, Any] = {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
    }
    db = u.path.lstrip("/")
    if db:
        args["database"] = unquote(db)
    args.update(parse_qsl(u.query))
    return args


def _lit(xid: Xid) -> str:
    return f"X'{xid.gtrid.hex()}',X'{xid.bqual.hex()}',{xid.format_id}"


def translate(e: Exception, what: str) -> Exception:
    """A PyMySQL error as a :mod:`notify.xa.errors` exception."""
    code = e.args[0] if e.args and isinstance(e.args[0], int) else 0
    if isinstance(e, pymysql.err.InterfaceError) or code in _GONE:
        return ParticipantUnavailableError(f"{what}: {e}")
    if code == ER_XAER_NOTA:
        return UnknownXidError(f"{what}: {e}")
    if code in _ROLLED_BACK:
        return VoteRollbackError(f"{what}: {e}")
    return ParticipantError(f"{what}: {e}")


class MySQLParticipant:
    """An XA participant for one MySQL/MariaDB database.

    ``url`` is an SQLAlchemy-style URL (``mysql+pymysql://root@127.0.0.1:3306/db``);
    ``connect_kwargs`` override what it gives. :attr:`handle` is the
    :class:`pymysql.connections.Connection` of the branch.
    """

    def __init__(self, url: str, **connect_kwargs: Any):
        self.url = url
        self.kwargs = {**connect_args(url), "connect_timeout": 5, **connect_kwargs}
        self._conn: Any = None
        self._xid: Xid | None = None
        self._active = False  # XA START done, XA END not yet
        self._attached: Xid | None = None  # prepared on this session, not finished here

    def _connection(self) -> Any:
        if self._conn is not None and not self._active and self._xid is None:
            sock = getattr(self._conn, "_sock", None)
            if sock is None or peer_closed(sock.fileno()):
                self._discard()  # the server closed it (restart): reconnect
        if self._conn is None:
            try:
                self._conn = pymysql.connect(**self.kwargs, autocommit=True)
            except pymysql.MySQLError as e:
                raise translate(e, "connect") from e
        return self._conn

    def _run(self, sql: str, what: str, xid: Xid | None = None) -> tuple[tuple[Any, ...], ...]:
        if self._attached is not None and self._attached != xid:
            self._discard()  # detach: the prepared branch stays in the server
        conn = self._connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                rows: tuple[tuple[Any, ...], ...] = cur.fetchall()
                return rows
        except pymysql.MySQLError as e:
            err = translate(e, what)
            if isinstance(err, ParticipantUnavailableError):
                self._discard()
            raise err from e

    def _discard(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        self._xid = None
        self._active = False
        self._attached = None

    @property
    def handle(self) -> Any:
        """The PyMySQL connection of the current branch."""
        if self._xid is None:
            raise ParticipantError("no active branch")
        return self._connection()

    def start(self, xid: Xid, timeout_s: int) -> None:
        """``XA START``."""
        self._run(f"XA START {_lit(xid)}", "XA START")
        self._xid, self._active = xid, True

    def end(self, xid: Xid, success: bool) -> None:
        """``XA END`` (once)."""
        if self._xid == xid and self._active:
            self._active = False
            self._run(f"XA END {_lit(xid)}", "XA END", xid)

    def prepare(self, xid: Xid) -> Vote:
        """``XA PREPARE``."""
        self.end(xid, True)
        try:
            self._run(f"XA PREPARE {_lit(xid)}", "XA PREPARE", xid)
            self._attached = xid
        finally:
            self._xid = None if self._xid == xid else self._xid
        return Vote.OK

    def commit(self, xid: Xid, one_phase: bool) -> None:
        """``XA COMMIT`` (``ONE PHASE`` for an ended, unprepared branch)."""
        self.end(xid, True)
        if self._xid == xid:
            self._xid = None
        self._run(f"XA COMMIT {_lit(xid)}{' ONE PHASE' if one_phase else ''}", "XA COMMIT", xid)
        if self._attached == xid:
            self._attached = None

    def rollback(self, xid: Xid) -> None:
        """``XA ROLLBACK`` (after ``XA END`` if still active)."""
        if self._xid == xid:
            with contextlib.suppress(VoteRollbackError):  # the server already rolled back
                self.end(xid, False)
            self._xid = None
        self._run(f"XA ROLLBACK {_lit(xid)}", "XA ROLLBACK", xid)
        if self._attached == xid:
            self._attached = None

    def recover(self, scope: Scope) -> list[Xid]:
        """``XA RECOVER`` filtered by ``scope``."""
        out = []
        for fmt, glen, blen, data in self._run("XA RECOVER", "XA RECOVER"):
            raw = data if isinstance(data, bytes) else str(data).encode("latin-1")
            try:
                xid = Xid(int(fmt), raw[: int(glen)], raw[int(glen) : int(glen) + int(blen)])
            except TransactionError:
                continue
            if scope.owns(xid):
                out.append(xid)
        return out

    def forget(self, xid: Xid) -> None:
        """Nothing to do: MariaDB keeps no heuristic outcomes."""

    def close(self) -> None:
        """Close the connection."""
        self._discard()

    def __repr__(self) -> str:
        return f"<MySQLParticipant {self.kwargs.get('host')}:{self.kwargs.get('port')}>"
