"""The targets in one run (the transactional outbox's too): every shape measured, one table
(shape, measured, target, met), the raw limits and the peers of the same run beside them.

    .venv/bin/python bench/targets.py             # ~3 minutes (2.6 on 2026-11-23, loaded)
    .venv/bin/python bench/targets.py --quick     # ~2 minutes
    .venv/bin/python bench/targets.py --skip-peers --skip-pg --markdown

Reuses the other benchmarks' functions (nothing measured twice in two ways):
``bench/client_e2e.py`` (client produce shapes, consume, end-to-end latency),
``bench/tx_client_bench.py`` (``with producer.transaction()`` on threads),
``bench/xa_bench.py`` (2PC broker + PostgreSQL against PostgreSQL's own PREPARE/COMMIT
PREPARED, PostgreSQL fsync on), ``bench/outbox_bench.py`` (half message + PostgreSQL
transaction against INSERT + COMMIT alone; the transactional outbox: its row's cost, commit
-> readable, the relay's drain), ``bench/broker_bench.py`` (bare fdatasync rate,
loopback copy) and ``bench/peers/`` (Redis MULTI/EXEC with ``appendfsync always``,
RabbitMQ ``tx.commit``, NATS JetStream; each skipped with a note when its server is not
installed: ``bash scripts/peers.sh install``). PostgreSQL rows are skipped when its
binaries are missing. Every server runs on 127.0.0.1 with its data in a temp dir.

Figures depend on the machine's load: the header prints the load average, and the client
CPU per message (this process) is printed where it applies; it holds better than rates
when other jobs share the cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
import uvloop  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import client_e2e as ce  # noqa: E402
from bench import outbox_bench as ob  # noqa: E402
from bench import tx_client_bench as txb  # noqa: E402
from bench import xa_bench as xb  # noqa: E402
from bench.broker_bench import raw_fsync_rate, raw_loopback_bandwidth  # noqa: E402
from bench.peers import servers  # noqa: E402
from notify.client import ClientConfig, connect  # noqa: E402
from notify.migrations import upgrade  # noqa: E402
from notify.testing import BrokerProcess  # noqa: E402
from notify.xa import (  # noqa: E402
    BrokerParticipant,
    CoordinatorConfig,
    PostgresParticipant,
    TransactionManager,
)
from tests.services import PostgresServer, fresh_database  # noqa: E402


@dataclass
class Target:
    """One line of the table."""

    shape: str
    measured: float | None  # None: not measured (skipped)
    unit: str
    target: str = ""  # what the issue asks, in words
    met: bool | None = None  # None: no target (a reference row) or not measured
    cpu_us: float | None = None  # this process's CPU per message / transaction
    note: str = ""


console = Console(width=190)


def _log(msg: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")


def _rate_row(
    shape: str,
    n: int,
    secs: float,
    cpu_s: float,
    goal: float | None,
    failed: int = 0,
    unit: str = "msg/s",
) -> Target:
    rate = n / secs if secs else 0.0
    return Target(
        shape,
        rate,
        unit,
        f">= {goal:,.0f} {unit}" if goal else "",
        (rate >= goal and not failed) if goal else None,
        cpu_s / n * 1e6 if n else None,
        f"{failed} failed" if failed else "",
    )


# ------------------------------------------------------------------------ client shapes


def version_round_trips(addr: str, count: int) -> float:
    """The floor under ``send()`` one at a time: a blocking socket writing ``version``
    and reading its reply, ``count`` times (nothing stored, no client library); seconds."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for i in range(count):
            sock.sendall(b"version %d\r\n" % (i + 1))
            if not sock.recv(4096):
                raise RuntimeError("broker closed the connection")
        return time.perf_counter() - t0


def client_rows(work: Path, count: int, one_count: int, lat_s: float) -> list[Target]:
    rows: list[Target] = []
    topics = {ce.TOPIC: 4, "lat1": 1, "lat4": 4}
    b = BrokerProcess(work / "client", topics=topics, log_level="warning")
    b.start()
    try:
        addr = b.addr
        asyncio_shapes: list[tuple[str, Callable[[], tuple[float, int]]]] = [
            (
                "asyncio post() per message",
                lambda: uvloop.run(ce.produce_posts(addr, count, 100, 50_000)),
            ),
            (
                "asyncio send_nowait() per message",
                lambda: uvloop.run(ce.produce(addr, count, 100, 50_000)),
            ),
            (
                "asyncio send_batch_nowait() x1000",
                lambda: uvloop.run(ce.produce_batches(addr, count, 100, 1000)),
            ),
        ]
        for label, fn in asyncio_shapes:
            c0 = time.process_time()
            secs, failed = fn()
            rows.append(
                _rate_row(
                    f"client produce 100 B: {label}",
                    count,
                    secs,
                    time.process_time() - c0,
                    300_000,
                    failed,
                )
            )
            _log(f"{label}: {count / secs:,.0f} msg/s")
        for mode, n, label, goal in (
            ("batch", count, "sync send_batch_future() x1000", 150_000.0),
            ("post", count, "sync post() per message", 150_000.0),
            ("future", count // 2, "sync send_future() per message", 150_000.0),
            ("one", one_count, "sync send() one at a time", 15_000.0),
        ):
            c0 = time.process_time()
            secs, failed = ce.produce_sync(addr, n, 100, mode, 1000)
            rows.append(
                _rate_row(
                    f"client produce 100 B: {label}",
                    n,
                    secs,
                    time.process_time() - c0,
                    goal,
                    failed,
                )
            )
            _log(f"{label}: {n / secs:,.0f} msg/s")
        c0 = time.process_time()
        secs = version_round_trips(addr, one_count)
        rows.append(
            _rate_row(
                "  (limit: raw `version` round trip: no library, no disk)",
                one_count,
                secs,
                time.process_time() - c0,
                None,
            )
        )
        c0 = time.process_time()
        secs = ce.raw_put_round_trips(addr, one_count, 100)
        rows.append(
            _rate_row(
                "  (limit: raw put round trip, no library)",
                one_count,
                secs,
                time.process_time() - c0,
                None,
            )
        )
        # everything produced so far is in the topic: consume the first `count` of it
        c0 = time.process_time()
        secs = uvloop.run(ce.consume(addr, count, work / "consumer"))
        rows.append(
            _rate_row(
                "client consume, every CRC checked (async listener)",
                count,
                secs,
                time.process_time() - c0,
                500_000,
            )
        )
        _log(f"consume: {count / secs:,.0f} msg/s")
        for topic in ("lat1", "lat4"):
            lat = ce.latency(addr, topic, 10_000, lat_s, 0.5, 100, work)
            p99 = ce.pct(lat, 0.99)
            ok = len(lat) == int(10_000 * lat_s) and p99 < 2.0
            parts = topic[3:]
            rows.append(
                Target(
                    f"end-to-end p99 at 10,000 msg/s, {parts} partition(s)",
                    p99,
                    "ms",
                    "< 2 ms",
                    ok,
                    note=f"p50 {ce.pct(lat, 0.5):.2f} ms, max {max(lat or [0]):.1f} ms, "
                    f"{len(lat):,} received",
                )
            )
            _log(f"e2e {topic}: p99 {p99:.2f} ms")
    finally:
        b.stop()
    return rows


# ------------------------------------------------------------------------ transactions


def tx_rows(work: Path, seconds: float, fsync_rate: float) -> tuple[list[Target], dict[int, float]]:
    """The ``with producer.transaction()`` shapes; also notify's 1-message tx/s at 1 and
    32 threads (flushTxLogAtCommit=1) for the peers' rows."""
    rows: list[Target] = []
    by_threads: dict[int, float] = {}
    for flush in (1, 2):
        b = BrokerProcess(
            work / f"tx{flush}",
            topics={txb.TOPIC: txb.PARTITIONS},
            system={"flushTxLogAtCommit": flush},
            log_level="warning",
        )
        b.start()
        try:
            with connect([b.addr], config=ClientConfig(request_timeout_s=30)) as s:
                p = s.create_producer()
                with p.transaction():
                    p.send(txb.TOPIC, b"warm-up")
                shapes = [(1, 1), (1, 8), (10, 8), (1, 32)] if flush == 1 else [(1, 1)]
                one = 0.0
                for per_tx, threads in shapes:
                    c0 = time.process_time()
                    r = txb.run(p, threads, per_tx, seconds)
                    cpu = time.process_time() - c0
                    rate = r.txs / r.seconds
                    cpu_us = cpu / r.txs * 1e6 if r.txs else None
                    note = f"p50 {r.pct(0.5):.2f} ms" + (f", {r.errors} errors" if r.errors else "")
                    shape = f"tx {per_tx} msg, flushTxLogAtCommit={flush}, {threads} thread(s)"
                    _log(f"{shape}: {rate:,.0f} tx/s")
                    if per_tx == 1 and threads in (1, 32) and flush == 1:
                        by_threads[threads] = rate
                    if flush == 2:
                        rows.append(
                            Target(shape, rate, "tx/s", ">= 8,000 tx/s", rate >= 8000, cpu_us, note)
                        )
                    elif per_tx == 10:
                        msgs = rate * 10
                        rows.append(
                            Target(
                                shape,
                                msgs,
                                "msg/s",
                                ">= 50,000 msg/s",
                                msgs >= 50_000,
                                cpu_us / 10 if cpu_us else None,
                                note,
                            )
                        )
                    elif threads == 1:
                        one = rate
                        goal = 0.6 * fsync_rate
                        rows.append(
                            Target(
                                shape,
                                rate,
                                "tx/s",
                                f">= 60% of fdatasync/s = {goal:,.0f}",
                                rate >= goal,
                                cpu_us,
                                note + f"; {rate / fsync_rate:.0%} of fdatasync/s",
                            )
                        )
                    elif threads == 8:
                        rows.append(
                            Target(
                                shape,
                                rate,
                                "tx/s",
                                f">= 4x 1 thread = {4 * one:,.0f}",
                                rate >= 4 * one,
                                cpu_us,
                                note + f"; {rate / one:.1f}x 1 thread" if one else note,
                            )
                        )
                    else:
                        rows.append(Target(shape, rate, "tx/s", "", None, cpu_us, note))
        finally:
            b.stop()
    return rows, by_threads


# ------------------------------------------------------------------------ PostgreSQL


def pg_rows(work: Path, seconds: float) -> list[Target]:
    rows: list[Target] = []
    broker = BrokerProcess(
        work / "pg-broker",
        topics={"orders": 4, ob.TOPIC: ob.PARTS},
        system={"flushTxLogAtCommit": 1},
        log_level="warning",
    )
    broker.start()
    early = BrokerProcess(  # the outbox again with halfCommitEarlyAck (README "Transactions")
        work / "pg-broker-early",
        topics={ob.TOPIC: ob.PARTS},
        system={"flushTxLogAtCommit": 1, "halfCommitEarlyAck": "true"},
        log_level="warning",
    )
    early.start()
    server = xb.DurablePostgres()
    server.start()
    try:
        url = fresh_database(server, "targets")
        dsn = "postgresql://" + url.split("://", 1)[1]
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, note TEXT)")
        upgrade(url)  # the half-message marker table (db=)
        engine = sa.create_engine(url, pool_size=20)
        pg_pid = server.pid
        assert pg_pid is not None

        def meter() -> xb.CpuMeter:
            return xb.CpuMeter(broker.pid, pg_pid)

        threads = 16
        pg = xb.bench_pg(dsn, threads, seconds, "on", meter)
        tm = TransactionManager(CoordinatorConfig(work / "xa-log", coordinator_id="targets"))
        tm.register("pg", lambda: PostgresParticipant(dsn))
        tm.register("broker", lambda: BrokerParticipant(broker.addr))
        tm.start()
        try:
            xa = xb.bench_xa(tm, threads, seconds, "on", 1 << 40, meter)
        finally:
            tm.close()
        ratio = xa.rate / pg.rate if pg.rate else 0.0
        cpu_ok = xa.cpu_ms(0) <= xa.cpu_ms(2)
        rows.append(
            Target(
                f"XA broker + PostgreSQL (fsync on), {threads} threads, vs PG 2PC alone",
                ratio * 100,
                "% of PG",
                ">= 50%, coordinator CPU/tx <= PG's",
                ratio >= 0.5 and cpu_ok,
                xa.cpu_ms(0) * 1000,
                f"{xa.rate:,.0f} vs {pg.rate:,.0f} tx/s; CPU ms/tx coordinator "
                f"{xa.cpu_ms(0):.2f}, broker {xa.cpu_ms(1):.2f}, PG {xa.cpu_ms(2):.2f}",
            )
        )
        _log(f"XA: {ratio:.0%} of PG alone")
        runs = [(t, b, how) for b, how in ((broker, ""), (early, ", early ack")) for t in (1, 8)]
        for n, (t, b, how) in enumerate(runs):
            bpid = b.pid
            assert bpid is not None

            def b_meter(bpid: int = bpid) -> xb.CpuMeter:
                return xb.CpuMeter(bpid, pg_pid)

            alone = ob.bench_pg(dsn, t, seconds, "on", (2 * n + 3) << 40, b_meter)
            half = ob.bench_half(dsn, b.addr, t, seconds, "on", (2 * n + 4) << 40, b_meter)
            r = half.rate / alone.rate if alone.rate else 0.0
            rows.append(
                Target(
                    f"outbox: half message + PG tx{how}, {t} thread(s), vs INSERT+COMMIT alone",
                    r * 100,
                    "% of PG",
                    ">= 70%",
                    r >= 0.7,
                    half.cpu_ms(0) * 1000,
                    f"{half.rate:,.0f} vs {alone.rate:,.0f} tx/s"
                    + (f", {half.errors} errors" if half.errors else ""),
                )
            )
            _log(f"outbox{how} {t} thread(s): {r:.0%} of PG alone")
            if how:
                continue
            half_db = ob.bench_half_db(engine, b.addr, t, seconds, (2 * n + 5) << 40, b_meter)
            r = half_db.rate / alone.rate if alone.rate else 0.0
            want = 0.5 if t == 1 else 0.4
            rows.append(
                Target(
                    f"half message (db=engine) + PG tx, {t} thread(s), vs INSERT+COMMIT alone",
                    r * 100,
                    "% of PG",
                    f">= {want:.0%}",
                    r >= want,
                    half_db.cpu_ms(0) * 1000,
                    f"{half_db.rate:,.0f} vs {alone.rate:,.0f} tx/s (send_in_transaction "
                    f"{half.rate:,.0f})" + (f", {half_db.errors} errors" if half_db.errors else ""),
                )
            )
            _log(f"half message db= {t} thread(s): {r:.0%} of PG alone")
        engine.dispose()
    finally:
        server.close()
        broker.stop()
        early.stop()
    return rows


def outbox_rows(seconds: float, backlog: int) -> list[Target]:
    """The transactional outbox's targets: the application's transaction with an
    outbox row against INSERT + COMMIT alone (SQLAlchemy, PostgreSQL fsync on), commit ->
    readable at 1,000 tx/s, the relay's drain of a backlog (``bench/outbox_bench.py``)."""
    opts = ob.Options(
        seconds=seconds, rounds=1, backlog=backlog, latency_s=5.0, skip_mariadb=True,
        skip_half=True,
    )  # fmt: skip
    rows: list[Target] = []
    for r in ob.run(opts):
        t = ob.target_of(r)
        kept = ("+ outbox.send", "+ outbox.send, relay draining")
        if r.section == "app tx" and r.shape not in kept:
            continue
        if r.section == "app tx":
            rows.append(
                Target(
                    f"outbox: INSERT + outbox row + COMMIT ({r.shape[2:]}), {r.threads} "
                    "thread(s), vs INSERT + COMMIT",
                    (r.ratio or 0) * 100,
                    "% of PG",
                    t[0] if t else "(reference)",
                    t[1] if t else None,
                    note=r.note,
                )
            )
        else:
            rows.append(Target(f"outbox: {r.shape}", r.value, r.unit, t[0] if t else "",
                               t[1] if t else None, note=r.note))  # fmt: skip
        _log(f"{rows[-1].shape}: {_measured(rows[-1])}")
    return rows


# ------------------------------------------------------------------------ peers


def _peer_row(peer: str, shape: str, goal: float, mine: float, rate: float) -> Target:
    """notify's transaction rate ``mine`` against a peer's ``rate`` in the same shape: met
    when at least ``goal`` times the peer's."""
    _log(f"{peer}, {shape}: {rate:,.0f} tx/s")
    return Target(
        shape,
        mine / rate if rate else None,
        f"x {peer}",
        f">= {goal:g}x",
        mine >= goal * rate if rate else None,
        note=f"notify {mine:,.0f} vs {peer} {rate:,.0f} tx/s",
    )


def peer_rows(work: Path, seconds: float, notify_tx: dict[int, float]) -> list[Target]:
    """1-message transactions with an fsync before the ack at 1 and 32 clients: Redis
    MULTI/EXEC (appendfsync always) and RabbitMQ tx.commit; NATS JetStream has no
    transactions: its js.publish (one in flight, 1 client) is a reference row."""
    rows: list[Target] = []
    servers.install_cleanup()
    try:
        if servers.have_redis():
            import redis.asyncio as aioredis  # optional client library of a peer

            from bench.peers import redis_side as rs  # optional client library of a peer

            srv = servers.RedisServer(work / "redis", "always").start()
            try:

                def make(port: int = srv.port) -> aioredis.Redis:
                    return aioredis.Redis(host="127.0.0.1", port=port)

                for n in (1, 32):
                    ops, _m, dt, _lat = uvloop.run(
                        rs._clients(make, n, seconds, rs._pipeline(1, True))
                    )
                    rows.append(
                        _peer_row(
                            "Redis",
                            f"vs Redis MULTI/EXEC appendfsync=always, 1 msg/tx, {n} client(s)",
                            1.5,
                            notify_tx.get(n, 0.0),
                            ops / dt,
                        )
                    )
            finally:
                srv.stop()
        else:
            rows.append(
                Target(
                    "vs Redis MULTI/EXEC",
                    None,
                    "",
                    ">= 1.5x",
                    None,
                    note="redis-server not installed: skipped",
                )
            )
        if servers.have_rabbitmq():
            from bench.peers import rabbit_side as rb  # optional client library of a peer

            rsrv = servers.RabbitServer(work / "rabbitmq")
            rsrv.start()
            try:
                uvloop.run(rb._setup(rsrv.port))
                for n in (1, 32):
                    ops, _m, dt, _lat = uvloop.run(
                        rb._clients(rsrv.port, n, seconds, rb._tx(1), tx=True)
                    )
                    rows.append(
                        _peer_row(
                            "RabbitMQ",
                            f"vs RabbitMQ tx.commit (persistent), 1 msg/tx, {n} client(s)",
                            2.0,
                            notify_tx.get(n, 0.0),
                            ops / dt,
                        )
                    )
            finally:
                rsrv.stop()
        else:
            rows.append(
                Target(
                    "vs RabbitMQ tx.commit",
                    None,
                    "",
                    ">= 2x",
                    None,
                    note="rabbitmq-server not installed: skipped",
                )
            )
        if servers.have_nats():
            from bench.peers import nats_side as ns  # optional client library of a peer

            nsrv = servers.NatsServer(work / "nats").start()
            try:
                url = f"nats://127.0.0.1:{nsrv.port}"
                uvloop.run(ns._setup(url))
                _o, msgs, dt, lat = uvloop.run(ns._clients(url, 1, seconds, ns._publish))
                rows.append(
                    Target(
                        "NATS JetStream js.publish, 1 in flight, 1 client (reference)",
                        msgs / dt,
                        "msg/s",
                        "",
                        None,
                        note=f"p50 {sorted(lat)[len(lat) // 2] * 1000:.2f} ms; no "
                        "transactions, acked before fsync",
                    )
                )
                _log(f"NATS publish: {msgs / dt:,.0f} msg/s")
            finally:
                nsrv.stop()
        else:
            rows.append(
                Target(
                    "NATS JetStream", None, "", "", None, note="nats-server not installed: skipped"
                )
            )
    finally:
        servers.cleanup_all()
    return rows


# ------------------------------------------------------------------------ table


def _measured(r: Target) -> str:
    if r.measured is None:
        return "—"
    if r.unit.startswith("x "):
        return f"{r.measured:.2f}{r.unit}"
    if r.unit == "ms":
        return f"{r.measured:,.2f} ms"
    if r.unit == "% of PG":
        return f"{r.measured:.0f}% of PG"
    return f"{r.measured:,.0f} {r.unit}"


def print_markdown(rows: list[Target], header: str) -> None:
    """The same table as Markdown (for README "Benchmarks")."""
    print(f"\n{header}\n")
    print("| shape | measured | target | met | client CPU µs | notes |")
    print("|---|---:|---|:---:|---:|---|")
    for r in rows:
        met = {True: "yes", False: "**no**", None: ""}[r.met]
        cpu = f"{r.cpu_us:.1f}" if r.cpu_us is not None else ""
        print(f"| {r.shape} | {_measured(r)} | {r.target} | {met} | {cpu} | {r.note} |")


def print_table(rows: list[Target], header: str) -> None:
    t = Table(title="targets, one run", caption=header)
    for col, just in (
        ("shape", "left"),
        ("measured", "right"),
        ("target", "left"),
        ("met", "center"),
        ("client CPU µs", "right"),
        ("notes", "left"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        measured = _measured(r)
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: ""}[r.met]
        cpu = f"{r.cpu_us:.1f}" if r.cpu_us is not None else ""
        t.add_row(r.shape, measured, r.target, met, cpu, r.note)
    console.print(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (~2 minutes)")
    ap.add_argument("--skip-peers", action="store_true", help="no Redis/RabbitMQ/NATS rows")
    ap.add_argument("--skip-pg", action="store_true", help="no XA / outbox rows")
    ap.add_argument("--dir", default=None, help="where servers keep data (default: temp)")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    a = ap.parse_args()
    seconds = 1.5 if a.quick else 3.0
    count = 150_000 if a.quick else 300_000
    one_count = 3_000 if a.quick else 10_000
    load0 = os.getloadavg()
    t_start = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    work = Path(tempfile.mkdtemp(prefix="notify-targets-", dir=a.dir))
    rows: list[Target] = []
    try:
        fs0 = raw_fsync_rate(work, 1.0 if a.quick else 2.0)
        lb = raw_loopback_bandwidth((512 << 20) if a.quick else (1 << 30))
        _log(f"raw: {fs0.rate:,.0f} fdatasync/s, loopback {lb.count / lb.seconds / 1e6:,.0f} MB/s")
        rows += client_rows(work, count, one_count, 2.0 if a.quick else 4.0)
        tx, notify_tx = tx_rows(work, seconds, fs0.rate)
        rows += tx
        if a.skip_pg:
            rows.append(Target("XA / outbox vs PostgreSQL", None, "", "", None, note="--skip-pg"))
        else:
            if PostgresServer.available():
                rows += pg_rows(work, seconds)
                rows += outbox_rows(seconds, 200_000 if a.quick else 1_000_000)
            else:
                rows.append(
                    Target(
                        "XA / outbox vs PostgreSQL",
                        None,
                        "",
                        "",
                        None,
                        note="PostgreSQL binaries not found: skipped",
                    )
                )
        if a.skip_peers:
            rows.append(Target("peers", None, "", "", None, note="--skip-peers"))
        else:
            rows += peer_rows(work, seconds, notify_tx)
        fs1 = raw_fsync_rate(work, 1.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = [
        Target(
            "raw: 100 B append + fdatasync (start / end of run)",
            fs0.rate,
            "ops/s",
            note=f"end {fs1.rate:,.0f} ops/s",
        ),
        Target("raw: loopback socket copy (1 MiB writes)", lb.count / lb.seconds / 1e6, "MB/s"),
    ]
    load1 = os.getloadavg()
    header = (
        f"{started}, {time.monotonic() - t_start:.0f} s{' (--quick)' if a.quick else ''}; "
        f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end, "
        f"{os.cpu_count()} CPUs; client CPU = this process per message (tx rows: per "
        "transaction)"
    )
    print_table(raw + rows, header)
    if a.markdown:
        print_markdown(raw + rows, header)
    measured = [r for r in rows if r.met is not None]
    console.print(f"targets met: {sum(bool(r.met) for r in measured)} of {len(measured)} measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
