"""The blocking client's own CPU per call, without the network's noise, A/B against another
tree (a git worktree of an older commit), alternated.

    git worktree add --detach /tmp/notify-base <commit>
    .venv/bin/python bench/client_cpu_ab.py /tmp/notify-base            # ~2 minutes

The blocking connection's ``exchange`` is replaced by canned 200 replies (every frame is
still built, every reply still parsed), so what is measured is the client's Python work
alone: ``send()`` one at a time over the caller's socket (the direct path), and a one-message
``with producer.transaction(): producer.send_future(...)`` (begin, send, commit timed
apart). Each figure is the calling thread's CPU time (``time.thread_time``) per call, the
best of five runs of ``--count`` calls with the garbage collector off, in a child process
per tree; the trees take turns, ``--rounds`` times. A broker is started only to route the
first messages. The CPU a call costs does not depend on other jobs as much as rates do;
the load average is printed anyway.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from bench.client_ab import run_child  # noqa: E402

CHILD = r"""
import gc, json, sys, tempfile, time
from pathlib import Path
tree, n = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, tree)
from notify.client import ClientConfig, connect
from notify.protocol.frames import Response
from notify.testing import BrokerProcess
try:
    from notify.client.transport import BlockingConnection
except ImportError:  # the older layout
    from notify.transport import BlockingConnection

def canned(self, builds, timeout_s=None):
    out = []
    for i, build in enumerate(builds):
        frame = build(i + 1)
        body = b"5 0 -1" if frame.startswith(b"put") else b""
        out.append(Response("result", 200, i + 1, body))
    return out

def request(self, build, timeout_s=None):
    return canned(self, [build], timeout_s)[0]

b = BrokerProcess(Path(tempfile.mkdtemp()), topics={"t": 4}, log_level="warning")
b.start()
try:
    with connect([b.addr], config=ClientConfig(request_timeout_s=30)) as s:
        p = s.create_producer()
        p.send("t", b"warm")
        with p.transaction():
            p.send("t", b"warm")
        BlockingConnection.exchange = canned
        BlockingConnection.request = request
        body = b"x" * 100
        gc.disable()
        tt = time.thread_time_ns
        best = {}
        for _ in range(5):
            t0 = tt()
            for _ in range(n):
                p.send("t", body)
            send = (tt() - t0) / n / 1000
            acc = [0, 0, 0]
            for _ in range(n):
                t0 = tt(); tx = p.begin_transaction(30); t1 = tt()
                p.send_future("t", body); t2 = tt()
                tx.commit(); t3 = tt()
                acc[0] += t1 - t0; acc[1] += t2 - t1; acc[2] += t3 - t2
            cur = {"send()": send, "tx begin": acc[0] / n / 1000,
                   "tx send_future": acc[1] / n / 1000, "tx commit": acc[2] / n / 1000}
            cur["tx total"] = cur["tx begin"] + cur["tx send_future"] + cur["tx commit"]
            for k, v in cur.items():
                best[k] = min(best.get(k, v), v)
        print(json.dumps(best))
finally:
    b.stop()
"""


def measure(tree: Path, n: int) -> dict[str, float]:
    return run_child(CHILD, [str(tree), str(n)], timeout_s=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the other tree (e.g. a git worktree of main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=4000)
    a = ap.parse_args()
    trees = {"A": HERE, "B": Path(a.base).resolve()}
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for rnd in range(a.rounds):
        print(f"round {rnd + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
        for name in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
            runs[name].append(measure(trees[name], a.count))
    print(f"A = {trees['A']}, B = {trees['B']}; end load average {os.getloadavg()[0]:.2f}")
    print(f"{'us of client CPU per call':28} {'A':>8} {'B':>8} {'A/B':>6}   runs A | runs B")
    for key in runs["A"][0]:
        va = [r[key] for r in runs["A"]]
        vb = [r[key] for r in runs["B"]]
        ma, mb = statistics.median(va), statistics.median(vb)
        print(
            f"{key:28} {ma:>8.2f} {mb:>8.2f} {ma / mb:>6.2f}   "
            f"{' '.join(f'{x:.2f}' for x in va)} | {' '.join(f'{x:.2f}' for x in vb)}"
        )


if __name__ == "__main__":
    main()
