"""How many partitions, and what do many cost? One broker, 16 vs 256 vs 1024 partitions.

    .venv/bin/python bench/partitions_bench.py             # ~2-3 minutes
    .venv/bin/python bench/partitions_bench.py --quick     # fewer messages
    .venv/bin/python bench/partitions_bench.py --partitions 16 64 --messages 50000

For each partition count a fresh broker child process (127.0.0.1, temp dir) is measured:

* start (fresh data dir) and its RSS / open fds when idle;
* produce, raw: one connection pipelining ``put`` frames round robin over all partitions
  (window 1000), with the default flush policy (unflushThreshold 1000, 10 s) and with
  group commit (unflushThreshold 0: fsync before every acknowledgement);
* produce, client library: ``AsyncProducer`` with ``RoundRobinSelector`` (per-partition
  queues batched into ``mput``), half as many messages;
* RSS / fds / files / allocated bytes after producing;
* restart time after SIGKILL (recovery scans the last segment of every partition) and
  after a clean stop.

ZooKeeper registration is per topic, not per partition (one ``numPartitions`` value per
broker), so it does not grow with the partition count and is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop

from notify.client import AsyncMessageSessionFactory, ProducerConfig, RoundRobinSelector
from notify.testing import BrokerProcess

TOPIC = "bench"


@dataclass
class Result:
    partitions: int
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- process facts


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def disk_usage(path: Path) -> tuple[int, int]:
    """(files, allocated bytes) under ``path``."""
    files = 0
    allocated = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            st = os.stat(os.path.join(root, n))
            files += 1
            allocated += st.st_blocks * 512
    return files, allocated


# ---------------------------------------------------------------------------- load


class _Pipeliner(asyncio.Protocol):
    """Writes precomputed frames with at most ``window`` in flight; counts replies by CRLF
    (put replies have exactly one)."""

    def __init__(self, frames: list[bytes], window: int, done: asyncio.Future[None]):
        self.frames, self.window, self.done = frames, window, done
        self.sent = self.replies = self.ok = 0
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._fill()

    def _fill(self) -> None:
        assert self.transport is not None
        limit = min(len(self.frames), self.replies + self.window)
        if self.sent < limit:
            self.transport.write(b"".join(self.frames[self.sent : limit]))
            self.sent = limit

    def data_received(self, data: bytes) -> None:
        buf, t = self.tail + data, self.tail
        self.replies += buf.count(b"\r\n") - t.count(b"\r\n")
        self.ok += buf.count(b"result 200 ") - t.count(b"result 200 ")
        self.tail = buf[-16:]
        if self.replies >= len(self.frames):
            if not self.done.done():
                self.done.set_result(None)
            return
        self._fill()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"lost after {self.replies}: {exc}"))


def put_frames(partitions: int, size: int, count: int, start: int = 0) -> list[bytes]:
    body = b"p" * size
    c = zlib.crc32(body) & 0x7FFFFFFF
    return [
        b"put %s %d %d 0 %d %d\r\n%b" % (TOPIC.encode(), i % partitions, size, c, i, body)
        for i in range(start, start + count)
    ]


async def pipelined(port: int, frames: list[bytes], window: int = 1000) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    t0 = time.perf_counter()
    tr, proto = await loop.create_connection(
        lambda: _Pipeliner(frames, window, done), "127.0.0.1", port
    )
    await done
    dt = time.perf_counter() - t0
    tr.close()
    if proto.ok != len(frames):
        raise RuntimeError(f"{len(frames) - proto.ok} error replies")
    return dt


async def client_produce(addr: str, partitions: int, size: int, count: int) -> float:
    body = b"c" * size
    async with AsyncMessageSessionFactory([addr], partitions={TOPIC: partitions}) as session:
        lenient = ProducerConfig(raise_on_error=False)  # failures counted, not raised
        producer = session.create_producer(lenient, RoundRobinSelector())
        await producer.send(TOPIC, body)  # connect first
        t0 = time.perf_counter()
        futs = [producer.send_nowait(TOPIC, body) for _ in range(count)]
        await producer.flush()
        dt = time.perf_counter() - t0
        failed = sum(1 for f in futs if not f.result().success)
        if failed:
            raise RuntimeError(f"{failed} client sends failed")
        return dt


# ---------------------------------------------------------------------------- scenario


def start_timed(b: BrokerProcess) -> float:
    t0 = time.perf_counter()
    b.start(timeout=120)
    return time.perf_counter() - t0


def measure(parts: int, n: int, size: int, n_group: int, rounds: int, workdir: Path) -> Result:
    res = Result(parts)
    f = res.figures
    topics = {TOPIC: parts}
    # default flush policy
    b = BrokerProcess(workdir / f"p{parts}", topics=topics, log_level="info")
    try:
        f["start_fresh_s"] = start_timed(b)
        f["rss_idle_mib"] = rss_mib(b.pid)
        f["fds_idle"] = open_fds(b.pid)
        rates = []
        for r in range(rounds):  # median of the rounds: the machine may be shared
            frames = put_frames(parts, size, n, r * n)
            rates.append(n / asyncio.run(pipelined(b.port, frames)))
        f["raw_msg_s"] = statistics.median(rates)
        dt = asyncio.run(client_produce(b.addr, parts, size, n // 2))
        f["client_msg_s"] = n // 2 / dt
        f["rss_loaded_mib"] = rss_mib(b.pid)
        f["fds_loaded"] = open_fds(b.pid)
        files, allocated = disk_usage(b.data_dir)
        f["files"] = files
        f["allocated_mib"] = allocated / (1 << 20)
        b.kill()  # SIGKILL: nothing flushed beyond the page cache, recovery on start
        f["restart_after_kill_s"] = start_timed(b)
        m = re.findall(r"(\d+) bytes scanned in recovery", b.log_tail(400))
        f["recovery_scanned_mib"] = int(m[-1]) / (1 << 20) if m else float("nan")
        b.stop()
        f["restart_clean_s"] = start_timed(b)
    finally:
        b.stop()
    # group commit: every acknowledgement waits for the fsync of its partition
    g = BrokerProcess(
        workdir / f"g{parts}",
        topics=topics,
        system={"unflushThreshold": 0},
        log_level="warning",
    )
    try:
        g.start(timeout=120)
        rates = []
        for r in range(rounds):
            frames = put_frames(parts, size, n_group, r * n_group)
            rates.append(n_group / asyncio.run(pipelined(g.port, frames)))
        f["group_commit_msg_s"] = statistics.median(rates)
    finally:
        g.stop()
    return res


COLUMNS = [
    ("partitions", "partitions", "{:.0f}"),
    ("start_fresh_s", "start s", "{:.2f}"),
    ("rss_idle_mib", "RSS idle MiB", "{:.0f}"),
    ("fds_idle", "fds idle", "{:.0f}"),
    ("raw_msg_s", "raw put msg/s", "{:,.0f}"),
    ("client_msg_s", "client msg/s", "{:,.0f}"),
    ("group_commit_msg_s", "group-commit msg/s", "{:,.0f}"),
    ("rss_loaded_mib", "RSS loaded MiB", "{:.0f}"),
    ("fds_loaded", "fds loaded", "{:.0f}"),
    ("files", "files", "{:.0f}"),
    ("allocated_mib", "disk MiB", "{:.0f}"),
    ("restart_after_kill_s", "restart kill -9 s", "{:.2f}"),
    ("recovery_scanned_mib", "scanned MiB", "{:.1f}"),
    ("restart_clean_s", "restart clean s", "{:.2f}"),
]


def table(results: list[Result]) -> str:
    rows = [[h for _k, h, _f in COLUMNS]]
    for r in results:
        vals = {"partitions": float(r.partitions), **r.figures}
        rows.append([fmt.format(vals.get(k, float("nan"))) for k, _h, fmt in COLUMNS])
    # transposed: one row per metric, one column per partition count
    width = max(len(row[0]) for row in zip(*rows, strict=True))
    lines = []
    for i, (_k, head, _f) in enumerate(COLUMNS):
        cells = [row[i] for row in rows[1:]]
        lines.append(f"{head:<{width}}  " + "  ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--group-commit-messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="raw produce rounds (median)")
    ap.add_argument("--quick", action="store_true", help="40k messages, 5k group commit, 1 round")
    args = ap.parse_args(argv)
    if args.quick:
        args.messages, args.group_commit_messages, args.rounds = 40_000, 5_000, 1
    uvloop.install()
    results = []
    with tempfile.TemporaryDirectory(prefix="notify-partitions-") as tmp:
        for p in args.partitions:
            print(f"... {p} partitions", file=sys.stderr, flush=True)
            results.append(
                measure(
                    p,
                    args.messages,
                    args.size,
                    args.group_commit_messages,
                    args.rounds,
                    Path(tmp),
                )
            )
    print(
        f"one broker, {args.messages:,} x {args.size} B puts round robin over all partitions "
        f"(group commit: {args.group_commit_messages:,}), median of {args.rounds} rounds; "
        f"client: {args.messages // 2:,} sends; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
