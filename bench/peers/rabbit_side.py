"""RabbitMQ rows: pika (its asyncio adapter) against rabbitmq-server 3.10.

One durable classic queue, persistent messages (delivery_mode 2) published to the default
exchange. Publisher confirms for a persistent message in a durable queue arrive once the
message is on disk, so confirmed publishing is the "fsync before ack" class; AMQP
transactions (``tx.select``/``tx.commit``) are too. Consumption: ``basic.consume`` with
prefetch 1000 and one ``basic.ack(multiple)`` per 100 deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pika
import uvloop
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.channel import Channel

from bench.peers.common import (
    BATCH,
    BODY,
    CONSUME,
    NONE,
    SYNC,
    SYNC1,
    SYNC10,
    TX_SHAPES,
    Budget,
    Result,
)
from bench.peers.servers import RabbitServer, check_stop, cpu_seconds, peak_rss_kib

QUEUE = "bench"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


async def _connect(port: int) -> AsyncioConnection:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[AsyncioConnection] = loop.create_future()

    def failed(_c: Any, e: BaseException) -> None:
        if not fut.done():
            fut.set_exception(ConnectionError(f"RabbitMQ connection failed: {e!r}"))

    AsyncioConnection(
        pika.ConnectionParameters("127.0.0.1", port, heartbeat=0),
        on_open_callback=lambda c: fut.set_result(c),
        on_open_error_callback=failed,
        custom_ioloop=loop,
    )
    return await fut


async def _cb(start: Callable[[Callable[..., None]], None]) -> Any:
    """Call ``start(callback)`` and wait for the callback's first argument."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(arg: Any = None, *_rest: Any) -> None:
        if not fut.done():
            fut.set_result(arg)

    start(done)
    return await fut


class _Client:
    """One connection with one channel; confirm mode or tx mode."""

    def __init__(self, conn: AsyncioConnection, ch: Channel):
        self.conn = conn
        self.ch = ch
        self.tag = 0
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []

    @classmethod
    async def open(cls, port: int, confirm: bool = False, tx: bool = False) -> _Client:
        conn = await _connect(port)
        ch: Channel = await _cb(lambda cb: conn.channel(on_open_callback=cb))
        self = cls(conn, ch)
        if confirm:
            await _cb(lambda cb: ch.confirm_delivery(self._on_confirm, callback=cb))
        if tx:
            await _cb(lambda cb: ch.tx_select(callback=cb))
        return self

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        ok = isinstance(method, pika.spec.Basic.Ack)
        tag, multiple = method.delivery_tag, method.multiple
        keep = []
        for t, fut in self.waiters:
            if t == tag or (multiple and t <= tag):
                if not fut.done():
                    if ok:
                        fut.set_result(None)
                    else:
                        fut.set_exception(RuntimeError(f"nack for delivery tag {t}"))
            else:
                keep.append((t, fut))
        self.waiters = keep

    def publish(self, n: int = 1) -> None:
        for _ in range(n):
            self.ch.basic_publish("", QUEUE, BODY, PERSISTENT)
        self.tag += n

    async def confirmed(self) -> None:
        """Wait for the confirm of everything published so far."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append((self.tag, fut))
        await fut

    async def commit(self) -> None:
        await _cb(lambda cb: self.ch.tx_commit(callback=cb))

    async def close(self) -> None:
        if self.conn.is_open:
            await _cb(lambda cb: self.conn.add_on_close_callback(cb) or self.conn.close())


async def _clients(
    port: int,
    n: int,
    seconds: float,
    op: Callable[[_Client], Awaitable[int]],
    confirm: bool = False,
    tx: bool = False,
) -> tuple[int, int, float, list[float]]:
    clients = [await _Client.open(port, confirm, tx) for _ in range(n)]
    lat: list[float] = []
    counts = [0, 0]
    deadline = time.perf_counter() + seconds

    async def one(c: _Client) -> None:
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
        await c.close()
    return counts[0], counts[1], dt, lat


def _confirm_every(n: int) -> Callable[[_Client], Awaitable[int]]:
    async def op(c: _Client) -> int:
        c.publish(n)
        await c.confirmed()
        return n

    return op


def _tx(n: int) -> Callable[[_Client], Awaitable[int]]:
    async def op(c: _Client) -> int:
        c.publish(n)
        await c.commit()
        return n

    return op


async def _setup(port: int) -> str:
    c = await _Client.open(port)
    await _cb(lambda cb: c.ch.queue_declare(QUEUE, durable=True, callback=cb))
    props = c.conn._impl.server_properties if hasattr(c.conn, "_impl") else {}
    props = getattr(c.conn, "server_properties", None) or props
    version = props.get("version", b"") if isinstance(props, dict) else b""
    await c.close()
    return version.decode() if isinstance(version, bytes) else str(version)


async def _consume(port: int, seconds: float) -> tuple[int, int, float, list[float]]:
    c = await _Client.open(port)
    ch = c.ch
    frame = await _cb(lambda cb: ch.queue_declare(QUEUE, durable=True, passive=True, callback=cb))
    depth = int(frame.method.message_count)
    await _cb(lambda cb: ch.basic_qos(prefetch_count=1000, callback=cb))
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    got = [0]

    def on_message(chan: Channel, method: Any, _props: Any, _body: bytes) -> None:
        got[0] += 1
        if got[0] % 100 == 0 or got[0] >= depth:
            chan.basic_ack(method.delivery_tag, multiple=True)
        if got[0] >= depth and not finished.done():
            finished.set_result(None)

    t0 = time.perf_counter()
    if depth:
        ch.basic_consume(QUEUE, on_message)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(finished), seconds)
    dt = time.perf_counter() - t0
    await c.close()
    return got[0], got[0], dt, []


def run(tmp: Path, budget: Budget) -> tuple[list[Result], int, str]:
    """Returns the rows, the peak RSS of the Erlang VM (KiB) and the server version."""
    results: list[Result] = []
    s = budget.seconds
    srv = RabbitServer(tmp / "rabbitmq")
    t0 = time.monotonic()
    srv.start()
    print(f"  rabbitmq started in {time.monotonic() - t0:.1f}s", flush=True)
    port = srv.port
    system = "RabbitMQ"
    try:
        version = uvloop.run(_setup(port))
        beam = srv.beam_pid

        def add(
            mode: str,
            shape: str,
            coro: Callable[[], Coroutine[Any, Any, tuple[int, int, float, list[float]]]],
            tx: bool = False,
            durability: str = SYNC,
        ) -> None:
            check_stop()
            c0 = cpu_seconds(beam)
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
                cpu_seconds(beam) - c0,
                time.process_time() - p0,
            )
            results.append(res)
            print(f"  {system:<15} {mode:<38} {shape:<32} {res.rate:>10,.0f}/s", flush=True)

        add(
            "persistent, confirm each",
            SYNC1,
            lambda: _clients(port, 1, s, _confirm_every(1), confirm=True),
        )
        add(
            "persistent, confirm each",
            SYNC10,
            lambda: _clients(port, 10, s, _confirm_every(1), confirm=True),
        )
        add(
            "persistent, confirm every 100",
            BATCH,
            lambda: _clients(port, 1, s, _confirm_every(100), confirm=True),
        )
        for shape, (clients, per_tx) in TX_SHAPES.items():
            add(
                "persistent, tx.select/tx.commit",
                shape,
                lambda c=clients, p=per_tx: _clients(port, c, s, _tx(p), tx=True),  # type: ignore[misc]
                tx=True,
            )
        add(
            "basic.consume, prefetch 1000, ack/100",
            CONSUME,
            lambda: _consume(port, s),
            durability=NONE,
        )
        peak = peak_rss_kib(beam)
    finally:
        srv.stop()
    return results, peak, version
