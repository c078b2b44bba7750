"""NATS JetStream rows: nats-py (asyncio) against nats-server 2.9 with a file-storage stream.

JetStream acknowledges a publish once the message is in the stream's file (written to the
OS, not fsynced: nats-server 2.9 has no fsync-per-ack option, ``sync_interval`` came in
2.10), so its rows are in the "loss window" class. Every message is a ``js.publish`` of
100 bytes to one subject of one stream; a batch is 100 publishes in flight, then the acks
(``publish_async`` does not exist in nats-py: one task per publish); consumption is a pull
consumer with ``AckPolicy.ALL``, ``fetch(100)`` and one ack of the last message. NATS has
no transactions: the transaction rows have no NATS figure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import nats
import uvloop
from nats.js.api import AckPolicy, ConsumerConfig, StorageType

from bench.peers.common import BATCH, BODY, CONSUME, NONE, SYNC1, SYNC10, WINDOW, Budget, Result
from bench.peers.servers import NatsServer, check_stop, cpu_seconds, peak_rss_kib

SUBJECT = "bench.m"
STREAM = "BENCH"

Op = Callable[[Any], Awaitable[int]]


async def _clients(url: str, n: int, seconds: float, op: Op) -> tuple[int, int, float, list[float]]:
    """``n`` clients (own connection each) repeating ``op`` until the deadline."""
    conns = [await nats.connect(url) for _ in range(n)]
    jss = [c.jetstream() for c in conns]
    lat: list[float] = []
    counts = [0, 0]
    deadline = time.perf_counter() + seconds

    async def one(js: Any) -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            msgs = await op(js)
            lat.append(time.perf_counter() - t)
            counts[0] += 1
            counts[1] += msgs

    t0 = time.perf_counter()
    await asyncio.gather(*(one(js) for js in jss))
    dt = time.perf_counter() - t0
    for c in conns:
        await c.close()
    return counts[0], counts[1], dt, lat


async def _publish(js: Any) -> int:
    await js.publish(SUBJECT, BODY)
    return 1


async def _batch(js: Any) -> int:
    await asyncio.gather(*(js.publish(SUBJECT, BODY) for _ in range(100)))
    return 100


async def _consume(url: str, seconds: float) -> tuple[int, int, float, list[float]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            SUBJECT, "g", stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.ALL)
        )
        got = 0
        deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            try:
                msgs = await sub.fetch(100, timeout=1.0)
            except nats.errors.TimeoutError:
                break
            if not msgs:
                break
            await msgs[-1].ack()
            got += len(msgs)
        return got, got, time.perf_counter() - t0, []
    finally:
        await nc.close()


async def _setup(url: str) -> str:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE)
        return str(nc.connected_server_version)
    finally:
        await nc.close()


def run(tmp: Path, budget: Budget) -> tuple[list[Result], int, str]:
    """The publish and consume rows; returns them, the peak RSS (KiB) and the version."""
    results: list[Result] = []
    s = budget.seconds
    srv = NatsServer(tmp / "nats").start()
    url = f"nats://127.0.0.1:{srv.port}"
    system = "NATS JetStream"
    try:
        version = uvloop.run(_setup(url))

        def add(
            mode: str,
            shape: str,
            coro: Callable[[], Coroutine[Any, Any, tuple[int, int, float, list[float]]]],
            durability: str = WINDOW,
        ) -> None:
            check_stop()
            c0 = cpu_seconds(srv.pid)
            p0 = time.process_time()
            _ops, msgs, dt, lat = uvloop.run(coro())
            res = Result(
                system,
                mode,
                durability,
                shape,
                msgs,
                dt,
                0,
                lat,
                cpu_seconds(srv.pid) - c0,
                time.process_time() - p0,
                note="file storage, no fsync per ack (2.9)",
            )
            results.append(res)
            print(f"  {system:<15} {mode:<38} {shape:<32} {res.rate:>10,.0f}/s", flush=True)

        add("js.publish", SYNC1, lambda: _clients(url, 1, s, _publish))
        add("js.publish", SYNC10, lambda: _clients(url, 10, s, _publish))
        add("100 js.publish in flight", BATCH, lambda: _clients(url, 1, s, _batch))
        add("pull fetch(100) + ack ALL", CONSUME, lambda: _consume(url, s), durability=NONE)
    finally:
        peak = peak_rss_kib(srv.pid)
        srv.stop()
    return results, peak, version
