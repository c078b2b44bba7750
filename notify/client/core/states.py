"""Client transaction states as data: one enum, one event enum, one transition table.

Every client-side transaction (a local transaction of the asyncio or the blocking API, a
half message, an XA branch of the broker participant) changes state only through
:func:`next_state`; the table is the whole machine and is tested as data
(``tests/client/test_tx_core.py``)::

    ACTIVE ──fail──▶ ROLLBACK_ONLY               (a send was refused or lost; commit will
                                                   roll back and raise)
    ACTIVE|ROLLBACK_ONLY ──end──▶ ENDED           (XA: no more sends in the branch)
    ACTIVE|ENDED ──prepared──▶ PREPARED           (PREPARE acknowledged: a half message, a
                                                   prepared branch)
    ACTIVE|ENDED ──read_only──▶ COMMITTED         (nothing was sent: nothing to commit)
    ACTIVE|ROLLBACK_ONLY|ENDED|PREPARED ──commit──▶ COMMITTING
    COMMITTING ──committed──▶ COMMITTED
    ACTIVE|ROLLBACK_ONLY|COMMITTING ──unknown──▶ FAILED
                                                  (no reply to PREPARE or COMMIT: the outcome
                                                   is not known to the client)
    ACTIVE|ROLLBACK_ONLY|ENDED|PREPARED|COMMITTING ──rollback──▶ ROLLING_BACK
                                                  (from COMMITTING: the COMMIT found a failed
                                                   send, the transaction is rolled back)
    ROLLING_BACK|COMMITTING|ROLLBACK_ONLY|ENDED ──rolled_back──▶ ROLLED_BACK
                                                  (acknowledged, or the broker rolled it back:
                                                   a timeout, a refused put, a dropped
                                                   connection)
    COMMITTING|ROLLING_BACK ──error──▶ FAILED     (the step failed otherwise)
    ROLLBACK_ONLY|ENDED|COMMITTING|ROLLING_BACK ──fail──▶ (same state)

``status`` of the public transaction objects is the state's value.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from notify.client._errors import ClientTransactionError
from notify.transitions import TransitionTable


class TxState(Enum):
    """Where a client transaction is (``value``: its public ``status``)."""

    #: members are singletons compared by identity: hash them so too (``Enum.__hash__`` is
    #: Python code hashing the name, run for every lookup)
    __hash__ = object.__hash__

    ACTIVE = "active"
    ROLLBACK_ONLY = "rollback_only"
    ENDED = "ended"
    PREPARED = "prepared"
    COMMITTING = "committing"
    ROLLING_BACK = "rolling_back"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


class TxEvent(Enum):
    """What can happen to a client transaction."""

    __hash__ = object.__hash__

    FAIL = "fail"
    END = "end"
    PREPARED = "prepared"
    READ_ONLY = "read_only"
    COMMIT = "commit"
    COMMITTED = "committed"
    UNKNOWN = "unknown"
    ROLLBACK = "rollback"
    ROLLED_BACK = "rolled_back"
    ERROR = "error"


S = TxState
#: event -> {state before: state after}: the whole machine, by event
_BY_EVENT: Final[dict[TxEvent, dict[TxState, TxState]]] = {
    TxEvent.FAIL: {
        S.ACTIVE: S.ROLLBACK_ONLY,
        S.ROLLBACK_ONLY: S.ROLLBACK_ONLY,
        S.ENDED: S.ENDED,
        S.COMMITTING: S.COMMITTING,
        S.ROLLING_BACK: S.ROLLING_BACK,
    },
    TxEvent.END: {S.ACTIVE: S.ENDED, S.ROLLBACK_ONLY: S.ENDED},
    TxEvent.PREPARED: {S.ACTIVE: S.PREPARED, S.ENDED: S.PREPARED},
    TxEvent.READ_ONLY: {S.ACTIVE: S.COMMITTED, S.ENDED: S.COMMITTED},
    TxEvent.COMMIT: dict.fromkeys((S.ACTIVE, S.ROLLBACK_ONLY, S.ENDED, S.PREPARED), S.COMMITTING),
    TxEvent.COMMITTED: {S.COMMITTING: S.COMMITTED},
    TxEvent.UNKNOWN: dict.fromkeys((S.ACTIVE, S.ROLLBACK_ONLY, S.COMMITTING), S.FAILED),
    TxEvent.ROLLBACK: dict.fromkeys(
        (S.ACTIVE, S.ROLLBACK_ONLY, S.ENDED, S.PREPARED, S.COMMITTING), S.ROLLING_BACK
    ),
    TxEvent.ROLLED_BACK: dict.fromkeys(
        (S.ROLLING_BACK, S.COMMITTING, S.ROLLBACK_ONLY, S.ENDED), S.ROLLED_BACK
    ),
    TxEvent.ERROR: dict.fromkeys((S.COMMITTING, S.ROLLING_BACK), S.FAILED),
}
TRANSITIONS: Final[dict[tuple[TxState, TxEvent], TxState]] = {
    (before, event): after
    for event, moves in _BY_EVENT.items()
    for before, after in moves.items()
}

#: states in which the transaction takes messages
OPEN: Final = frozenset({TxState.ACTIVE, TxState.ROLLBACK_ONLY})
#: states a transaction never leaves
FINISHED: Final = frozenset({TxState.COMMITTED, TxState.ROLLED_BACK, TxState.FAILED})

_TABLE: Final = TransitionTable(TRANSITIONS, ClientTransactionError)
#: The state after ``event``; :class:`ClientTransactionError` when the event is not allowed.
next_state = _TABLE.next_state
#: Whether ``event`` may happen in ``state``.
allowed = _TABLE.allowed
