"""Randomized kill -9 of the broker under mixed produce / consume / transaction load.

Each iteration starts the broker (on the data of the previous iterations), runs two plain
producers, a local-transaction producer, an XA producer and a consumer against it, and
crashes it: either at a crashpoint (``NOTIFY_CRASHPOINTS``: the broker SIGKILLs itself the
first time it gets there) or by a SIGKILL at a random moment. Then it restarts the broker
and has the independent checker (``tests/faults/ledger.py``) compare what the clients were
told with what the broker serves; prepared XA transactions are resolved at random and
checked again. The store keeps growing over the iterations, so every check re-verifies all
earlier acknowledgements too.

Note: SIGKILL leaves the page cache alone, so these tests prove the broker's own ordering
(nothing acknowledged before it was written, nothing half-applied, recovery idempotent),
not the fsync ordering a power cut would test.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from notify.testing import BrokerProcess
from tests.faults import summary
from tests.faults.ledger import (
    COMMITTED,
    PREPARED,
    ROLLED_BACK,
    TOPICS,
    Ledger,
    check,
    settle,
)
from tests.faults.load import Consumer, Generator, LocalTxProducer, PlainProducer, XaProducer
from tests.helpers import WireClient, crc

pytestmark = [pytest.mark.crash, pytest.mark.slow]

CRASHPOINTS = [
    "after_append_msg",
    "after_commit_record",
    "mid_apply",
    "after_apply",
    "after_prepare_record",
]
ITERATIONS = 30 if summary.LONG else 6  # per parameter: 12 in the normal run


def _schedule(rnd: random.Random, n: int, offset: int) -> list[str]:
    """Crash methods for ``n`` iterations: crashpoints (starting at ``offset``, so the two
    parameters cover all five) in half of them, random SIGKILL timing in the rest."""
    m = len(CRASHPOINTS)
    out = [CRASHPOINTS[(offset + i // 2) % m] if i % 2 == 0 else "random" for i in range(n)]
    rnd.shuffle(out)
    return out


def _recover_list(addr: str) -> set[str]:
    with WireClient(addr) as c:
        r = c.call(b"transaction null chk RECOVER fq 1\r\n")
        assert r.code == 200, r
        return {k.decode() for k in r.body.split(b"\r\n") if k}


def _resolve_prepared(addr: str, ledger: Ledger, keys: set[str], rnd: random.Random) -> None:
    with WireClient(addr) as c:
        for key in sorted(keys):
            commit = rnd.random() < 0.5
            verb = "COMMIT_TWO_PHASE" if commit else "ROLLBACK"
            r = c.call(f"transaction {key} chk {verb} 2\r\n".encode())
            assert r.code == 200, (key, verb, r)
            ledger.tx_state(key, COMMITTED if commit else ROLLED_BACK)


def _barrier(addr: str, ledger: Ledger, tag: str) -> None:
    """One acknowledged put per partition. Under group commit its ack means an fsync that
    started after every earlier append finished, so everything appended before (records
    re-applied by recovery, transactions just committed) is visible when the check reads.
    Without it a check can catch a committed transaction whose share in one partition is
    visible and in another not yet: that window is real, but it is the group-commit
    visibility bug that tests/faults/test_visibility.py tracks, not a crash effect."""
    with WireClient(addr) as c:
        for topic, n in TOPICS.items():
            for part in range(n):
                body = b"P|barrier-%s|%d|" % (tag.encode(), part) + topic.encode()
                ledger.sent.add(body)
                r = c.call(
                    b"put %s %d %d 0 %d 7\r\n%b"
                    % (topic.encode(), part, len(body), crc(body), body)
                )
                assert r.code == 200, r
                mid, p, off = (int(x) for x in r.body.split())
                ledger.acked[body] = (topic, p, off, mid)


def _append_check(addr: str, ledger: Ledger, it: int) -> None:
    """After a restart a new put lands exactly at the end of each partition."""
    with WireClient(addr) as c:
        for topic, n in TOPICS.items():
            for part in range(n):
                ends = [
                    off + 20 + len(body)
                    for (t, p, off), (_m, body) in ledger.known.items()
                    if (t, p) == (topic, part)
                ]
                end = max(ends, default=0)
                body = b"P|restart-%d|%d|" % (it, part) + topic.encode()
                ledger.sent.add(body)
                r = c.call(
                    b"put %s %d %d 0 %d 7\r\n%b"
                    % (topic.encode(), part, len(body), crc(body), body)
                )
                assert r.code == 200, r
                mid, p, off = (int(x) for x in r.body.split())
                assert off == end, f"{topic}-{part}: new put at {off}, store ended at {end}"
                ledger.acked[body] = (topic, p, off, mid)


def _record_violations(sec: str, it: int, method: str, violations: list[str]) -> None:
    if violations:
        summary.record(
            sec,
            failed_iteration=f"{it} ({method})",
            violations=len(violations),
            losses=sum("LOST" in v for v in violations),
            duplicates=sum(v.startswith("duplicate") for v in violations),
            partial_transactions=sum("PARTLY" in v for v in violations),
            first_violations=violations[:5],
        )


@pytest.mark.parametrize("threshold", [0, 1])
def test_kill9_under_mixed_load(tmp_path: Path, threshold: int, fault_seed: int) -> None:
    rnd = random.Random(fault_seed * 10 + threshold)
    schedule = _schedule(rnd, ITERATIONS, threshold * 3)
    system = {
        "unflushThreshold": threshold,
        "maxSegmentSize": 64 * 1024,
        "flushTxLogAtCommit": rnd.choice([1, 2]),
    }
    b = BrokerProcess(tmp_path, topics=dict(TOPICS), system=system, log_level="warning")
    ledger = Ledger()
    sec = f"kill9_threshold{threshold}"
    summary.record(sec, seed=fault_seed, system=system, schedule=schedule)
    t_start = time.monotonic()
    try:
        for it, method in enumerate(schedule):
            b.env = {} if method == "random" else {"NOTIFY_CRASHPOINTS": method}
            b.start()
            stop = threading.Event()
            base = rnd.randrange(1 << 30)
            gens: list[Generator] = [
                PlainProducer(f"p{it}a", b.addr, ledger, stop, base + 1),
                PlainProducer(f"p{it}b", b.addr, ledger, stop, base + 2),
                Consumer(f"c{it}", b.addr, ledger, stop, base + 3),
            ]
            for g in gens:
                g.start()
            time.sleep(rnd.uniform(0.05, 0.4))  # plain load first, then transactions
            txg: list[Generator] = [
                LocalTxProducer(f"t{it}", b.addr, ledger, stop, base + 4, session=f"i{it}"),
                XaProducer(
                    f"x{it}",
                    b.addr,
                    ledger,
                    stop,
                    base + 5,
                    prefix=(fault_seed + threshold * 7919 + it) & 0xFFFFFFFF,
                ),
            ]
            for g in txg:
                g.start()
            gens += txg
            if method == "random":
                time.sleep(rnd.uniform(0.2, 1.2))
                b.kill()
            else:
                code = b.wait_exit(20)
                if code is None:
                    b.kill()
                    pytest.fail(f"iteration {it}: crashpoint {method} not reached in 20 s")
                assert f"crashpoint {method}" in b.log_tail(200), b.log_tail()
            stop.set()
            for g in gens:
                g.join(15)
                assert not g.is_alive(), f"load generator {g.name} did not stop"
            assert not ledger.unexpected, ledger.unexpected[:5]
            b.env = {}
            b.start()
            prepared = _recover_list(b.addr)
            _barrier(b.addr, ledger, f"{it}a")
            res = check(b.addr, ledger, prepared)
            _record_violations(sec, it, method, res.violations)
            assert not res.violations, (
                f"seed {fault_seed}, iteration {it} ({method}):\n" + "\n".join(res.violations[:20])
            )
            settle(ledger, res, prepared)
            _resolve_prepared(b.addr, ledger, prepared, rnd)
            _barrier(b.addr, ledger, f"{it}b")
            res2 = check(b.addr, ledger, set())
            _record_violations(sec, it, method, res2.violations)
            assert not res2.violations, (
                f"seed {fault_seed}, iteration {it} after resolving {len(prepared)} prepared:\n"
                + "\n".join(res2.violations[:20])
            )
            settle(ledger, res2, set())
            _append_check(b.addr, ledger, it)
            summary.add(sec, "iterations")
            summary.add(sec, "faults_injected")
            summary.add(sec, "crashpoint_kills" if method != "random" else "random_sigkills")
            summary.add(sec, "xa_prepared_resolved_after_restart", len(prepared))
            summary.record(
                sec,
                acked_messages_checked=res2.plain_checked,
                transactions_checked=res2.tx_checked,
                records_in_store=res2.records,
                messages_served_to_consumers=ledger.served,
                committed_transactions=sum(1 for t in ledger.txs.values() if t.state == COMMITTED),
                rolled_back_transactions=sum(
                    1 for t in ledger.txs.values() if t.state == ROLLED_BACK
                ),
                still_prepared=sum(1 for t in ledger.txs.values() if t.state == PREPARED),
                losses=0,
                duplicates=0,
                partial_transactions=0,
                seconds=round(time.monotonic() - t_start, 1),
            )
            b.stop()
        assert len(ledger.acked) > 500, "too little load to mean anything"
        assert sum(1 for t in ledger.txs.values() if t.state == COMMITTED) > 20
    finally:
        b.kill()
