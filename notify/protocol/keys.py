"""Transaction keys in MetaQ's text forms.

* local: ``TX:<sessionId>:<seq>``
* XA:    ``XID:<formatId>:<hex gtrid>:<hex bqual>:<uniqueQualifier>`` (lowercase hex)
* none:  ``null``
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from notify.errors import TransactionError

_LOCAL: Final = re.compile(r"TX:([^:\s]+):(\d+)")
_XID: Final = re.compile(r"XID:(-?\d+):([0-9a-f]*):([0-9a-f]*):([^\s]*)")
MAX_XID_PART: Final = 64  # bytes, as in the X/Open XA spec


@dataclass(frozen=True, slots=True)
class Xid:
    """An X/Open XA transaction id."""

    format_id: int
    gtrid: bytes
    bqual: bytes

    def __post_init__(self) -> None:
        if len(self.gtrid) > MAX_XID_PART or len(self.bqual) > MAX_XID_PART:
            raise TransactionError("gtrid and bqual are at most 64 bytes each")

    def key(self, unique_qualifier: str) -> str:
        return f"XID:{self.format_id}:{self.gtrid.hex()}:{self.bqual.hex()}:{unique_qualifier}"


def local_key(session_id: str, seq: int) -> str:
    return f"TX:{session_id}:{seq}"


def is_local(key: str) -> bool:
    return key.startswith("TX:")


def is_xa(key: str) -> bool:
    return key.startswith("XID:")


def is_local_key(key: str) -> bool:
    """Whether ``key`` is a well-formed local key (what :func:`validate_key` accepts and
    :func:`is_xa` does not)."""
    return _LOCAL.fullmatch(key) is not None


def parse_xid(key: str) -> tuple[Xid, str]:
    """``(xid, uniqueQualifier)`` of an XA key; TransactionError when malformed."""
    m = _XID.fullmatch(key)
    if not m or len(m.group(2)) % 2 or len(m.group(3)) % 2:
        raise TransactionError(f"malformed XA transaction key {key[:120]!r}")
    return Xid(int(m.group(1)), bytes.fromhex(m.group(2)), bytes.fromhex(m.group(3))), m.group(4)


def validate_key(key: str) -> str:
    """Accept a local or XA key, reject anything else with a readable reason."""
    if _LOCAL.fullmatch(key):
        return key
    if key.startswith("XID:"):
        parse_xid(key)
        return key
    raise TransactionError(
        f"malformed transaction key {key[:120]!r}: expected TX:<sessionId>:<seq> or "
        "XID:<formatId>:<hex gtrid>:<hex bqual>:<uniqueQualifier>"
    )
