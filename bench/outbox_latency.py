"""Commit -> readable through the outbox, broken down stage by stage (PostgreSQL).

    .venv/bin/python bench/outbox_latency.py [--rate 1000] [--seconds 10] [--repeat 3]
        [--base /path/to/older/worktree] [--variant NAME:setting=value,...]

Starts a durable PostgreSQL (fsync and synchronous_commit on) and a broker
(``flushTxLogAtCommit=1``), then per run: a consumer child process (long-polling, the
default), a relay child process (``Outbox(engine).relay(session)`` with the defaults,
as ``notify outbox relay`` runs it) and 4 writer threads committing ``--rate``
transactions per second, one outbox row each (``engine.begin()`` + ``outbox.send``).
Every process stamps CLOCK_MONOTONIC (shared), per message:

    commit    the writer's commit returned (the latency's zero)
    pickup    commit -> the relay's cycle that read the row began (how it woke: ``busy``
              after a batch, ``poll`` after an empty read's sleep, ``notify`` a writer's
              NOTIFY, ``timeout`` the NOTIFY wait ran out)
    read      that cycle's first round trip (the previous batch's DELETE and the SELECT)
    plan      the relay's Python between the read and the mput (planning, encoding)
    record    recording the batch durably (its PostgreSQL commit: a WAL flush)
    mput      the publisher's call: mput -> the broker's ack (its group commit, fsync)
    deliver   the ack -> the consumer's listener got the message (long-poll wake-up)

and prints p50/p90/p99/max per stage, the same for the slowest 1% of the messages (what
the tail is made of), how the relay woke, and GC pauses in the relay and the consumer.
The relay is instrumented from here (wrappers around its cycle, its waits and the
publisher); nothing in the product is changed for it.

``--base``: also run the same thing from another worktree (an older commit), alternated
run by run in the same minutes (A/B): each run's writers, relay and consumer import
``notify`` from their tree. ``--variant NAME:setting=value,...``: this tree again with
these RelayConfig settings, in the same rotation; ``unsafe_async_record=1`` is a what-if
(the batch's record not flushed before its send: not safe, it prices that flush).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("OUTBOX_BENCH_TREE") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

TOPIC = "outbox"
PARTS = 4
_SEQ = struct.Struct(">q")
#: environment: ``name=value,...`` RelayConfig settings of the relay child
RELAY_SET = "OUTBOX_BENCH_RELAY_SET"
#: a setting of ``--variant`` that is not RelayConfig's (see _no_flush_before_send)
UNSAFE_ASYNC_RECORD = "unsafe_async_record"
BODY = 100  # bytes of a message: its sequence number, then filler
STAGES = ("pickup", "read", "plan", "record", "mput", "deliver")


# ---------------------------------------------------------------------------- children


class GcPauses:
    """GC pauses of this process (gc.callbacks), in ms."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.monotonic_ns()
        else:
            self.pauses.append((int(info["generation"]), (time.monotonic_ns() - self._t0) / 1e6))

    def summary(self) -> dict[str, Any]:
        big = sorted((p for _g, p in self.pauses), reverse=True)
        return {"n": len(self.pauses), "over_1ms": sum(p > 1 for p in big), "max_ms": big[:3]}


def consume_until(
    addr: str, cfg: Any, listener: Callable[[Any], None], done: threading.Event
) -> None:
    """Subscribe ``listener`` to the topic with ``cfg``, print "ready" (the parent waits for
    it), then consume until ``done`` is set (120 s at most)."""
    from notify.client import MessageSessionFactory

    with MessageSessionFactory([addr]) as session:
        c = session.create_consumer(cfg)
        c.subscribe(TOPIC, listener).complete_subscribe()
        time.sleep(0.3)
        print("ready", flush=True)
        done.wait(120)
        c.shutdown()


def consumer_child(addr: str, total: int, out: Path, data_dir: Path) -> None:
    """Consume ``total`` records; write {seq: receive ns} and GC pauses as JSON."""
    from notify.client import ConsumerConfig, Message

    got: dict[int, int] = {}
    all_in = threading.Event()
    pauses = GcPauses()

    def listener(m: Message) -> None:
        got[_SEQ.unpack_from(m.data, 0)[0]] = time.monotonic_ns()
        if len(got) >= total:
            all_in.set()

    cfg = ConsumerConfig(group="latency", data_dir=data_dir, initial_offset="latest",
                         listener_threads=0)  # fmt: skip
    consume_until(addr, cfg, listener, all_in)
    out.write_text(json.dumps({"recv": got, "gc": pauses.summary()}))


def relay_child(url: str, addr: str, out: Path) -> None:
    """The relay with the defaults, its stages stamped per message, until SIGTERM."""
    import sqlalchemy as sa

    from notify.client import connect
    from notify.outbox import Outbox, RelayConfig, relaydb
    from notify.outbox import relay as relay_mod

    local = threading.local()
    stamps: dict[int, list[Any]] = {}  # seq -> [cycle start, read done, publish start, ack, wake]
    wakes: dict[str, int] = {}
    cycles: list[list[Any]] = []  # [shard, start, read done, rows, wake, wait began]
    pauses = GcPauses()

    def note_wake(kind: str, began: int) -> None:
        local.wake, local.w0 = kind, began

    orig_cycle = relaydb.ShardDB.cycle

    @contextlib.contextmanager
    def cycle(self: Any, *a: Any, **k: Any) -> Iterator[Any]:
        local.c0 = time.monotonic_ns()
        with orig_cycle(self, *a, **k) as cyc:
            yield cyc

    orig_read = relaydb.PgCycle.read

    def read(self: Any, *a: Any, **k: Any) -> Any:
        rows = orig_read(self, *a, **k)
        t = time.monotonic_ns()
        wake = getattr(local, "wake", "busy")
        local.wake, local.w0 = "busy", 0
        if rows:
            wakes[wake] = wakes.get(wake, 0) + 1
        seqs = [_SEQ.unpack_from(r[4], len(r[4]) - BODY)[0] for r in rows if r[1] == TOPIC]
        local.batch = seqs
        for s in seqs:
            stamps[s] = [local.c0, t, 0, 0, wake, self.db.shard]
        cycles.append([self.db.shard, local.c0, t, len(rows), wake, getattr(local, "w0", 0)])
        return rows

    orig_record = relaydb.PgCycle.record

    def record(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.monotonic_ns()
        got = orig_record(self, *a, **k)
        local.rec = (t0, time.monotonic_ns())
        return got

    orig_sleep = relay_mod.Relay.sleep

    def sleep(self: Any, seconds: float) -> bool:
        t = time.monotonic_ns()
        got = orig_sleep(self, seconds)
        note_wake("poll", t)
        return got

    orig_wait = relaydb.ShardDB.wait_notified

    def wait_notified(self: Any, *a: Any, **k: Any) -> bool:
        t = time.monotonic_ns()
        got = orig_wait(self, *a, **k)
        note_wake("notify" if got else "timeout", t)
        return got

    relaydb.ShardDB.cycle = cycle  # type: ignore[method-assign]
    relaydb.PgCycle.read = read  # type: ignore[method-assign]
    relaydb.PgCycle.record = record  # type: ignore[method-assign]
    relay_mod.Relay.sleep = sleep  # type: ignore[method-assign]
    relaydb.ShardDB.wait_notified = wait_notified  # type: ignore[method-assign]

    class Stamped:
        def __init__(self, inner: Any):
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def publish(self, identity: Any, batches: Any) -> Any:
            t0 = time.monotonic_ns()
            res = self.inner.publish(identity, batches)
            t1 = time.monotonic_ns()
            for s in getattr(local, "batch", ()):
                st = stamps.get(s)
                if st is not None and not st[3]:
                    st[2], st[3] = t0, t1
                    st.extend(getattr(local, "rec", (0, 0)))
            return res

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = sa.create_engine(url, pool_size=12)
    with connect([addr]) as session:
        outbox = Outbox(engine)
        sets = [kv.split("=", 1) for kv in os.environ.get(RELAY_SET, "").split(",") if kv]
        values: dict[str, Any] = {k: float(v) for k, v in sets}
        if values.pop(UNSAFE_ASYNC_RECORD, 0):
            _no_flush_before_send(relaydb)
        relay = outbox.relay(session, RelayConfig(**values))
        relay.publisher = Stamped(relay.publisher)
        with relay:
            print("ready", flush=True)
            stop.wait()
    engine.dispose()
    cpu = time.process_time()
    out.write_text(json.dumps({"stamps": stamps, "wakes": wakes, "cycles": cycles, "cpu_s": cpu,
                               "gc": pauses.summary()}))  # fmt: skip


def paced_writers(
    engine: Any, outbox: Any, rate: int, total: int, threads: int = 4
) -> tuple[dict[int, tuple[int, int]], float]:
    """``threads`` writers committing ``total`` transactions at ``rate`` per second, one
    outbox row each (body: the sequence number, then filler): {seq: (CLOCK_MONOTONIC ns
    before the transaction, after its commit returned)} and the seconds it took."""
    commit: dict[int, tuple[int, int]] = {}
    per = rate / threads
    start = time.monotonic()

    def writer(w: int) -> None:
        k, n = w, 0
        while k < total:
            delay = start + n / per - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.monotonic_ns()
            with engine.begin() as c:
                outbox.send(c, TOPIC, _SEQ.pack(k) + b"y" * (BODY - 8), key=str(k))
            commit[k] = (t0, time.monotonic_ns())
            k += threads
            n += 1

    ts = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return commit, time.monotonic() - start


def _no_flush_before_send(relaydb: Any) -> None:
    """What-if only (``unsafe_async_record=1``): the relay's connections commit without
    waiting for the WAL flush, so a batch is sent before its record is durable. NOT SAFE
    (a database crash can lose a record whose batch the broker stored); it measures what
    the flush before each send costs."""
    orig = relaydb.ShardDB._pg_conn

    def pg_conn(self: Any) -> Any:
        fresh = self._pg is None or self._pg.closed
        conn = orig(self)
        if fresh:
            conn.execute("SET synchronous_commit TO off")
        return conn

    relaydb.ShardDB._pg_conn = pg_conn


def run_child(url: str, addr: str, rate: int, seconds: float, out: Path) -> None:
    """One run from this tree: consumer, relay, writers; all stamps into ``out``."""
    import sqlalchemy as sa

    from notify.outbox import Outbox

    work = out.parent
    total = int(rate * seconds)
    engine = sa.create_engine(url, pool_size=8)
    with engine.begin() as c:
        c.exec_driver_sql("TRUNCATE TABLE notify_outbox")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUTBOX_BENCH_TREE": str(ROOT)}
    me = [sys.executable, str(Path(__file__).resolve())]
    cons_out, relay_out = work / "consumer.json", work / "relay.json"
    cons = subprocess.Popen(
        [*me, "--consumer", addr, str(total), str(cons_out), str(work / "consumer-data")],
        stdout=subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip
    relay = subprocess.Popen([*me, "--relay", url, addr, str(relay_out)],
                             stdout=subprocess.PIPE, env=env, cwd=ROOT)  # fmt: skip
    try:
        for p in (cons, relay):
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"ready":
                raise RuntimeError("a child did not start")
        time.sleep(2.0)  # the relay leads its shards
        commit, took = paced_writers(engine, Outbox(engine), rate, total)
        achieved = total / took
        cons.wait(120)
    finally:
        relay.send_signal(signal.SIGTERM)
        for p in (relay, cons):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        engine.dispose()
    c_data = json.loads(cons_out.read_text())
    r_data = json.loads(relay_out.read_text())
    out.write_text(json.dumps({"tree": str(ROOT), "sets": os.environ.get(RELAY_SET, ""),
                               "commit": commit, "achieved": achieved, "consumer": c_data,
                               "relay": r_data}))  # fmt: skip


# ---------------------------------------------------------------------------- analysis


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def breakdown(data: dict[str, Any]) -> dict[str, Any]:
    """Per message stages (ms) from one run's stamps."""
    recv = {int(k): v for k, v in data["consumer"]["recv"].items()}
    stamps = {int(k): v for k, v in data["relay"]["stamps"].items()}
    rows: list[dict[str, Any]] = []
    missing = 0
    for k, (_c0, c1) in data["commit"].items():
        k = int(k)
        r, st = recv.get(k), stamps.get(k)
        if r is None or st is None or not st[3]:
            missing += 1
            continue
        cyc, read, p0, p1, wake = st[:5]
        rec0, rec1 = st[6:8] if len(st) >= 8 else (read, p0)
        rows.append({
            "total": (r - c1) / 1e6, "pickup": (cyc - c1) / 1e6, "read": (read - cyc) / 1e6,
            "plan": (rec0 - read + p0 - rec1) / 1e6, "record": (rec1 - rec0) / 1e6,
            "mput": (p1 - p0) / 1e6, "deliver": (r - p1) / 1e6,
            "wake": wake, "commit_ms": (c1 - _c0) / 1e6,
        })  # fmt: skip
    return {"rows": rows, "missing": missing, "achieved": data["achieved"],
            "gc_relay": data["relay"]["gc"], "gc_consumer": data["consumer"]["gc"],
            "wakes": data["relay"]["wakes"], "cpu_s": data["relay"].get("cpu_s", 0.0),
            "cycles": len(data["relay"].get("cycles", ()))}  # fmt: skip


def print_breakdown(label: str, b: dict[str, Any]) -> None:
    rows = b["rows"]
    tot = [r["total"] for r in rows]
    print(f"\n{label}: {len(rows):,} messages at {b['achieved']:,.0f} tx/s"
          f" (missing stamps {b['missing']}); cycles that read rows woke by "
          f"{b['wakes']}")  # fmt: skip
    print(f"  {'stage (ms)':10} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}   "
          f"{'mean in slowest 1%':>18}")  # fmt: skip
    tail = sorted(rows, key=lambda r: r["total"])[-max(1, len(rows) // 100) :]
    for s in ("total", *STAGES, "commit_ms"):
        xs = [r[s] for r in rows]
        tm = statistics.fmean(r[s] for r in tail)
        print(f"  {s:10} {pct(xs, .5):7.2f} {pct(xs, .9):7.2f} {pct(xs, .99):7.2f} "
              f"{max(xs):7.2f}   {tm:18.2f}")  # fmt: skip
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["wake"], []).append(r["total"])
    print("  by wake-up: " + "; ".join(
        f"{w} {len(xs)} msgs p50 {pct(xs, .5):.2f} p99 {pct(xs, .99):.2f}"
        for w, xs in sorted(by.items())))  # fmt: skip
    tw: dict[str, int] = {}
    for r in tail:
        tw[r["wake"]] = tw.get(r["wake"], 0) + 1
    n = max(1, len(rows))
    print(f"  relay: {b['cycles']:,} reads, CPU {b['cpu_s'] * 1e6 / n:.0f} us per message "
          "(start-up included)")  # fmt: skip
    print(f"  slowest 1% woke by {tw}; gc relay {b['gc_relay']}, consumer {b['gc_consumer']}")
    del tot


# ---------------------------------------------------------------------------- the run


@contextlib.contextmanager
def servers(work: Path) -> Iterator[tuple[str, str]]:
    from bench.xa_bench import DurablePostgres
    from notify.migrations import upgrade
    from notify.testing import BrokerProcess
    from tests.services import fresh_database

    broker = BrokerProcess(work / "broker", topics={TOPIC: PARTS},
                           system={"flushTxLogAtCommit": 1}, log_level="warning")  # fmt: skip
    broker.start()
    pg = DurablePostgres()
    try:
        pg.start()
        url = fresh_database(pg, "outbox")
        upgrade(url)
        yield url, broker.addr
    finally:
        pg.close()
        broker.stop()


def one_run(
    tree: Path, sets: str, url: str, addr: str, rate: int, seconds: float, work: Path
) -> Any:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    out = run_dir / "run.json"
    env = {**os.environ, "PYTHONPATH": str(tree), "OUTBOX_BENCH_TREE": str(tree), RELAY_SET: sets}
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run", url, addr,
                    str(rate), str(seconds), str(out)], env=env, cwd=tree, check=True)  # fmt: skip
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    children: dict[str, Callable[..., None]] = {
        "--consumer": lambda a, n, o, d: consumer_child(a, int(n), Path(o), Path(d)),
        "--relay": lambda u, a, o: relay_child(u, a, Path(o)),
        "--run": lambda u, a, r, s, o: run_child(u, a, int(r), float(s), Path(o)),
    }
    if args and args[0] in children:
        children[args[0]](*args[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=1000, help="tx/s (4 writer threads)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tree")
    ap.add_argument("--base", type=Path, default=None, help="worktree of the older commit (A/B)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:setting=value,...: also this tree with these RelayConfig "
                    "settings (e.g. 'nowait:notify_after_s=0'); 'unsafe_async_record=1': "
                    "what-if, the batch record not flushed before the send (NOT SAFE)")  # fmt: skip
    a = ap.parse_args(args)
    trees = [("this", ROOT, "")] + ([("base", a.base.resolve(), "")] if a.base else [])
    for v in a.variant:
        name, _, sets = v.partition(":")
        trees.append((name, ROOT, sets))
    work = Path(tempfile.mkdtemp(prefix="outbox-latency-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results: list[tuple[str, str, dict[str, Any]]] = []
    with servers(work) as (url, addr):
        for i in range(a.repeat):
            for name, tree, sets in trees if i % 2 == 0 else trees[::-1]:
                load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                b = breakdown(one_run(tree, sets, url, addr, a.rate, a.seconds, work))
                tot = [r["total"] for r in b["rows"]]
                print(f"run {i + 1} {name}: p50 {pct(tot, .5):.2f} ms p99 {pct(tot, .99):.2f} "
                      f"max {max(tot):.1f}; load {load}", flush=True)  # fmt: skip
                results.append((name, load, b))
    print(
        f"\n{started}; {a.rate} tx/s, {a.seconds:g} s per run, {os.cpu_count()} CPUs; "
        "PostgreSQL fsync on, broker flushTxLogAtCommit=1"
    )
    for name, tree, sets in trees:
        mine = [(load, b) for n, load, b in results if n == name]
        p50s = [pct([r["total"] for r in b["rows"]], 0.5) for _l, b in mine]
        p99s = [pct([r["total"] for r in b["rows"]], 0.99) for _l, b in mine]
        print(f"{name} ({tree} {sets}): p50 {', '.join(f'{x:.2f}' for x in p50s)} ms; "
              f"p99 {', '.join(f'{x:.2f}' for x in p99s)} ms; loads "
              + " | ".join(load for load, _b in mine))  # fmt: skip
        for j, (load, b) in enumerate(mine):
            print_breakdown(f"{name} run {j + 1} (load {load})", b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
