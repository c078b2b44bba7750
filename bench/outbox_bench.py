""""Update my table and publish": a half message + a local PostgreSQL transaction vs the same
INSERT + COMMIT in PostgreSQL alone (the transactional-outbox baseline; issue #16).

    .venv/bin/python bench/outbox_bench.py [--threads 1,8] [--seconds 5] [--pg-fsync on|off]
        [--early-ack]

Starts its own PostgreSQL (tests/services.py; ``--pg-fsync on``, the default, turns fsync and
synchronous_commit back on) and broker (flushTxLogAtCommit=1; ``--early-ack``:
halfCommitEarlyAck=true, the COMMIT of a half message answered before its fsync, README
"Transactions"), then with the same threads:

* ``pg alone``: per transaction BEGIN, one INSERT, COMMIT on a connection per thread (what a
  transactional outbox costs before its relay: the outbox row is that INSERT);
* ``half msg + pg``: ``producer.send_in_transaction(topic, body, local_tx)`` where
  ``local_tx`` runs the same INSERT + COMMIT on the thread's connection and answers COMMIT
  (BEGIN, put and PREPARE pipelined to the broker, the local transaction, then
  COMMIT_TWO_PHASE); the producer's checker looks the row up when the broker asks back.

Prints tx/s, latency p50/p99, CPU ms per transaction in this process, the broker and
PostgreSQL, the load average, and the ratio ``half msg + pg / pg alone`` per thread count
(target >= 70%). Checks that every committed message is in the topic.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.xa_bench import CpuMeter, DurablePostgres, Row, run_threads
from notify.client import LocalTxState, Message, connect
from notify.testing import BrokerProcess
from tests.client.test_transactions import bodies
from tests.services import PostgresServer, fresh_database

TOPIC = "outbox"
PARTS = 4


def bench_pg(
    dsn: str, threads: int, seconds: float, label: str, base: int, meter: Callable[[], CpuMeter]
) -> Row:
    conns: list[psycopg.Connection[tuple[object, ...]]] = []

    def setup(i: int) -> Callable[[int], None]:
        conn = psycopg.connect(dsn)
        conns.append(conn)

        def op(k: int) -> None:
            with conn.transaction():
                conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'pg alone')", (base + k,))

        return op

    row = run_threads(Row("pg alone (INSERT + COMMIT)", label, threads), seconds, setup, meter)
    for c in conns:
        c.close()
    return row


def bench_half(
    dsn: str,
    addr: str,
    threads: int,
    seconds: float,
    label: str,
    base: int,
    meter: Callable[[], CpuMeter],
) -> Row:
    conns: list[psycopg.Connection[tuple[object, ...]]] = []

    def checker(msg: Message) -> LocalTxState:  # asked back when the outcome is unknown
        k = int(msg.data.split()[1])
        with psycopg.connect(dsn) as c:
            found = c.execute("SELECT 1 FROM orders WHERE id = %s", (k,)).fetchone()
        return LocalTxState.COMMIT if found else LocalTxState.ROLLBACK

    with connect([addr]) as s:
        producer = s.create_transactional_producer("outbox-bench", checker)

        def setup(i: int) -> Callable[[int], None]:
            conn = psycopg.connect(dsn)
            conns.append(conn)

            def op(k: int) -> None:
                def local_tx(msg: Message) -> LocalTxState:
                    with conn.transaction():
                        conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'half')", (k,))
                    return LocalTxState.COMMIT

                r = producer.send_in_transaction(TOPIC, b"order %d" % k, local_tx, timeout=30)
                if r.error is not None or r.state is not LocalTxState.COMMIT:
                    raise RuntimeError(f"{r.state} {r.error}")

            return lambda k: op(base + k)

        row = run_threads(Row("half msg + pg (outbox)", label, threads), seconds, setup, meter)
    for c in conns:
        c.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,8", help="comma-separated thread counts")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pg-fsync", choices=["on", "off"], default="on")
    ap.add_argument("--early-ack", action="store_true", help="halfCommitEarlyAck=true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    broker = BrokerProcess(
        work / "broker",
        topics={TOPIC: PARTS},
        system={"flushTxLogAtCommit": 1, "halfCommitEarlyAck": str(a.early_ack).lower()},
        log_level="warning",
    )
    broker.start()
    server = (DurablePostgres if a.pg_fsync == "on" else PostgresServer)()
    server.start()
    half_ok = 0
    try:
        url = fresh_database(server, "outbox")
        dsn = "postgresql://" + url.split("://", 1)[1]
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, note TEXT)")
        pg_pid = server.pid
        assert pg_pid is not None

        def meter() -> CpuMeter:
            return CpuMeter(broker.pid, pg_pid)

        for n, threads in enumerate(int(t) for t in a.threads.split(",")):
            rows.append(bench_pg(dsn, threads, a.seconds, a.pg_fsync, (2 * n + 1) << 40, meter))
            half = bench_half(
                dsn, broker.addr, threads, a.seconds, a.pg_fsync, (2 * n + 2) << 40, meter
            )
            rows.append(half)
            half_ok += half.txs
        seen = len(bodies(broker.addr, TOPIC, PARTS))
        if seen != half_ok:
            raise SystemExit(f"{half_ok} half messages committed but {seen} in the topic")
    finally:
        server.close()
        broker.stop()
    print(f"\n{'scenario':28} {'pg fsync':>8} {'thr':>4} {'tx/s':>7} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'err':>4}  cpu ms/tx: {'self':>5} {'broker':>6} {'pg':>5}")  # fmt: skip
    for r in rows:
        print(
            f"{r.scenario:28} {r.pg_fsync:>8} {r.threads:>4} {r.rate:>7.0f} {r.pct(0.5):>7.2f} "
            f"{r.pct(0.99):>7.2f} {r.errors:>4}             {r.cpu_ms(0):>5.2f} {r.cpu_ms(1):>6.2f}"
            f" {r.cpu_ms(2):>5.2f}"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    for pg, half in zip(rows[::2], rows[1::2], strict=True):
        if pg.rate:
            print(f"half msg + pg / pg alone, {pg.threads} threads: {half.rate / pg.rate:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
