"""One lookup for every state machine's transition table.

The broker's transactions (:mod:`notify.core.states`), queue messages
(:mod:`notify.core.queues`) and the XA coordinator (:mod:`notify.xa.states`) each define their
table as data, ``{(state, event): next_state}``; :class:`TransitionTable` answers the two
questions all of them ask of it, with the error class of its own module.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Generic, TypeVar

from notify.errors import NotifyError

__all__ = ["TransitionTable"]

St = TypeVar("St", bound=Enum)
Ev = TypeVar("Ev", bound=Enum)


class TransitionTable(Generic[St, Ev]):
    """``table`` with ``error`` raised for an event the table does not allow."""

    __slots__ = ("error", "table")

    def __init__(self, table: Mapping[tuple[St, Ev], St], error: type[NotifyError]):
        self.table = table
        self.error = error

    def next_state(self, state: St, event: Ev) -> St:
        """The state after ``event``; ``error`` when the event is not allowed in ``state``."""
        try:
            return self.table[(state, event)]
        except KeyError:
            raise self.error(f"{event.value} is not allowed in state {state.value}") from None

    def allowed(self, state: St, event: Ev) -> bool:
        """Whether ``event`` may happen in ``state``."""
        return (state, event) in self.table
