"""Delivery latency of ``consumer.messages()`` (the pull iterator) and ``idle_timeout_s``.

    .venv/bin/python bench/consumer_poll.py                  # 4 partitions, 200 messages
    .venv/bin/python bench/consumer_poll.py --partitions 8 --count 100

Starts a broker child process (notify.testing.BrokerProcess) on 127.0.0.1, then a thread
sends one message every ``--interval`` seconds to a random partition (random key),
with its send time (monotonic clock) in the body, while the main thread iterates
``consumer.messages(topic)``; latency = receive time - send time. Then it measures how long
``messages(topic, idle_timeout_s=0.5)`` takes to end on the idle topic. Prints p50/p99/max.
"""

from __future__ import annotations

import argparse
import random
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from notify.client import ConsumerConfig, connect
from notify.testing import BrokerProcess

_TS = struct.Struct(">d")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.02)
    ap.add_argument("--idle-timeout", type=float, default=0.5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "b", topics={"lat": args.partitions}).start()
        try:
            run(broker.addr, Path(tmp) / "c", args)
        finally:
            broker.stop()


def run(addr: str, data_dir: Path, args: argparse.Namespace) -> None:
    with connect([addr]) as s:
        producer = s.create_producer()
        consumer = s.create_consumer(ConsumerConfig(group="lat", data_dir=data_dir))
        producer.send("lat", _TS.pack(time.monotonic())).raise_for_error()  # warm up

        def produce() -> None:
            time.sleep(0.3)
            for _ in range(args.count):
                key = str(random.random())
                producer.send("lat", _TS.pack(time.monotonic()), key=key)
                time.sleep(args.interval)

        t = threading.Thread(target=produce, daemon=True)
        lat: list[float] = []
        t.start()
        for msg in consumer.messages("lat", idle_timeout_s=5.0):
            lat.append((time.monotonic() - _TS.unpack(msg.data)[0]) * 1000)
            if len(lat) == args.count + 1:
                break
        t.join()
        lat = sorted(lat[1:])
        t0 = time.monotonic()
        extra = sum(1 for _ in consumer.messages("lat", idle_timeout_s=args.idle_timeout))
        idle = time.monotonic() - t0
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(
        f"partitions={args.partitions} messages={len(lat)} latency ms: "
        f"p50={statistics.median(lat):.1f} p99={p99:.1f} max={lat[-1]:.1f}; "
        f"messages(idle_timeout_s={args.idle_timeout}) ended after {idle:.2f} s"
        f" ({extra} more)"
    )


if __name__ == "__main__":
    main()
