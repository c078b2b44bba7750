"""Produce throughput with no slave, an asynchronous slave and a synchronous slave.

    .venv/bin/python bench/replication_bench.py [--quick]

One producer pipelines 100-byte puts (and, separately, mput batches of 500) to a master on
127.0.0.1; the synchronous case acknowledges only what the slave confirmed (msync). Prints
msg/s and the ratio to the no-slave run of the same kind (Kafka reports a ~50% drop with
synchronous replication).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import uvloop
from broker_bench import mput_frames, pipelined, put_frames

from notify.testing import BrokerProcess, free_port


def run_case(tmp: Path, mode: str, frames: list[bytes], per_frame: int, window: int) -> float:
    secret = {"replicationSecret": "bench-rs"}
    master = BrokerProcess(
        tmp / f"{mode}-m", topics={"bench": 1}, log_level="warning", system=secret
    )
    master.port = free_port()
    slave = None
    if mode != "none":
        slave = BrokerProcess(
            tmp / f"{mode}-s",
            topics={"bench": 1},
            log_level="warning",
            system=secret,
            slave={"slaveId": 1, "masterAddress": f"127.0.0.1:{master.port}"},
        )
        slave.start()
        if mode == "sync":
            master.system["syncSlave"] = slave.addr
    master.start()
    time.sleep(0.8)  # let the sync link connect
    try:
        dt, acked = uvloop.run(pipelined((master.host, master.port), frames, window))
        return acked * per_frame / dt
    finally:
        master.stop()
        if slave is not None:
            slave.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 100_000 if args.quick else 400_000
    tmp = Path(tempfile.mkdtemp(prefix="notify-repbench-"))
    rows = []
    for label, frames, per, window in (
        ("pipelined put, 100 B", put_frames("bench", 1, 100, n), 1, 20_000),
        ("pipelined mput x500, 100 B", mput_frames("bench", 1, 100, n * 4, 500), 500, 64),
    ):
        base = 0.0
        for mode in ("none", "async", "sync"):
            rate = run_case(tmp, mode, frames, per, window)
            base = base or rate
            rows.append((label, mode, rate, rate / base))
    print()
    print(f"| {'producer':<28} | {'slave':<6} | {'msg/s':>10} | {'vs no slave':>11} |")
    print(f"|{'-' * 30}|{'-' * 8}|{'-' * 12}|{'-' * 13}|")
    for label, mode, rate, ratio in rows:
        print(f"| {label:<28} | {mode:<6} | {rate:>10,.0f} | {ratio:>10.0%} |")


if __name__ == "__main__":
    main()
