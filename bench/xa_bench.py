"""2PC throughput: notify.xa across the broker and PostgreSQL vs PostgreSQL's own 2PC.

    .venv/bin/python bench/xa_bench.py [--threads 16] [--seconds 6] [--pg-fsync on|off|both]

Starts its own PostgreSQL (tests/services.py; max_prepared_transactions=64) and broker
(notify.testing.BrokerProcess, flushTxLogAtCommit=1), then for each PostgreSQL durability
setting measures, in the same run and with the same threads:

* ``pg alone``: per transaction BEGIN, one INSERT, PREPARE TRANSACTION, COMMIT PREPARED
  (psycopg ``tpc_*``) on a pooled connection per thread;
* ``xa pg+broker``: per transaction ``tm.transaction()`` with one INSERT and one message:
  prepare on both, the commit decision fsynced in the coordinator's log, commit on both;
* ``broker alone``: the broker's XA branch by itself (BEGIN+put, END+PREPARE, COMMIT).

``--pg-fsync off`` is how the test fixtures run PostgreSQL (fsync=off,
synchronous_commit=off); ``on`` makes its PREPARE/COMMIT PREPARED durable like the broker's
and the coordinator's writes. Prints one table (tx/s, latency p50/p99, CPU milliseconds per
transaction spent in this process, the broker and PostgreSQL, from /proc) and the ratio
``xa / pg alone``; the target is >= 50%. Everything shares the machine's cores, so when the
run is CPU-bound the ratio is roughly the ratio of the CPU columns' sums.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from notify.protocol.keys import Xid
from notify.testing import BrokerProcess
from notify.xa import (
    BrokerParticipant,
    CoordinatorConfig,
    PostgresParticipant,
    TransactionManager,
)
from tests.services import PostgresServer, fresh_database

TOPICS = {"orders": 4}


class DurablePostgres(PostgresServer):
    """The fixtures' PostgreSQL with fsync and synchronous_commit back on."""

    def _command(self) -> list[str]:
        cmd = super()._command()
        return [
            {"fsync=off": "fsync=on", "synchronous_commit=off": "synchronous_commit=on"}.get(a, a)
            for a in cmd
        ]


def _cpu_s(pid: int) -> float:
    """utime + stime of one process (seconds); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """CPU of ``root`` and its live children (PostgreSQL backends)."""
    total = _cpu_s(root)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == root:
                total += _cpu_s(int(entry))
    return total


class CpuMeter:
    """CPU seconds of this process, the broker and PostgreSQL across a measurement."""

    def __init__(self, broker_pid: int, pg_pid: int | None):
        self.pids = (broker_pid, pg_pid)
        self.start = self._now()

    def _now(self) -> tuple[float, float, float]:
        b, p = self.pids
        return time.process_time(), _cpu_s(b), _tree_cpu_s(p) if p else 0.0

    def done(self) -> tuple[float, float, float]:
        end = self._now()
        return tuple(e - s for e, s in zip(end, self.start, strict=True))  # type: ignore[return-value]


@dataclass
class Row:
    scenario: str
    pg_fsync: str
    threads: int
    txs: int = 0
    seconds: float = 0.0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)  # seconds: this process, broker, pg

    def cpu_ms(self, i: int) -> float:
        return 1000 * self.cpu[i] / self.txs if self.txs else 0.0

    @property
    def rate(self) -> float:
        return self.txs / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))] * 1000


def run_threads(
    row: Row,
    seconds: float,
    setup: Callable[[int], Callable[[int], None]],
    meter: Callable[[], CpuMeter],
) -> Row:
    """Run ``row.threads`` workers for ``seconds``; ``setup(i)`` returns the per-tx call."""
    stop = threading.Event()
    lock = threading.Lock()
    ready = threading.Barrier(row.threads + 1)

    def worker(i: int) -> None:
        op = setup(i)
        lat: list[float] = []
        n = errors = 0
        ready.wait()
        k = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                op(i * 10_000_000 + k)
                n += 1
                lat.append(time.perf_counter() - t0)
            except Exception:  # counted, the run goes on
                errors += 1
            k += 1
        with lock:
            row.txs += n
            row.errors += errors
            row.latencies.extend(lat)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(row.threads)]
    for t in threads:
        t.start()
    ready.wait()
    cpu = meter()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    row.seconds = time.perf_counter() - t0
    row.cpu = cpu.done()
    for t in threads:
        t.join()
    return row


def bench_pg(
    dsn: str, threads: int, seconds: float, label: str, meter: Callable[[], CpuMeter]
) -> Row:
    conns: list[psycopg.Connection[tuple[object, ...]]] = []

    def setup(i: int) -> Callable[[int], None]:
        conn = psycopg.connect(dsn)
        conns.append(conn)

        def op(k: int) -> None:
            conn.tpc_begin(conn.xid(1, f"pg-{k}", "b"))
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'pg alone')", (k,))
            conn.tpc_prepare()
            conn.tpc_commit()

        return op

    row = run_threads(
        Row("pg alone (PREPARE/COMMIT PREPARED)", label, threads), seconds, setup, meter
    )
    for c in conns:
        c.close()
    return row


def bench_xa(
    tm: TransactionManager,
    threads: int,
    seconds: float,
    label: str,
    base: int,
    meter: Callable[[], CpuMeter],
) -> Row:
    def setup(i: int) -> Callable[[int], None]:
        def op(k: int) -> None:
            with tm.transaction(timeout=30) as tx:
                tx.enlist("pg").execute(
                    "INSERT INTO orders (id, note) VALUES (%s, 'xa')", (base + k,)
                )
                tx.enlist("broker").send("orders", b"order %d" % k)

        return op

    return run_threads(Row("xa pg+broker (notify.xa)", label, threads), seconds, setup, meter)


def bench_broker(
    addr: str, threads: int, seconds: float, label: str, meter: Callable[[], CpuMeter]
) -> Row:
    parts: list[BrokerParticipant] = []

    def setup(i: int) -> Callable[[int], None]:
        p = BrokerParticipant(addr)
        parts.append(p)

        def op(k: int) -> None:
            xid = Xid(7, b"bench-%d" % k, b"b")
            p.start(xid, 30)
            p.send("orders", b"order %d" % k, None, None)
            p.prepare(xid)
            p.commit(xid, False)

        return op

    row = run_threads(Row("broker alone (XA branch)", label, threads), seconds, setup, meter)
    for p in parts:
        p.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pg-fsync", choices=["on", "off", "both"], default="both")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="xa-bench-"))
    broker = BrokerProcess(work / "broker", topics=TOPICS, log_level="warning")
    broker.start()
    try:
        for label in ["off", "on"] if a.pg_fsync == "both" else [a.pg_fsync]:
            server = (DurablePostgres if label == "on" else PostgresServer)()
            server.start()
            try:
                url = fresh_database(server, "bench")
                dsn = "postgresql://" + url.split("://", 1)[1]
                with psycopg.connect(dsn, autocommit=True) as c:
                    c.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, note TEXT)")
                pg_pid = server.pid
                assert pg_pid is not None

                def meter(pg_pid: int = pg_pid) -> CpuMeter:
                    return CpuMeter(broker.pid, pg_pid)

                rows.append(bench_pg(dsn, a.threads, a.seconds, label, meter))
                tm = TransactionManager(
                    CoordinatorConfig(work / f"xa-{label}", coordinator_id="bench")
                )
                tm.register("pg", lambda dsn=dsn: PostgresParticipant(dsn))  # type: ignore[misc]
                tm.register("broker", lambda: BrokerParticipant(broker.addr))
                tm.start()
                try:
                    rows.append(bench_xa(tm, a.threads, a.seconds, label, 1 << 40, meter))
                finally:
                    tm.close()
                with psycopg.connect(dsn) as c:
                    left = c.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
                    assert left is not None and left[0] == 0, "prepared transactions left"
            finally:
                server.close()
        rows.append(
            bench_broker(broker.addr, a.threads, a.seconds, "-", lambda: CpuMeter(broker.pid, None))
        )
    finally:
        broker.stop()
    if a.json:
        print(json.dumps([{**r.__dict__, "latencies": None, "rate": r.rate} for r in rows]))
        return 0
    print(f"\n{'scenario':36} {'pg fsync':>8} {'thr':>4} {'tx/s':>7} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'err':>4}  cpu ms/tx: {'self':>5} {'broker':>6} {'pg':>5}")  # fmt: skip
    for r in rows:
        print(
            f"{r.scenario:36} {r.pg_fsync:>8} {r.threads:>4} {r.rate:>7.0f} {r.pct(0.5):>7.2f} "
            f"{r.pct(0.99):>7.2f} {r.errors:>4}             {r.cpu_ms(0):>5.2f} {r.cpu_ms(1):>6.2f}"
            f" {r.cpu_ms(2):>5.2f}"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    by = {(r.scenario.split()[0], r.pg_fsync): r for r in rows}
    for label in ("off", "on"):
        pg, xa = by.get(("pg", label)), by.get(("xa", label))
        if pg and xa and pg.rate:
            print(f"xa / pg alone (pg fsync {label}): {xa.rate / pg.rate:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
