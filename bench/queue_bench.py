"""Queue consumption with per-message acknowledgement: notify queue groups vs RabbitMQ.

    .venv/bin/python bench/queue_bench.py [--messages 100000] [--consumers 1,4,16,32]
        [--slow-messages 4000] [--lock-ms 1000] [--no-rabbit]

Prints one table, three parts:

* ``slow1ms``: each consumer handles one message at a time and takes 1 ms per message (an
  ``async def`` listener that awaits 1 ms under a per-consumer lock; credit 8 hides the
  round trip), ``--slow-messages`` messages: throughput must keep growing past 4
  consumers on a topic of 4 partitions (the point of queues). Consumers are machines in
  this model: at most 4 per process (forked), so the client's CPU is not the limit;
* ``wire`` / ``batch`` / ``client``: instant listeners (below);
* ``redelivery``: a consumer takes a message and never acknowledges it; the time until
  another consumer gets it, against ``--lock-ms`` (``queueLockTimeout``), median of 5.

notify: one broker process, a topic of 4 partitions preloaded with N messages of 100 B, then
for each consumer count a fresh queue group drains it. Three drivers with instant listeners:

* ``wire``: raw asyncio connections, ``qbsub`` with credit 1000 (batched ``qbatch`` pushes),
  one ``qack`` frame per read batch accepting every run received as one range item
  (answered once the accepts are fsynced, group committed): the broker's limit;
* ``batch``: ``session.create_queue_consumer(..., credit=1000, batch_listener=...)``, an
  async listener called once per pushed frame that returns at once (its return accepts
  the batch): the library's fast path;
* ``client``: ``session.create_queue_consumer(..., credit=1000, listener=...)`` with an async
  listener per message that returns at once (its return accepts the message): one task
  per message, accepts coalesced into ranges per loop turn.

Each row also prints the CPU per message (``/proc`` utime+stime over the drain) of the
broker and of the consumers (this process).

RabbitMQ (only when rabbitmq-server is installed, see ``scripts/peers.sh install``): one
durable queue preloaded with N persistent messages, each consumer its own connection with
``basic.consume``, prefetch 1000, ``basic.ack(multiple)`` every 100 deliveries (as in
bench/peers). Note the durability classes differ: a notify accept is on disk before it is
answered; a RabbitMQ ack is not fsynced. One table: msg/s delivered and acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import uvloop  # noqa: E402

from notify.client import AsyncMessageSessionFactory, QueueMessage  # noqa: E402
from notify.protocol.frames import (  # noqa: E402
    QBATCH_RUN,
    ResponseParser,
    decode_qbatch,
    encode_line,
    encode_qack,
)
from notify.protocol.records import encode  # noqa: E402
from notify.testing import BrokerProcess  # noqa: E402

BODY = b"m" * 100
PARTS = 4
CREDIT = 1000
SLOW_PER_PROCESS = 4


async def preload(addr: str, n: int) -> None:
    """``mput`` batches of 500 records per partition, pipelined."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    rec = encode(0, 0, BODY)
    per = 500
    frames = 0
    for i in range(0, n, per):
        k = min(per, n - i)
        batch = rec * k
        writer.write(b"mput q %d %d %d %d\r\n" % ((i // per) % PARTS, len(batch), k, i) + batch)
        frames += 1
    await writer.drain()
    parser = ResponseParser()
    got = 0
    while got < frames:
        for r in parser.feed(await reader.read(1 << 16)):
            if r.code != 200:
                raise RuntimeError(f"preload failed: {r.code} {r.body[:80]!r}")
            got += 1
    writer.close()


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (Linux ``/proc``): the
    broker's cost per message, which the machine's load does not change much."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def preload_topic(addr: str, topic: str, n: int) -> None:
    """``n`` messages to partition 0 of ``topic``."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    for i in range(n):
        writer.write(b"put %s 0 %d 0 %d\r\n" % (topic.encode(), len(BODY), i) + BODY)
    await writer.drain()
    parser = ResponseParser()
    got = 0
    while got < n:
        for r in parser.feed(await reader.read(1 << 16)):
            if r.code != 200:
                raise RuntimeError(f"preload failed: {r.code} {r.body[:80]!r}")
            got += 1
    writer.close()


async def wire_consumers(addr: str, group: str, consumers: int, n: int) -> float:
    """Raw protocol, ``qbsub``: ``qbatch`` frames, one range item per run accepted."""
    host, port = addr.rsplit(":", 1)
    total = [0]
    done = asyncio.Event()

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(encode_line("qbsub", "q", group, CREDIT, "earliest", 1))
        parser = ResponseParser()
        opaque = 10
        while not done.is_set():
            data = await reader.read(1 << 20)
            if not data:
                return
            items = []
            got = 0
            for r in parser.feed(data):
                if r.kind == "qbatch":
                    for p, _c, k, first, pos in decode_qbatch(r.body):
                        end = first + QBATCH_RUN.unpack_from(r.body, pos - QBATCH_RUN.size)[4]
                        items.append(b"a %d %d %d\n" % (p, first, end))
                        got += k
                elif r.code != 200:
                    raise RuntimeError(f"consumer {i}: {r.code} {r.body[:80]!r}")
            if items:
                opaque += 1
                writer.write(encode_qack("q", group, b"".join(items), opaque))
                total[0] += got
                if total[0] >= n:
                    done.set()
        writer.close()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(one(i)) for i in range(consumers)]
    await asyncio.wait_for(done.wait(), 600)
    dt = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return dt


async def batch_consumers(addr: str, group: str, consumers: int, n: int) -> float:
    """The client library with a ``batch_listener`` (one call per pushed frame; its return
    accepts the batch, one range item per run)."""
    total = [0]
    done = asyncio.Event()

    async def listener(msgs: list[QueueMessage]) -> None:
        total[0] += len(msgs)
        if total[0] >= n:
            done.set()

    return await _timed(addr, group, consumers, done, batch_listener=listener)


async def client_consumers(addr: str, group: str, consumers: int, n: int) -> float:
    total = [0]
    done = asyncio.Event()

    async def listener(msg: QueueMessage) -> None:
        total[0] += 1
        if total[0] >= n:
            done.set()

    return await _timed(addr, group, consumers, done, listener=listener)


async def _timed(
    addr: str, group: str, consumers: int, done: asyncio.Event, **listener: Any
) -> float:
    """Seconds from starting ``consumers`` queue consumers of ``group`` (with ``listener``:
    ``listener=`` or ``batch_listener=``) until ``done`` is set."""
    async with AsyncMessageSessionFactory([addr]) as s:
        t0 = time.perf_counter()
        cs = [
            await s.create_queue_consumer("q", group, credit=CREDIT, **listener)
            for _ in range(consumers)
        ]
        await asyncio.wait_for(done.wait(), 600)
        dt = time.perf_counter() - t0
        for c in cs:
            await c.close()
    return dt


def _slow_process(addr: str, group: str, consumers: int, counter: Any, first: Any,
                  stop: Any) -> None:
    """One consumer machine (a forked process): ``consumers`` queue consumers, each
    handling one message at a time, 1 ms per message; counts into ``counter``."""

    async def run() -> None:
        def make() -> Any:
            lock = asyncio.Lock()

            async def listener(msg: QueueMessage) -> None:
                if not first.value:  # the clock starts with the first push anywhere
                    with first.get_lock():
                        first.value = first.value or time.time()
                async with lock:  # one at a time per consumer: a 1 ms job
                    await asyncio.sleep(0.001)
                with counter.get_lock():
                    counter.value += 1

            return listener

        async with AsyncMessageSessionFactory([addr]) as s:
            cs = [
                await s.create_queue_consumer("q", group, credit=8, listener=make())
                for _ in range(consumers)
            ]
            while not stop.is_set():
                await asyncio.sleep(0.02)
            for c in cs:
                await c.close()

    uvloop.run(run())


def slow_consumers(addr: str, group: str, consumers: int, n: int) -> float:
    """``consumers`` 1 ms consumers, at most SLOW_PER_PROCESS per process (consumers are
    machines in this model; one Python process would be CPU-bound, not listener-bound)."""
    ctx = multiprocessing.get_context("fork")
    counter, first, stop = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Event()
    shares = [min(SLOW_PER_PROCESS, consumers - i)
              for i in range(0, consumers, SLOW_PER_PROCESS)]
    procs = [ctx.Process(target=_slow_process, args=(addr, group, k, counter, first, stop))
             for k in shares]
    for p in procs:
        p.start()
    deadline = time.time() + 600
    while counter.value < n and time.time() < deadline:
        time.sleep(0.005)
    end = time.time()
    stop.set()
    for p in procs:
        p.join(30)
    if counter.value < n:
        raise RuntimeError(f"slow consumers handled {counter.value} of {n}")
    return float(end - first.value)


async def redelivery_ms(addr: str, group: str) -> float:
    """A message taken and never acknowledged: ms from its delivery to its redelivery."""
    async with AsyncMessageSessionFactory([addr]) as s:
        loop = asyncio.get_running_loop()
        seen: list[float] = []
        again: asyncio.Future[None] = loop.create_future()
        stop = asyncio.Event()

        async def hold(msg: QueueMessage) -> None:
            seen.append(time.perf_counter())
            if msg.delivery_count > 1 and not again.done():
                again.set_result(None)
            await stop.wait()  # holds it (its accept comes after the lock is lost: refused)

        c = await s.create_queue_consumer("r", group, credit=2, listener=hold)
        await asyncio.wait_for(again, 120)
        stop.set()
        await c.close()
    return (seen[1] - seen[0]) * 1000


def notify_rows(
    n: int, counts: list[int], workdir: Path, slow_n: int = 0, lock_ms: int = 1000
) -> list[tuple[str, str, int, float]]:
    rows = []
    sysc = {"queueMaxInFlight": 20000, "queueMaxCredit": CREDIT}
    if slow_n or lock_ms:
        rows += slow_rows(counts, workdir, slow_n, lock_ms, sysc)
    with BrokerProcess(workdir / "fast", topics={"q": PARTS}, system=sysc,
                       log_level="warning") as b:
        uvloop.run(preload(b.addr, n))
        for driver, fn in (("wire", wire_consumers), ("batch", batch_consumers),
                           ("client", client_consumers)):
            for c in counts:
                cpu0, own0 = _cpu_s(b.pid), _cpu_s(os.getpid())
                dt = uvloop.run(fn(b.addr, f"{driver}{c}", c, n))
                us = (_cpu_s(b.pid) - cpu0) / n * 1e6
                own = (_cpu_s(os.getpid()) - own0) / n * 1e6
                rows.append(("notify", driver, c, n / dt))
                print(f"  notify   {driver:<7} {c:>3} consumers {n / dt:>10,.0f} msg/s "
                      f"(CPU per message: broker {us:.1f} us, consumers {own:.1f} us)",
                      flush=True)
    return rows


def slow_rows(
    counts: list[int], workdir: Path, slow_n: int, lock_ms: int, sysc: dict[str, int]
) -> list[tuple[str, str, int, float]]:
    """The 1 ms listener and the redelivery measurement."""
    rows = []
    with BrokerProcess(workdir / "slow", topics={"q": PARTS, "r": 1}, system={
        **sysc, "queueLockTimeout": lock_ms or 30_000}, log_level="warning") as b:
        if slow_n:
            uvloop.run(preload(b.addr, slow_n))
            for c in counts:
                dt = slow_consumers(b.addr, f"slow{c}", c, slow_n)
                rows.append(("notify", "slow1ms", c, slow_n / dt))
                print(f"  notify   slow1ms {c:>3} consumers {slow_n / dt:>10,.0f} msg/s",
                      flush=True)
        if lock_ms:
            uvloop.run(preload_topic(b.addr, "r", 1))
            got = sorted(uvloop.run(redelivery_ms(b.addr, f"redeliver{i}")) for i in range(5))
            rows.append(("notify", "redelivery", lock_ms, got[2]))
            print(f"  notify   redelivery after {got[2]:,.0f} ms (lock {lock_ms} ms; "
                  f"min {got[0]:,.0f}, max {got[-1]:,.0f})", flush=True)
    return rows


def rabbit_rows(n: int, counts: list[int], workdir: Path) -> list[tuple[str, str, int, float]]:
    import pika  # the peers' extra: only when RabbitMQ is benchmarked

    from bench.peers import rabbit_side as rs
    from bench.peers.servers import RabbitServer

    async def fill(port: int) -> None:
        c = await rs._Client.open(port, confirm=True)
        await rs._cb(lambda cb: c.ch.queue_declare(rs.QUEUE, durable=True, callback=cb))
        for i in range(0, n, 1000):
            c.publish(min(1000, n - i))
            await c.confirmed()
        await c.close()

    async def drain(port: int, consumers: int) -> float:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        got = [0]
        clients = [await rs._Client.open(port) for _ in range(consumers)]

        def on_message(chan: Any, method: Any, _p: Any, _b: bytes) -> None:
            got[0] += 1
            if method.delivery_tag % 100 == 0:
                chan.basic_ack(method.delivery_tag, multiple=True)
            if got[0] >= n and not finished.done():
                finished.set_result(None)

        for c in clients:
            await rs._cb(lambda cb, ch=c.ch: ch.basic_qos(prefetch_count=CREDIT, callback=cb))
        t0 = time.perf_counter()
        for c in clients:
            c.ch.basic_consume(rs.QUEUE, on_message)
        await asyncio.wait_for(finished, 600)
        dt = time.perf_counter() - t0
        for c in clients:
            await c.close()  # unacked tail (< 100 per consumer) goes back to the queue
        return dt

    assert pika
    rows = []
    srv = RabbitServer(workdir / "rabbitmq")
    srv.start()
    try:
        for c in counts:
            port = srv.port

            async def purge(port: int = port) -> None:
                cl = await rs._Client.open(port)
                await rs._cb(lambda cb: cl.ch.queue_declare(rs.QUEUE, durable=True, callback=cb))
                await rs._cb(lambda cb: cl.ch.queue_purge(rs.QUEUE, callback=cb))
                await cl.close()

            uvloop.run(purge())
            uvloop.run(fill(port))
            dt = uvloop.run(drain(port, c))
            rows.append(("RabbitMQ", "pika", c, n / dt))
            print(f"  RabbitMQ pika    {c:>3} consumers {n / dt:>10,.0f} msg/s", flush=True)
    finally:
        srv.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--consumers", default="1,4,16,32")
    ap.add_argument("--slow-messages", type=int, default=4000,
                    help="messages for the 1 ms listener (0: skip)")
    ap.add_argument("--lock-ms", type=int, default=1000,
                    help="queueLockTimeout for the redelivery measurement (0: skip)")
    ap.add_argument("--no-rabbit", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.consumers.split(",")]
    rows: list[tuple[str, str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as tmp:
        rows += notify_rows(args.messages, counts, Path(tmp) / "notify", args.slow_messages,
                            args.lock_ms)
        if not args.no_rabbit:
            if Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists():
                rows += rabbit_rows(args.messages, counts, Path(tmp))
            else:
                print("  (RabbitMQ not installed: scripts/peers.sh install)")
    print()
    print(f"queue consume + ack, {args.messages:,} messages of {len(BODY)} B (slow1ms: "
          f"{args.slow_messages:,}), topic of {PARTS} partitions, credit/prefetch {CREDIT} "
          "(slow1ms: 8)")
    print(f"{'system':<9} {'driver':<10} {'consumers':>9} {'msg/s':>10}")
    for system, driver, c, rate in rows:
        if driver == "redelivery":
            print(f"{system:<9} {driver:<10} {'':>9} {rate:>8,.0f} ms after the lock timeout "
                  f"of {c} ms ({(rate - c) / c:+.1%})")
        else:
            print(f"{system:<9} {driver:<10} {c:>9} {rate:>10,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
