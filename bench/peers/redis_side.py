"""Redis Streams rows: redis-py (asyncio API) against redis-server with the AOF on.

``appendfsync always`` fsyncs the AOF before replying (once per event-loop iteration, so
concurrent clients and pipelines share it); ``everysec`` fsyncs once a second. Every message
is an ``XADD`` of a 100-byte field to one stream; transactions are ``MULTI``/``EXEC``
pipelines; consumption is ``XREADGROUP COUNT 100`` followed by one ``XACK`` of those ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvloop

from bench.peers.common import (
    BATCH,
    BODY,
    CONSUME,
    NONE,
    SYNC,
    SYNC1,
    SYNC10,
    TX_SHAPES,
    WINDOW,
    Budget,
    Result,
)
from bench.peers.servers import RedisServer, check_stop, cpu_seconds, peak_rss_kib

STREAM_KEY = "bench"


async def _clients(
    make: Callable[[], aioredis.Redis],
    n: int,
    seconds: float,
    op: Callable[[aioredis.Redis], Awaitable[int]],
) -> tuple[int, int, float, list[float]]:
    """``n`` clients (own connection each) repeating ``op`` (returns messages) until the
    deadline."""
    clients = [make() for _ in range(n)]
    for c in clients:
        await c.ping()
    lat: list[float] = []
    counts = [0, 0]
    deadline = time.perf_counter() + seconds

    async def one(c: aioredis.Redis) -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            msgs = await op(c)
            lat.append(time.perf_counter() - t)
            counts[0] += 1
            counts[1] += msgs

    t0 = time.perf_counter()
    await asyncio.gather(*(one(c) for c in clients))
    dt = time.perf_counter() - t0
    for c in clients:
        await c.aclose()
    return counts[0], counts[1], dt, lat


async def _xadd(c: aioredis.Redis) -> int:
    await c.xadd(STREAM_KEY, {"b": BODY})
    return 1


def _pipeline(n: int, transaction: bool) -> Callable[[aioredis.Redis], Awaitable[int]]:
    async def op(c: aioredis.Redis) -> int:
        pipe = c.pipeline(transaction=transaction)
        for _ in range(n):
            pipe.xadd(STREAM_KEY, {"b": BODY})
        await pipe.execute()
        return n

    return op


async def _consume(make: Callable[[], aioredis.Redis], seconds: float) -> tuple[int, int, float]:
    c = make()
    try:
        await c.xgroup_create(STREAM_KEY, "g", id="0")
        got = 0
        deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            resp: Any = await c.xreadgroup("g", "c1", {STREAM_KEY: ">"}, count=100)
            if not resp:
                break
            ids = [mid for mid, _fields in resp[0][1]]
            if not ids:
                break
            await c.xack(STREAM_KEY, "g", *ids)
            got += len(ids)
        return got, got, time.perf_counter() - t0
    finally:
        await c.aclose()


def run(tmp: Path, budget: Budget) -> tuple[list[Result], int, str]:
    """Both fsync policies; returns the rows, the peak RSS (KiB) and the server version."""
    results: list[Result] = []
    s = budget.seconds
    peak = 0
    version = ""
    for policy, dur in (("always", SYNC), ("everysec", WINDOW)):
        srv = RedisServer(tmp / f"redis-{policy}", policy).start()
        system = f"Redis {policy}"
        try:

            def make(port: int = srv.port) -> aioredis.Redis:
                return aioredis.Redis(host="127.0.0.1", port=port)

            def add(
                mode: str,
                shape: str,
                coro: Callable[[], Coroutine[Any, Any, tuple[int, int, float, list[float]]]],
                tx: bool = False,
                durability: str = dur,
                srv: RedisServer = srv,
                system: str = system,
            ) -> None:
                check_stop()
                c0 = cpu_seconds(srv.pid)
                p0 = time.process_time()
                ops, msgs, dt, lat = uvloop.run(coro())
                res = Result(
                    system,
                    mode,
                    durability,
                    shape,
                    msgs,
                    dt,
                    ops if tx else 0,
                    lat,
                    cpu_seconds(srv.pid) - c0,
                    time.process_time() - p0,
                )
                results.append(res)
                print(f"  {system:<15} {mode:<38} {shape:<32} {res.rate:>10,.0f}/s", flush=True)

            async def info() -> str:
                c = make()
                v = (await c.info("server"))["redis_version"]
                await c.aclose()
                return str(v)

            version = uvloop.run(info())
            add("XADD", SYNC1, lambda: _clients(make, 1, s, _xadd))
            add("XADD", SYNC10, lambda: _clients(make, 10, s, _xadd))
            add("XADD pipeline of 100", BATCH, lambda: _clients(make, 1, s, _pipeline(100, False)))
            for shape, (clients, per_tx) in TX_SHAPES.items():
                add(
                    "MULTI/EXEC of XADDs",
                    shape,
                    lambda c=clients, p=per_tx: _clients(make, c, s, _pipeline(p, True)),  # type: ignore[misc]
                    tx=True,
                )
            if policy == "everysec":

                async def consume() -> tuple[int, int, float, list[float]]:
                    got, msgs, dt = await _consume(make, s)
                    return got, msgs, dt, []

                add("XREADGROUP COUNT 100 + XACK", CONSUME, consume, durability=NONE)
        finally:
            peak = max(peak, peak_rss_kib(srv.pid))
            srv.stop()
    return results, peak, version
