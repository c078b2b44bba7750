"""javax.transaction.xa.XAException codes, as the broker sends them in
``500 XAException:code=<n>,msg=<text>`` and as participants and the coordinator use them."""

from __future__ import annotations

from typing import Final

XA_OK: Final = 0
XA_RDONLY: Final = 3
XA_RETRY: Final = 4
XA_HEURMIX: Final = 5
XA_HEURRB: Final = 6
XA_HEURCOM: Final = 7
XA_HEURHAZ: Final = 8
XA_RBBASE: Final = 100
XA_RBROLLBACK: Final = 100
XA_RBTIMEOUT: Final = 106
XA_RBEND: Final = 107
XAER_RMERR: Final = -3
XAER_NOTA: Final = -4
XAER_INVAL: Final = -5
XAER_PROTO: Final = -6
XAER_RMFAIL: Final = -7
XAER_DUPID: Final = -8


def encode_xa_failure(code: int, message: str) -> bytes:
    """The body of an XA error reply: ``XAException:code=<n>,msg=<text>`` (MetaQ's form)."""
    return f"XAException:code={code},msg={message}".encode("utf-8", "replace")
