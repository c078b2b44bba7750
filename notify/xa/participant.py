"""The participant protocol: what the coordinator asks of every resource, in which order.

A :class:`Participant` is one connection to one resource manager (the broker, a database)
able to run one XA branch at a time. The coordinator obtains participants from the
factories registered with :meth:`~notify.xa.TransactionManager.register`, keeps idle ones
in a small pool, and may create new ones after a crash to run recovery.

Fixed order (per transaction; participants are called in enlistment order in every phase)::

    start(xid, timeout_s)           at enlist; the application then works through .handle
    end(xid, success=True)          once the application's block is over
    ── one participant ──
    commit(xid, one_phase=True)     one-phase optimisation: no prepare, no log record
    ── two or more ──
    prepare(xid) -> Vote            phase 1; READ_ONLY branches are done and skipped later
    [commit decision fsynced]       the commit point (none with a single OK vote)
    commit(xid, one_phase=False)    phase 2, every OK voter
    ── on failure before the decision ──
    end(xid, success=False); rollback(xid)
    ── after a crash (any instance, xid maybe never seen by it) ──
    recover(scope) -> [xid]; commit(xid, False) | rollback(xid); forget(xid)

What each call must guarantee:

``start``
    The work done through :attr:`~Participant.handle` from now on belongs to branch ``xid``
    and nothing of it is visible before commit. ``timeout_s`` may bound the branch's life
    in the resource (the broker's BEGIN timeout). On failure nothing was started.
``end``
    The application is done with the branch; ``success=False`` when it will be rolled back.
    Must tolerate being called for a branch that already failed.
``prepare``
    Return :attr:`Vote.OK` only once the branch is *durably* prepared: it survives a crash
    of the resource and can then be committed or rolled back from any connection.
    :attr:`Vote.READ_ONLY` means the branch changed nothing and is already finished (no
    phase 2 for it). Raise :class:`~notify.xa.errors.VoteRollbackError` when the resource
    rolled the branch back, any other :class:`~notify.xa.errors.ParticipantError` when the
    outcome of the prepare is unknown; the coordinator then rolls everything back.
``commit`` / ``rollback``
    Finish the branch. Raise :class:`~notify.xa.errors.UnknownXidError` when the resource
    does not know ``xid`` (already finished, or never prepared),
    :class:`~notify.xa.errors.ParticipantUnavailableError` when the resource cannot be
    reached (the coordinator retries later), and
    :class:`~notify.xa.errors.BranchHeuristicError` when the resource completed the branch
    on its own. ``commit(one_phase=True)`` raises VoteRollbackError if it rolled back.
``recover``
    List the xids of the prepared branches the resource holds that ``scope`` owns. Called
    on a connection with no branch of its own.
``forget``
    Let the resource discard what it remembers of a heuristically completed branch.
``close``
    Release the connection. Never raises.

Cleanup rules: a participant that raised from any call is closed and not reused; the
coordinator never calls two participants concurrently for one transaction, and never uses
one participant for two transactions at once. Translate driver exceptions into the
:mod:`notify.xa.errors` classes at this boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

from notify.protocol.keys import Xid
from notify.xa.ids import Scope


class Vote(Enum):
    """A prepare vote, with the XA return codes' values."""

    OK = 0  # XA_OK: prepared; commit or rollback follows
    READ_ONLY = 3  # XA_RDONLY: nothing to commit, branch finished


class Participant(Protocol):
    """One resource-manager connection that runs XA branches (see the module docstring)."""

    @property
    def handle(self) -> Any:
        """What :meth:`~notify.xa.Transaction.enlist` returns to the application."""
        ...

    def start(self, xid: Xid, timeout_s: int) -> None:
        """Begin branch ``xid``; work through :attr:`handle` belongs to it."""
        ...

    def end(self, xid: Xid, success: bool) -> None:
        """The application is done with the branch (``success=False``: it will roll back)."""
        ...

    def prepare(self, xid: Xid) -> Vote:
        """Phase 1: durably prepare, or report read-only."""
        ...

    def commit(self, xid: Xid, one_phase: bool) -> None:
        """Commit a prepared branch (or an ended one, with ``one_phase``)."""
        ...

    def rollback(self, xid: Xid) -> None:
        """Roll back the branch in whatever state it is."""
        ...

    def recover(self, scope: Scope) -> list[Xid]:
        """Prepared branches of ``scope`` that the resource holds."""
        ...

    def forget(self, xid: Xid) -> None:
        """Discard a heuristically completed branch."""
        ...

    def close(self) -> None:
        """Release the connection; never raises."""
        ...


#: A registered factory: makes a new participant (a new connection) on every call.
ParticipantFactory = Callable[[], Participant]
