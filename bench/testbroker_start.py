"""How fast a broker for an application's tests starts: ``notify.testing.broker()`` (in
this process, on a thread) against a child process (``BrokerProcess``: ``python -m
notify broker start``), alternated, ``--runs`` each.

Columns: the first in-process start pays the imports of the broker's modules (a test
session's first ``notify_broker``); the next ones are what every later test pays; "first
use" adds a client's connect, one send to a topic created on first use and the stop.

    PYTHONPATH=$PWD .venv/bin/python bench/testbroker_start.py --runs 10
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from notify.testing import BrokerProcess


def first_in_process() -> float:
    """A fresh interpreter's first start (imports of the broker included)."""
    code = (
        "import time; t0 = time.perf_counter()\n"
        "from notify.testing import broker\n"
        "with broker() as b: t1 = time.perf_counter()\n"
        "print(t1 - t0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def in_process() -> tuple[float, float]:
    from notify.client import connect
    from notify.testing import broker

    t0 = time.perf_counter()
    with broker() as b:
        t1 = time.perf_counter()
        with connect([b.address]) as session:
            session.create_producer().send("created-on-first-use", b"x")
    return t1 - t0, time.perf_counter() - t0


def child_process() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        b = BrokerProcess(Path(tmp), topics={"t": 1}).start()
        took = time.perf_counter() - t0
        b.stop()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    in_process()  # imports paid once, as in a test session
    first, warm, used, child = [], [], [], []
    for _ in range(args.runs):
        first.append(first_in_process())
        s, u = in_process()
        warm.append(s)
        used.append(u)
        child.append(child_process())
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"test broker start, {args.runs} runs each, alternated; load {load}")
    print(f"{'':44} {'median ms':>10} {'max ms':>10}")
    for name, xs in (
        ("in process, first (imports included)", first),
        ("in process, later starts", warm),
        ("in process, start + send (new topic) + stop", used),
        ("child process (python -m notify broker)", child),
    ):
        print(f"{name:44} {statistics.median(xs) * 1e3:10.1f} {max(xs) * 1e3:10.1f}")


if __name__ == "__main__":
    main()
