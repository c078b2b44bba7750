"""The broker's transaction state machine, tested as data: every (state, event) pair."""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from notify.core.states import OPEN, TERMINAL, TRANSITIONS, TxEvent, TxState, allowed, next_state
from notify.errors import TransactionError

S, E = TxState, TxEvent
CREATION = {
    E.BEGIN,
    E.RECOVERED_PREPARED,
    E.RECOVERED_COMMITTED,
    E.RECOVERED_HEURISTIC_COMMIT,
    E.RECOVERED_HEURISTIC_ROLLBACK,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(TxState, TxEvent)))
def test_every_pair_is_either_a_transition_or_refused(state: TxState, event: TxEvent) -> None:
    if (state, event) in TRANSITIONS:
        assert allowed(state, event)
        assert next_state(state, event) is TRANSITIONS[(state, event)]
    else:
        assert not allowed(state, event)
        with pytest.raises(TransactionError, match=event.value):
            next_state(state, event)


def test_only_creation_events_leave_new_and_nothing_enters_it() -> None:
    assert {e for (s, e) in TRANSITIONS if s is S.NEW} == CREATION
    assert all(s is S.NEW for (s, e) in TRANSITIONS if e in CREATION)
    assert S.NEW not in TRANSITIONS.values()


def test_terminal_states_are_final_except_forgetting_a_heuristic_outcome() -> None:
    for (s, e), _to in TRANSITIONS.items():
        if s in TERMINAL:
            assert e is E.FORGET and s in (S.HEURISTIC_COMMITTED, S.HEURISTIC_ROLLED_BACK)
    assert not any(s is S.FORGOTTEN for (s, _e) in TRANSITIONS)


def test_a_prepared_transaction_is_never_timed_out_or_dropped_with_a_connection() -> None:
    # XA safety: only an explicit decision (or abandoning an orphan local one) ends it
    assert not allowed(S.PREPARED, E.TIMEOUT)
    assert not allowed(S.PREPARED, E.CONNECTION_LOST)
    out = {e for (s, e) in TRANSITIONS if s is S.PREPARED}
    assert out == {
        E.COMMIT_TWO_PHASE,
        E.ROLLBACK,
        E.ABANDONED,
        E.CHECK_BACK_EXHAUSTED,
        E.HEURISTIC_COMMIT,
        E.HEURISTIC_ROLLBACK,
    }


def test_rollback_only_can_never_commit() -> None:
    reach = {S.ROLLBACK_ONLY}
    todo = deque([S.ROLLBACK_ONLY])
    while todo:
        s = todo.popleft()
        for (a, _e), b in TRANSITIONS.items():
            if a is s and b not in reach:
                reach.add(b)
                todo.append(b)
    assert S.COMMITTING not in reach and S.COMMITTED not in reach
    assert reach == {S.ROLLBACK_ONLY, S.ROLLED_BACK}


def test_committing_only_becomes_committed() -> None:
    assert {(e, b) for (s, e), b in TRANSITIONS.items() if s is S.COMMITTING} == {
        (E.APPLIED, S.COMMITTED)
    }


def test_every_state_is_reachable_from_new_and_open_states_can_end() -> None:
    reach = {S.NEW}
    changed = True
    while changed:
        changed = False
        for (a, _e), b in TRANSITIONS.items():
            if a in reach and b not in reach:
                reach.add(b)
                changed = True
    assert reach == set(TxState)
    for s in OPEN:
        assert allowed(s, E.TIMEOUT) and allowed(s, E.CONNECTION_LOST) and allowed(s, E.ROLLBACK)
