""""Update my table and publish", in one printed table: the transactional outbox
(:mod:`notify.outbox`) and the half message against the same INSERT + COMMIT in the
database alone, with PostgreSQL (fsync on) and MariaDB (flush at commit) beside the broker.

    .venv/bin/python bench/outbox_bench.py [--threads 1,8] [--seconds 4] [--rounds 3]
        [--backlog 1000000] [--rate 1000] [--skip-mariadb] [--skip-half] [--only SHAPES]

Starts its own servers (tests/services.py, with durability back on) and broker
(flushTxLogAtCommit=1), then:

* **application transaction**, rounds alternated in the same minutes, every shape on the
  same tables (emptied before each run): per transaction the application's INSERT and
  COMMIT (``alone``), the same plus ``outbox.send`` (``outbox``: the row rides in the
  COMMIT's round trip on PostgreSQL), the same with the relay draining meanwhile (``outbox
  + relay``: a ``notify outbox relay`` process), a naive extra INSERT of the same row
  (``naive``, the reference cost of a plain row), through SQLAlchemy (``engine.begin()``, the
  documented form) and through a psycopg connection; the half message + PostgreSQL
  transaction (``send_in_transaction``) against psycopg's INSERT + COMMIT as before, and
  the half message whose local transaction is the producer's own (``db=engine``:
  ``half_message(...) as conn``, no checker; its block ends once the rows and the marker
  are committed, the message's COMMIT written but its answer not awaited, and the session's
  close waits for the last answers) against the same (and SQLAlchemy's alone).
  Median tx/s of the rounds, ratio to ``alone`` of the same API and thread count.
* **commit -> readable**: 4 threads commit ``--rate`` transactions per second with an
  outbox row each; a consumer in a child process (no shared GIL) reads the topic; latency =
  its receive time - the commit's return (CLOCK_MONOTONIC, shared by the processes).
  ``bench/outbox_latency.py`` measures the same and breaks it down stage by stage.
* **relay drain**: ``--backlog`` rows (100-byte payloads, keys spread over the 4 shards)
  put in the table, then one ``notify outbox relay`` process drains them; rows/s from its
  start to an empty table (process start-up included), CPU per message of the relay,
  PostgreSQL (reaped backends included) and the broker. Checks the broker holds them all.

MariaDB (``innodb_flush_log_at_trx_commit=1``, doublewrite on): the application
transaction via SQLAlchemy and the drain (a tenth of the backlog).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.outbox_latency import consume_until, paced_writers
from bench.xa_bench import CpuMeter, DurablePostgres, Row, _cpu_s, _tree_cpu_s, run_threads
from notify.client import ConsumerConfig, LocalTxState, Message, connect
from notify.migrations import upgrade
from notify.outbox import Outbox
from notify.testing import BrokerProcess
from tests.client.test_transactions import bodies
from tests.services import MariaDBServer, PostgresServer, fresh_database

TOPIC = "outbox"
PARTS = 4
ROOT = Path(__file__).resolve().parents[1]
_SEQ = struct.Struct(">q")


# ---------------------------------------------------------------------------- servers


class DurableMariaDB(MariaDBServer):
    """The fixtures' MariaDB with the log flushed at every commit and doublewrite on."""

    def _command(self) -> list[str]:
        cmd = super()._command()
        out = [
            {
                "--innodb-flush-log-at-trx-commit=2": "--innodb-flush-log-at-trx-commit=1",
                "--innodb-doublewrite=0": "--innodb-doublewrite=1",
            }.get(a, a)
            for a in cmd
        ]
        return [*out, "--sync-binlog=0"]


def pg_cpu_s(pid: int) -> float:
    """CPU of the postmaster, its live backends and the backends it reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return _tree_cpu_s(pid) + (int(x[13]) + int(x[14])) / os.sysconf("SC_CLK_TCK")


class Meter(CpuMeter):
    """CPU of this process, the broker and the database (reaped children too)."""

    def _now(self) -> tuple[float, float, float]:
        b, p = self.pids
        return time.process_time(), _cpu_s(b), pg_cpu_s(p) if p else 0.0


# ---------------------------------------------------------------------------- shapes


def _reset(engine: Engine) -> None:
    with engine.begin() as c:
        d = engine.dialect.name
        for t in ("orders", "notify_outbox"):
            c.exec_driver_sql(f"DELETE FROM {t}" if d == "sqlite" else f"TRUNCATE TABLE {t}")


def bench_sa(
    engine: Engine,
    threads: int,
    seconds: float,
    shape: str,
    base: int,
    meter: Callable[[], CpuMeter],
) -> Row:
    """The application's transaction through SQLAlchemy: ``alone``, ``outbox`` (one
    ``outbox.send``), ``naive`` (the same row by a plain INSERT statement)."""
    outbox = Outbox(engine)
    orders = sa.table("orders", sa.column("id"), sa.column("note"))
    ins = sa.insert(orders)
    naive = sa.text(
        "INSERT INTO notify_outbox (shard, topic, khash, flag, payload) "
        "VALUES (:s, :t, :k, 0, :p)"
    )

    def setup(i: int) -> Callable[[int], None]:
        def op(k: int) -> None:
            k += base
            with engine.begin() as c:
                c.execute(ins, {"id": k, "note": "x"})
                if shape == "outbox":
                    outbox.send(c, TOPIC, b"order %d" % k, key=str(k))
                elif shape == "naive":
                    c.execute(naive, {"s": k % 4, "t": TOPIC, "k": k & 0x7FFFFFFF,
                                      "p": b"order %d" % k})  # fmt: skip

        return op

    return run_threads(Row(shape, engine.dialect.name, threads), seconds, setup, meter)


def bench_pg(
    dsn: str, threads: int, seconds: float, label: str, base: int, meter: Callable[[], CpuMeter]
) -> Row:
    """psycopg: BEGIN, the INSERT, COMMIT on a connection per thread."""
    return _bench_psycopg(dsn, threads, seconds, label, base, meter, None)


def bench_pg_outbox(
    dsn: str,
    outbox: Outbox,
    threads: int,
    seconds: float,
    base: int,
    meter: Callable[[], CpuMeter],
) -> Row:
    """psycopg: the same plus ``outbox.send`` on the connection (written at send)."""
    return _bench_psycopg(dsn, threads, seconds, "on", base, meter, outbox)


def _bench_psycopg(
    dsn: str,
    threads: int,
    seconds: float,
    label: str,
    base: int,
    meter: Callable[[], CpuMeter],
    outbox: Outbox | None,
) -> Row:
    conns: list[psycopg.Connection[tuple[object, ...]]] = []

    def setup(i: int) -> Callable[[int], None]:
        conn = psycopg.connect(dsn)
        conns.append(conn)

        def op(k: int) -> None:
            with conn.transaction():
                conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'pg alone')", (base + k,))
                if outbox is not None:
                    outbox.send(conn, TOPIC, b"order %d" % k, key=str(k))

        return op

    name = "pg alone (INSERT + COMMIT)" if outbox is None else "outbox, psycopg conn"
    row = run_threads(Row(name, label, threads), seconds, setup, meter)
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
    """A half message + the same PostgreSQL transaction (``send_in_transaction``)."""
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


def bench_half_db(
    engine: Engine,
    addr: str,
    threads: int,
    seconds: float,
    base: int,
    meter: Callable[[], CpuMeter],
) -> Row:
    """A half message whose local transaction is the producer's own (``db=engine``): the
    same INSERT in the block, the marker and COMMIT on leaving it, no checker."""
    orders = sa.table("orders", sa.column("id"), sa.column("note"))
    ins = sa.insert(orders)
    with connect([addr]) as s:
        producer = s.create_transactional_producer("outbox-bench-db", db=engine)

        def setup(i: int) -> Callable[[int], None]:
            def op(k: int) -> None:
                k += base
                with producer.half_message(TOPIC, b"order %d" % k, key=str(k)) as conn:
                    conn.execute(ins, {"id": k, "note": "half db"})

            return op

        row = run_threads(Row("half msg db=", "on", threads), seconds, setup, meter)
    return row


# ---------------------------------------------------------------------------- relay


@contextlib.contextmanager
def relay_process(url: str, addr: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``notify outbox relay`` for ``url`` in a child process (stopped with SIGTERM)."""
    cmd = [sys.executable, "-m", "notify", "outbox", "relay", "--db", url, "-s", addr]
    with open(log, "ab") as err:
        p = subprocess.Popen(
            [*cmd, "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        yield p
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def backlog(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.text("SELECT count(*) FROM notify_outbox")).scalar_one())


def wait_drained(engine: Engine, timeout_s: float, poll_s: float = 0.05) -> float:
    """Seconds until ``notify_outbox`` is empty."""
    t0 = time.monotonic()
    while backlog(engine):
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"backlog not drained in {timeout_s} s")
        time.sleep(poll_s)
    return time.monotonic() - t0


def fill_backlog(engine: Engine, n: int) -> None:
    """``n`` rows of 100-byte payloads, keys spread over the shards, in bulk (SQL)."""
    d = engine.dialect.name
    with engine.begin() as c:
        if d == "postgresql":
            c.exec_driver_sql(
                "INSERT INTO notify_outbox (shard, topic, khash, flag, payload) "
                f"SELECT (i %% 4)::int2, '{TOPIC}', (i::bigint * 40503 %% 2147483647)::int4, 0, "
                "convert_to(rpad('order ' || i, 100, 'x'), 'UTF8') "
                f"FROM generate_series(1, {n}) AS i"
            )
        else:
            step = 10_000
            for lo in range(0, n, step):
                c.exec_driver_sql(
                    "INSERT INTO notify_outbox (shard, topic, khash, flag, payload) "
                    f"SELECT MOD(seq, 4), '{TOPIC}', MOD(seq * 40503, 2147483647), 0, "
                    "RPAD(CONCAT('order ', seq), 100, 'x') "
                    f"FROM seq_{lo + 1}_to_{min(n, lo + step)}"
                )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql(
            "VACUUM ANALYZE notify_outbox" if d == "postgresql" else "ANALYZE TABLE notify_outbox"
        )


@dataclass
class Drain:
    db: str
    rows: int
    seconds: float
    cpu_relay_s: float
    cpu_db_s: float
    cpu_broker_s: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def drain(
    engine: Engine, url: str, broker: BrokerProcess, db_pid: int, n: int, work: Path
) -> Drain:
    """Fill ``n`` rows, then time one relay process draining them."""
    _reset(engine)
    fill_backlog(engine, n)
    before = len(bodies(broker.addr, TOPIC, PARTS))
    db0, b0 = pg_cpu_s(db_pid), _cpu_s(broker.pid)
    t0 = time.monotonic()
    with relay_process(url, broker.addr, work / "relay-drain.log") as p:
        wait_drained(engine, 600)
        dt = time.monotonic() - t0
        relay_cpu = _cpu_s(p.pid)
    got = len(bodies(broker.addr, TOPIC, PARTS)) - before
    if got != n:
        raise SystemExit(f"drain: {n} rows but {got} new records in the topic")
    return Drain(engine.dialect.name, n, dt, relay_cpu, pg_cpu_s(db_pid) - db0,
                 _cpu_s(broker.pid) - b0)  # fmt: skip


# ---------------------------------------------------------------------------- latency


def latency_consumer(addr: str, total: int, out: Path, data_dir: Path) -> None:
    """Child process: consume ``total`` records, then write (seq, receive ns) pairs."""
    got = array("q")
    all_in = threading.Event()

    def listener(m: Message) -> None:
        now = time.monotonic_ns()
        got.append(_SEQ.unpack_from(m.data, 0)[0])
        got.append(now)
        if len(got) >= 2 * total:
            all_in.set()

    cfg = ConsumerConfig(
        group="latency",
        data_dir=data_dir,
        initial_offset="latest",
        listener_threads=0,
        idle_backoff_min_s=0.0002,
        idle_backoff_max_s=0.001,
    )
    consume_until(addr, cfg, listener, all_in)
    out.write_bytes(got.tobytes())


def commit_to_readable(
    engine: Engine, url: str, addr: str, rate: int, seconds: float, work: Path
) -> tuple[list[float], float]:
    """Latencies (ms) at ``rate`` tx/s; and the rate achieved."""
    _reset(engine)
    total = int(rate * seconds)
    out = work / "latency.bin"
    args = [addr, str(total), str(out), str(work / "latency-consumer")]
    child = subprocess.Popen(
        [sys.executable, __file__, "--latency-consumer", *args], stdout=subprocess.PIPE
    )
    done: dict[int, int] = {}
    outbox = Outbox(engine)
    t_run = 0.0
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != b"ready":
            raise RuntimeError("latency consumer did not start")
        with relay_process(url, addr, work / "relay-latency.log"):
            time.sleep(2.0)  # the relay leads its shards
            stamps, t_run = paced_writers(engine, outbox, rate, total)
            done = {k: t1 for k, (_t0, t1) in stamps.items()}
            child.wait(150)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    pairs = array("q")
    pairs.frombytes(out.read_bytes())
    lat = [
        (pairs[i + 1] - done[pairs[i]]) / 1e6 for i in range(0, len(pairs), 2) if pairs[i] in done
    ]
    if len(lat) != total:
        raise SystemExit(f"latency: {total} committed, {len(lat)} received")
    return lat, total / t_run if t_run else 0.0


# ---------------------------------------------------------------------------- the run


@dataclass
class Result:
    """One line of the table."""

    section: str
    shape: str
    db: str
    threads: int
    value: float
    unit: str
    ratio: float | None = None
    note: str = ""
    rounds: list[float] = field(default_factory=list)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def app_rounds(
    engine: Engine,
    dsn: str | None,
    url: str,
    broker: BrokerProcess,
    db_pid: int,
    threads_list: list[int],
    seconds: float,
    rounds: int,
    work: Path,
    half: bool,
    only: set[str] | None = None,
) -> list[Result]:
    """The application-transaction shapes, alternated round after round (``only``: these
    shapes and their baselines)."""

    def meter() -> CpuMeter:
        return Meter(broker.pid, db_pid)

    db = engine.dialect.name
    shapes = ["alone", "outbox", "outbox + relay", "naive"]
    if dsn is not None:
        shapes += ["psycopg alone", "psycopg outbox"] + (["half msg + pg"] if half else [])
    shapes += ["half msg db="] if half else []
    if only:
        shapes = [x for x in shapes if x in only or x.endswith("alone")]
    runs: dict[tuple[str, int], list[Row]] = {}
    base = 1 << 40
    outbox = Outbox(engine)
    for _r in range(rounds):
        for threads in threads_list:
            for shape in shapes:
                _reset(engine)
                base += 1 << 34
                if shape == "outbox + relay":
                    with relay_process(url, broker.addr, work / "relay-app.log"):
                        time.sleep(1.5)  # leads its shards
                        row = bench_sa(engine, threads, seconds, "outbox", base, meter)
                        wait_drained(engine, 60)
                elif shape == "psycopg alone":
                    assert dsn is not None
                    row = bench_pg(dsn, threads, seconds, "on", base, meter)
                elif shape == "psycopg outbox":
                    assert dsn is not None
                    row = bench_pg_outbox(dsn, outbox, threads, seconds, base, meter)
                elif shape == "half msg + pg":
                    assert dsn is not None
                    row = bench_half(dsn, broker.addr, threads, seconds, "on", base, meter)
                elif shape == "half msg db=":
                    row = bench_half_db(engine, broker.addr, threads, seconds, base, meter)
                else:
                    row = bench_sa(engine, threads, seconds, shape, base, meter)
                if row.errors:
                    raise SystemExit(f"{shape}: {row.errors} errors")
                runs.setdefault((shape, threads), []).append(row)
                print(f"  {db} {shape:16} {threads} thr: {row.rate:7.0f} tx/s  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    out: list[Result] = []
    for (shape, threads), rows in runs.items():
        rate = statistics.median(r.rate for r in rows)
        # PostgreSQL: the half messages against psycopg's INSERT + COMMIT (the issue's
        # "PostgreSQL alone"), the db= one also against SQLAlchemy's (its own API)
        psycopg_based = shape.startswith(("psycopg", "half")) and dsn is not None
        alone_key = "psycopg alone" if psycopg_based else "alone"
        alone = statistics.median(r.rate for r in runs[(alone_key, threads)])
        versus = ""
        if shape == "half msg db=" and dsn is not None:
            sa_alone = statistics.median(r.rate for r in runs[("alone", threads)])
            versus = f"; {rate / sa_alone:.0%} of SQLAlchemy alone"
        mid = sorted(rows, key=lambda r: r.rate)[len(rows) // 2]
        label = {"alone": "INSERT + COMMIT alone (SQLAlchemy)", "outbox": "+ outbox.send",
                 "outbox + relay": "+ outbox.send, relay draining", "naive":
                 "+ naive INSERT of the row", "psycopg alone": "INSERT + COMMIT alone (psycopg)",
                 "psycopg outbox": "+ outbox.send (psycopg conn)", "half msg + pg":
                 "half message + INSERT + COMMIT", "half msg db=":
                 "half message (db=) + INSERT + COMMIT"}[shape]  # fmt: skip
        out.append(
            Result(
                "app tx",
                label,
                db,
                threads,
                rate,
                "tx/s",
                None if shape.endswith("alone") else rate / alone,
                f"p50 {mid.pct(0.5):.2f} ms; cpu ms/tx self {mid.cpu_ms(0):.2f} "
                f"db {mid.cpu_ms(2):.2f} broker {mid.cpu_ms(1):.2f}{versus}",
                [r.rate for r in rows],
            )
        )
    return out


def target_of(r: Result) -> tuple[str, bool] | None:
    """The target for ``r`` in words and whether ``r`` meets it (None: none)."""
    if r.section == "app tx" and r.db == "postgresql" and r.shape == "+ outbox.send":
        return ">= 85% of alone", (r.ratio or 0) >= 0.85
    if r.section == "app tx" and r.shape.startswith("half message (db=)"):
        want = 0.5 if r.threads == 1 else 0.4
        return f">= {want:.0%} of alone", (r.ratio or 0) >= want
    if r.section == "drain" and r.db == "postgresql":
        return ">= 50,000 msg/s", r.value >= 50_000
    if r.section == "latency" and r.shape.startswith("p50"):
        return "<= 3 ms", r.value <= 3
    if r.section == "latency" and r.shape.startswith("p99"):
        return "<= 15 ms", r.value <= 15
    return None


def print_table(results: list[Result], header: str) -> None:
    print(f"\n{header}")
    print(f"{'section':8} {'shape':38} {'db':10} {'thr':>3} {'measured':>14} {'vs alone':>8}"
          f"  {'target':12} notes")  # fmt: skip
    for r in results:
        ratio = f"{r.ratio:.0%}" if r.ratio is not None else ""
        t = target_of(r)
        target = "" if t is None else t[0].split(" of")[0] + (" ok" if t[1] else " NOT MET")
        value = f"{r.value:,.0f} {r.unit}" if r.unit != "ms" else f"{r.value:.2f} ms"
        rounds = " [" + ", ".join(f"{x:,.0f}" for x in r.rounds) + "]" if r.rounds else ""
        print(f"{r.section:8} {r.shape:38} {r.db:10} {r.threads or '':>3} {value:>14} "
              f"{ratio:>8}  {target:12} {r.note}{rounds}")  # fmt: skip


@dataclass
class Options:
    """What :func:`run` measures (the command line's options)."""

    threads: str = "1,8"
    seconds: float = 4.0
    rounds: int = 3
    backlog: int = 1_000_000
    rate: int = 1000
    latency_s: float = 10.0
    skip_mariadb: bool = False
    skip_half: bool = False
    only: str = ""


def run(a: Options | argparse.Namespace) -> list[Result]:
    work = Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    threads = [int(t) for t in a.threads.split(",")]
    results: list[Result] = []
    broker = BrokerProcess(
        work / "broker", topics={TOPIC: PARTS}, system={"flushTxLogAtCommit": 1},
        log_level="warning",
    )  # fmt: skip
    broker.start()
    servers: list[PostgresServer | MariaDBServer] = []
    try:
        pg = DurablePostgres()
        pg.start()
        servers.append(pg)
        url = fresh_database(pg, "outbox")
        upgrade(url)
        dsn = "postgresql://" + url.split("://", 1)[1]
        engine = sa.create_engine(url, pool_size=20)
        with engine.begin() as c:
            c.exec_driver_sql("CREATE TABLE orders (id BIGINT PRIMARY KEY, note TEXT)")
        assert pg.pid is not None
        only = {x.strip() for x in a.only.split(",") if x.strip()} or None
        shapes = only - {"latency"} if only else None
        if shapes or not only:
            print("PostgreSQL, application transaction:", flush=True)
            results += app_rounds(engine, dsn, url, broker, pg.pid, threads, a.seconds,
                                  a.rounds, work, not a.skip_half, shapes)  # fmt: skip
        if only and "latency" not in only:  # the chosen application shapes only
            return results
        print("PostgreSQL, commit -> readable:", flush=True)
        lat, achieved = commit_to_readable(engine, url, broker.addr, a.rate, a.latency_s, work)
        note = f"at {achieved:,.0f} tx/s, {len(lat):,} messages, max {max(lat):.1f} ms"
        results.append(Result("latency", "p50 commit -> readable", "postgresql", 4,
                              pct(lat, 0.5), "ms", note=note))  # fmt: skip
        results.append(Result("latency", "p99 commit -> readable", "postgresql", 4,
                              pct(lat, 0.99), "ms", note=note))  # fmt: skip
        if only:
            return results
        print("PostgreSQL, drain:", flush=True)
        d = drain(engine, url, broker, pg.pid, a.backlog, work)
        results.append(_drain_result(d))
        engine.dispose()
        pg.close()
        servers.remove(pg)
        if not a.skip_mariadb and MariaDBServer.available():
            my = DurableMariaDB()
            my.start()
            servers.append(my)
            murl = fresh_database(my, "outbox")
            upgrade(murl)
            mengine = sa.create_engine(murl, pool_size=20)
            with mengine.begin() as c:
                c.exec_driver_sql("CREATE TABLE orders (id BIGINT PRIMARY KEY, note TEXT)")
            assert my.pid is not None
            print("MariaDB, application transaction:", flush=True)
            results += app_rounds(mengine, None, murl, broker, my.pid, threads, a.seconds,
                                  a.rounds, work, not a.skip_half)  # fmt: skip
            print("MariaDB, drain:", flush=True)
            results.append(_drain_result(drain(mengine, murl, broker, my.pid,
                                               max(1, a.backlog // 10), work)))  # fmt: skip
            mengine.dispose()
    finally:
        for s in servers:
            s.close()
        broker.stop()
    return results


def _drain_result(d: Drain) -> Result:
    per = 1e6 / d.rows
    return Result(
        "drain",
        f"relay drains {d.rows:,} rows",
        d.db,
        0,
        d.rate,
        "msg/s",
        note=f"{d.seconds:.1f} s; cpu us/msg relay {d.cpu_relay_s * per:.1f} db "
        f"{d.cpu_db_s * per:.1f} broker {d.cpu_broker_s * per:.1f}",
    )


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--latency-consumer":
        latency_consumer(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,8", help="comma-separated thread counts")
    ap.add_argument("--seconds", type=float, default=4.0, help="per application-tx run")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    ap.add_argument("--backlog", type=int, default=1_000_000, help="rows the relay drains")
    ap.add_argument("--rate", type=int, default=1000, help="tx/s of the latency run")
    ap.add_argument("--latency-s", type=float, default=10.0, help="seconds of the latency run")
    ap.add_argument("--skip-mariadb", action="store_true")
    ap.add_argument("--skip-half", action="store_true", help="no half-message rows")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated application shapes (e.g. 'half msg + pg,half msg db='): "
        "these and their baselines on PostgreSQL, nothing else; 'latency': the commit -> "
        "readable run (bench/outbox_latency.py breaks it down stage by stage)",
    )
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()[0]
    results = run(a)
    print_table(
        results,
        f"{started}; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
        f"end, {os.cpu_count()} CPUs; PostgreSQL fsync on, MariaDB flush at commit; "
        f"median of {a.rounds} alternated rounds [each round]",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
