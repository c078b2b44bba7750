"""Local-transaction throughput of the broker, per flushTxLogAtCommit policy.

    .venv/bin/python bench/tx_bench.py [--quick]

Each client loops: BEGIN, k puts, COMMIT_ONE_PHASE, sent as one pipelined write, then waits
for the k+2 replies. Scenarios: 1 and 10 messages per transaction, 1 and 32 concurrent
clients, flushTxLogAtCommit 0, 1 and 2; plus the bare append+fdatasync rate of the same disk
measured in the same run. Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop

from notify.protocol.frames import ResponseParser
from notify.testing import BrokerProcess


@dataclass
class Row:
    scenario: str
    txs: int
    msgs: int
    seconds: float
    errors: int = 0


def bare_fsync(directory: Path, seconds: float = 2.0) -> float:
    path = directory / "bare.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        os.write(fd, b"x" * 100)
        os.fdatasync(fd)
        n += 1
    os.close(fd)
    path.unlink()
    return n / (time.perf_counter() - t0)


class _Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = ResponseParser()
        self.need = 0
        self.bad = 0
        self.waiter: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        for r in self.parser.feed(data):
            if r.code != 200:
                self.bad += 1
            self.need -= 1
        if self.need <= 0 and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


async def run_clients(addr: tuple[str, int], clients: int, per_tx: int, seconds: float,
                      size: int = 100) -> tuple[int, int, float]:
    loop = asyncio.get_running_loop()
    body = b"t" * size
    crc = zlib.crc32(body) & 0x7FFFFFFF
    deadline = time.perf_counter() + seconds
    counts = [0] * clients
    errors = [0] * clients

    async def one(k: int) -> None:
        tr, proto = await loop.create_connection(_Client, *addr)
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            key = b"TX:c%d:%d" % (k, seq)
            frames = [b"transaction %s c%d BEGIN 30 1\r\n" % (key, k)]
            frames += [b"put txbench %d 100 0 %d %s 2\r\n%b" % (k % 4, crc, key, body)
                       for _ in range(per_tx)]
            frames.append(b"transaction %s c%d COMMIT_ONE_PHASE 3\r\n" % (key, k))
            proto.need = per_tx + 2
            proto.waiter = loop.create_future()
            tr.write(b"".join(frames))
            await proto.waiter
            counts[k] += 1
        errors[k] = proto.bad
        tr.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(clients)))
    return sum(counts), sum(errors), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    seconds = 2.0 if args.quick else 5.0
    tmp = Path(tempfile.mkdtemp(prefix="notify-txbench-", dir=args.dir))
    bare = bare_fsync(tmp)
    rows: list[Row] = []
    for policy in (1, 2, 0):
        b = BrokerProcess(tmp / f"p{policy}", topics={"txbench": 4},
                          system={"flushTxLogAtCommit": policy}, log_level="warning")
        b.start()
        try:
            for clients in (1, 32):
                for per_tx in (1, 10):
                    n, err, dt = uvloop.run(run_clients((b.host, b.port), clients, per_tx, seconds))
                    rows.append(Row(f"flushTxLogAtCommit={policy}, {clients:>2} clients, "
                                    f"{per_tx:>2} msg/tx", n, n * per_tx, dt, err))
        finally:
            b.stop()
    print()
    print(f"bare 100 B append+fdatasync on this disk: {bare:,.0f}/s")
    print()
    print(f"| {'scenario':<48} | {'tx/s':>9} | {'msg/s':>9} | {'vs bare fsync':>13} | errors |")
    print(f"|{'-' * 50}|{'-' * 11}|{'-' * 11}|{'-' * 15}|--------|")
    for r in rows:
        tps = r.txs / r.seconds
        print(f"| {r.scenario:<48} | {tps:>9,.0f} | {r.msgs / r.seconds:>9,.0f} | "
              f"{tps / bare:>12.2f}x | {r.errors:>6} |")


if __name__ == "__main__":
    main()
