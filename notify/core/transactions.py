"""The broker's transaction engine: MetaQ's ``transaction`` command and transactional puts,
as pure logic over explicit collaborators (requests in, effects out).

Collaborators, passed at construction and nothing else:

* ``log``      the redo log (:class:`txlog.TxLog` or anything with its append/replay API)
* ``store``    partitions by ``(topic, index)``; ``applier`` appends committed shares
* ``clock``    ``monotonic()`` for deadlines, ``time()`` for persisted timestamps
* ``ids``      message ids (``next()``, ``next_block(n)``)
* ``limits``   the settings that bound transactions (:class:`TxLimits`)
* ``out``      the outbox: every command appends :mod:`~notify.core.effects` to it and the
               shell (the broker, or the simulation) executes them

A transactional put's record (message id assigned here) goes to the redo log as APPEND_MSG and
is kept in memory. COMMIT is logged and, with ``force_at_commit``, made durable (a
:class:`~notify.core.effects.Force` effect; the shell group-commits and calls
:meth:`TxEngine.forced`) **before** any message reaches a partition; then the shares are
applied through the shared :class:`~notify.core.apply.Applier` (all shares under one
:class:`~notify.store.gate.Gate`: readers see all of them or none) and APPLIED is logged. The
commit is answered only once readers can see the messages (the gate opened), which needs no
partition fsync: the redo log holds them, and until their partitions are flushed the
checkpoint keeps their records (:meth:`TxEngine.checkpoint_position`).

Every state change goes through :func:`notify.core.states.next_state`.

Local transactions (``TX:<session>:<seq>``) belong to the connection ("owner") that began them:
rolled back when it drops, and, once prepared, still rolled back when it drops or times out
unless the owner registered a producer group (a Notify *half message*, resolved by check-back).
XA transactions (``XID:...``) are associated with their owner as JTA has it: until END only the
owner may add messages to, end, prepare or commit the branch; once ENDed (or prepared, or its
owner gone) any owner may prepare, commit or roll it back; a prepared one never times out.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any, Final

from notify.core.effects import Reply
from notify.core.states import OPEN, TERMINAL, TxEvent, TxState, allowed, next_state
from notify.core.txbase import (
    BrokerTx,
    IdSource,
    RedoLog,
    TxFailure,
    TxLimits,
    TxPut,
    TxStats,
    forget_is_noop,
)
from notify.core.txrecovery import Recovery
from notify.core.txtimers import TimedWork
from notify.errors import TransactionError, TxLogError
from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.frames import Transaction
from notify.protocol.keys import is_local_key, is_xa, validate_key
from notify.protocol.replies import MultiPutAck, PutAck, encode_put_ack_body
from notify.protocol.xa import (
    XA_RBROLLBACK,
    XA_RBTIMEOUT,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMERR,
    XAER_RMFAIL,
)

__all__ = [
    "BrokerTx",
    "IdSource",
    "RedoLog",
    "TxEngine",
    "TxFailure",
    "TxLimits",
    "TxPut",
    "TxStats",
]

log = logging.getLogger("notify.tx")

#: where a one-shot transaction (BEGIN, puts, COMMIT_ONE_PHASE in one read) stands once its
#: COMMIT is written, by the transition table; a put leaves an active transaction active
ONESHOT_STATE: Final = next_state(
    next_state(next_state(TxState.NEW, TxEvent.BEGIN), TxEvent.PUT), TxEvent.COMMIT_ONE_PHASE
)
assert next_state(TxState.ACTIVE, TxEvent.PUT) is TxState.ACTIVE


class TxEngine(Recovery, TimedWork):
    """Transactions of one broker; every method runs on the broker's one thread.

    The commands (BEGIN, puts, one-shot transactions, END, PREPARE, COMMIT, ROLLBACK,
    RECOVER, FORGET, producer groups) are here; the steps that end a transaction in
    :mod:`notify.core.txsteps`, recovery in :mod:`notify.core.txrecovery`, time-driven work
    in :mod:`notify.core.txtimers`, the state and data in :mod:`notify.core.txbase`."""

    def register(self, owner: Any, group: str, opaque: int) -> None:
        """``register <group>``: this owner's prepared transactions are half messages the
        broker may check back on through any owner of the group."""
        members = self.groups.setdefault(group, [])
        if owner not in members:
            members.append(owner)
        self._owner_group[owner] = group
        self._reply(owner, opaque, 200, b"registered")

    def owner_lost(self, owner: Any) -> None:
        """The owner's connection is gone: roll back its unprepared local transactions and
        its prepared ones nobody else can resolve."""
        group = self._owner_group.pop(owner, None)
        if group is not None:
            members = self.groups.get(group)
            if members is not None and owner in members:
                members.remove(owner)
                if not members:
                    del self.groups[group]
        keys = self._owned.pop(owner, None)
        if not keys:
            return
        for key in list(keys):
            tx = self.txs.get(key)
            if tx is None or tx.owner is not owner:
                continue
            tx.owner = None
            if tx.xa:
                continue
            if tx.state in OPEN:
                self.stats.connection_rollbacks += 1
                log.info("connection lost: rolled back local transaction %s", key)
                self._rollback_now(tx, TxEvent.CONNECTION_LOST, "connection lost")
            elif tx.state is TxState.PREPARED and tx.orphanable:
                self.stats.abandoned += 1
                log.info("connection lost: rolled back prepared local transaction %s", key)
                self._rollback_now(tx, TxEvent.ABANDONED, "connection lost while prepared")

    def _tx_for_put(self, owner: Any, key: str) -> BrokerTx:
        tx = self.txs.get(key)
        if tx is None:
            raise TxFailure(XAER_NOTA, f"unknown transaction {key}: send BEGIN first")
        if tx.owner is not owner:  # XA too: only the connection that began the branch
            raise TxFailure(XAER_PROTO, f"transaction {key} belongs to another connection")
        if tx.state is TxState.ROLLED_BACK and tx.ended_reason == "timeout":
            raise TxFailure(XA_RBTIMEOUT, f"transaction {key} timed out and was rolled back")
        if tx.state is TxState.ROLLBACK_ONLY:
            raise TxFailure(XA_RBROLLBACK, f"transaction {key} can only roll back: {tx.failure}")
        if not allowed(tx.state, TxEvent.PUT):
            raise TxFailure(XAER_PROTO, f"cannot add messages to {key} in state {tx.state.value}")
        return tx

    def _add_batch(self, tx: BrokerTx, am: lr.AppendMsg) -> None:
        """Log one batch of the transaction; a refusal makes the transaction rollback-only."""
        try:
            if tx.nbytes + len(am.records) > self.limits.max_tx_size:
                raise TxFailure(
                    XAER_RMERR,
                    f"transaction {tx.key} would exceed maxTxSize {self.limits.max_tx_size}",
                )
            try:
                pos = self._log(lr.APPEND_MSG, am.encode())
            except TxLogError as e:
                raise TxFailure(XAER_RMFAIL, f"transaction log write failed: {e}") from e
        except TxFailure as e:
            tx.failure = str(e)
            if allowed(tx.state, TxEvent.FAILED):
                self._to(tx, TxEvent.FAILED)
            raise
        self._to(tx, TxEvent.PUT)
        if tx.first_pos is None:
            tx.first_pos = pos
        tx.batches.append(am)
        tx.nbytes += len(am.records)
        self.crashpoint("after_append_msg")

    def put(
        self,
        owner: Any,
        key: str,
        topic: str,
        partition: int,
        flag: int,
        body: bytes,
        crc: int,
        opaque: int,
        reply_partition: int = -1,
    ) -> None:
        """A put inside a transaction (a delayed put passes its envelope for the delay
        partition and the target partition to report in the reply)."""
        try:
            tx = self._tx_for_put(owner, key)
            msg_id = self.ids.next()
            rec = records.encode(msg_id, flag, body, crc)
            self._add_batch(tx, lr.AppendMsg(tx.key, topic, partition, 1, rec))
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        shown = partition if reply_partition < 0 else reply_partition
        self._reply(owner, opaque, 200, PutAck(msg_id, shown, -1).encode())

    def mput(
        self,
        owner: Any,
        key: str,
        topic: str,
        partition: int,
        buf: bytearray,
        count: int,
        opaque: int,
    ) -> None:
        """A batch of validated records (ids still 0) inside a transaction."""
        try:
            tx = self._tx_for_put(owner, key)
            first = self.ids.next_block(count)
            records.stamp_ids(buf, first)
            self._add_batch(tx, lr.AppendMsg(tx.key, topic, partition, count, bytes(buf)))
        except TxFailure as e:
            return self._fail(owner, opaque, e)
        self._reply(owner, opaque, 200, MultiPutAck(first, partition, -1, count).encode())

    def oneshot(
        self, owner: Any, begin: Transaction, puts: list[TxPut], commit: Transaction
    ) -> bool:
        """BEGIN, ``puts`` and COMMIT_ONE_PHASE of one local transaction that arrived
        together (one read): handled as one unit with the same replies, states and redo
        records as one by one, but the APPEND_MSG records and the COMMIT go to the redo log
        in one write. False (nothing changed, nothing answered) when the shape is not the
        plain one (unknown or reused key, capacity reached, over ``maxTxSize``, a
        ``msgs=<n>`` mismatch, a failing log write): the shell then runs the requests one
        by one, which gives the usual errors."""
        key = begin.tx_key
        if key is None or commit.tx_key != key or not puts:
            return False
        limits = self.limits
        if not is_local_key(key) or key in self.txs or len(self._timers) >= limits.capacity:
            return False  # (an XA or malformed key: one by one, for the usual answers)
        count = 0
        nbytes = 0
        for p in puts:
            if p.count:
                count += p.count
                nbytes += len(p.data)
            else:
                count += 1
                nbytes += len(p.data) + records.HEADER_SIZE
        expect = commit.expect_messages
        if nbytes > limits.max_tx_size or (expect is not None and expect != count):
            return False
        cap_s = limits.max_timeout_s
        timeout = begin.timeout
        timeout = cap_s if not timeout or timeout <= 0 else min(timeout, cap_s)
        now_ms = self._now_ms()
        # born COMMITTING: the states BEGIN, the puts and COMMIT_ONE_PHASE lead to in the
        # transition table (ONESHOT_STATE), once its COMMIT is written below
        tx = BrokerTx(
            key, False, owner, TxState.NEW, timeout, self.clock.monotonic() + timeout, now_ms
        )
        acks: list[tuple[int, int, bytes]] = [(begin.opaque, 200, b"")]
        frames: list[tuple[int, bytes]] = []
        batches = tx.batches
        hints: list[tuple[str, int, int]] = []
        store = self.store
        ids = self.ids
        for p in puts:
            topic = p.topic
            partition = p.partition
            if p.count:
                first = ids.next_block(p.count)
                records.stamp_ids(p.data, first)  # type: ignore[arg-type]
                am = lr.AppendMsg(key, topic, partition, p.count, bytes(p.data))
                ack = MultiPutAck(first, partition, -1, p.count).encode()
            else:
                msg_id = ids.next_block(1)
                am = lr.AppendMsg(
                    key, topic, partition, 1, records.encode(msg_id, p.flag, p.data, p.crc)  # type: ignore[arg-type]
                )
                ack = encode_put_ack_body(msg_id, partition, -1)
            batches.append(am)
            frames.append((lr.APPEND_MSG, am.encode()))
            acks.append((p.opaque, 200, ack))
            for h in hints:  # one per partition, in the order partitions first appear
                if h[1] == partition and h[0] == topic:
                    break
            else:
                part = store.get(topic, partition)
                hints.append((topic, partition, part.end if part is not None else 0))
        tx.nbytes = nbytes
        tx.hints = hints_t = tuple(hints)
        frames.append((lr.COMMIT, lr.Commit(key, now_ms, hints_t).encode()))
        backlog = self._backlog
        try:
            positions = self.log.append_many(backlog + frames if backlog else frames)
        except TxLogError:
            tx.hints = ()
            tx.batches = []
            return False  # nothing written: the one-by-one path reports the failure
        if backlog:
            self._backlog = []
        tx.first_pos = positions[len(backlog)]
        tx.state = ONESHOT_STATE
        self.txs[key] = tx
        self.stats.begun += 1
        self.crashpoint("after_append_msg")  # (the COMMIT is in the same write)
        pos = positions[-1]
        _pos, finish, unsure = self._committed(tx, pos)
        if self.limits.force_at_commit:  # the acks go with the COMMIT's reply, after its force
            self._await_force(owner, commit.opaque, pos, finish, unsure, acks)
        else:
            out = self.out
            for opaque, code, body in acks:
                out.append(Reply(owner, opaque, code, body))
            self._finish(owner, commit.opaque, None, finish)
        return True

    def handle(self, owner: Any, r: Transaction) -> None:
        """One ``transaction`` command."""
        t = r.type
        try:
            if t == "RECOVER":
                return self._recover_cmd(owner, r)
            if r.tx_key is None:
                raise TxFailure(XAER_INVAL, f"{t} needs a transaction key")
            try:
                key = validate_key(r.tx_key)
            except TransactionError as e:
                raise TxFailure(XAER_INVAL, str(e)) from None
            if t == "BEGIN":
                return self._begin(owner, key, r)
            tx = self.txs.get(key)
            if t == "FORGET" and forget_is_noop(key, tx):
                return self._reply(owner, r.opaque, 200)
            if tx is None:
                raise TxFailure(XAER_NOTA, f"unknown transaction {key}")
            if t != "END" and t != "PREPARE" and not getattr(owner, "admin", True):
                self._require_resolver(owner, tx, t)
            if t == "END":
                self._check_owner(tx, owner)
                self._to(tx, TxEvent.END)
                self._reply(owner, r.opaque, 200)
            elif t == "PREPARE":
                self._check(tx, TxEvent.PREPARE, owner)
                self._check_count(tx, r.expect_messages)
                self._step(owner, r.opaque, lambda: self._prepare(tx, owner))
            elif t in ("COMMIT_ONE_PHASE", "COMMIT_TWO_PHASE"):
                ev = (
                    TxEvent.COMMIT_ONE_PHASE
                    if t == "COMMIT_ONE_PHASE"
                    else TxEvent.COMMIT_TWO_PHASE
                )
                self._check(tx, ev, owner)
                if ev is TxEvent.COMMIT_ONE_PHASE:
                    self._check_count(tx, r.expect_messages)
                elif (
                    self.limits.half_early_ack
                    and tx.group
                    and not tx.xa
                    and tx.state is TxState.PREPARED
                    and (tx.owner is owner or self._owner_group.get(owner) == tx.group)
                ):  # a half message committed by its producer group (not an admin)
                    return self._commit_half(owner, r.opaque, tx)
                self._step(owner, r.opaque, lambda: self._commit(tx, ev))
            elif t == "ROLLBACK":
                self._check(tx, TxEvent.ROLLBACK, owner)
                self._step(
                    owner, r.opaque, lambda: self._rollback(tx, TxEvent.ROLLBACK, "rollback")
                )
            elif t == "FORGET":
                self._to(tx, TxEvent.FORGET)
                self._log(lr.FORGET, lr.Forget(key).encode())
                self._drop(tx)
                self._reply(owner, r.opaque, 200)
        except TxFailure as e:
            self._fail(owner, r.opaque, e)

    def _check_count(self, tx: BrokerTx, expected: int | None) -> None:
        """``msgs=<n>`` on COMMIT_ONE_PHASE/PREPARE: fewer (or more) messages recorded than
        the client wrote means a put was refused before it reached the transaction (unknown
        partition, bad checksum, too large...): the transaction becomes rollback-only, so
        the commit or prepare that follows rolls it back."""
        if expected is None or tx.message_count == expected:
            return
        if not tx.failure:
            tx.failure = (
                f"the client wrote {expected} messages, {tx.message_count} were recorded "
                "(a put was refused)"
            )
        if allowed(tx.state, TxEvent.FAILED):
            self._to(tx, TxEvent.FAILED)

    def _require_resolver(self, owner: Any, tx: BrokerTx, ttype: str) -> None:
        """Without the admin role (``adminSecret`` set, ``auth`` with ``authSecret``) an owner
        may commit or roll back only what an application may: its own transactions, any XA
        transaction (apps commit their xids from any connection), and half messages of the
        producer group it registered (check-back answers). FORGET and anything in a heuristic
        state are administrator paths."""
        if ttype == "FORGET" or tx.state in (
            TxState.HEURISTIC_COMMITTED,
            TxState.HEURISTIC_ROLLED_BACK,
        ):
            ok = False
        elif tx.xa or tx.owner is owner:
            ok = True
        else:
            ok = bool(tx.group) and self._owner_group.get(owner) == tx.group
        if not ok:
            raise TxFailure(
                XAER_PROTO, f"{ttype} of {tx.key} needs the admin role (auth with adminSecret)", 403
            )

    def _check_owner(self, tx: BrokerTx, owner: Any) -> None:
        """A local transaction is its connection's until prepared; an XA branch is
        associated with the connection that began it until END (JTA: only it may add to,
        end, prepare or commit it while active), then any connection may prepare, commit
        or roll it back (a recovering coordinator's), as it may once that one is gone."""
        if tx.owner is None or tx.owner is owner:
            return
        if tx.xa:
            if tx.state is TxState.ACTIVE:
                raise TxFailure(
                    XAER_PROTO,
                    f"XA branch {tx.key} is associated with the connection that began it "
                    "until END",
                )
        elif tx.state is not TxState.PREPARED:
            raise TxFailure(XAER_PROTO, f"transaction {tx.key} belongs to another connection")

    def _check(self, tx: BrokerTx, ev: TxEvent, owner: Any) -> None:
        if tx.state is TxState.ROLLED_BACK and tx.ended_reason == "timeout":
            raise TxFailure(XA_RBTIMEOUT, f"transaction {tx.key} timed out and was rolled back")
        if not allowed(tx.state, ev):
            raise TxFailure(XAER_PROTO, f"{ev.value} is not allowed in state {tx.state.value}")
        self._check_owner(tx, owner)

    def _begin(self, owner: Any, key: str, r: Transaction) -> None:
        old = self.txs.get(key)
        if old is not None and old.state not in TERMINAL:
            raise TxFailure(XAER_DUPID, f"transaction {key} already exists")
        cap = self.limits.capacity
        live = self._live
        if live >= cap:
            raise TxFailure(
                XAER_RMFAIL,
                f"too many open transactions ({live} >= maxTxTimeoutTimerCapacity {cap}); "
                "retry later",
                503,
            )
        cap_s = self.limits.max_timeout_s
        timeout = cap_s if not r.timeout or r.timeout <= 0 else min(r.timeout, cap_s)
        tx = BrokerTx(
            key=key,
            xa=is_xa(key),
            owner=owner,
            state=TxState.NEW,
            timeout_s=timeout,
            deadline=self.clock.monotonic() + timeout,
            created_ms=self._now_ms(),
        )
        self._to(tx, TxEvent.BEGIN)
        self.txs[key] = tx
        self._compact_timers()
        heapq.heappush(self._timers, (tx.deadline, key))
        tx.timer_live = True
        self._live += 1
        self._owned.setdefault(owner, set()).add(key)
        self.stats.begun += 1
        self._reply(owner, r.opaque, 200)

    def _recover_cmd(self, owner: Any, r: Transaction) -> None:
        uq = r.unique_qualifier
        keys = [
            tx.key
            for tx in self.txs.values()
            if tx.xa
            and tx.state is TxState.PREPARED
            and (not uq or uq == "null" or tx.key.rsplit(":", 1)[-1] == uq)
        ]
        self._reply(owner, r.opaque, 200, "\r\n".join(keys).encode())

