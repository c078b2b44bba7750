"""Broker transaction states as data: one enum, one event enum, one transition table.

Every change of a transaction's state goes through :func:`next_state`; the table is the
whole state machine and is tested exhaustively as data (``tests/core/test_states.py``)::

    NEW ──begin──▶ ACTIVE
    ACTIVE ──put──▶ ACTIVE
    ACTIVE|ENDED ──failed──▶ ROLLBACK_ONLY      (a put or a record was refused: over
                                                 maxTxSize, disk full)
    ACTIVE|ENDED ──end──▶ ENDED ;  ROLLBACK_ONLY ──end──▶ ROLLBACK_ONLY
    ACTIVE|ENDED ──prepare──▶ PREPARED          (durable PREPARE record)
    ACTIVE|ENDED ──read_only──▶ COMMITTED       (prepare or commit of a transaction with no
                                                 messages: nothing to remember)
    ACTIVE|ENDED ──commit_one_phase──▶ COMMITTING
    PREPARED ──commit_two_phase──▶ COMMITTING   (durable COMMIT record, then apply)
    COMMITTING ──applied──▶ COMMITTED
    ROLLBACK_ONLY ──prepare|commit_one_phase──▶ ROLLED_BACK   (answered XA_RBROLLBACK)
    ACTIVE|ENDED|ROLLBACK_ONLY|PREPARED ──rollback──▶ ROLLED_BACK
    ACTIVE|ENDED|ROLLBACK_ONLY ──timeout|connection_lost──▶ ROLLED_BACK
    PREPARED ──abandoned──▶ ROLLED_BACK         (a prepared local transaction nobody can
                                                 resolve: no producer group to check back
                                                 with, and its connection or timeout is gone)
    PREPARED ──check_back_exhausted──▶ ROLLED_BACK
    PREPARED ──heuristic_commit──▶ HEURISTIC_COMMITTED        (an admin's decision)
    PREPARED ──heuristic_rollback──▶ HEURISTIC_ROLLED_BACK
    HEURISTIC_* ──forget──▶ FORGOTTEN
    NEW ──recovered_prepared──▶ PREPARED ; NEW ──recovered_committed──▶ COMMITTING
    NEW ──recovered_heuristic_commit|rollback──▶ HEURISTIC_*   (restart: from the redo log)

An XA transaction is never timed out once PREPARED (only ``abandoned`` for local ones).
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from notify.errors import TransactionError
from notify.transitions import TransitionTable


class TxState(Enum):
    """Where a transaction is; ``NEW`` is the state before it exists."""

    #: members are singletons compared by identity: hash them so too (``Enum.__hash__``
    #: is Python code hashing the name, run for every transition-table lookup)
    __hash__ = object.__hash__

    NEW = "NEW"
    ACTIVE = "ACTIVE"
    ENDED = "ENDED"
    ROLLBACK_ONLY = "ROLLBACK_ONLY"
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    HEURISTIC_COMMITTED = "HEURISTIC_COMMITTED"
    HEURISTIC_ROLLED_BACK = "HEURISTIC_ROLLED_BACK"
    FORGOTTEN = "FORGOTTEN"


class TxEvent(Enum):
    """What can happen to a transaction."""

    #: members are singletons compared by identity: hash them so too (``Enum.__hash__``
    #: is Python code hashing the name, run for every transition-table lookup)
    __hash__ = object.__hash__

    BEGIN = "begin"
    PUT = "put"
    FAILED = "failed"
    END = "end"
    PREPARE = "prepare"
    READ_ONLY = "read_only"
    COMMIT_ONE_PHASE = "commit_one_phase"
    COMMIT_TWO_PHASE = "commit_two_phase"
    APPLIED = "applied"
    ROLLBACK = "rollback"
    TIMEOUT = "timeout"
    CONNECTION_LOST = "connection_lost"
    ABANDONED = "abandoned"
    CHECK_BACK_EXHAUSTED = "check_back_exhausted"
    HEURISTIC_COMMIT = "heuristic_commit"
    HEURISTIC_ROLLBACK = "heuristic_rollback"
    FORGET = "forget"
    RECOVERED_PREPARED = "recovered_prepared"
    RECOVERED_COMMITTED = "recovered_committed"
    RECOVERED_HEURISTIC_COMMIT = "recovered_heuristic_commit"
    RECOVERED_HEURISTIC_ROLLBACK = "recovered_heuristic_rollback"


S, E = TxState, TxEvent
TRANSITIONS: Final[dict[tuple[TxState, TxEvent], TxState]] = {
    (S.NEW, E.BEGIN): S.ACTIVE,
    (S.NEW, E.RECOVERED_PREPARED): S.PREPARED,
    (S.NEW, E.RECOVERED_COMMITTED): S.COMMITTING,
    (S.NEW, E.RECOVERED_HEURISTIC_COMMIT): S.HEURISTIC_COMMITTED,
    (S.NEW, E.RECOVERED_HEURISTIC_ROLLBACK): S.HEURISTIC_ROLLED_BACK,
    (S.ACTIVE, E.PUT): S.ACTIVE,
    (S.ACTIVE, E.FAILED): S.ROLLBACK_ONLY,
    (S.ENDED, E.FAILED): S.ROLLBACK_ONLY,
    (S.ACTIVE, E.END): S.ENDED,
    (S.ENDED, E.END): S.ENDED,
    (S.ROLLBACK_ONLY, E.END): S.ROLLBACK_ONLY,
    (S.ACTIVE, E.PREPARE): S.PREPARED,
    (S.ENDED, E.PREPARE): S.PREPARED,
    (S.ACTIVE, E.READ_ONLY): S.COMMITTED,
    (S.ENDED, E.READ_ONLY): S.COMMITTED,
    (S.ACTIVE, E.COMMIT_ONE_PHASE): S.COMMITTING,
    (S.ENDED, E.COMMIT_ONE_PHASE): S.COMMITTING,
    (S.PREPARED, E.COMMIT_TWO_PHASE): S.COMMITTING,
    (S.COMMITTING, E.APPLIED): S.COMMITTED,
    (S.ROLLBACK_ONLY, E.PREPARE): S.ROLLED_BACK,
    (S.ROLLBACK_ONLY, E.COMMIT_ONE_PHASE): S.ROLLED_BACK,
    (S.ACTIVE, E.ROLLBACK): S.ROLLED_BACK,
    (S.ENDED, E.ROLLBACK): S.ROLLED_BACK,
    (S.ROLLBACK_ONLY, E.ROLLBACK): S.ROLLED_BACK,
    (S.PREPARED, E.ROLLBACK): S.ROLLED_BACK,
    (S.ACTIVE, E.TIMEOUT): S.ROLLED_BACK,
    (S.ENDED, E.TIMEOUT): S.ROLLED_BACK,
    (S.ROLLBACK_ONLY, E.TIMEOUT): S.ROLLED_BACK,
    (S.ACTIVE, E.CONNECTION_LOST): S.ROLLED_BACK,
    (S.ENDED, E.CONNECTION_LOST): S.ROLLED_BACK,
    (S.ROLLBACK_ONLY, E.CONNECTION_LOST): S.ROLLED_BACK,
    (S.PREPARED, E.ABANDONED): S.ROLLED_BACK,
    (S.PREPARED, E.CHECK_BACK_EXHAUSTED): S.ROLLED_BACK,
    (S.PREPARED, E.HEURISTIC_COMMIT): S.HEURISTIC_COMMITTED,
    (S.PREPARED, E.HEURISTIC_ROLLBACK): S.HEURISTIC_ROLLED_BACK,
    (S.HEURISTIC_COMMITTED, E.FORGET): S.FORGOTTEN,
    (S.HEURISTIC_ROLLED_BACK, E.FORGET): S.FORGOTTEN,
}

#: states a transaction never leaves (the heuristic ones only by FORGET)
TERMINAL: Final = frozenset(
    {S.COMMITTED, S.ROLLED_BACK, S.FORGOTTEN, S.HEURISTIC_COMMITTED, S.HEURISTIC_ROLLED_BACK}
)
#: states in which the transaction still takes messages or can be timed out
OPEN: Final = frozenset({S.ACTIVE, S.ENDED, S.ROLLBACK_ONLY})


_TABLE: Final = TransitionTable(TRANSITIONS, TransactionError)
#: The state after ``event``; :class:`TransactionError` when the event is not allowed.
next_state = _TABLE.next_state
#: Whether ``event`` may happen in ``state``.
allowed = _TABLE.allowed
