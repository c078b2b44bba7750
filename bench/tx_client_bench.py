"""Local-transaction throughput through the client API.

    .venv/bin/python bench/tx_client_bench.py [--quick] [--seconds S] [--dir DIR] [--compare]

Each worker thread loops over ``with producer.transaction(): k x producer.send_future(...)``
(the puts are pipelined; the commit waits for their acknowledgements, then
COMMIT_ONE_PHASE), all threads sharing one synchronous producer (one transaction per
thread; all transactions multiplexed on the producer's own connection). Scenarios: 1 and
10 messages of 100 B per transaction, 1 and 8 threads, one broker per
flushTxLogAtCommit 1 and 2 (``BrokerProcess(system={"flushTxLogAtCommit": n})``). Prints
transactions/s, messages/s and commit latency percentiles, and checks that every committed
message is in the partitions. The same run measures the bare 100-byte append + fdatasync
rate on the same disk (before and after) and prints each flush=1 row's ratio to it.
``--compare`` adds the 1-message rows with ``ProducerConfig(pipeline_commit=False)`` (the
COMMIT waits for the puts' acks: two round trips per transaction).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker_bench import raw_fsync_rate
from notify.client import ClientConfig, ConsumerConfig, Producer, ProducerConfig, connect
from notify.testing import BrokerProcess

TOPIC = "txbench"
PARTITIONS = 4


@dataclass
class Row:
    flush: int
    per_tx: int
    threads: int
    txs: int
    seconds: float
    errors: int
    latencies_ms: list[float] = field(default_factory=list)
    pipelined: bool = True
    client_cpu_s: float = 0.0  # this process (all threads) during the scenario
    broker_cpu_s: float = 0.0  # the broker process during the scenario

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(producer: Producer, threads: int, per_tx: int, seconds: float) -> Row:
    body = b"t" * 100
    start = threading.Barrier(threads + 1)
    deadline = 0.0
    counts = [0] * threads
    errors = [0] * threads
    lats: list[list[float]] = [[] for _ in range(threads)]

    def worker(k: int) -> None:
        start.wait()
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                with producer.transaction(timeout=30):
                    for _ in range(per_tx):
                        producer.send_future(TOPIC, body)
            except Exception:
                errors[k] += 1
                continue
            lats[k].append((time.perf_counter() - t0) * 1000)
            counts[k] += 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start.wait()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    return Row(0, per_tx, threads, sum(counts), dt, sum(errors), [x for ls in lats for x in ls])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def visible(b: BrokerProcess) -> int:
    """Messages in the topic, counted with a consumer from the start."""
    with connect([b.addr]) as s, tempfile.TemporaryDirectory() as d:
        c = s.create_consumer(ConsumerConfig(group="count", data_dir=Path(d)))
        n = 0
        while True:
            got = c.fetch(TOPIC, max_wait_s=0.3)
            if not got:
                return n
            n += len(got)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 s per scenario")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--dir", default=None, help="where the brokers keep their data")
    ap.add_argument("--compare", action="store_true", help="also without pipelined commit")
    args = ap.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    tmp = Path(tempfile.mkdtemp(prefix="notify-txclient-", dir=args.dir))
    try:
        fs0 = raw_fsync_rate(tmp, 2.0)
        rows = run_all(tmp, seconds, args.compare)
        fs1 = raw_fsync_rate(tmp, 2.0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    raw = (fs0.count / fs0.seconds, fs1.count / fs1.seconds)
    print_table(rows, raw)


def run_all(tmp: Path, seconds: float, compare: bool = False) -> list[Row]:
    rows: list[Row] = []
    for flush in (1, 2):
        b = BrokerProcess(
            tmp / f"flush{flush}",
            topics={TOPIC: PARTITIONS},
            system={"flushTxLogAtCommit": flush},
            log_level="warning",
        )
        b.start()
        try:
            committed = 0
            with connect([b.addr], config=ClientConfig(request_timeout_s=30)) as s:
                p = s.create_producer()
                with p.transaction():  # warm up: routing, connection
                    p.send(TOPIC, b"warm-up")
                committed += 1
                plain = s.create_producer(ProducerConfig(pipeline_commit=False))
                shapes = [(p, 1, 1), (p, 1, 8), (p, 10, 1), (p, 10, 8)]
                if compare:
                    shapes[2:2] = [(plain, 1, 1), (plain, 1, 8)]
                for prod, per_tx, threads in shapes:
                    c0, b0 = time.process_time(), cpu_seconds(b.pid)
                    r = run(prod, threads, per_tx, seconds)
                    r.client_cpu_s = time.process_time() - c0
                    r.broker_cpu_s = cpu_seconds(b.pid) - b0
                    r.flush = flush
                    r.pipelined = prod is p
                    rows.append(r)
                    committed += r.txs * per_tx
                    print(
                        f"flush={flush} msgs/tx={per_tx} threads={threads} "
                        f"pipelined={r.pipelined}: {r.txs / r.seconds:,.0f} tx/s",
                        file=sys.stderr,
                    )
            seen = visible(b)
            if seen != committed:
                raise SystemExit(f"flush={flush}: {committed} committed but {seen} visible")
        finally:
            b.stop()
    return rows


def print_table(rows: list[Row], raw: tuple[float, float]) -> None:
    print()
    print(
        f"bare 100 B append + fdatasync on the same disk: {raw[0]:,.0f}/s before, "
        f"{raw[1]:,.0f}/s after"
    )
    fs = min(raw)
    print(
        f"| {'flushTxLogAtCommit':>18} | {'msgs/tx':>7} | {'threads':>7} | {'commit':>9} "
        f"| {'tx/s':>8} | {'msgs/s':>8} | {'p50 ms':>7} | {'p99 ms':>7} | {'/ fsync':>7} "
        f"| {'client CPU us/tx':>16} | {'broker CPU us/tx':>16} | errors |"
    )
    print(
        f"|{'-' * 20}|{'-' * 9}|{'-' * 9}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 9}"
        f"|{'-' * 9}|{'-' * 9}|{'-' * 18}|{'-' * 18}|--------|"
    )
    for r in rows:
        tps = r.txs / r.seconds
        ratio = f"{tps / fs:.2f}" if r.flush == 1 and fs > 0 else ""
        mode = "pipelined" if r.pipelined else "after acks"
        print(
            f"| {r.flush:>18} | {r.per_tx:>7} | {r.threads:>7} | {mode:>9} | {tps:>8,.0f} "
            f"| {tps * r.per_tx:>8,.0f} | {r.pct(0.5):>7.2f} | {r.pct(0.99):>7.2f} "
            f"| {ratio:>7} | {r.client_cpu_s / max(1, r.txs) * 1e6:>16,.0f} "
            f"| {r.broker_cpu_s / max(1, r.txs) * 1e6:>16,.0f} | {r.errors:>6} |"
        )
    all_lat = [x for r in rows for x in r.latencies_ms]
    if all_lat:
        print(f"\nmedian commit latency over all scenarios: {statistics.median(all_lat):.2f} ms")


if __name__ == "__main__":
    main()
