"""Delayed messages at scale: memory for N pending and lateness of delivery.

    .venv/bin/python bench/delay_bench.py [--count 1000000] [--quick]

Pipelines N ``dput`` frames (100 B) due over a 10 s window starting 10 s after the last send,
records the broker's RSS before and with everything pending, then waits for every message to
reach its topic and reads the broker's lateness percentiles (actual move time minus due
time) from ``stats``. Pending messages are kept as 8-byte offsets in one-second buckets, not
as timer objects, which is what the RSS figure shows.
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
from broker_bench import pipelined

from notify.cli.request import request
from notify.protocol.frames import encode_dput, encode_line
from notify.protocol.replies import parse_stats
from notify.testing import BrokerProcess


def _stats(opaque: int) -> bytes:
    return encode_line("stats", opaque)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 200_000 if args.quick else args.count
    tmp = Path(tempfile.mkdtemp(prefix="notify-delaybench-"))
    b = BrokerProcess(tmp, topics={"late": 4}, log_level="warning")
    b.start()
    try:
        rss0 = rss_kb(b.pid)
        est_send_s = n / 40_000
        start = int(time.time() * 1000) + int((est_send_s + 10) * 1000)
        body = b"d" * 100
        frames = [
            encode_dput("late", i % 4, body, 0, -1, start + (i * 10_000) // n, i) for i in range(n)
        ]
        t0 = time.perf_counter()
        dt, ok = uvloop.run(pipelined((b.host, b.port), frames, 20_000))
        send_rate = ok / dt
        rss_pending = rss_kb(b.pid)
        st = dict(parse_stats(request(b.addr, _stats).body))
        pending = int(st["delay_pending"])
        while (
            int(dict(parse_stats(request(b.addr, _stats).body))["delay_moved"]) < n
        ):
            time.sleep(0.5)
            if time.perf_counter() - t0 > est_send_s * 4 + 120:
                raise SystemExit("not all delivered in time")
        st = dict(parse_stats(request(b.addr, _stats).body))
        print()
        print("| measure | value |")
        print("|---|---|")
        print(
            f"| delayed messages sent (pipelined dput, 100 B) | {ok:,} at {send_rate:,.0f} msg/s |"
        )
        print(f"| pending at peak | {pending:,} |")
        print(
            f"| broker RSS idle / with all pending | {rss0 / 1024:.0f} MiB / "
            f"{rss_pending / 1024:.0f} MiB ({(rss_pending - rss0) * 1024 / max(pending, 1):.0f} "
            "B per pending message) |"
        )
        print(
            f"| lateness p50 / p99 (move time - due time) | {st['delay_lateness_p50_ms']} ms / "
            f"{st['delay_lateness_p99_ms']} ms |"
        )
    finally:
        b.stop()


if __name__ == "__main__":
    main()
