"""Transaction ids of one coordinator: how they are made and how they are recognised.

Every branch id is an X/Open :class:`~notify.protocol.keys.Xid` ``(formatId, gtrid, bqual)``:

* ``formatId``: the coordinator's (default :data:`DEFAULT_FORMAT_ID`, "NTXA").
* ``gtrid``: ASCII ``<coordinatorId>-<deadline>-<nonce>``; ``deadline`` is the transaction's
  deadline in Unix seconds (lowercase hex), so recovery can tell an orphan's age from the id
  alone; ``nonce`` is 6 hex digits random per process + 6 hex digits of a counter.
* ``bqual``: the participant's registered name (ASCII), one branch per participant.

On the broker the key is ``XID:<formatId>:<hex gtrid>:<hex bqual>:<coordinatorId>``, the
coordinator id serving as MetaQ's uniqueQualifier, so ``RECOVER <coordinatorId>`` lists
only this coordinator's branches. Resources addressed by a single string id (SQLAlchemy's
``begin_twophase``) use :func:`xid_to_text`: ``<gtrid>:<bqual>`` (at most 63 characters).

:class:`Scope` answers "is this prepared branch mine?": same formatId and a gtrid starting
with ``<coordinatorId>-``. Two coordinators sharing resources must have distinct ids.
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Final

from notify.errors import ConfigError
from notify.protocol.keys import Xid

DEFAULT_FORMAT_ID: Final = 0x4E545841  # "NTXA"
MAX_COORDINATOR_ID: Final = 16
MAX_NAME: Final = 24
_ID_RE: Final = re.compile(rf"[A-Za-z0-9_]{{1,{MAX_COORDINATOR_ID}}}")
_NAME_RE: Final = re.compile(rf"[A-Za-z0-9_.]{{1,{MAX_NAME}}}")
_GTRID_RE: Final = re.compile(rb"([A-Za-z0-9_]{1,16})-([0-9a-f]{1,12})-([0-9a-f]{12})")


def validate_coordinator_id(cid: str) -> str:
    """Accept ``[A-Za-z0-9_]{1,16}``; :class:`~notify.errors.ConfigError` otherwise."""
    if not isinstance(cid, str) or not _ID_RE.fullmatch(cid):
        raise ConfigError(
            f"coordinator_id must match [A-Za-z0-9_]{{1,{MAX_COORDINATOR_ID}}} (got {cid!r})"
        )
    return cid


def validate_name(name: str) -> str:
    """Accept a participant name ``[A-Za-z0-9_.]{1,24}``; ConfigError otherwise."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"participant name must match [A-Za-z0-9_.]{{1,{MAX_NAME}}} (got {name!r})"
        )
    return name


def validate_format_id(format_id: int) -> int:
    """Accept a positive int32 formatId (0 and -1 mean "OSI CCR" / "null" in XA)."""
    if not isinstance(format_id, int) or not 0 < format_id < 2**31:
        raise ConfigError(f"format_id must be in 1..2**31-1 (got {format_id!r})")
    return format_id


def new_coordinator_id() -> str:
    """A random id for a log created without one: ``tm`` + 8 hex digits."""
    return "tm" + secrets.token_hex(4)


@dataclass(frozen=True, slots=True)
class Scope:
    """The branches one coordinator owns: ``format_id`` and gtrids ``<coordinator_id>-...``."""

    coordinator_id: str
    format_id: int = DEFAULT_FORMAT_ID

    @property
    def gtrid_prefix(self) -> bytes:
        """Every gtrid of this coordinator starts with these bytes."""
        return self.coordinator_id.encode() + b"-"

    @property
    def unique_qualifier(self) -> str:
        """MetaQ uniqueQualifier used for this coordinator's broker keys."""
        return self.coordinator_id

    def owns(self, xid: Xid) -> bool:
        """Whether ``xid`` is a branch this coordinator created."""
        return (
            xid.format_id == self.format_id
            and xid.gtrid.startswith(self.gtrid_prefix)
            and _GTRID_RE.fullmatch(xid.gtrid) is not None
        )

    def owns_gtrid(self, gtrid: bytes) -> bool:
        """Whether ``gtrid`` has this coordinator's prefix and shape."""
        return gtrid.startswith(self.gtrid_prefix) and _GTRID_RE.fullmatch(gtrid) is not None


def deadline_of(gtrid: bytes) -> int | None:
    """The deadline (Unix seconds) encoded in a notify gtrid, or ``None`` for foreign ones."""
    m = _GTRID_RE.fullmatch(gtrid)
    return int(m.group(2), 16) if m else None


def qualifier_of(gtrid: bytes) -> str | None:
    """The coordinator id (broker uniqueQualifier) of a notify gtrid, or ``None``."""
    m = _GTRID_RE.fullmatch(gtrid)
    return m.group(1).decode() if m else None


class XidFactory:
    """Makes gtrids for one coordinator; thread-safe."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self._nonce = secrets.randbits(24)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def new_gtrid(self, deadline_s: float) -> bytes:
        """A fresh gtrid whose deadline field is ``deadline_s`` rounded up."""
        with self._lock:
            n = next(self._seq) & 0xFFFFFF
        deadline = int(-(-deadline_s // 1))
        return f"{self.scope.coordinator_id}-{deadline:x}-{self._nonce:06x}{n:06x}".encode()

    def branch(self, gtrid: bytes, name: str) -> Xid:
        """The branch id of participant ``name`` in transaction ``gtrid``."""
        return Xid(self.scope.format_id, gtrid, name.encode())


def name_of_branch(xid: Xid) -> str | None:
    """The participant name a notify branch id carries (its bqual), or ``None`` when the
    bqual is not a participant name."""
    try:
        name = xid.bqual.decode("ascii")
    except UnicodeDecodeError:
        return None
    return name if _NAME_RE.fullmatch(name) else None


def xid_to_text(xid: Xid) -> str:
    """``<gtrid>:<bqual>``: the single-string form for SQLAlchemy's two-phase API."""
    return f"{xid.gtrid.decode('ascii')}:{xid.bqual.decode('ascii')}"


def xid_from_text(text: str, format_id: int) -> Xid | None:
    """Inverse of :func:`xid_to_text` (``None`` when ``text`` is not of that form)."""
    gtrid, sep, bqual = text.partition(":")
    if not sep or not _GTRID_RE.fullmatch(gtrid.encode()) or not _NAME_RE.fullmatch(bqual):
        return None
    return Xid(format_id, gtrid.encode(), bqual.encode())
