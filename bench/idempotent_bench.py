"""Idempotent producer throughput on the broker: the identity check's cost, A/B-ready.

    .venv/bin/python bench/idempotent_bench.py [--rounds 2] [--quick]
    # A/B: the same script against another checkout, alternated in the same minutes
    PYTHONPATH=/path/to/older/checkout .venv/bin/python bench/idempotent_bench.py

One fresh broker per scenario (topic bench:1, default flush), loaded by broker_bench's
pipelining client (precomputed frames, replies counted by a C-level scan): pipelined
``mput`` of 1000 x 100-byte records without properties, with a key in each record's
properties (no producer), and from one idempotent producer (its id and consecutive
sequences in every record); pipelined single ``put`` plain and idempotent. The idempotent
scenarios claim their identity first (``producer`` verb) when the checkout has one (an
older broker takes the records unclaimed). Prints msg/s per scenario and round, then the
best round.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uvloop
from broker_bench import crc, pipelined

from notify.client._message import build_payload
from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.testing import BrokerProcess

SECRET = "bench-producer-secret-0001"
BATCH = 1000
SIZE = 100


def identity() -> tuple[str, bytes]:
    """The producer id and the frame that claims it (empty on a checkout without it)."""
    try:
        from notify.protocol.identity import encode_claim, producer_id
    except ImportError:  # an older checkout: puts name an id nobody claims
        return "bench-producer", b""
    pid = producer_id("", SECRET)
    return pid, encode_claim(pid, SECRET, 0, "-", 2**31 - 2)


def mput_frames(kind: str, pid: str, n: int) -> list[bytes]:
    body = b"m" * SIZE
    if kind == "plain":
        block = records.encode(0, 0, body) * BATCH
        return [encode_mput("bench", 0, block, BATCH, i) for i in range(n // BATCH)]
    out = []
    for i in range(n // BATCH):
        recs = []
        for j in range(BATCH):
            if kind == "keyed":
                p, f = build_payload(body, None, key=b"k%d" % j)
            else:
                p, f = build_payload(body, None, producer_id=pid, sequence=i * BATCH + j)
            recs.append(records.encode(0, f, p))
        out.append(encode_mput("bench", 0, b"".join(recs), BATCH, i))
    return out


def put_frames(kind: str, pid: str, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        if kind == "plain":
            p, f = b"p" * SIZE, 0
        else:
            p, f = build_payload(b"p" * SIZE, None, producer_id=pid, sequence=i)
        out.append(b"put bench 0 %d %d %d %d\r\n%b" % (len(p), f, crc(p), i, p))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a fifth of the messages")
    ap.add_argument("--only", default="", help="scenarios whose name contains this")
    a = ap.parse_args()
    n_mput = 400_000 if a.quick else 2_000_000
    n_put = 40_000 if a.quick else 200_000
    pid, claim = identity()
    scenarios = [
        ("mput x1000, no properties", lambda: mput_frames("plain", pid, n_mput), BATCH, False),
        ("mput x1000, keyed (no producer)", lambda: mput_frames("keyed", pid, n_mput), BATCH,
         False),
        ("mput x1000, idempotent", lambda: mput_frames("idem", pid, n_mput), BATCH, True),
        ("put, no properties", lambda: put_frames("plain", pid, n_put), 1, False),
        ("put, idempotent", lambda: put_frames("idem", pid, n_put), 1, True),
    ]
    scenarios = [sc for sc in scenarios if a.only in sc[0]]
    tmp = Path(tempfile.mkdtemp(prefix="notify-idem-bench-"))
    best: dict[str, float] = {}
    import notify

    print(f"checkout {Path(notify.__file__).parents[1]}  claim frame: {bool(claim)}")
    built = {name: make() for name, make, _per, _claims in scenarios}
    for rnd in range(a.rounds):
        for name, _make, per, claims in scenarios:
            frames = built[name]
            b = BrokerProcess(tmp / f"r{rnd}-{len(best)}-{time.monotonic_ns()}",
                              topics={"bench": 1}, log_level="warning")  # fmt: skip
            b.start()
            try:
                todo = ([claim] if claims and claim else []) + frames
                window = 64 if per > 1 else 20_000
                dt, _ok = uvloop.run(pipelined((b.host, b.port), todo, window))
            finally:
                b.stop()
            rate = len(frames) * per / dt
            best[name] = max(best.get(name, 0.0), rate)
            print(f"round {rnd}  {name:34s} {rate:12,.0f} msg/s", flush=True)
    print("\nbest of rounds")
    for name, rate in best.items():
        print(f"  {name:34s} {rate:12,.0f} msg/s")


if __name__ == "__main__":
    main()
