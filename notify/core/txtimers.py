"""Time-driven work of the transaction engine: timeouts, half messages' check-backs, retries of
applies a partition refused, and the timer heap's compaction (see
:class:`~notify.core.transactions.TxEngine`)."""

from __future__ import annotations

import heapq
import logging

from notify.core.effects import (
    SendCheck,
)
from notify.core.states import OPEN, TxEvent, TxState
from notify.core.txbase import CHECK_TIMEOUT_S, COMPACT_SLACK, BrokerTx
from notify.core.txsteps import Steps

log = logging.getLogger("notify.tx")


class TimedWork(Steps):
    """Timeouts, check-backs, apply retries."""

    def expire(self) -> None:
        """Roll back transactions past their deadline (open ones; prepared local ones nobody
        can resolve) and forget old tombstones."""
        now = self.clock.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, key = heapq.heappop(timers)
            tx = self.txs.get(key)
            if tx is None or tx.deadline != deadline or not tx.timer_live:
                continue
            tx.timer_live = False
            self._live -= 1
            if tx.state in OPEN:
                self.stats.timed_out += 1
                log.info("transaction %s timed out after %ds: rolled back", tx.key, tx.timeout_s)
                self._rollback_now(tx, TxEvent.TIMEOUT, "timeout")
            elif tx.state is TxState.PREPARED and tx.orphanable:
                self.stats.abandoned += 1
                log.info("prepared local transaction %s timed out: rolled back", tx.key)
                self._rollback_now(tx, TxEvent.ABANDONED, "timeout")
        tomb = self._tombstones
        while tomb and tomb[0][0] <= now:
            _t, key = tomb.popleft()
            tx = self.txs.get(key)
            if tx is not None and tx.state is TxState.ROLLED_BACK:
                self._drop(tx)

    def check_backs(self) -> None:
        """Ask producers about half messages prepared longer than ``txCheckBackDelay``."""
        now = self.clock.monotonic()
        lim = self.limits
        delay = lim.check_back_delay_ms / 1000.0
        in_flight = 0
        due: list[BrokerTx] = []
        wall = self.clock.time()
        for tx in self.txs.values():
            if tx.state is not TxState.PREPARED or not tx.group:
                continue
            if tx.checking and now - tx.last_check > CHECK_TIMEOUT_S:
                tx.checking = False  # the producer did not answer: ask again later
            if tx.checking:
                in_flight += 1
                continue
            age = wall - tx.prepared_at_ms / 1000.0
            if age >= delay and now - tx.last_check >= delay:
                due.append(tx)
        for tx in due:
            if in_flight >= lim.check_back_concurrency:
                break
            if tx.checks >= lim.check_back_max_times:
                self.stats.check_back_exhausted += 1
                self.stats.exhausted.append(tx.key)
                del self.stats.exhausted[:-100]
                log.warning(
                    "half message %s: no answer after %d check-backs: rolled back",
                    tx.key,
                    tx.checks,
                )
                self._rollback_now(tx, TxEvent.CHECK_BACK_EXHAUSTED, "check-back exhausted")
                continue
            owners = self.groups.get(tx.group)
            if not owners:
                continue
            owner = owners[tx.checks % len(owners)]
            tx.checks += 1
            tx.last_check = now
            tx.checking = True
            in_flight += 1
            self.stats.check_backs_sent += 1
            first = tx.batches[0]
            self._opaque = (self._opaque + 1) & 0x7FFFFFFF
            self.out.append(
                SendCheck(owner, tx.key, first.topic, first.partition, first.records, self._opaque)
            )

    def retry_applies(self) -> None:
        """Apply committed transactions whose apply failed (a full disk) again, and the
        shares a partition refused when their gate was ready to open."""
        for tx in list(self.txs.values()):
            if tx.state is TxState.COMMITTING and tx.apply_error is not None:
                self._apply(tx)
        self._gates = [g for g in self._gates if not g.is_open]
        self.applier.retry_stalled(self._gates)

    def _compact_timers(self) -> None:
        """Drop dead heap entries once they outnumber the live ones: each pass is O(heap)
        and frees at least half of it, so it costs O(1) per transaction amortised (a
        compaction per end+begin pair at capacity cost O(capacity) each before), and the
        heap never holds more than about twice ``maxTxTimeoutTimerCapacity`` entries."""
        timers = self._timers
        if len(timers) > 2 * self._live + COMPACT_SLACK:
            self._timers = timers = [
                (d, k)
                for d, k in timers
                if (tx := self.txs.get(k)) is not None and tx.deadline == d and tx.timer_live
            ]
            heapq.heapify(timers)

