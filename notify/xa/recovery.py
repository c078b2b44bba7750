"""Recovery: finish what a crash (or an unreachable resource) left prepared.

One pass (:func:`recover_once`):

1. Ask every registered participant for the prepared branches this coordinator owns
   (``recover(scope)``: same formatId, gtrid ``<coordinatorId>-...``; the broker is also
   asked by uniqueQualifier), so coordinators sharing resources never touch each other's.
2. For each branch of a transaction not running in this process:

   * a logged decision (the coordinator's commit, or an admin's commit/rollback): apply it;
   * no decision: **presumed abort**. The coordinator writes its commit decision before
     any branch is committed and never after the transaction's deadline, so a prepared
     branch without a decision belongs to a transaction that never decided to commit, and
     rolling it back is always safe once nobody can still decide. On the first pass over a
     participant (at start) that is immediately: the log directory is locked by this
     process, so no other incarnation of this coordinator is deciding. On later passes the
     branch must also be older than its deadline (encoded in the gtrid) plus a grace
     period, which keeps a pass from racing a slow decision even if the in-process check
     were ever bypassed (two processes misconfigured with one coordinator id).

3. A decision none of whose branches is prepared anywhere any more (every participant it
   names answered) is finished: END is appended and the decision forgotten.

Resolution errors: ``UnknownXidError`` means already finished; an unreachable participant
is retried on the next pass; a heuristic outcome is logged durably and the branch forgotten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from notify.protocol.keys import Xid
from notify.xa import records as rec
from notify.xa.decisionlog import DecisionLog
from notify.xa.errors import (
    BranchHeuristicError,
    DecisionLogError,
    HeuristicKind,
    ParticipantError,
    UnknownXidError,
)
from notify.xa.ids import Scope, deadline_of
from notify.xa.pool import ParticipantPool

log = logging.getLogger("notify.xa.recovery")

Listing = dict[str, list[Xid]]


@dataclass
class RecoveryReport:
    """What one recovery pass saw and did."""

    committed: list[tuple[str, Xid]] = field(default_factory=list)
    rolled_back: list[tuple[str, Xid]] = field(default_factory=list)
    waiting: list[tuple[str, Xid]] = field(default_factory=list)  # undecided, not expired
    failed: list[tuple[str, Xid, str]] = field(default_factory=list)
    completed: list[bytes] = field(default_factory=list)  # decisions ENDed
    errors: dict[str, str] = field(default_factory=dict)  # participant -> listing error
    heuristics: list[rec.HeuristicRecord] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def clean(self) -> bool:
        """Nothing left that this pass could not settle."""
        return not (self.waiting or self.failed or self.errors)


def scan(
    pool: ParticipantPool, scope: Scope, names: Collection[str] | None = None
) -> tuple[Listing, dict[str, str]]:
    """``recover(scope)`` on each participant: ``(listing by name, errors by name)``."""
    listing: Listing = {}
    errors: dict[str, str] = {}
    for name in pool.names() if names is None else names:
        try:
            with pool.borrowed(name) as p:
                listing[name] = p.recover(scope)
        except ParticipantError as e:
            errors[name] = str(e)
            log.warning("recovery: cannot list prepared branches of %s: %s", name, e)
    return listing, errors


def resolve_branch(
    pool: ParticipantPool,
    decisions: DecisionLog,
    name: str,
    xid: Xid,
    commit: bool,
    source: rec.Source = rec.Source.COORDINATOR,
) -> tuple[bool, rec.HeuristicRecord | None, str]:
    """Commit or roll back one prepared branch.

    Returns ``(finished, heuristic report or None, error text)``; ``finished`` is False when
    the participant could not be reached (try again later).
    """
    decided = rec.Outcome.COMMIT if commit else rec.Outcome.ROLLBACK
    try:
        p = pool.acquire(name)
    except ParticipantError as e:
        return False, None, str(e)
    healthy = False
    try:
        if commit:
            p.commit(xid, False)
        else:
            p.rollback(xid)
        healthy = True
        return True, None, ""
    except UnknownXidError:
        return True, None, ""  # already finished (by us before a crash, or a retry)
    except BranchHeuristicError as e:
        agree = HeuristicKind.COMMIT if commit else HeuristicKind.ROLLBACK
        report = None
        if e.kind is not agree:
            report = rec.HeuristicRecord(
                gtrid=xid.gtrid,
                name=name,
                bqual=xid.bqual,
                kind=e.kind,
                decided=decided,
                source=source,
                at_ms=int(time.time() * 1000),
                message=str(e)[:1000],
            )
            log.error("HEURISTIC %s: branch %s of %s: %s", e.kind.name, name, xid.gtrid, e)
            try:
                decisions.heuristic(report)
            except DecisionLogError as le:
                log.error("heuristic report not logged: %s", le)
        try:
            p.forget(xid)
        except ParticipantError as fe:
            log.warning("forget of %s on %s failed: %s", xid, name, fe)
        return True, report, ""
    except ParticipantError as e:
        return False, None, str(e)
    finally:
        pool.release(name, p, healthy)


def recover_once(
    pool: ParticipantPool,
    decisions: DecisionLog,
    live: Callable[[bytes], bool],
    first_pass: Collection[str],
    grace_s: float,
    now: float | None = None,
) -> RecoveryReport:
    """One recovery pass (see the module docstring).

    ``live(gtrid)`` tells transactions running in this process (never touched);
    ``first_pass`` names the participants for which this is the first pass since start
    (undecided branches are rolled back at once there).
    """
    t0 = time.monotonic()
    scope = decisions.scope
    report = RecoveryReport()
    listing, report.errors = scan(pool, scope)
    now = time.time() if now is None else now
    unresolved: set[bytes] = set()
    for name, xids in listing.items():
        for xid in xids:
            g = xid.gtrid
            if live(g):
                unresolved.add(g)
                continue
            d = decisions.decision(g)
            if d is not None and not decisions.durable(g):
                report.failed.append((name, xid, "its decision is not durable yet"))
                unresolved.add(g)
                continue
            if d is not None:
                commit = d.outcome is rec.Outcome.COMMIT
                source = d.source
            else:
                deadline = deadline_of(g)
                expired = deadline is None or now > deadline + grace_s
                if name not in first_pass and not expired:
                    report.waiting.append((name, xid))
                    unresolved.add(g)
                    continue
                commit, source = False, rec.Source.COORDINATOR
            finished, heuristic, error = resolve_branch(pool, decisions, name, xid, commit, source)
            if heuristic is not None:
                report.heuristics.append(heuristic)
            if not finished:
                report.failed.append((name, xid, error))
                unresolved.add(g)
            elif commit:
                report.committed.append((name, xid))
            else:
                report.rolled_back.append((name, xid))
    for d in decisions.decisions():
        g = d.gtrid
        if live(g) or g in unresolved:
            continue
        names = {b.name for b in d.branches}
        if any(n not in listing for n in names):
            continue  # a participant of it did not answer (or is not registered)
        decisions.end(g)
        report.completed.append(g)
    report.duration_s = time.monotonic() - t0
    if report.committed or report.rolled_back or report.completed or report.failed:
        log.info(
            "recovery: %d committed, %d rolled back, %d decisions finished, %d failed, "
            "%d waiting (%.3fs)",
            len(report.committed),
            len(report.rolled_back),
            len(report.completed),
            len(report.failed),
            len(report.waiting),
            report.duration_s,
        )
    return report
