"""Exceptions of the 2PC coordinator (:mod:`notify.xa`), under notify's one root.

Classified by behaviour: what the application should do, and whether the same call may
succeed if simply tried again (``retriable``). Foreign driver errors (psycopg, PyMySQL,
SQLAlchemy, sockets) are translated by each participant module; they never leave the
public API as themselves.

Tree::

    NotifyError
    └── TransactionError
        └── XAError                         anything raised by notify.xa
            ├── RollbackError               the transaction was rolled back: nothing of it
            │   │                           happened, running it again may work (retriable)
            │   └── TransactionTimeoutError its deadline passed before the commit decision
            ├── OutcomeUnknownError         the decision could not be made known (a failed
            │                               fsync, a lost one-phase commit reply); recovery
            │                               settles prepared branches, do not blindly retry
            ├── HeuristicError              a participant's outcome differs from the decision;
            │   │                           recorded in the decision log (``reports``)
            │   ├── HeuristicMixedError     some branches committed, some rolled back
            │   ├── HeuristicRollbackError  decided commit, the branches rolled back
            │   ├── HeuristicCommitError    decided rollback, the branches committed
            │   └── HeuristicHazardError    the outcome of some branch is unknown
            ├── ParticipantError            raised by participants (carries the XA ``code``)
            │   ├── ParticipantUnavailableError  no connection / connection lost (retriable)
            │   ├── UnknownXidError         XAER_NOTA: the resource does not know the branch
            │   ├── VoteRollbackError       XA_RB*: the resource rolled the branch back
            │   └── BranchHeuristicError    XA_HEUR*: the resource decided on its own
            ├── NotRegisteredError          enlist/lookup of a name nobody registered
            ├── DecisionLogError            the decision log cannot be used
            │   └── LogLockedError          another process holds the log directory
            └── InDoubtError                an admin action refused (unknown or live gtrid,
                                            a commit decision overridden without --force)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from notify.errors import TransactionError

# javax.transaction.xa.XAException codes (the broker sends them as XAException:code=<n>),
# re-exported from their one home, notify.protocol.xa
from notify.protocol.xa import (
    XA_HEURCOM as XA_HEURCOM,
)
from notify.protocol.xa import (
    XA_HEURHAZ as XA_HEURHAZ,
)
from notify.protocol.xa import (
    XA_HEURMIX as XA_HEURMIX,
)
from notify.protocol.xa import (
    XA_HEURRB as XA_HEURRB,
)
from notify.protocol.xa import (
    XA_OK as XA_OK,
)
from notify.protocol.xa import (
    XA_RBBASE as XA_RBBASE,
)
from notify.protocol.xa import (
    XA_RBEND as XA_RBEND,
)
from notify.protocol.xa import (
    XA_RDONLY as XA_RDONLY,
)
from notify.protocol.xa import (
    XAER_DUPID as XAER_DUPID,
)
from notify.protocol.xa import (
    XAER_INVAL as XAER_INVAL,
)
from notify.protocol.xa import (
    XAER_NOTA as XAER_NOTA,
)
from notify.protocol.xa import (
    XAER_PROTO as XAER_PROTO,
)
from notify.protocol.xa import (
    XAER_RMERR as XAER_RMERR,
)
from notify.protocol.xa import (
    XAER_RMFAIL as XAER_RMFAIL,
)
from notify.xa.records import HeuristicKind as HeuristicKind  # re-exported: its old home
from notify.xa.records import HeuristicRecord


class XAError(TransactionError):
    """Root of the coordinator's errors."""


class RollbackError(XAError):
    """The transaction was rolled back; nothing of it is visible anywhere."""

    retriable = True


class TransactionTimeoutError(RollbackError):
    """The transaction's deadline passed before the commit decision was made."""


class OutcomeUnknownError(XAError):
    """The coordinator cannot tell the outcome yet; recovery will settle it."""


class HeuristicError(XAError):
    """Participants' outcomes differ from the decision; ``reports`` were logged durably."""

    def __init__(self, message: str, reports: Sequence[HeuristicRecord] = ()):
        super().__init__(message)
        self.reports: tuple[HeuristicRecord, ...] = tuple(reports)


class HeuristicMixedError(HeuristicError):
    """Some branches committed and some rolled back."""


class HeuristicRollbackError(HeuristicError):
    """The decision was commit but the branches rolled back."""


class HeuristicCommitError(HeuristicError):
    """The decision was rollback but the branches committed."""


class HeuristicHazardError(HeuristicError):
    """The outcome of at least one branch is unknown."""


class ParticipantError(XAError):
    """A participant call failed; ``code`` is the nearest XA error code."""

    def __init__(self, message: str, code: int = XAER_RMERR):
        super().__init__(message)
        self.code = code


class ParticipantUnavailableError(ParticipantError):
    """The resource cannot be reached, or the connection broke during the call."""

    retriable = True

    def __init__(self, message: str, code: int = XAER_RMFAIL):
        super().__init__(message, code)


class UnknownXidError(ParticipantError):
    """XAER_NOTA: the resource has no branch with this xid (finished or never started)."""

    def __init__(self, message: str, code: int = XAER_NOTA):
        super().__init__(message, code)


class VoteRollbackError(ParticipantError):
    """The resource rolled back the branch (XA_RB*): at prepare, a "no" vote."""

    def __init__(self, message: str, code: int = XA_RBBASE):
        super().__init__(message, code)


class BranchHeuristicError(ParticipantError):
    """The resource completed the branch on its own (XA_HEUR*)."""

    def __init__(self, message: str, kind: HeuristicKind, code: int = XA_HEURHAZ):
        super().__init__(message, code)
        self.kind = kind


class NotRegisteredError(XAError):
    """No participant factory is registered under that name."""


class DecisionLogError(XAError):
    """The decision log cannot be opened, read or written."""


class LogLockedError(DecisionLogError):
    """Another process (an application or ``notify xa``) holds the log directory."""


class InDoubtError(XAError):
    """An administrative resolution was refused; the message says why."""


_HEURISTIC_CODES: Final = {
    XA_HEURCOM: HeuristicKind.COMMIT,
    XA_HEURRB: HeuristicKind.ROLLBACK,
    XA_HEURMIX: HeuristicKind.MIXED,
    XA_HEURHAZ: HeuristicKind.HAZARD,
}


def from_xa_code(code: int, message: str) -> ParticipantError:
    """The exception for an XAException code reported by a resource."""
    if code == XAER_NOTA:
        return UnknownXidError(message)
    if XA_RBBASE <= code <= XA_RBEND:
        return VoteRollbackError(message, code)
    if code in _HEURISTIC_CODES:
        return BranchHeuristicError(message, _HEURISTIC_CODES[code], code)
    if code == XAER_RMFAIL:
        return ParticipantUnavailableError(message, code)
    return ParticipantError(message, code)
