"""notify's rows: real broker child processes driven at the wire level.

Reuses the load generators of ``bench/broker_bench.py`` (the windowed pipeliner, frame
builders and the CRC-checking drain). The time-bounded drivers here build every frame while
running (the peers' clients encode while running too) and record per-operation latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import uvloop

from bench.broker_bench import crc, drain, mput_frames, pipelined, put_frames
from bench.peers.common import (
    BATCH,
    BODY,
    CONSUME,
    NONE,
    SIZE,
    STREAM,
    SYNC,
    SYNC1,
    SYNC10,
    TX_SHAPES,
    WINDOW,
    Budget,
    Result,
)
from bench.peers.servers import check_stop, cpu_seconds, peak_rss_kib
from notify.client import (
    AsyncMessageSessionFactory,
    AsyncProducer,
    ConsumerConfig,
    ProducerConfig,
)
from notify.protocol import records
from notify.protocol.frames import ResponseParser, encode_mput
from notify.testing import BrokerProcess

_CRC = crc(BODY)


class _Waiter(asyncio.Protocol):
    """Counts replies; wakes the driver when ``need`` replies arrived."""

    def __init__(self) -> None:
        self.parser = ResponseParser()
        self.need = 0
        self.errors: list[str] = []
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for r in self.parser.feed(data):
            if r.code != 200:
                self.errors.append(f"{r.code} {r.body[:200]!r}")
            self.need -= 1
        if self.need <= 0 and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def call(self, data: bytes, replies: int) -> None:
        assert self.transport is not None
        self.need = replies
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        await self.waiter


async def _clients(
    addr: tuple[str, int],
    n: int,
    seconds: float,
    step: Callable[[int, int], tuple[bytes, int, int]],
) -> tuple[int, int, float, list[float]]:
    """``n`` connections each repeating ``step(client, seq) -> (frames, replies, msgs)``
    until the deadline; returns (ops, msgs, seconds, per-op latencies)."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    counts = [0, 0]
    conns = [await loop.create_connection(_Waiter, *addr) for _ in range(n)]
    deadline = time.perf_counter() + seconds

    async def one(k: int) -> None:
        proto = conns[k][1]
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            data, replies, msgs = step(k, seq)
            t = time.perf_counter()
            await proto.call(data, replies)
            lat.append(time.perf_counter() - t)
            counts[0] += 1
            counts[1] += msgs
        if proto.errors:
            raise RuntimeError(f"{len(proto.errors)} error replies, first: {proto.errors[0]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    dt = time.perf_counter() - t0
    for tr, _ in conns:
        tr.close()
    return counts[0], counts[1], dt, lat


def _put(topic: str, part: int, opaque: int) -> bytes:
    return b"put %s %d %d 0 %d %d\r\n%b" % (topic.encode(), part, SIZE, _CRC, opaque, BODY)


_REC = records.encode(0, 0, BODY)


def sync_step(parts: int) -> Callable[[int, int], tuple[bytes, int, int]]:
    return lambda k, seq: (_put("bench", k % parts, seq), 1, 1)


def batch_step(batch: int, mput: bool) -> Callable[[int, int], tuple[bytes, int, int]]:
    if mput:
        return lambda k, seq: (encode_mput("bench", 0, _REC * batch, batch, seq), 1, batch)
    return lambda k, seq: (
        b"".join(_put("bench", 0, seq * batch + i) for i in range(batch)),
        batch,
        batch,
    )


def tx_step(per_tx: int) -> Callable[[int, int], tuple[bytes, int, int]]:
    def step(k: int, seq: int) -> tuple[bytes, int, int]:
        key = b"TX:c%d:%d" % (k, seq)
        frames = [b"transaction %s c%d BEGIN 30 1\r\n" % (key, k)]
        frames += [
            b"put bench %d %d 0 %d %s 2\r\n%b" % (k % 4, SIZE, _CRC, key, BODY)
            for _ in range(per_tx)
        ]
        frames.append(b"transaction %s c%d COMMIT_ONE_PHASE 3\r\n" % (key, k))
        return b"".join(frames), per_tx + 2, per_tx

    return step


async def _lib_clients(
    addr: tuple[str, int],
    n: int,
    seconds: float,
    op: Callable[[AsyncProducer], Coroutine[Any, Any, int]],
) -> tuple[int, int, float, list[float]]:
    """The project's own Python client (notify.client, asyncio API): ``n`` producers, each
    repeating ``op`` (returns messages sent) until the deadline."""
    lat: list[float] = []
    counts = [0, 0]
    async with AsyncMessageSessionFactory([f"{addr[0]}:{addr[1]}"]) as session:
        producers = [
            session.create_producer(ProducerConfig(raise_on_error=False)) for _ in range(n)
        ]
        for p in producers:
            await p.publish("bench")
        deadline = time.perf_counter() + seconds

        async def one(p: AsyncProducer) -> None:
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                msgs = await op(p)
                lat.append(time.perf_counter() - t)
                counts[0] += 1
                counts[1] += msgs

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in producers))
        dt = time.perf_counter() - t0
    return counts[0], counts[1], dt, lat


async def _lib_send(p: AsyncProducer) -> int:
    r = await p.send("bench", BODY)
    if not r.success:
        raise RuntimeError(f"send failed: {r.error}")
    return 1


async def _lib_burst(p: AsyncProducer) -> int:
    rs = await asyncio.gather(*(p.send_nowait("bench", BODY) for _ in range(100)))
    if not all(r.success for r in rs):
        raise RuntimeError("send failed")
    return 100


async def _lib_batch(p: AsyncProducer) -> int:
    r = await p.send_batch("bench", [BODY] * 100)
    if not r.success:
        raise RuntimeError(f"send_batch failed: {r.error}")
    return 100


def _lib_tx(per_tx: int) -> Callable[[AsyncProducer], Coroutine[Any, Any, int]]:
    async def op(p: AsyncProducer) -> int:
        async with p.transaction(timeout=30):
            for _ in range(per_tx):
                p.send_nowait("bench", BODY)
        return per_tx

    return op


class NotifyRunner:
    """Starts one broker per flush configuration and runs scenarios against it."""

    def __init__(self, tmp: Path, budget: Budget):
        self.tmp = tmp
        self.budget = budget
        self.results: list[Result] = []
        self.peak_rss_kib = 0

    def _broker(self, name: str, system: dict[str, object]) -> BrokerProcess:
        b = BrokerProcess(self.tmp / name, topics={"bench": 4}, system=system, log_level="warning")
        return b.start()

    def _run(
        self,
        b: BrokerProcess,
        mode: str,
        durability: str,
        shape: str,
        coro: Coroutine[Any, Any, tuple[int, int, float, list[float]]],
        tx: bool = False,
        lib: bool = False,
    ) -> Result:
        check_stop()
        c0 = cpu_seconds(b.pid)
        p0 = time.process_time()
        ops, msgs, dt, lat = uvloop.run(coro)
        res = Result(
            "notify",
            mode,
            durability,
            shape,
            msgs,
            dt,
            ops if tx else 0,
            lat,
            cpu_seconds(b.pid) - c0,
            time.process_time() - p0,
            lib,
        )
        self.results.append(res)
        print(f"  notify  {mode:<44} {shape:<32} {res.rate:>10,.0f}/s", flush=True)
        return res

    def run(self) -> list[Result]:
        configs: list[tuple[str, dict[str, object], str]] = [
            ("unflushThreshold=1", {"unflushThreshold": 1}, SYNC),
            ("group commit (unflushThreshold=0)", {"unflushThreshold": 0}, SYNC),
            ("default flush (1000 msgs / 10 s)", {}, WINDOW),
        ]
        for label, system, dur in configs:
            b = self._broker(label.split()[0].replace("=", ""), system)
            try:
                self._flush_modes(b, label, dur, per_message=system.get("unflushThreshold") == 1)
            finally:
                self.peak_rss_kib = max(self.peak_rss_kib, peak_rss_kib(b.pid))
                b.stop()
        for policy, dur in ((1, SYNC), (2, WINDOW)):
            b = self._broker(f"tx{policy}", {"flushTxLogAtCommit": policy})
            try:
                self._transactions(b, policy, dur)
            finally:
                self.peak_rss_kib = max(self.peak_rss_kib, peak_rss_kib(b.pid))
                b.stop()
        return self.results

    def _flush_modes(self, b: BrokerProcess, label: str, dur: str, per_message: bool) -> None:
        s = self.budget.seconds
        addr = (b.host, b.port)
        self._run(b, f"{label}, sync put", dur, SYNC1, _clients(addr, 1, s, sync_step(4)))
        self._run(b, f"{label}, sync put", dur, SYNC10, _clients(addr, 10, s, sync_step(4)))
        if per_message:
            return  # pipelining under a per-message fsync is the group commit rows' business
        lib = "notify.client"
        self._run(
            b,
            f"{lib}: await producer.send",
            dur,
            SYNC1,
            _lib_clients(addr, 1, s, _lib_send),
            lib=True,
        )
        self._run(
            b,
            f"{lib}: await producer.send",
            dur,
            SYNC10,
            _lib_clients(addr, 10, s, _lib_send),
            lib=True,
        )
        self._run(
            b,
            f"{lib}: 100 x send_nowait, gather",
            dur,
            BATCH,
            _lib_clients(addr, 1, s, _lib_burst),
            lib=True,
        )
        self._run(
            b,
            f"{lib}: send_batch of 100",
            dur,
            BATCH,
            _lib_clients(addr, 1, s, _lib_batch),
            lib=True,
        )
        self._run(
            b,
            f"{label}, 100 pipelined puts",
            dur,
            BATCH,
            _clients(addr, 1, s, batch_step(100, False)),
        )
        self._run(b, f"{label}, mput x100", dur, BATCH, _clients(addr, 1, s, batch_step(100, True)))
        self._stream(b, label, dur)
        if dur == WINDOW:
            self._consume(b)

    def _transactions(self, b: BrokerProcess, policy: int, dur: str) -> None:
        s = self.budget.seconds
        addr = (b.host, b.port)
        for shape, (clients, per_tx) in TX_SHAPES.items():
            self._run(
                b,
                f"local tx, flushTxLogAtCommit={policy}",
                dur,
                shape,
                _clients(addr, clients, s, tx_step(per_tx)),
                tx=True,
            )
            self._run(
                b,
                f"notify.client: async with producer.transaction(), flushTxLogAtCommit={policy}",
                dur,
                shape,
                _lib_clients(addr, clients, s, _lib_tx(per_tx)),
                tx=True,
                lib=True,
            )

    def _stream(self, b: BrokerProcess, label: str, dur: str) -> None:
        addr = (b.host, b.port)
        n_put = 150_000 if self.budget.quick else 400_000
        n_mput = 300_000 if self.budget.quick else 1_000_000

        async def put_stream() -> tuple[int, int, float, list[float]]:
            frames = put_frames("bench", 1, SIZE, n_put)
            dt, acked = await pipelined(addr, frames, 2_000)
            return acked, acked, dt, []

        async def mput_stream() -> tuple[int, int, float, list[float]]:
            frames = mput_frames("bench", 1, SIZE, n_mput, 500)
            dt, acked = await pipelined(addr, frames, 16)
            return acked, acked * 500, dt, []

        self._run(b, f"{label}, pipelined put (window 2000)", dur, STREAM, put_stream())
        self._run(b, f"{label}, pipelined mput x500 (window 16)", dur, STREAM, mput_stream())

    def _consume(self, b: BrokerProcess) -> None:
        addr = (b.host, b.port)
        s = self.budget.seconds

        async def wire() -> tuple[int, int, float, list[float]]:
            dt, got = await drain(addr, "bench", 0)
            return got, got, dt, []

        async def lib() -> tuple[int, int, float, list[float]]:
            got = 0
            async with AsyncMessageSessionFactory([f"{addr[0]}:{addr[1]}"]) as session:
                consumer = session.create_consumer(
                    ConsumerConfig(group="peers", data_dir=self.tmp / "consumer")
                )
                deadline = time.perf_counter() + s
                t0 = time.perf_counter()
                while time.perf_counter() < deadline:
                    msgs = await consumer.fetch("bench", max_wait_s=0.05)
                    if not msgs:
                        break
                    got += len(msgs)
                dt = time.perf_counter() - t0
                await consumer.commit()
            return got, got, dt, []

        self._run(
            b, "notify.client: consumer.fetch, offsets committed", NONE, CONSUME, lib(), lib=True
        )
        self._run(b, "get 1 MiB windows, records CRC-checked", NONE, CONSUME, wire())
