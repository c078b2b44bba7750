"""Commit and put latency under mixed load, and what readers see: the case where a
transaction's shares wait for one another (README "Transactions": all of a committed
transaction appears at once).

    .venv/bin/python bench/tx_visibility_bench.py [--seconds 5] [--dir DIR]

One broker (group commit, ``flushTxLogAtCommit=1``, 1 MiB segments), a group-commit topic of
4 partitions and one of 2 without group commit. Three producers pipeline bursts of 1-4 plain
puts (1 B-64 KiB), three transactional clients commit 1-5 messages across both topics (BEGIN,
puts and COMMIT in one write, as the client does), two readers tail every partition and count
fractured reads (a reader served part of a transaction reaching another of its partitions'
served end without its share). Prints commit and plain-put latency percentiles (client side),
the broker's CPU per transaction, the fractured reads, and the load average. Run it from a
worktree of an older commit in the same minutes, alternated, to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.tx_client_bench import cpu_seconds
from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.testing import BrokerProcess
from tests.broker.test_tx_visibility import (
    PARTS,
    SYSTEM,
    TOPICS,
    Link,
    Reader,
    Shared,
    _messages,
    body,
    put_frame,
    reader,
)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def producer(addr: str, sh: Shared, seed: int, lat: list[float]) -> None:
    rng = random.Random(seed)
    link = await Link.open(addr)
    while not sh.stop:
        frames = [put_frame(*rng.choice(PARTS), body(rng), i) for i in range(rng.randrange(1, 5))]
        t0 = time.perf_counter()
        await link.call(frames)
        lat.append((time.perf_counter() - t0) * 1000)
        sh.plain += len(frames)
    await link.close()


async def committer(
    addr: str, sh: Shared, seed: int, lat: list[float], lat2: list[float]
) -> None:
    """Every other transaction in one write (BEGIN, puts, COMMIT: ``lat``), the others
    with the COMMIT sent once the puts are answered (``lat2``: the COMMIT's round trip;
    the readers know its messages before it is sent, so they can tell a fractured read)."""
    rng = random.Random(seed)
    name = f"c{seed}"
    link = await Link.open(addr)
    seq = 0
    while not sh.stop:
        seq += 1
        key = f"TX:{name}:{seq}"
        frames = [f"transaction {key} {name} BEGIN 30 0\r\n".encode()]
        sent = []
        for i in range(rng.randrange(1, 6)):
            t, p = rng.choice(PARTS)
            if rng.random() < 0.2:
                recs = records.encode(0, 0, rng.randbytes(rng.randrange(1, 300)))
                frames.append(encode_mput(t, p, recs, 1, i + 1, key))
            else:
                frames.append(put_frame(t, p, body(rng)[:8192], i + 1, key))
            sent.append((t, p, 1))
        commit = f"transaction {key} {name} COMMIT_ONE_PHASE msgs={len(sent)} 99\r\n"
        if seq % 2:
            t0 = time.perf_counter()
            replies = await link.call([*frames, commit.encode()])
            lat.append((time.perf_counter() - t0) * 1000)
            assert replies[-1][1] == 200, replies[-1]
            sh.register(key, _messages(sent, replies[1:-1]))
        else:
            replies = await link.call(frames)
            sh.register(key, _messages(sent, replies[1:]))
            t0 = time.perf_counter()
            ((_k, code, _o, reply),) = await link.call([commit.encode()])
            lat2.append((time.perf_counter() - t0) * 1000)
            assert code == 200, reply
        sh.committed.append(key)
    await link.close()


async def load(
    addr: str, seconds: float
) -> tuple[Shared, list[float], list[float], list[float]]:
    sh = Shared()
    sh.readers = [Reader(f"r{i}") for i in range(2)]
    put_lat: list[float] = []
    tx_lat: list[float] = []
    tx2_lat: list[float] = []
    tasks = [asyncio.create_task(producer(addr, sh, i, put_lat)) for i in range(3)]
    tasks += [
        asyncio.create_task(committer(addr, sh, 20 + i, tx_lat, tx2_lat)) for i in range(3)
    ]
    tasks += [asyncio.create_task(reader(addr, sh, rd, 30 + i)) for i, rd in enumerate(sh.readers)]
    await asyncio.sleep(seconds)
    sh.stop = True
    await asyncio.gather(*tasks)
    return sh, put_lat, tx_lat, tx2_lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="notify-txvis-", dir=a.dir))
    b = BrokerProcess(work / "b", topics=TOPICS, system=SYSTEM, log_level="warning")
    b.start()
    try:
        load0 = os.getloadavg()[0]
        c0 = cpu_seconds(b.pid)
        sh, put_lat, tx_lat, tx2_lat = asyncio.run(load(b.addr, a.seconds))
        cpu = cpu_seconds(b.pid) - c0
        load1 = os.getloadavg()[0]
    finally:
        b.stop()
        shutil.rmtree(work, ignore_errors=True)
    n = len(tx_lat) + len(tx2_lat)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} load {load0:.1f}->{load1:.1f}: "
        f"{n / a.seconds:,.0f} commits/s; one-write tx p50 {pct(tx_lat, 0.5):.2f} "
        f"p99 {pct(tx_lat, 0.99):.2f} ms; COMMIT alone p50 {pct(tx2_lat, 0.5):.2f} "
        f"p99 {pct(tx2_lat, 0.99):.2f} ms; {len(put_lat) / a.seconds:,.0f} put bursts/s, "
        f"p50 {pct(put_lat, 0.5):.2f} p99 {pct(put_lat, 0.99):.2f} ms; broker CPU "
        f"{cpu / max(1, n + len(put_lat)) * 1e6:.0f} us per commit or burst; "
        f"fractured reads {len(sh.fractures)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
