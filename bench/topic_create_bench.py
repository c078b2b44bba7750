"""REST topic creation cost as topics accumulate.

Starts a real broker with HTTP, creates ``--topics`` topics one by one through
``POST /api/topics`` and reports the latency of each block of 50, plus how long the
broker's event loop was blocked meanwhile (a 10 ms probe on the wire port: the worst gap
between two ``version`` replies).

    PYTHONPATH=$PWD .venv/bin/python bench/topic_create_bench.py --topics 300
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(
            Path(tmp), topics={"seed": 1}, system={"dashboardHttpPort": free_port()}
        ).start()
        try:
            stop = threading.Event()
            worst = [0.0]

            def probe() -> None:
                with WireClient(b.addr) as c:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        c.call(b"version 1\r\n")
                        worst[0] = max(worst[0], time.perf_counter() - t0)
                        time.sleep(0.01)

            th = threading.Thread(target=probe, daemon=True)
            th.start()
            lat: list[float] = []
            for i in range(args.topics):
                body = json.dumps({"name": f"bench{i}", "numPartitions": 1}).encode()
                req = urllib.request.Request(
                    b.http_url + "/api/topics",
                    data=body,
                    method="POST",
                    headers={"Content-Type": "application/json"},
                )
                t0 = time.perf_counter()
                with urllib.request.urlopen(req, timeout=60) as r:
                    assert r.status == 201
                lat.append(time.perf_counter() - t0)
            stop.set()
            th.join()
            for start in range(0, len(lat), 50):
                blk = lat[start : start + 50]
                print(
                    f"topics {start + 1:4d}-{start + len(blk):4d}: "
                    f"mean {1000 * sum(blk) / len(blk):7.1f} ms  max {1000 * max(blk):7.1f} ms"
                )
            print(f"worst wire 'version' reply while creating: {1000 * worst[0]:.1f} ms")
        finally:
            b.stop()


if __name__ == "__main__":
    main()
