"""Recovery of the transaction engine from the redo log at start (and the checkpoint position
that keeps what a recovery needs; see :class:`~notify.core.transactions.TxEngine`)."""

from __future__ import annotations

import logging
from typing import Any

from notify.core.states import TERMINAL, TxEvent, TxState
from notify.core.txbase import BrokerTx, Recovered
from notify.core.txsteps import Steps
from notify.protocol import logrecords as lr
from notify.protocol.keys import is_xa
from notify.txlog import Position

log = logging.getLogger("notify.tx")


class Recovery(Steps):
    """Replay of the redo log; where a checkpoint may start."""

    def checkpoint_position(self) -> Position:
        """Where replay must start: the first record of the oldest transaction that is
        unfinished, or applied but not yet on disk in its partitions (the waiting APPLIED
        records are written first)."""
        self.write_backlog()
        unflushed = self._unflushed
        while unflushed and self.applier.durable(unflushed[0][1]):
            unflushed.popleft()
        live = [
            tx.first_pos
            for tx in self.txs.values()
            if tx.first_pos is not None
            and (
                tx.state not in TERMINAL
                or tx.state in (TxState.HEURISTIC_COMMITTED, TxState.HEURISTIC_ROLLED_BACK)
            )
        ]
        live += [pos for pos, _pl in unflushed]
        return min(live, default=self.log.end_position)

    def recover(self) -> None:
        """Replay the redo log: re-apply committed transactions whose messages are not all in
        their partitions (in commit order, at their original offsets), restore prepared
        XA transactions and half messages, roll back the rest."""
        table: dict[str, Recovered] = {}
        commit_order: list[str] = []
        for pos, rtype, body in self.log.replay():
            key = lr.key_of(body)
            ent = table.get(key)
            if ent is None:
                ent = table[key] = Recovered(pos)
            if rtype == lr.APPEND_MSG:
                ent.batches.append(lr.AppendMsg.decode(body))
            elif rtype == lr.PREPARE:
                ent.state = "prepared"
                ent.prepare = lr.Prepare.decode(body)
            elif rtype == lr.COMMIT:
                ent.state = "committed"
                ent.commit = lr.Commit.decode(body)
                commit_order.append(key)
            elif rtype == lr.APPLIED:
                ent.state = "applied"
                ent.applied = lr.Applied.decode(body)
            elif rtype == lr.ROLLBACK or rtype == lr.FORGET:
                ent.state = "done"
            elif rtype == lr.HEURISTIC:
                ent.state = "heuristic"
                ent.heuristic = lr.Heuristic.decode(body)
        now = self.clock.monotonic()
        cap_s = self.limits.max_timeout_s
        touched: set[Any] = set()
        for key in commit_order:
            ent = table[key]
            if ent.state == "committed" or (ent.state == "applied" and not self._all_present(ent)):
                tx = self._restored(key, ent, now, cap_s, TxEvent.RECOVERED_COMMITTED)
                assert ent.commit is not None
                tx.hints = self._recovery_hints(ent)
                tx.hints_exact = ent.applied is not None
                self.txs[key] = tx
                ends = self._ends(ent)
                joint = self._apply(tx, recovering=True)
                if ends != self._ends(ent):  # something had to be appended again
                    self.stats.recovered_reapplied += 1
                for pl in joint.placements if joint is not None else ():
                    part = self.store.get(pl.topic, pl.partition)
                    if part is not None:
                        touched.add(part)
        for part in touched:
            part.sync()  # re-applied messages are on disk before the log may forget them
        for key, ent in table.items():
            if ent.state == "prepared":
                assert ent.prepare is not None
                p = ent.prepare
                if not is_xa(key) and not p.group:
                    # a prepared local transaction without a producer group: its connection
                    # is gone with the restart, so nobody can ever resolve it
                    self._log(
                        lr.ROLLBACK, lr.Rollback(key, "broker restart while prepared").encode()
                    )
                    self.stats.recovered_rolled_back += 1
                    continue
                tx = self._restored(key, ent, now, cap_s, TxEvent.RECOVERED_PREPARED)
                tx.group = p.group
                tx.prepared_at_ms = p.prepared_at_ms
                tx.timeout_s = p.timeout_s
                self.txs[key] = tx
                self.stats.recovered_prepared += 1
                log.info("recovered prepared transaction %s (%d messages)", key, tx.message_count)
            elif ent.state == "heuristic":
                assert ent.heuristic is not None
                ev = (
                    TxEvent.RECOVERED_HEURISTIC_COMMIT
                    if ent.heuristic.commit
                    else TxEvent.RECOVERED_HEURISTIC_ROLLBACK
                )
                self.txs[key] = self._restored(key, ent, now, cap_s, ev)
            elif ent.state == "active":  # no decision was ever logged
                self._log(lr.ROLLBACK, lr.Rollback(key, "broker restart").encode())
                self.stats.recovered_rolled_back += 1
                log.info(
                    "rolled back unfinished transaction %s (%d messages) at restart",
                    key,
                    sum(b.count for b in ent.batches),
                )
        self.log.sync()

    def _ends(self, ent: Recovered) -> list[int]:
        ends = []
        for b in ent.batches:
            part = self.store.get(b.topic, b.partition)
            ends.append(part.end if part is not None else -1)
        return ends

    def _restored(self, key: str, ent: Recovered, now: float, cap_s: int, ev: TxEvent) -> BrokerTx:
        tx = BrokerTx(
            key=key,
            xa=is_xa(key),
            owner=None,
            state=TxState.NEW,
            timeout_s=cap_s,
            deadline=now + cap_s,
            created_ms=self._now_ms(),
            first_pos=ent.first,
            batches=ent.batches,
            nbytes=sum(len(b.records) for b in ent.batches),
        )
        self._to(tx, ev)
        return tx

    def _all_present(self, ent: Recovered) -> bool:
        """Whether every placement an APPLIED record names certainly survived the crash: it
        ends before its partition's checked start (durable before the crash; a gone or
        in-memory partition counts as present). Anything later is verified by re-applying
        with ``verify``, which matches message ids and appends only what is missing."""
        assert ent.applied is not None
        for topic, pidx, off, _n, nbytes in ent.applied.placements:
            part = self.store.get(topic, pidx)
            if part is not None and not part.memory and part.scan_start < off + nbytes:
                return False
        return True

    @staticmethod
    def _recovery_hints(ent: Recovered) -> tuple[tuple[str, int, int], ...]:
        assert ent.commit is not None
        if ent.applied is None:
            return ent.commit.hints
        # the APPLIED record knows exactly where each share went
        return tuple((t, p, off) for t, p, off, _n, _b in ent.applied.placements)

