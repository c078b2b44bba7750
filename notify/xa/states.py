"""The coordinator's transaction states as data: one enum, one transition table.

::

    ACTIVE ──enlist──▶ ACTIVE
    ACTIVE ──commit_one_phase──▶ COMMITTING_ONE_PHASE    (0 or 1 participant)
    ACTIVE ──prepare──▶ PREPARING                         (phase 1, in enlistment order)
    ACTIVE ──rollback──▶ ROLLING_BACK
    PREPARING ──prepared──▶ PREPARED                      (every vote in: OK or READ_ONLY)
    PREPARING ──rollback──▶ ROLLING_BACK                  (a "no" vote, a failure, a timeout)
    PREPARED ──all_read_only──▶ COMMITTED                 (nothing left to decide)
    PREPARED ──decide_commit──▶ COMMITTING                (decision durable; or one branch)
    PREPARED ──rollback──▶ ROLLING_BACK                   (deadline passed / log write failed)
    PREPARED ──outcome_unknown──▶ IN_DOUBT                (the decision's fsync failed)
    COMMITTING ──completed──▶ COMMITTED                   (END record appended)
    COMMITTING ──incomplete──▶ COMMIT_PENDING             (a branch unreachable: recovery)
    COMMITTING ──heuristic──▶ HEURISTIC                   (a branch decided on its own)
    COMMITTING_ONE_PHASE ──completed──▶ COMMITTED
    COMMITTING_ONE_PHASE ──rolled_back──▶ ROLLED_BACK
    COMMITTING_ONE_PHASE ──outcome_unknown──▶ IN_DOUBT    (reply lost: a hazard, recorded)
    COMMITTING_ONE_PHASE ──heuristic──▶ HEURISTIC
    ROLLING_BACK ──completed──▶ ROLLED_BACK               (unreachable branches: recovery)
    ROLLING_BACK ──heuristic──▶ HEURISTIC

Terminal: COMMITTED, COMMIT_PENDING (the decision is commit; recovery finishes phase 2),
ROLLED_BACK, IN_DOUBT and HEURISTIC. :func:`next_state` is the only place a transaction
changes state.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from notify.errors import TransactionError
from notify.transitions import TransitionTable


class TxState(Enum):
    """State of a coordinator transaction."""

    ACTIVE = "ACTIVE"
    PREPARING = "PREPARING"
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    COMMITTING_ONE_PHASE = "COMMITTING_ONE_PHASE"
    ROLLING_BACK = "ROLLING_BACK"
    COMMITTED = "COMMITTED"
    COMMIT_PENDING = "COMMIT_PENDING"
    ROLLED_BACK = "ROLLED_BACK"
    IN_DOUBT = "IN_DOUBT"
    HEURISTIC = "HEURISTIC"


class TxEvent(Enum):
    """What happens to a coordinator transaction."""

    ENLIST = "enlist"
    COMMIT_ONE_PHASE = "commit_one_phase"
    PREPARE = "prepare"
    PREPARED = "prepared"
    ALL_READ_ONLY = "all_read_only"
    DECIDE_COMMIT = "decide_commit"
    ROLLBACK = "rollback"
    OUTCOME_UNKNOWN = "outcome_unknown"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    HEURISTIC = "heuristic"
    ROLLED_BACK = "rolled_back"


S, E = TxState, TxEvent
TRANSITIONS: Final[dict[tuple[TxState, TxEvent], TxState]] = {
    (S.ACTIVE, E.ENLIST): S.ACTIVE,
    (S.ACTIVE, E.COMMIT_ONE_PHASE): S.COMMITTING_ONE_PHASE,
    (S.ACTIVE, E.PREPARE): S.PREPARING,
    (S.ACTIVE, E.ROLLBACK): S.ROLLING_BACK,
    (S.PREPARING, E.PREPARED): S.PREPARED,
    (S.PREPARING, E.ROLLBACK): S.ROLLING_BACK,
    (S.PREPARED, E.ALL_READ_ONLY): S.COMMITTED,
    (S.PREPARED, E.DECIDE_COMMIT): S.COMMITTING,
    (S.PREPARED, E.ROLLBACK): S.ROLLING_BACK,
    (S.PREPARED, E.OUTCOME_UNKNOWN): S.IN_DOUBT,
    (S.COMMITTING, E.COMPLETED): S.COMMITTED,
    (S.COMMITTING, E.INCOMPLETE): S.COMMIT_PENDING,
    (S.COMMITTING, E.HEURISTIC): S.HEURISTIC,
    (S.COMMITTING_ONE_PHASE, E.COMPLETED): S.COMMITTED,
    (S.COMMITTING_ONE_PHASE, E.ROLLED_BACK): S.ROLLED_BACK,
    (S.COMMITTING_ONE_PHASE, E.OUTCOME_UNKNOWN): S.IN_DOUBT,
    (S.COMMITTING_ONE_PHASE, E.HEURISTIC): S.HEURISTIC,
    (S.ROLLING_BACK, E.COMPLETED): S.ROLLED_BACK,
    (S.ROLLING_BACK, E.HEURISTIC): S.HEURISTIC,
}

TERMINAL: Final = frozenset({S.COMMITTED, S.COMMIT_PENDING, S.ROLLED_BACK, S.IN_DOUBT, S.HEURISTIC})


_TABLE: Final = TransitionTable(TRANSITIONS, TransactionError)
#: The state after ``event``; :class:`TransactionError` when the event is not allowed.
next_state = _TABLE.next_state
#: Whether ``event`` may happen in ``state``.
allowed = _TABLE.allowed
