"""The steps that end a transaction: forcing the redo log (group commit) and answering,
PREPARE, COMMIT (one- and two-phase, a half message's early answer), applying committed
shares under one gate and logging APPLIED, and ROLLBACK (see
:class:`~notify.core.transactions.TxEngine`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from notify.core.apply import Joint, Share, group_shares
from notify.core.effects import (
    Applied,
    Complete,
    Defer,
    Force,
    Placement,
    Ticket,
)
from notify.core.states import TxEvent, TxState
from notify.core.txbase import (
    NO_HINTS,
    TOMBSTONE_S,
    BrokerTx,
    Done,
    EngineBase,
    ForceWait,
    Started,
    TxFailure,
    xa_reply,
)
from notify.errors import NotifyError, TxLogError
from notify.protocol import logrecords as lr
from notify.protocol.replies import encode_prepare_vote
from notify.protocol.xa import (
    XA_OK,
    XA_RBROLLBACK,
    XA_RDONLY,
    XAER_RMFAIL,
)
from notify.txlog import Position

log = logging.getLogger("notify.tx")


class Steps(EngineBase):
    """Forcing, prepare, commit, apply and rollback."""

    def _step(self, owner: Any, opaque: int, start: Callable[[], Started]) -> None:
        """Run a step: ``start()`` changes state and appends its record (no fsync) and
        returns ``(position to force or None, finish, what a failed force means)``. With
        ``force_at_commit`` the reply waits for the force; ``finish`` then returns the
        reply body and the gate readers must see open first."""
        try:
            pos, finish, unsure = start()
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        if pos is None or not self.limits.force_at_commit:
            return self._finish(owner, opaque, None, finish)
        self._await_force(owner, opaque, pos, finish, unsure)

    def _await_force(
        self,
        owner: Any,
        opaque: int,
        pos: Position,
        finish: Callable[[], Done],
        unsure: str,
        head: list[tuple[int, int, bytes]] | None = None,
    ) -> None:
        """Reserve the step's reply (``head``: answers to the same owner sent with it) and
        ask for the force of the redo log up to ``pos``."""
        ticket = Ticket(owner, opaque)
        ticket.head = head
        out = self.out
        out.append(Defer(ticket))
        self._forcing.append(ForceWait(pos, ticket, finish, unsure))
        out.append(Force(pos))

    def _commit_half(self, owner: Any, opaque: int, tx: BrokerTx) -> None:
        """COMMIT_TWO_PHASE of a prepared half message with ``halfCommitEarlyAck``: answered
        as soon as the COMMIT is logged, without waiting for its force. Safe because the
        PREPARE was forced and the messages are applied (readable) only once the COMMIT is
        forced: if a crash loses the COMMIT, recovery finds the half message prepared and the
        check-back asks the producer group, whose checker answers COMMIT from the
        application's database (README "Transactions")."""
        try:
            pos, finish, unsure = self._commit(tx, TxEvent.COMMIT_TWO_PHASE)
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        self._reply(owner, opaque, 200)
        if pos is None or not self.limits.force_at_commit:
            finish()
            return
        self._forcing.append(ForceWait(pos, None, finish, unsure))
        self.out.append(Force(pos, lazy=True))

    def _finish(
        self,
        owner: Any,
        opaque: int,
        ticket: Ticket | None,
        finish: Callable[[], Done],
    ) -> None:
        try:
            body, gate = finish()
        except TxFailure as e:
            code, fbody = xa_reply(e)
            if ticket is None:
                return self._reply(owner, opaque, code, fbody)
            ticket.set(code, fbody)
            self.out.append(Complete(ticket))
            return
        if gate is None or gate.is_open:
            if ticket is None:
                return self._reply(owner, opaque, 200, body)
            ticket.set(200, body)
            self.out.append(Complete(ticket))
            return
        if ticket is None:
            ticket = Ticket(owner, opaque)
            self.out.append(Defer(ticket))
        t = ticket
        hook = gate.on_open

        def opened() -> None:
            if hook is not None:
                hook()
            if not t.done:
                t.set(200, body)
                self.out.append(Complete(t))

        gate.on_open = opened

    @property
    def acked_before_force(self) -> bool:
        """Whether a step waiting for the force was already answered (a half message's
        commit, see :meth:`_commit_half`)."""
        return any(s.ticket is None for s in self._forcing)

    @property
    def pending_force(self) -> bool:
        """Whether steps wait for a force of the redo log."""
        return bool(self._forcing)

    def forced(self, upto: Position, error: str | None = None) -> None:
        """The shell forced the redo log up to ``upto`` (``error``: the force failed, so the
        outcome of those steps is unknown until a restart's recovery settles it)."""
        ready = [s for s in self._forcing if s.pos <= upto]
        if not ready:
            return
        self._forcing = [s for s in self._forcing if s.pos > upto]
        for s in ready:
            t = s.ticket
            if error is not None:
                if t is not None:
                    t.set(*xa_reply(TxFailure(XAER_RMFAIL, f"{s.unsure}: {error}")))
                    self.out.append(Complete(t))
                continue
            if t is None:
                s.finish()
            else:
                self._finish(t.owner, t.opaque, t, s.finish)

    def _prepare(
        self, tx: BrokerTx, owner: Any
    ) -> Started:
        if tx.state is TxState.ROLLBACK_ONLY:
            self._rollback_only(tx, TxEvent.PREPARE)
        if not tx.batches:
            self._to(tx, TxEvent.READ_ONLY)  # no work: vote read-only, nothing to remember
            self._forget_finished(tx)
            return None, lambda: (encode_prepare_vote(XA_RDONLY), None), ""
        group = self._owner_group.get(owner, "")
        at = self._now_ms()
        body = lr.Prepare(tx.key, at, tx.timeout_s, group).encode()
        try:
            pos = self._log(lr.PREPARE, body)
        except TxLogError as e:
            # the record did not reach the log: the transaction can only roll back now
            tx.failure = f"prepare record not written: {e}"
            self._to(tx, TxEvent.FAILED)
            raise TxFailure(XAER_RMFAIL, tx.failure) from e
        self._to(tx, TxEvent.PREPARE)
        tx.group = group
        self._untime(tx)  # a half message has no deadline
        tx.prepared_at_ms = at

        def finish() -> Done:
            self.crashpoint("after_prepare_record")
            return encode_prepare_vote(XA_OK), None

        return pos, finish, "prepare not known to be durable; roll it back"

    def _rollback_only(self, tx: BrokerTx, ev: TxEvent) -> None:
        """A commit or prepare of a transaction one of whose puts failed: roll it back."""
        reason = tx.failure or "a put of this transaction failed"
        self._to(tx, ev)  # ROLLBACK_ONLY -> ROLLED_BACK
        tx.ended_reason = reason
        self._log_rollback(tx, reason)
        self.stats.rolled_back += 1
        self._forget_finished(tx)
        raise TxFailure(XA_RBROLLBACK, f"transaction {tx.key} was rolled back: {reason}", 500)

    def _commit(
        self, tx: BrokerTx, ev: TxEvent
    ) -> Started:
        if tx.state is TxState.ROLLBACK_ONLY:
            self._rollback_only(tx, ev)
        if not tx.batches:
            self._to(tx, ev)
            self._to(tx, TxEvent.APPLIED)
            self._forget_finished(tx)
            self.stats.committed += 1
            return None, lambda: (b"", None), ""
        hints: list[tuple[str, int, int]] = []
        seen: set[tuple[str, int]] = set()
        for b in tx.batches:
            k = (b.topic, b.partition)
            if k not in seen:
                seen.add(k)
                part = self.store.get(b.topic, b.partition)
                hints.append((b.topic, b.partition, part.end if part is not None else 0))
        try:
            pos = self._log(lr.COMMIT, lr.Commit(tx.key, self._now_ms(), tuple(hints)).encode())
        except TxLogError as e:  # the decision never reached the log: nothing changed
            raise TxFailure(XAER_RMFAIL, f"commit record not written: {e}") from e
        self._to(tx, ev)  # -> COMMITTING; no other command can touch it now
        tx.hints = tuple(hints)
        return self._committed(tx, pos)

    def _committed(
        self, tx: BrokerTx, pos: Position
    ) -> Started:
        """A COMMIT record was written at ``pos`` (not yet forced): the step that applies it."""

        def finish() -> Done:
            self.crashpoint("after_commit_record")
            self.stats.committed += 1
            applied = self._apply(tx)
            if applied is None:
                return b"committed; messages will appear when the store recovers", None
            return b"", applied.gate

        # a failed force leaves the decision unknown: the restart's recovery settles it
        return pos, finish, "commit decision not known to be durable (outcome unknown)"

    def _apply(self, tx: BrokerTx, recovering: bool = False) -> Joint | None:
        """Append the transaction's messages to their partitions (once, all under one gate:
        readers see all or none of them), then log APPLIED (once every share is placed:
        shares deferred to the gate's opening are placed later). None when a partition
        refused (the apply is retried; nothing of it is visible). Recovery applies without
        a gate: nobody reads meanwhile, and it ends with every touched partition synced."""
        batches = tx.batches
        if len(batches) == 1:
            b = batches[0]
            shares = [Share(b.topic, b.partition, b.records, b.count)]
        else:
            shares = group_shares((b.topic, b.partition, b.records, b.count) for b in batches)
        verify = recovering or tx.apply_error is not None
        # where each partition ended at the decision: read only to verify what is there
        hints = {(t, p): h for t, p, h in tx.hints} if verify else NO_HINTS

        def missing(sh: Share) -> None:
            log.error(
                "transaction %s: partition %s-%d no longer exists; %d messages dropped",
                tx.key,
                sh.topic,
                sh.partition,
                sh.count,
            )

        what = f"transaction {tx.key}"
        try:
            if recovering:
                joint = Joint(
                    self.applier.apply(
                        shares,
                        hints,
                        verify=True,
                        what=what,
                        on_missing=missing,
                        exact=tx.hints_exact,
                    ),
                    None,
                )
            else:
                joint = self.applier.apply_joint(
                    shares, hints, verify=verify, what=what, on_missing=missing
                )
        except NotifyError as e:
            if tx.apply_error is None:
                log.error(
                    "transaction %s is committed but applying it failed (%s); nothing of it "
                    "is visible; retrying every second",
                    tx.key,
                    e,
                )
            tx.apply_error = str(e)
            return None
        tx.apply_error = None
        gate = joint.gate
        if gate is None or not gate.deferred:
            self._applied(tx, shares, tuple(joint.placements), recovering)
            return joint
        # the shares of settled partitions without group commit are placed when the gate
        # opens: APPLIED (and the end of COMMITTING, which keeps the COMMIT record from
        # checkpoints) waits for them
        later = [(d.part, d.count) for d in gate.deferred]
        now = list(joint.placements)

        def placed(done: list[tuple[Any, int, int]]) -> None:
            more = [
                Placement(part.topic, part.index, start, count, end - start)
                for (part, count), (_p, start, end) in zip(later, done, strict=True)
            ]
            self._applied(tx, shares, tuple(now + more), False)

        gate.on_placed = placed
        if len(self._gates) > 64:
            self._gates = [g for g in self._gates if not g.is_open]
        self._gates.append(gate)
        return joint

    def _applied(
        self,
        tx: BrokerTx,
        shares: list[Share],
        placements: tuple[Placement, ...],
        recovering: bool,
    ) -> None:
        """Every share of ``tx`` is placed: log APPLIED, finish its state, tell the shell."""
        applied = lr.Applied(
            tx.key, tuple([(p.topic, p.partition, p.offset, p.count, p.nbytes) for p in placements])
        ).encode()
        if recovering:
            # a re-apply may land below the COMMIT's hint (the partition's tail was lost):
            # only this record tells the next recovery where, so it is written now
            try:
                self._log(lr.APPLIED, applied)
            except TxLogError as e:
                log.error("APPLIED of %s not logged (recovery re-checks it): %s", tx.key, e)
        else:
            # the next redo write carries it: the messages went at or after the COMMIT's
            # hint, where a recovery without this record finds them by message id
            self._backlog.append((lr.APPLIED, applied))
        self.crashpoint("after_apply")
        self._to(tx, TxEvent.APPLIED)
        if tx.first_pos is not None:
            self._unflushed.append((tx.first_pos, placements))
        delay_topic = self.limits.delay_topic
        delayed: tuple[tuple[int, bytes], ...] = ()
        for p in placements:
            if p.topic == delay_topic:
                data_of = {(sh.topic, sh.partition): sh.data for sh in shares}
                delayed = tuple(
                    [(q.offset, data_of[(q.topic, q.partition)])
                     for q in placements if q.topic == delay_topic]
                )
                break
        self.out.append(Applied(tx.key, placements, delayed))
        self._forget_finished(tx)

    def _log_rollback(self, tx: BrokerTx, reason: str) -> Position | None:
        if not tx.batches:
            return None
        try:
            return self._log(lr.ROLLBACK, lr.Rollback(tx.key, reason).encode())
        except TxLogError as e:
            log.warning("rollback record of %s not written: %s", tx.key, e)
            return None

    def _rollback(
        self, tx: BrokerTx, ev: TxEvent, reason: str
    ) -> Started:
        was_prepared = tx.state is TxState.PREPARED
        self._to(tx, ev)
        tx.ended_reason = reason
        pos = self._log_rollback(tx, reason)
        self.stats.rolled_back += 1
        self._forget_finished(tx)
        # presumed abort: only a prepared transaction's rollback needs to be forced
        return (
            (pos if was_prepared else None),
            lambda: (b"", None),
            "rollback not known to be durable",
        )

    def _rollback_now(self, tx: BrokerTx, ev: TxEvent, reason: str) -> None:
        """Roll back without a reply (timeouts, lost owners, exhausted check-backs)."""
        self._to(tx, ev)
        tx.ended_reason = reason
        self._log_rollback(tx, reason)
        self.stats.rolled_back += 1
        if reason == "timeout":
            # keep a timed-out transaction known so its owner gets XA_RBTIMEOUT
            tx.batches = []
            self._tombstones.append((self.clock.monotonic() + tx.timeout_s + TOMBSTONE_S, tx.key))
        else:
            self._forget_finished(tx)

