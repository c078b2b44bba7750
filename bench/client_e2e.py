"""End-to-end client benchmark: produce and consume through notify.client.

    .venv/bin/python bench/client_e2e.py                 # 1,000,000 x 100 B
    .venv/bin/python bench/client_e2e.py --count 200000  # quicker

Starts a broker child process (``python -m notify broker start -c <ini>`` via
notify.testing.BrokerProcess) on 127.0.0.1 with its data in a temp directory, then:

1. produce: ``--count`` messages of ``--size`` bytes with the asyncio API
   (``send_nowait``, at most ``--window`` unacknowledged, mput batches), msg/s; then
   ``post()`` per message (no future), ``send_batch_nowait`` (``--batch`` messages per
   call), and the synchronous API: ``send_batch_future``, ``post()`` and ``send_future``
   per message, ``send()`` one at a time;
2. consume: the same messages from the earliest offset with an async listener, msg/s;
3. latency: a fixed rate (``--rate``, default 10,000 msg/s for ``--seconds``) from this
   process while a consumer in a child process (synchronous session, inline listener,
   polling tuned to 0.2-1 ms idle backoff) reads along; end-to-end latency = receive time -
   send time (monotonic clock,
   embedded in the message), p50/p99/max.

Prints one table. Everything shares this machine's cores with the broker; the client CPU
column (this process's CPU time per message, the broker is another process) is the figure
that holds up when other jobs load the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop
from rich.console import Console
from rich.table import Table

from notify.client import (
    AsyncMessageSessionFactory,
    BatchSendResult,
    ConsumerConfig,
    Message,
    MessageSessionFactory,
    ProducerConfig,
    SendResult,
)
from notify.testing import BrokerProcess

TOPIC = "bench"
#: failures are counted, not raised
LENIENT = ProducerConfig(raise_on_error=False)
_TS = struct.Struct(">q")


async def produce(addr: str, count: int, size: int, window: int) -> tuple[float, int]:
    body = b"x" * size
    failed = 0
    async with AsyncMessageSessionFactory([addr]) as s:
        p = s.create_producer(LENIENT)
        await p.publish(TOPIC)
        chunks: list[list[asyncio.Future[object]]] = []
        t0 = time.perf_counter()
        sent = 0
        while sent < count:
            n = min(5000, count - sent)
            chunks.append([p.send_nowait(TOPIC, body) for _ in range(n)])  # type: ignore[misc]
            sent += n
            while p.outstanding > window:
                await asyncio.sleep(0.0005)
            while chunks and all(f.done() for f in chunks[0]):
                failed += sum(not f.result().success for f in chunks.pop(0))  # type: ignore[attr-defined]
        await p.flush()
        elapsed = time.perf_counter() - t0
        for c in chunks:
            failed += sum(not f.result().success for f in c)  # type: ignore[attr-defined]
    return elapsed, failed


async def produce_posts(addr: str, count: int, size: int, window: int) -> tuple[float, int]:
    """``post()`` per message (no future; results counted), at most ``window`` pending."""
    body = b"x" * size
    async with AsyncMessageSessionFactory([addr]) as s:
        p = s.create_producer(LENIENT)
        await p.publish(TOPIC)
        t0 = time.perf_counter()
        sent = 0
        while sent < count:
            n = min(5000, count - sent)
            for _ in range(n):
                p.post(TOPIC, body)
            sent += n
            await p.drain(window)
        await p.flush()
        elapsed = time.perf_counter() - t0
        failed = p.posts_failed
        assert p.posts_acked + failed == count
    return elapsed, failed


async def produce_batches(addr: str, count: int, size: int, batch: int) -> tuple[float, int]:
    """``send_batch_nowait`` of ``batch`` messages at a time, at most 64 batches pending."""
    body = b"x" * size
    failed = 0
    async with AsyncMessageSessionFactory([addr]) as s:
        p = s.create_producer(LENIENT)
        await p.publish(TOPIC)
        pending: list[asyncio.Future[BatchSendResult]] = []
        t0 = time.perf_counter()
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            pending.append(p.send_batch_nowait(TOPIC, [body] * n))
            sent += n
            if len(pending) >= 64:
                r = await pending.pop(0)
                failed += 0 if r.success else len(r.msg_ids) or 1
        for r in await asyncio.gather(*pending):
            failed += 0 if r.success else 1
        elapsed = time.perf_counter() - t0
    return elapsed, failed


def produce_sync(addr: str, count: int, size: int, mode: str, batch: int) -> tuple[float, int]:
    """The synchronous API: ``send_batch`` (blocking per ``batch``), ``send_future`` (one
    future per message), ``post`` (no future, results counted) or ``send`` (one at a
    time, waiting for each ack)."""
    body = b"x" * size
    failed = 0
    with MessageSessionFactory([addr]) as s:
        p = s.create_producer(LENIENT)
        p.publish(TOPIC)
        t0 = time.perf_counter()
        if mode == "batch":
            futs = []
            for i in range(0, count, batch):
                futs.append(p.send_batch_future(TOPIC, [body] * min(batch, count - i)))
                if len(futs) >= 64:
                    failed += not futs.pop(0).result().success
            failed += sum(not f.result().success for f in futs)
        elif mode == "future":
            pending: list[concurrent.futures.Future[SendResult]] = []
            for _i in range(count):
                pending.append(p.send_future(TOPIC, body))
                if len(pending) >= 50_000:
                    failed += sum(not f.result().success for f in pending)
                    pending = []
            failed += sum(not f.result().success for f in pending)
        elif mode == "post":
            for i in range(count):
                p.post(TOPIC, body)
                if i % 5000 == 4999:
                    while p.outstanding > 50_000:
                        time.sleep(0.0005)
            p.flush()
            failed = p.posts_failed
        else:
            for _i in range(count):
                failed += not p.send(TOPIC, body).success
        elapsed = time.perf_counter() - t0
    return elapsed, failed


def raw_put_round_trips(addr: str, count: int, size: int) -> float:
    """The limit for ``send()`` one at a time: a blocking socket writing one ``put`` and
    reading its reply, ``count`` times (no client library); seconds."""
    host, port = addr.rsplit(":", 1)
    body = b"x" * size
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for i in range(count):
            sock.sendall(b"put %s 0 %d 0 %d\r\n%b" % (TOPIC.encode(), size, i + 1, body))
            if not sock.recv(4096):
                raise RuntimeError("broker closed the connection")
        return time.perf_counter() - t0


async def consume(addr: str, count: int, data_dir: Path) -> float:
    done = asyncio.Event()
    seen = 0

    async def listener(m: Message) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    async with AsyncMessageSessionFactory([addr]) as s:
        c = s.create_consumer(ConsumerConfig(group="bench", data_dir=data_dir))
        c.subscribe(TOPIC, listener)
        t0 = time.perf_counter()
        await c.complete_subscribe()
        await done.wait()
        elapsed = time.perf_counter() - t0
    return elapsed


def latency_consumer(addr: str, topic: str, total: int, out: Path, data_dir: Path) -> None:
    """Child process of the latency phase: consume, then write the latencies (ms)."""
    lat = array("d")
    all_in = threading.Event()

    def listener(m: Message) -> None:
        now = time.monotonic_ns()
        if m.flag:  # warm-up messages carry an attribute
            return
        (ts,) = _TS.unpack_from(m.payload, 0)
        lat.append((now - ts) / 1e6)
        if len(lat) >= total:
            all_in.set()

    cfg = ConsumerConfig(
        group="latency",
        data_dir=data_dir,
        initial_offset="latest",
        listener_threads=0,  # inline: the listener is trivial
        idle_backoff_min_s=0.0002,
        idle_backoff_max_s=0.001,
    )
    with MessageSessionFactory([addr]) as session:
        c = session.create_consumer(cfg)
        c.subscribe(topic, listener).complete_subscribe()
        time.sleep(0.3)  # every partition has its "latest" offset
        print("ready", flush=True)
        all_in.wait(120)
        c.shutdown()
    out.write_bytes(lat.tobytes())


def latency(
    addr: str, topic: str, rate: int, seconds: float, warmup_s: float, size: int, data_dir: Path
) -> list[float]:
    """Fixed-rate producer here, consumer in a child process (no shared GIL).

    The first ``warmup_s`` seconds of messages carry an attribute and are not measured.
    """
    total = int(rate * seconds)
    warm = int(rate * warmup_s)
    out = data_dir / f"latencies-{topic}.bin"
    args = [addr, topic, str(total), str(out), str(data_dir / f"c-{topic}")]
    child = subprocess.Popen(
        [sys.executable, __file__, "--latency-consumer", *args],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != b"ready":
            raise RuntimeError("latency consumer did not start")

        async def paced() -> None:
            async with AsyncMessageSessionFactory([addr]) as s:
                p = s.create_producer(LENIENT)
                await p.publish(topic)
                pad = b"y" * max(0, size - 8)
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                i = 0
                while i < warm + total:
                    due = min(warm + total, int((loop.time() - t0) * rate) + 1)
                    while i < due:
                        attr = "w" if i < warm else None
                        p.send_nowait(topic, _TS.pack(time.monotonic_ns()) + pad, attr)
                        i += 1
                    await asyncio.sleep(0.0005)
                await p.flush()

        uvloop.run(paced())
        child.wait(150)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    lat = array("d")
    if out.exists():
        lat.frombytes(out.read_bytes())
    return list(lat)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--latency-consumer":
        _, _, addr, topic, total, out, data_dir = sys.argv
        latency_consumer(addr, topic, int(total), Path(out), Path(data_dir))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--window", type=int, default=50_000, help="max unacknowledged sends")
    ap.add_argument("--batch", type=int, default=1000, help="messages per send_batch")
    ap.add_argument("--one-count", type=int, default=20_000, help="messages sent one at a time")
    ap.add_argument("--rate", type=int, default=10_000, help="latency phase msg/s")
    ap.add_argument("--seconds", type=float, default=5.0, help="latency phase duration")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    args = ap.parse_args()

    console = Console()
    lat_topics = {"lat1": 1, f"lat{args.partitions}": args.partitions}
    topics = {TOPIC: args.partitions, **lat_topics}
    with tempfile.TemporaryDirectory(prefix="notify-client-bench-") as tmp:
        work = Path(tmp)
        broker = BrokerProcess(work / "broker", topics=topics, log_level="warning")
        broker.start()
        try:
            console.print(
                f"broker {broker.addr} (pid {broker.pid}), {args.count:,} x {args.size} B"
            )
            cpu = time.process_time()
            p_s, failed = uvloop.run(produce(broker.addr, args.count, args.size, args.window))
            p_cpu = time.process_time() - cpu
            console.print(f"produce: {p_s:.2f}s, failed {failed}")
            extra: list[tuple[str, int, float, int, float]] = []
            cpu = time.process_time()
            po_s, po_failed = uvloop.run(
                produce_posts(broker.addr, args.count, args.size, args.window)
            )
            extra.append(
                (
                    "produce (async, post() per message)",
                    args.count,
                    po_s,
                    po_failed,
                    time.process_time() - cpu,
                )
            )
            cpu = time.process_time()
            b_s, b_failed = uvloop.run(
                produce_batches(broker.addr, args.count, args.size, args.batch)
            )
            extra.append(
                (
                    f"produce (async, send_batch x{args.batch})",
                    args.count,
                    b_s,
                    b_failed,
                    time.process_time() - cpu,
                )
            )
            for mode, n, label in (
                ("batch", args.count, f"produce (sync, send_batch x{args.batch})"),
                ("post", args.count, "produce (sync, post() per message)"),
                ("future", args.count // 2, "produce (sync, send_future)"),
                ("one", args.one_count, "produce (sync, send() one at a time)"),
            ):
                cpu = time.process_time()
                m_s, m_failed = produce_sync(broker.addr, n, args.size, mode, args.batch)
                extra.append((label, n, m_s, m_failed, time.process_time() - cpu))
            cpu = time.process_time()
            raw_s = raw_put_round_trips(broker.addr, args.one_count, args.size)
            extra.append(
                (
                    "limit: raw put round trip, one at a time",
                    args.one_count,
                    raw_s,
                    0,
                    time.process_time() - cpu,
                )
            )
            console.print("produce variants done")
            cpu = time.process_time()
            c_s = uvloop.run(consume(broker.addr, args.count, work / "c1"))
            c_cpu = time.process_time() - cpu
            console.print(f"consume: {c_s:.2f}s")
            lats = {
                t: latency(broker.addr, t, args.rate, args.seconds, args.warmup, args.size, work)
                for t in lat_topics
            }
        finally:
            broker.stop()

    t = Table(title="notify.client end to end (loopback, one broker)")
    t.add_column("phase")
    t.add_column("messages", justify="right")
    t.add_column("seconds", justify="right")
    t.add_column("msg/s", justify="right")
    t.add_column("MB/s", justify="right")
    t.add_column("client CPU µs/msg", justify="right")
    t.add_column("notes")
    mb = args.size / 1e6
    t.add_row(
        "produce (async, mput)",
        f"{args.count:,}",
        f"{p_s:.2f}",
        f"{args.count / p_s:,.0f}",
        f"{args.count * mb / p_s:.1f}",
        f"{p_cpu / args.count * 1e6:.1f}",
        f"failed={failed}",
    )
    for label, n, secs, nfail, cpu_s in extra:
        t.add_row(
            label,
            f"{n:,}",
            f"{secs:.2f}",
            f"{n / secs:,.0f}",
            f"{n * mb / secs:.1f}",
            f"{cpu_s / n * 1e6:.1f}",
            f"failed={nfail}",
        )
    t.add_row(
        "consume (async listener)",
        f"{args.count:,}",
        f"{c_s:.2f}",
        f"{args.count / c_s:,.0f}",
        f"{args.count * mb / c_s:.1f}",
        f"{c_cpu / args.count * 1e6:.1f}",
        "from earliest",
    )
    ok = True
    for topic, lat in lats.items():
        parts = lat_topics[topic]
        t.add_row(
            f"e2e @ {args.rate:,}/s, {parts} partition{'s' if parts > 1 else ''}",
            f"{len(lat):,}",
            f"{args.seconds:.1f}",
            f"{args.rate:,}",
            "",
            "",
            f"p50={pct(lat, 0.5):.2f}ms p99={pct(lat, 0.99):.2f}ms max={max(lat or [0]):.2f}ms",
        )
        ok = ok and len(lat) == int(args.rate * args.seconds) and pct(lat, 0.99) < 5.0
    console.print(t)
    console.print(f"goal p99 < 5 ms: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
