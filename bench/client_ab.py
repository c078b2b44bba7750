"""Client speed A/B: this tree's client against another tree's (a git worktree of an older
commit), alternated in the same minutes, the broker the same for both.

    git worktree add /tmp/notify-base <commit>
    .venv/bin/python bench/client_ab.py /tmp/notify-base               # ~8 minutes
    .venv/bin/python bench/client_ab.py /tmp/notify-base --rounds 2 --quick

The shapes are ``bench/targets.py``'s client and transaction rows: the blocking ``send()``
one at a time, ``send_future()`` and ``post()`` per message, the asyncio ``post()``, the
asyncio consumer with an async listener (the messages posted first, not timed), and
``with producer.transaction()`` (1 message on 1, 8 and 32 threads and 10 messages on 8
threads with ``flushTxLogAtCommit=1``, 1 message on 1 thread with 2). Each measurement is
a child process that imports the client of one tree (``sys.path``) and runs that tree's own
``bench/client_e2e.py`` / ``bench/tx_client_bench.py`` function against a fresh broker
started from this tree's installed ``notify`` (so only the client differs); the two trees
take turns shape by shape, in A-B then B-A order each round. The table shows each tree's
median rate and client CPU per message (or transaction), their ratio, and every run's rate;
the load average is printed with each round (other jobs on the machine move rates more than
CPU times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: (label, kind, params): kind "sync" (client_e2e.produce_sync mode), "post" (asyncio
#: post), "tx" ((flush, threads, per_tx))
SHAPES: list[tuple[str, str, object]] = [
    ("sync send() one at a time", "sync", "one"),
    ("sync send_future() per message", "sync", "future"),
    ("sync post() per message", "sync", "post"),
    ("asyncio post() per message", "post", None),
    ("asyncio consume, async listener", "consume", None),
    ("tx 1 msg, flush=1, 1 thread", "tx", (1, 1, 1)),
    ("tx 1 msg, flush=1, 8 threads", "tx", (1, 8, 1)),
    ("tx 10 msg, flush=1, 8 threads", "tx", (1, 8, 10)),
    ("tx 1 msg, flush=1, 32 threads", "tx", (1, 32, 1)),
    ("tx 1 msg, flush=2, 1 thread", "tx", (2, 1, 1)),
]

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
tree, kind, param, count, one, seconds = sys.argv[1:7]
sys.path.insert(0, tree)
import uvloop
from bench import client_e2e as ce
from bench import tx_client_bench as txb
from notify.client import ClientConfig, connect
from notify.testing import BrokerProcess

work = Path(tempfile.mkdtemp(prefix="notify-ab-"))
count, one, seconds = int(count), int(one), float(seconds)
if kind == "tx":
    flush, threads, per_tx = (int(x) for x in param.split(","))
    b = BrokerProcess(work, topics={txb.TOPIC: txb.PARTITIONS},
                      system={"flushTxLogAtCommit": flush}, log_level="warning")
else:
    b = BrokerProcess(work, topics={ce.TOPIC: 4}, log_level="warning")
b.start()
try:
    c0 = time.process_time()
    if kind == "tx":
        with connect([b.addr], config=ClientConfig(request_timeout_s=30)) as s:
            p = s.create_producer()
            with p.transaction():
                p.send(txb.TOPIC, b"warm-up")
            c0 = time.process_time()
            r = txb.run(p, threads, per_tx, seconds)
            n, secs, failed = r.txs, r.seconds, r.errors
    elif kind == "post":
        n = count
        secs, failed = uvloop.run(ce.produce_posts(b.addr, n, 100, 50_000))
    elif kind == "consume":  # the messages posted first; only the consuming is measured
        n, failed = count, 0
        uvloop.run(ce.produce_posts(b.addr, n, 100, 50_000))
        c0 = time.process_time()
        secs = uvloop.run(ce.consume(b.addr, n, work / "consumer"))
    else:
        n = one if param == "one" else (count // 2 if param == "future" else count)
        secs, failed = ce.produce_sync(b.addr, n, 100, param, 1000)
    cpu = time.process_time() - c0
finally:
    b.stop()
print(json.dumps({"n": n, "secs": secs, "cpu": cpu, "failed": failed}))
"""


def run_child(code: str, args: list[str], timeout_s: float = 900) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` = ``args``, the first being the
    tree it imports the client of); the JSON object its last line of output holds."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # `-m notify` of the broker: the installed (this) tree
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=timeout_s,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}:\n{out.stderr[-3000:]}")
    r: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return r


def measure(tree: Path, kind: str, param: object, a: argparse.Namespace) -> dict[str, float]:
    p = ",".join(map(str, param)) if isinstance(param, tuple) else str(param)
    return run_child(CHILD, [str(tree), kind, p, str(a.count), str(a.one), str(a.seconds)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the other tree (e.g. a git worktree of main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller counts, shorter tx runs")
    ap.add_argument("--only", default="", help="comma-separated substrings of shape labels")
    a = ap.parse_args()
    a.count = 100_000 if a.quick else 300_000
    a.one = 3_000 if a.quick else 10_000
    a.seconds = 1.5 if a.quick else 3.0
    trees = {"A (this)": HERE, "B (base)": Path(a.base).resolve()}
    shapes = [s for s in SHAPES if not a.only or any(o in s[0] for o in a.only.split(","))]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{started}; A = {HERE}, B = {trees['B (base)']}; {os.cpu_count()} CPUs", flush=True)
    for rnd in range(a.rounds):
        print(f"round {rnd + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
        for label, kind, param in shapes:
            order = list(trees.items())
            if rnd % 2:
                order.reverse()
            for name, tree in order:
                r = measure(tree, kind, param, a)
                runs.setdefault((label, name), []).append(r)
                print(f"  {label:34} {name}: {r['n'] / r['secs']:>10,.0f}/s", flush=True)
    print(f"end: load average {os.getloadavg()[0]:.2f}")
    head = f"{'shape':34} {'A median':>10} {'B median':>10} {'A/B':>6} "
    head += f"{'A cpu us':>9} {'B cpu us':>9}   runs A | runs B"
    print(head)
    for label, _kind, _param in shapes:
        ra, rb = runs[(label, "A (this)")], runs[(label, "B (base)")]
        rate_a = [r["n"] / r["secs"] for r in ra]
        rate_b = [r["n"] / r["secs"] for r in rb]
        cpu_a = statistics.median(r["cpu"] / r["n"] * 1e6 for r in ra)
        cpu_b = statistics.median(r["cpu"] / r["n"] * 1e6 for r in rb)
        ma, mb = statistics.median(rate_a), statistics.median(rate_b)
        fails = sum(r["failed"] for r in ra + rb)
        print(
            f"{label:34} {ma:>10,.0f} {mb:>10,.0f} {ma / mb:>6.2f} {cpu_a:>9.1f} {cpu_b:>9.1f}"
            f"   {' '.join(f'{x:,.0f}' for x in rate_a)} | {' '.join(f'{x:,.0f}' for x in rate_b)}"
            + (f"  ({fails} failed)" if fails else "")
        )


if __name__ == "__main__":
    main()
