"""Broker throughput benchmark: raw limits and the broker, measured in one run.

    .venv/bin/python bench/broker_bench.py            # full run (~2 minutes)
    .venv/bin/python bench/broker_bench.py --quick    # smaller counts

Prints one table. Every broker scenario runs against a fresh broker child process on
127.0.0.1 with its data in a temp directory on the same disk as the raw fsync test. Load
generators are uvloop protocols in this process (precomputed frames, replies counted by a
C-level scan), so the client costs as little CPU as possible on this 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop

from notify.protocol import records
from notify.protocol.frames import ResponseParser, encode_mput
from notify.testing import BrokerProcess


@dataclass
class Row:
    scenario: str
    size: int
    count: int
    seconds: float
    unit: str = "msg/s"
    note: str = ""
    latency_ms: tuple[float, float] | None = None

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0


# ---------------------------------------------------------------------------- raw limits


def raw_fsync_rate(directory: Path, seconds: float = 2.0) -> Row:
    path = directory / "raw-fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    data = b"x" * 100
    n = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            os.write(fd, data)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
        path.unlink()
    return Row("raw: 100 B append + fdatasync loop", 100, n, time.perf_counter() - t0, "ops/s")


def raw_loopback_bandwidth(total: int = 2 << 30) -> Row:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = [0]

    def sink() -> None:
        c, _ = srv.accept()
        buf = bytearray(1 << 20)
        while True:
            n = c.recv_into(buf)
            if not n:
                break
            got[0] += n
        c.close()

    t = threading.Thread(target=sink)
    t.start()
    s = socket.create_connection(("127.0.0.1", port))
    chunk = b"x" * (1 << 20)
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        s.sendall(chunk)
        sent += len(chunk)
    s.close()
    t.join()
    dt = time.perf_counter() - t0
    srv.close()
    return Row(
        "raw: loopback socket copy (1 MiB writes)",
        0,
        got[0],
        dt,
        "MB/s",
        f"{got[0] / dt / 1e6:,.0f} MB/s",
    )


# ---------------------------------------------------------------------------- load generators


def crc(b: bytes) -> int:
    return zlib.crc32(b) & 0x7FFFFFFF


class _Pipeliner(asyncio.Protocol):
    """Sends precomputed frames keeping at most ``window`` requests in flight.

    Every reply has exactly one CRLF (bodies of put/mput replies and errors have none), so
    replies are counted with ``bytes.count`` instead of being parsed one by one.
    """

    def __init__(self, frames: list[bytes], window: int, done: asyncio.Future[None]):
        self.frames = frames
        self.window = window
        self.done = done
        self.sent = 0
        self.replies = 0
        self.ok = 0
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
        buf = self.tail + data
        t = self.tail
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
            self.done.set_exception(ConnectionError(f"lost after {self.replies} replies: {exc}"))


async def pipelined(addr: tuple[str, int], frames: list[bytes], window: int) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    t0 = time.perf_counter()
    tr, proto = await loop.create_connection(lambda: _Pipeliner(frames, window, done), *addr)
    await done
    dt = time.perf_counter() - t0
    tr.close()
    if proto.ok != len(frames):
        raise RuntimeError(f"{len(frames) - proto.ok} error replies")
    return dt, proto.ok


class _SyncClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = ResponseParser()
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for r in self.parser.feed(data):
            if r.code != 200:
                raise RuntimeError(f"error reply {r}")
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)


async def sync_producers(
    addr: tuple[str, int], topic: str, partitions: int, nprod: int, per_producer: int, size: int
) -> tuple[float, list[float]]:
    loop = asyncio.get_running_loop()
    body = b"s" * size
    latencies: list[float] = []

    async def one(k: int) -> None:
        tr, proto = await loop.create_connection(_SyncClient, *addr)
        frame = b"put %s %d %d 0 %d %d\r\n%b" % (
            topic.encode(),
            k % partitions,
            size,
            crc(body),
            k,
            body,
        )
        write = tr.write
        for _ in range(per_producer):
            proto.waiter = loop.create_future()
            t = time.perf_counter()
            write(frame)
            await proto.waiter
            latencies.append(time.perf_counter() - t)
        tr.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(nprod)))
    return time.perf_counter() - t0, latencies


async def drain(
    addr: tuple[str, int], topic: str, partition: int, max_size: int = 1 << 20
) -> tuple[float, int]:
    """Fetch a whole partition with get and decode every record (CRC verified)."""
    reader, writer = await asyncio.open_connection(*addr)
    off = 0
    n = 0
    parser = ResponseParser()
    t0 = time.perf_counter()
    opaque = 0
    while True:
        opaque += 1
        writer.write(
            b"get %s g %d %d %d %d\r\n" % (topic.encode(), partition, off, max_size, opaque)
        )
        reply = None
        while reply is None:
            data = await reader.read(1 << 21)
            if not data:
                raise ConnectionError("closed")
            rs = parser.feed(data)
            if rs:
                reply = rs[0]
        if reply.code == 404:
            break
        recs, used = records.decode_all(reply.body, off)
        n += len(recs)
        off += used
    dt = time.perf_counter() - t0
    writer.close()
    return dt, n


# ---------------------------------------------------------------------------- scenarios


def put_frames(topic: str, partitions: int, size: int, count: int) -> list[bytes]:
    body = b"p" * size
    c = crc(body)
    return [
        b"put %s %d %d 0 %d %d\r\n%b" % (topic.encode(), i % partitions, size, c, i, body)
        for i in range(count)
    ]


def mput_frames(topic: str, partitions: int, size: int, count: int, batch: int) -> list[bytes]:
    rec = records.encode(0, 0, b"m" * size)
    block = rec * batch
    return [encode_mput(topic, i % partitions, block, batch, i) for i in range(count // batch)]


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="notify-bench-", dir=args.dir))
    rows.append(raw_fsync_rate(tmp))
    rows.append(raw_loopback_bandwidth())
    q = args.quick
    n_pipe = 200_000 if q else 1_000_000
    n_sync = 20_000 if q else 100_000

    def with_broker(
        name: str,
        system: dict[str, object],
        fn: Callable[[tuple[str, int]], None],
        topics: dict[str, int] | None = None,
    ) -> None:
        b = BrokerProcess(
            tmp / name,
            topics=topics or {"bench": 1, "bench4": 4},
            system=system,
            log_level="warning",
        )
        b.start()
        try:
            fn((b.host, b.port))
        finally:
            b.stop()

    loop_run = uvloop.run

    def s_pipelined(size: int, n: int) -> Callable[[tuple[str, int]], None]:
        def f(addr: tuple[str, int]) -> None:
            frames = put_frames("bench", 1, size, n)
            dt, acked = loop_run(pipelined(addr, frames, 20_000))
            rows.append(Row("1 producer, pipelined put, default flush", size, acked, dt))

        return f

    def s_mput(size: int, n: int, threshold: int) -> Callable[[tuple[str, int]], None]:
        def f(addr: tuple[str, int]) -> None:
            batch = 500
            frames = mput_frames("bench", 1, size, n, batch)
            dt, acked = loop_run(pipelined(addr, frames, 64))
            label = "group commit" if threshold == 0 else "default flush"
            rows.append(
                Row(f"1 producer, pipelined mput x{batch}, {label}", size, acked * batch, dt)
            )

        return f

    def s_sync(size: int, nprod: int, n: int, label: str) -> Callable[[tuple[str, int]], None]:
        def f(addr: tuple[str, int]) -> None:
            dt, lat = loop_run(sync_producers(addr, "bench4", 4, nprod, n // nprod, size))
            lat.sort()
            p50 = lat[len(lat) // 2] * 1000
            p99 = lat[int(len(lat) * 0.99)] * 1000
            rows.append(
                Row(
                    f"{nprod} sync producers, put, {label}",
                    size,
                    len(lat),
                    dt,
                    latency_ms=(p50, p99),
                )
            )

        return f

    def s_group_pipelined(size: int, n: int) -> Callable[[tuple[str, int]], None]:
        def f(addr: tuple[str, int]) -> None:
            frames = put_frames("bench4", 4, size, n)
            dt, acked = loop_run(pipelined(addr, frames, 2_000))
            rows.append(Row("1 producer, pipelined put, group commit", size, acked, dt))

        return f

    def s_consume(size: int, n: int) -> Callable[[tuple[str, int]], None]:
        def f(addr: tuple[str, int]) -> None:
            frames = mput_frames("bench", 1, size, n, 1000)
            loop_run(pipelined(addr, frames, 64))
            dt, got = loop_run(drain(addr, "bench", 0))
            assert got == n, (got, n)
            rows.append(
                Row("1 consumer draining a partition (get 1 MiB, CRC checked)", size, got, dt)
            )

        return f

    default = {"unflushThreshold": 1000, "unflushInterval": 10000}
    group = {"unflushThreshold": 0}
    for size in (100, 1024):
        with_broker(
            f"pipe{size}", default, s_pipelined(size, n_pipe if size == 100 else n_pipe // 2)
        )
        with_broker(
            f"mput{size}", default, s_mput(size, n_pipe * 2 if size == 100 else n_pipe, 1000)
        )
    with_broker("sync256", default, s_sync(256, 10, n_sync, "default flush"))
    with_broker("sync100", default, s_sync(100, 10, n_sync, "default flush"))
    with_broker("group2k", group, s_sync(2048, 10, n_sync // 2, "group commit (fsync per ack)"))
    with_broker("group100p", group, s_group_pipelined(100, n_pipe // 2))
    with_broker("groupmput", group, s_mput(100, n_pipe, 0))
    with_broker("consume", default, s_consume(100, n_pipe))
    return rows


def print_table(rows: list[Row]) -> None:
    print()
    print(f"| {'scenario':<62} | {'size':>5} | {'count':>9} | {'rate':>14} | {'p50/p99 ms':>12} |")
    print(f"|{'-' * 64}|{'-' * 7}|{'-' * 11}|{'-' * 16}|{'-' * 14}|")
    for r in rows:
        rate = r.note if r.note else f"{r.rate:,.0f} {r.unit}"
        lat = f"{r.latency_ms[0]:.2f}/{r.latency_ms[1]:.2f}" if r.latency_ms else ""
        size = str(r.size) if r.size else ""
        print(f"| {r.scenario:<62} | {size:>5} | {r.count:>9,} | {rate:>14} | {lat:>12} |")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller counts")
    ap.add_argument("--dir", default=None, help="where to put data (default: system temp dir)")
    args = ap.parse_args()
    rows = run(args)
    print_table(rows)


if __name__ == "__main__":
    main()
