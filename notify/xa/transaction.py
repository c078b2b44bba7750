"""One global transaction: enlistment and the two-phase commit driver.

Commit, in the participants' enlistment order (see :mod:`notify.xa.participant`):

1. ``end`` every branch.
2. No branch: nothing to do. One branch: ``commit(one_phase=True)``, no log record.
3. Phase 1: ``prepare`` each branch. A READ_ONLY vote finishes that branch. A "no" vote or
   a failure rolls everything back (:class:`~notify.xa.errors.RollbackError`); nothing was
   logged, so recovery presumes abort for any branch it finds prepared later.
4. If no branch voted OK: done. If the deadline passed: roll back. If exactly one voted OK
   it is committed without a log record (the others are finished, so rolling that one back
   after a crash is still atomic); should that commit fail, the decision is logged then.
   Otherwise the commit decision (branch list included) is fsynced: the commit point.
5. Phase 2: ``commit`` each OK voter. An unreachable branch is retried once on a new
   connection, then left to recovery (state COMMIT_PENDING; the decision stays logged).
   A branch that was resolved outside the coordinator, or reports a heuristic outcome, is
   recorded durably (HEURISTIC record), told to ``forget``, and raised to the caller as a
   :class:`~notify.xa.errors.HeuristicError` once phase 2 is over.
6. END is appended (not fsynced) when every branch is finished.

Crash points (``NOTIFY_CRASHPOINTS``): ``xa_before_prepare``, ``xa_between_prepares``,
``xa_before_decision``, ``xa_after_decision``, ``xa_between_commits``, ``xa_before_end``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, NoReturn

from notify.errors import TransactionError
from notify.faults import crashpoint
from notify.protocol.keys import Xid
from notify.xa import records as rec
from notify.xa.decisionlog import DecisionLog
from notify.xa.errors import (
    BranchHeuristicError,
    DecisionLogError,
    HeuristicCommitError,
    HeuristicError,
    HeuristicHazardError,
    HeuristicKind,
    HeuristicMixedError,
    HeuristicRollbackError,
    OutcomeUnknownError,
    ParticipantError,
    ParticipantUnavailableError,
    RollbackError,
    TransactionTimeoutError,
    UnknownXidError,
    VoteRollbackError,
)
from notify.xa.ids import XidFactory
from notify.xa.participant import Participant, Vote
from notify.xa.pool import ParticipantPool
from notify.xa.states import TERMINAL, TxEvent, TxState, allowed, next_state

log = logging.getLogger("notify.xa")


class BranchStatus(Enum):
    """Where one branch stands, as seen by the coordinator."""

    ACTIVE = "active"
    ENDED = "ended"
    PREPARED = "prepared"
    READ_ONLY = "read-only"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    PENDING = "pending"  # unreachable: recovery finishes it
    HEURISTIC = "heuristic"


@dataclass
class Branch:
    """A participant enlisted in a transaction."""

    name: str
    xid: Xid
    participant: Participant
    status: BranchStatus = BranchStatus.ACTIVE
    healthy: bool = True


def _now_ms() -> int:
    return int(time.time() * 1000)


class Transaction:
    """A global transaction; use it from one thread. Made by
    :meth:`~notify.xa.TransactionManager.begin` / ``transaction()``."""

    def __init__(
        self,
        gtrid: bytes,
        deadline: float,
        pool: ParticipantPool,
        decisions: DecisionLog,
        xids: XidFactory,
        on_finish: Callable[[Transaction], None],
    ):
        self.gtrid = gtrid
        #: Unix time after which the transaction can no longer decide to commit.
        self.deadline = deadline
        self.state = TxState.ACTIVE
        #: Heuristic reports of this transaction (also in the decision log).
        self.heuristics: list[rec.HeuristicRecord] = []
        self._pool = pool
        self._log = decisions
        self._xids = xids
        self._on_finish = on_finish
        self._branches: list[Branch] = []
        self._by_name: dict[str, Branch] = {}
        self._finished = False

    # ------------------------------------------------------------------ inspection

    @property
    def branches(self) -> list[tuple[str, BranchStatus]]:
        """``(name, status)`` of every enlisted participant, in enlistment order."""
        return [(b.name, b.status) for b in self._branches]

    @property
    def pending(self) -> list[str]:
        """Names of branches left to recovery."""
        return [b.name for b in self._branches if b.status is BranchStatus.PENDING]

    def xid_of(self, name: str) -> Xid:
        """The branch id of participant ``name``."""
        return self._by_name[name].xid

    def _to(self, event: TxEvent) -> None:
        self.state = next_state(self.state, event)

    def _remaining_s(self) -> float:
        return self.deadline - time.time()

    def __repr__(self) -> str:
        return f"<Transaction {self.gtrid.decode()} {self.state.value}>"

    # ------------------------------------------------------------------ enlistment

    def enlist(self, name: str) -> Any:
        """Join participant ``name`` (registered with the manager) and return its handle.

        Enlisting the same name again returns the same handle. Raises
        :class:`~notify.xa.errors.NotRegisteredError`, :class:`TransactionTimeoutError`
        when the deadline passed, or the participant's error when its branch cannot start.
        """
        if not allowed(self.state, TxEvent.ENLIST):
            raise TransactionError(f"cannot enlist in a {self.state.value} transaction")
        b = self._by_name.get(name)
        if b is not None:
            return b.participant.handle
        remaining = self._remaining_s()
        if remaining <= 0:
            raise TransactionTimeoutError(f"transaction {self.gtrid.decode()} timed out")
        p = self._pool.acquire(name)
        xid = self._xids.branch(self.gtrid, name)
        try:
            p.start(xid, int(-(-remaining // 1)))
        except BaseException:
            self._pool.release(name, p, healthy=False)
            raise
        b = Branch(name, xid, p)
        self._branches.append(b)
        self._by_name[name] = b
        self._to(TxEvent.ENLIST)
        return p.handle

    # ------------------------------------------------------------------ commit

    def commit(self) -> None:
        """Commit atomically across the enlisted participants (see the module docstring).

        Returns normally when the decision is commit, even if some branch was left to
        recovery (:attr:`state` is then COMMIT_PENDING and :attr:`pending` names them).
        Raises :class:`RollbackError` (:class:`TransactionTimeoutError`) when everything
        was rolled back, :class:`OutcomeUnknownError` when the decision's durability is
        unknown, :class:`HeuristicError` when participants deviated.
        """
        if self.state is not TxState.ACTIVE:
            raise TransactionError(f"cannot commit a {self.state.value} transaction")
        try:
            self._commit()
        finally:
            self._finish()

    def _commit(self) -> None:
        for b in self._branches:
            try:
                b.participant.end(b.xid, True)
                b.status = BranchStatus.ENDED
            except ParticipantError as e:
                b.healthy = False
                self._abort(f"end of {b.name} failed: {e}", e)
        if len(self._branches) <= 1:
            return self._one_phase()
        if self._remaining_s() <= 0:
            self._abort_timeout()
        self._to(TxEvent.PREPARE)
        crashpoint("xa_before_prepare")
        for i, b in enumerate(self._branches):
            if i:
                crashpoint("xa_between_prepares")
            try:
                vote = b.participant.prepare(b.xid)
            except VoteRollbackError as e:
                b.status, b.healthy = BranchStatus.ROLLED_BACK, False
                self._abort(f"{b.name} voted rollback: {e}", e)
            except ParticipantError as e:
                b.healthy = False
                self._abort(f"prepare of {b.name} failed: {e}", e)
            b.status = BranchStatus.PREPARED if vote is Vote.OK else BranchStatus.READ_ONLY
        self._to(TxEvent.PREPARED)
        voters = [b for b in self._branches if b.status is BranchStatus.PREPARED]
        if not voters:
            self._to(TxEvent.ALL_READ_ONLY)
            return None
        if self._remaining_s() <= 0:
            self._abort_timeout()
        logged = len(voters) > 1
        if logged:
            crashpoint("xa_before_decision")
            self._decide(voters)
            crashpoint("xa_after_decision")
        self._to(TxEvent.DECIDE_COMMIT)
        return self._phase_two(voters, logged)

    def _decision(self, voters: list[Branch]) -> rec.Decision:
        return rec.Decision(
            gtrid=self.gtrid,
            outcome=rec.Outcome.COMMIT,
            source=rec.Source.COORDINATOR,
            decided_at_ms=_now_ms(),
            deadline_s=int(self.deadline),
            format_id=self._xids.scope.format_id,
            branches=tuple(rec.Branch(b.name, b.xid.bqual) for b in voters),
        )

    def _decide(self, voters: list[Branch]) -> None:
        try:
            self._log.decide(self._decision(voters))
        except DecisionLogError as e:
            self._abort(f"commit decision not written: {e}", e)
        except OutcomeUnknownError:
            self._to(TxEvent.OUTCOME_UNKNOWN)
            log.error("transaction %s: decision durability unknown; left to recovery", self)
            raise

    def _phase_two(self, voters: list[Branch], logged: bool) -> None:
        reports: list[rec.HeuristicRecord] = []
        for i, b in enumerate(voters):
            if i:
                crashpoint("xa_between_commits")
            report = self._commit_branch(b)
            if report is not None:
                reports.append(report)
        pending = [b for b in voters if b.status is BranchStatus.PENDING]
        if pending and not logged:
            # the single prepared branch is unreachable: make the decision durable now so
            # recovery commits it instead of presuming abort
            try:
                self._log.decide(self._decision(voters))
            except (DecisionLogError, OutcomeUnknownError) as e:
                self._to(TxEvent.OUTCOME_UNKNOWN)
                raise OutcomeUnknownError(
                    f"transaction {self.gtrid.decode()}: commit of {pending[0].name} failed and"
                    f" the decision could not be logged ({e}); recovery will roll it back"
                    " unless the commit went through"
                ) from e
            logged = True
        self._settle(reports, rec.Outcome.COMMIT, n_done=len(voters) - len(pending))
        if pending:
            self._to(TxEvent.INCOMPLETE)
            log.warning(
                "transaction %s committed; branches %s unreachable, left to recovery",
                self.gtrid.decode(),
                ", ".join(b.name for b in pending),
            )
            return
        crashpoint("xa_before_end")
        if logged:
            self._log.end(self.gtrid)
        self._to(TxEvent.COMPLETED)

    def _commit_branch(self, b: Branch) -> rec.HeuristicRecord | None:
        try:
            b.participant.commit(b.xid, False)
            b.status = BranchStatus.COMMITTED
            return None
        except UnknownXidError as e:
            b.status, b.healthy = BranchStatus.HEURISTIC, False
            return self._report(b, HeuristicKind.HAZARD, rec.Outcome.COMMIT, str(e))
        except BranchHeuristicError as e:
            b.status, b.healthy = BranchStatus.HEURISTIC, False
            return self._report(b, e.kind, rec.Outcome.COMMIT, str(e), forget=True)
        except ParticipantError as e:
            b.healthy = False
            first = e
        # unreachable or a failure of unknown effect: once more on a new connection
        try:
            p = self._pool.fresh(b.name)
        except ParticipantError:
            b.status = BranchStatus.PENDING
            return None
        try:
            p.commit(b.xid, False)
            b.status = BranchStatus.COMMITTED  # or the first attempt already did
            ok = True
        except UnknownXidError:
            b.status = BranchStatus.COMMITTED  # the first attempt went through
            ok = True
        except BranchHeuristicError as e:
            b.status = BranchStatus.HEURISTIC
            self._pool.release(b.name, p, healthy=False)
            return self._report(b, e.kind, rec.Outcome.COMMIT, str(e), forget=True)
        except ParticipantError as e:
            log.warning("commit of %s in %s failed: %s / %s", b.name, self, first, e)
            b.status = BranchStatus.PENDING
            ok = False
        self._pool.release(b.name, p, healthy=ok)
        return None

    def _report(
        self,
        b: Branch,
        kind: HeuristicKind,
        decided: rec.Outcome,
        message: str,
        forget: bool = False,
    ) -> rec.HeuristicRecord:
        report = rec.HeuristicRecord(
            gtrid=self.gtrid,
            name=b.name,
            bqual=b.xid.bqual,
            kind=kind,
            decided=decided,
            source=rec.Source.COORDINATOR,
            at_ms=_now_ms(),
            message=message[:1000],
        )
        if forget:
            try:
                p = self._pool.fresh(b.name)
                try:
                    p.forget(b.xid)
                finally:
                    p.close()
            except ParticipantError as e:
                log.warning("forget of %s in %s failed: %s", b.name, self, e)
        return report

    def _log_reports(self, reports: list[rec.HeuristicRecord], decided: rec.Outcome) -> None:
        for r in reports:
            log.error(
                "HEURISTIC %s: branch %s of %s (decided %s): %s",
                r.kind.name,
                r.name,
                r.gtrid.decode(),
                decided.name,
                r.message,
            )
            try:
                self._log.heuristic(r)
            except DecisionLogError as e:
                log.error("heuristic report of %s not logged: %s", r.gtrid.decode(), e)
        self.heuristics.extend(reports)

    def _settle(
        self, reports: list[rec.HeuristicRecord], decided: rec.Outcome, n_done: int
    ) -> None:
        """Log heuristic reports durably, then raise them as one HeuristicError (unless
        every report agrees with the decision)."""
        if not reports:
            return
        self._log_reports(reports, decided)
        err = heuristic_error(self.gtrid, decided, reports, n_done)
        if err is None:
            return
        if self._log.decision(self.gtrid) is not None and not self.pending:
            self._log.end(self.gtrid)
        self._to(TxEvent.HEURISTIC)
        raise err

    def _one_phase(self) -> None:
        if self._branches and self._remaining_s() <= 0:
            self._abort_timeout()
        self._to(TxEvent.COMMIT_ONE_PHASE)
        if not self._branches:
            self._to(TxEvent.COMPLETED)
            return
        b = self._branches[0]
        try:
            b.participant.commit(b.xid, True)
        except (VoteRollbackError, UnknownXidError) as e:
            b.status, b.healthy = BranchStatus.ROLLED_BACK, False
            self._to(TxEvent.ROLLED_BACK)
            raise RollbackError(f"{b.name} rolled back instead of committing: {e}") from e
        except BranchHeuristicError as e:
            b.healthy = False
            report = self._report(b, e.kind, rec.Outcome.COMMIT, str(e), forget=True)
            if e.kind is not HeuristicKind.COMMIT:
                b.status = BranchStatus.HEURISTIC
                self._settle([report], rec.Outcome.COMMIT, 0)
        except ParticipantError as e:
            b.status, b.healthy = BranchStatus.PENDING, False
            report = self._report(
                b, HeuristicKind.HAZARD, rec.Outcome.COMMIT, f"one-phase commit: {e}"
            )
            self._to(TxEvent.OUTCOME_UNKNOWN)
            self._log_reports([report], rec.Outcome.COMMIT)
            raise HeuristicHazardError(
                f"transaction {self.gtrid.decode()}: outcome of the one-phase commit of"
                f" {b.name} is unknown: {e}",
                [report],
            ) from e
        b.status = BranchStatus.COMMITTED
        self._to(TxEvent.COMPLETED)

    # ------------------------------------------------------------------ rollback

    def rollback(self) -> None:
        """Roll back every branch. Idempotent once the transaction is rolled back.

        Unreachable branches are left to recovery (presumed abort). Raises
        :class:`HeuristicError` if a participant reports it committed on its own.
        """
        if self.state in TERMINAL:
            if self.state is TxState.ROLLED_BACK:
                return
            raise TransactionError(f"cannot roll back a {self.state.value} transaction")
        try:
            self._to(TxEvent.ROLLBACK)
            self._rollback_branches()
        finally:
            self._finish()

    def _abort(self, reason: str, cause: BaseException | None) -> NoReturn:
        """Roll back from inside commit and raise RollbackError (never returns)."""
        self._to(TxEvent.ROLLBACK)
        self._rollback_branches()
        raise RollbackError(f"transaction {self.gtrid.decode()} rolled back: {reason}") from cause

    def _abort_timeout(self) -> NoReturn:
        self._to(TxEvent.ROLLBACK)
        self._rollback_branches()
        raise TransactionTimeoutError(
            f"transaction {self.gtrid.decode()} passed its deadline before the commit decision:"
            " rolled back"
        )

    def _rollback_branches(self) -> None:
        reports: list[rec.HeuristicRecord] = []
        done = 0
        for b in self._branches:
            if b.status in (BranchStatus.READ_ONLY, BranchStatus.ROLLED_BACK):
                continue
            p = b.participant
            try:
                if b.status is BranchStatus.ACTIVE:
                    try:
                        p.end(b.xid, False)
                    except ParticipantError:
                        b.healthy = False
                p.rollback(b.xid)
                b.status = BranchStatus.ROLLED_BACK
                done += 1
            except UnknownXidError:
                b.status = BranchStatus.ROLLED_BACK  # gone: nothing of it survives
                b.healthy = False
                done += 1
            except BranchHeuristicError as e:
                b.status, b.healthy = BranchStatus.HEURISTIC, False
                reports.append(self._report(b, e.kind, rec.Outcome.ROLLBACK, str(e), forget=True))
            except ParticipantError as e:
                b.healthy = False
                b.status = BranchStatus.PENDING
                if not isinstance(e, ParticipantUnavailableError):
                    log.warning("rollback of %s in %s failed: %s", b.name, self, e)
        self._settle(reports, rec.Outcome.ROLLBACK, done)
        self._to(TxEvent.COMPLETED)

    # ------------------------------------------------------------------ cleanup

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        for b in self._branches:
            clean = b.status in (
                BranchStatus.COMMITTED,
                BranchStatus.ROLLED_BACK,
                BranchStatus.READ_ONLY,
                BranchStatus.PREPARED,
            )
            self._pool.release(b.name, b.participant, healthy=b.healthy and clean)
        self._on_finish(self)


def heuristic_error(
    gtrid: bytes, decided: rec.Outcome, reports: list[rec.HeuristicRecord], n_done: int
) -> HeuristicError | None:
    """The error to raise for ``reports`` when ``n_done`` other branches followed the
    decision; ``None`` when every report agrees with the decision."""
    agree = HeuristicKind.COMMIT if decided is rec.Outcome.COMMIT else HeuristicKind.ROLLBACK
    deviating = [r for r in reports if r.kind is not agree]
    if not deviating:
        return None
    kinds = {r.kind for r in deviating}
    what = ", ".join(f"{r.name}: {r.kind.name.lower()} ({r.message})" for r in deviating)
    msg = f"transaction {gtrid.decode()} decided {decided.name.lower()}; {what}"
    if HeuristicKind.MIXED in kinds or (
        len(kinds) == 1 and HeuristicKind.HAZARD not in kinds and n_done > 0
    ):
        return HeuristicMixedError(msg, reports)
    if HeuristicKind.HAZARD in kinds:
        return HeuristicHazardError(msg, reports)
    if kinds == {HeuristicKind.ROLLBACK}:
        return HeuristicRollbackError(msg, reports)
    if kinds == {HeuristicKind.COMMIT}:
        return HeuristicCommitError(msg, reports)
    return HeuristicMixedError(msg, reports)
