"""Operator actions on in-doubt transactions: list them, resolve one by hand, acknowledge
heuristic reports. Plain functions used by ``notify xa`` (and :class:`TransactionManager`).

Resolving by hand writes an *admin* DECISION record (durable) before touching any branch,
so a crash halfway through is finished by recovery the same way; whenever the admin's
outcome is not what the coordinator would have done (commit without a logged decision, or
rollback against a logged commit), a HEURISTIC record (source admin) is written as well and
stays listed until acknowledged with :func:`forget`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from notify.protocol.keys import Xid
from notify.xa import records as rec
from notify.xa.decisionlog import DecisionLog
from notify.xa.errors import HeuristicKind, InDoubtError
from notify.xa.ids import Scope, deadline_of, name_of_branch
from notify.xa.pool import ParticipantPool
from notify.xa.recovery import resolve_branch, scan


class DecisionView(Protocol):
    """What listing needs from a decision log (a :class:`DecisionLog`, or a
    :class:`TableView` of a log some other process holds)."""

    @property
    def scope(self) -> Scope: ...

    def decision(self, gtrid: bytes) -> rec.Decision | None: ...

    def decisions(self) -> list[rec.Decision]: ...

    def heuristics(self) -> list[rec.HeuristicRecord]: ...


class TableView:
    """A read-only :class:`DecisionView` over a :class:`~notify.xa.records.DecisionTable`
    (see :func:`~notify.xa.decisionlog.peek`)."""

    def __init__(self, table: rec.DecisionTable):
        self.table = table
        self._scope = Scope(table.coordinator_id, table.format_id)

    @property
    def scope(self) -> Scope:
        """The log's coordinator."""
        return self._scope

    def decision(self, gtrid: bytes) -> rec.Decision | None:
        """The live decision of ``gtrid``."""
        return self.table.decisions.get(gtrid)

    def decisions(self) -> list[rec.Decision]:
        """Live decisions, oldest first."""
        return sorted(self.table.decisions.values(), key=lambda d: d.decided_at_ms)

    def heuristics(self) -> list[rec.HeuristicRecord]:
        """Unacknowledged heuristic reports, oldest first."""
        out = [h for hs in self.table.heuristics.values() for h in hs]
        return sorted(out, key=lambda h: h.at_ms)


@dataclass
class InDoubt:
    """A transaction with prepared branches, a live decision, or heuristic reports."""

    gtrid: bytes
    decision: rec.Decision | None
    prepared: list[tuple[str, Xid]] = field(default_factory=list)
    heuristics: list[rec.HeuristicRecord] = field(default_factory=list)

    @property
    def deadline_s(self) -> int | None:
        """The transaction's deadline (Unix seconds) from its gtrid."""
        return deadline_of(self.gtrid)

    @property
    def status(self) -> str:
        """One line: what recovery would do with it."""
        d = self.decision
        if d is None:
            what = "no decision: presumed abort (recovery rolls back)"
        elif d.source is rec.Source.ADMIN:
            what = f"admin decided {d.outcome.name.lower()}" + (f" ({d.by})" if d.by else "")
        else:
            what = "commit decided: recovery commits"
        if self.heuristics:
            what += f"; {len(self.heuristics)} heuristic report(s)"
        if not self.prepared and d is not None:
            what += "; no branch prepared (finished or unreachable)"
        return what


def list_in_doubt(
    pool: ParticipantPool, decisions: DecisionView
) -> tuple[list[InDoubt], dict[str, str]]:
    """Every in-doubt transaction of the log's coordinator, and participants' errors."""
    listing, errors = scan(pool, decisions.scope)
    found: dict[bytes, InDoubt] = {}

    def get(g: bytes) -> InDoubt:
        item = found.get(g)
        if item is None:
            item = found[g] = InDoubt(g, decisions.decision(g))
        return item

    for name, xids in listing.items():
        for xid in xids:
            get(xid.gtrid).prepared.append((name, xid))
    for d in decisions.decisions():
        get(d.gtrid)
    for h in decisions.heuristics():
        get(h.gtrid).heuristics.append(h)
    return sorted(found.values(), key=lambda i: (deadline_of(i.gtrid) or 0, i.gtrid)), errors


@dataclass
class Resolution:
    """What :func:`resolve` did."""

    gtrid: bytes
    outcome: rec.Outcome
    done: list[tuple[str, Xid]] = field(default_factory=list)
    failed: list[tuple[str, Xid, str]] = field(default_factory=list)
    heuristics: list[rec.HeuristicRecord] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every prepared branch was finished."""
        return not self.failed


def _gtrid(decisions: DecisionLog, text: str) -> bytes:
    g = text.encode()
    if not decisions.scope.owns_gtrid(g):
        raise InDoubtError(
            f"{text!r} is not a transaction of coordinator {decisions.scope.coordinator_id}"
        )
    return g


def resolve(
    pool: ParticipantPool,
    decisions: DecisionLog,
    gtrid_text: str,
    commit: bool,
    by: str,
    force: bool = False,
) -> Resolution:
    """Commit or roll back transaction ``gtrid_text`` by hand on every participant.

    Refuses (:class:`InDoubtError`) a transaction nobody knows, and one whose logged
    decision says otherwise unless ``force`` (a heuristic: some branches may already be
    finished the other way). See the module docstring for what is recorded.
    """
    g = _gtrid(decisions, gtrid_text)
    listing, errors = scan(pool, decisions.scope)
    prepared = [(n, x) for n, xs in listing.items() for x in xs if x.gtrid == g]
    old = decisions.decision(g)
    if old is None and not prepared:
        where = f" (unreachable: {', '.join(errors)})" if errors else ""
        raise InDoubtError(f"{gtrid_text}: no prepared branch and no decision{where}")
    outcome = rec.Outcome.COMMIT if commit else rec.Outcome.ROLLBACK
    if old is not None and old.outcome is not outcome and not force:
        raise InDoubtError(
            f"{gtrid_text}: the log holds a {old.outcome.name.lower()} decision"
            f" ({'admin' if old.source is rec.Source.ADMIN else 'coordinator'}); some branches"
            " may already be finished that way. Use --force to override (a heuristic outcome)"
        )
    now = int(time.time() * 1000)
    branches = {b.name: b for b in (old.branches if old else ())}
    for name, xid in prepared:
        # recorded under the application's name (a notify bqual is the registered name),
        # whatever the operator called the participant, so the app's recovery matches it
        app_name = name_of_branch(xid) or name
        branches.setdefault(app_name, rec.Branch(app_name, xid.bqual))
    decisions.decide(
        rec.Decision(
            gtrid=g,
            outcome=outcome,
            source=rec.Source.ADMIN,
            decided_at_ms=now,
            deadline_s=deadline_of(g) or 0,
            format_id=decisions.scope.format_id,
            branches=tuple(branches.values()),
            by=by,
        )
    )
    result = Resolution(g, outcome)
    presumed = rec.Outcome.COMMIT if old and old.outcome is rec.Outcome.COMMIT else None
    presumed = presumed or rec.Outcome.ROLLBACK
    if outcome is not presumed:
        kind = HeuristicKind.COMMIT if commit else HeuristicKind.ROLLBACK
        against = "a logged commit decision" if old is not None else "presumed abort"
        report = rec.HeuristicRecord(
            gtrid=g,
            name="*",
            bqual=b"",
            kind=kind,
            decided=old.outcome if old is not None else rec.Outcome.NONE,
            source=rec.Source.ADMIN,
            at_ms=now,
            message=f"{by} resolved it by hand: {outcome.name.lower()} against {against}",
        )
        decisions.heuristic(report)
        result.heuristics.append(report)
    for name, xid in prepared:
        finished, heuristic, error = resolve_branch(
            pool, decisions, name, xid, commit, rec.Source.ADMIN
        )
        if heuristic is not None:
            result.heuristics.append(heuristic)
        if finished:
            result.done.append((name, xid))
        else:
            result.failed.append((name, xid, error))
    unanswered = [b.name for b in branches.values() if b.name not in listing]
    if result.complete and not unanswered:
        decisions.end(g)
    return result


def forget(decisions: DecisionLog, gtrid_text: str, by: str) -> int:
    """Acknowledge (durably forget) the heuristic reports of a transaction; returns how
    many there were. :class:`InDoubtError` when there are none."""
    g = _gtrid(decisions, gtrid_text)
    n = sum(1 for h in decisions.heuristics() if h.gtrid == g)
    if not n:
        raise InDoubtError(f"{gtrid_text}: no heuristic reports to forget")
    decisions.ack(g, by)
    return n
