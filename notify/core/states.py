"""Broker transaction states as data: one enum and one transition table, checked in one place.

::

    ACTIVE ──put──▶ ACTIVE
    ACTIVE ──end──▶ ENDED
    ACTIVE|ENDED ──prepare──▶ PREPARED          (durable PREPARE record)
    ACTIVE|ENDED ──commit_one_phase──▶ COMMITTING
    PREPARED ──commit_two_phase──▶ COMMITTING   (durable COMMIT record, then apply)
    COMMITTING ──applied──▶ COMMITTED
    ACTIVE|ENDED|PREPARED ──rollback──▶ ROLLED_BACK
    ACTIVE|ENDED ──timeout / connection lost──▶ ROLLED_BACK   (never a PREPARED one)
    PREPARED ──heuristic_commit──▶ HEURISTIC_COMMITTED        (an admin's decision)
    PREPARED ──heuristic_rollback──▶ HEURISTIC_ROLLED_BACK
    HEURISTIC_* ──forget──▶ FORGOTTEN
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from notify.errors import TransactionError


class TxState(Enum):
    ACTIVE = "ACTIVE"
    ENDED = "ENDED"
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    HEURISTIC_COMMITTED = "HEURISTIC_COMMITTED"
    HEURISTIC_ROLLED_BACK = "HEURISTIC_ROLLED_BACK"
    FORGOTTEN = "FORGOTTEN"


class TxEvent(Enum):
    PUT = "put"
    END = "end"
    PREPARE = "prepare"
    COMMIT_ONE_PHASE = "commit_one_phase"
    COMMIT_TWO_PHASE = "commit_two_phase"
    APPLIED = "applied"
    ROLLBACK = "rollback"
    TIMEOUT = "timeout"
    CONNECTION_LOST = "connection_lost"
    HEURISTIC_COMMIT = "heuristic_commit"
    HEURISTIC_ROLLBACK = "heuristic_rollback"
    FORGET = "forget"


S, E = TxState, TxEvent
TRANSITIONS: Final[dict[tuple[TxState, TxEvent], TxState]] = {
    (S.ACTIVE, E.PUT): S.ACTIVE,
    (S.ACTIVE, E.END): S.ENDED,
    (S.ENDED, E.END): S.ENDED,
    (S.ACTIVE, E.PREPARE): S.PREPARED,
    (S.ENDED, E.PREPARE): S.PREPARED,
    (S.ACTIVE, E.COMMIT_ONE_PHASE): S.COMMITTING,
    (S.ENDED, E.COMMIT_ONE_PHASE): S.COMMITTING,
    (S.PREPARED, E.COMMIT_TWO_PHASE): S.COMMITTING,
    (S.COMMITTING, E.APPLIED): S.COMMITTED,
    (S.ACTIVE, E.ROLLBACK): S.ROLLED_BACK,
    (S.ENDED, E.ROLLBACK): S.ROLLED_BACK,
    (S.PREPARED, E.ROLLBACK): S.ROLLED_BACK,
    (S.ACTIVE, E.TIMEOUT): S.ROLLED_BACK,
    (S.ENDED, E.TIMEOUT): S.ROLLED_BACK,
    (S.ACTIVE, E.CONNECTION_LOST): S.ROLLED_BACK,
    (S.ENDED, E.CONNECTION_LOST): S.ROLLED_BACK,
    (S.PREPARED, E.HEURISTIC_COMMIT): S.HEURISTIC_COMMITTED,
    (S.PREPARED, E.HEURISTIC_ROLLBACK): S.HEURISTIC_ROLLED_BACK,
    (S.HEURISTIC_COMMITTED, E.FORGET): S.FORGOTTEN,
    (S.HEURISTIC_ROLLED_BACK, E.FORGET): S.FORGOTTEN,
}

TERMINAL: Final = frozenset(
    {S.COMMITTED, S.ROLLED_BACK, S.FORGOTTEN, S.HEURISTIC_COMMITTED, S.HEURISTIC_ROLLED_BACK}
)


def next_state(state: TxState, event: TxEvent) -> TxState:
    """The state after ``event``; TransactionError when the event is not allowed."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise TransactionError(f"{event.value} is not allowed in state {state.value}") from None


def allowed(state: TxState, event: TxEvent) -> bool:
    return (state, event) in TRANSITIONS
