"""Many delayed messages delivered behind one far-future message
in the *active* ``__delay`` segment (which compaction never frees) no longer grow the delivered
set and the checkpoint without bound. Past ``delayMaxDelivered`` offsets above the watermark
the oldest pending messages are re-put at the end of ``__delay`` and the watermark passes
what was delivered. A SIGKILL afterwards loses nothing and delivers nothing twice.

One real broker process, a 200 ms delay checkpoint and ``delayMaxDelivered=16``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from notify.testing import BrokerProcess
from tests.broker.test_delay import dput, now_ms
from tests.helpers import WireClient, read_all, stats, wait_until

LIMIT = 16
N = 150


stats_now: dict[str, str] = {}


def _with_stats(what: str) -> Callable[[], str]:
    return lambda: f"{what}: {stats_now}"


def _tracked(addr: str) -> int:
    stats_now.clear()
    stats_now.update(stats(addr))
    return int(stats_now["delay_delivered_tracked"])


def _checkpoint_bytes(data: Path) -> int:
    return max((p.stat().st_size for p in (data / "delay").glob("checkpoint*")), default=0)


def test_delivered_behind_a_far_future_message_stay_bounded(tmp_path: Path) -> None:
    sysc = {"delayCheckpointInterval": 200, "delayMaxDelivered": LIMIT, "unflushThreshold": 0}
    b = BrokerProcess(tmp_path, topics={"orders": 1}, system=sysc)
    b.start()
    try:
        base = now_ms()
        with WireClient(b.addr) as c:
            dput(c, "orders", b"far", base + 3_600_000)  # pins the watermark for an hour
            for i in range(N):  # due at once, all behind it in the same (active) segment
                dput(c, "orders", b"now%03d" % i, base - 1000, opaque=i + 2)
                if i % 50 == 49:  # a few checkpoints in between
                    time.sleep(0.25)
        wait_until(
            lambda: len(read_all(b.addr, "orders")) >= N,
            10,
            what=_with_stats("all due messages delivered"),
        )
        wait_until(lambda: _tracked(b.addr) <= LIMIT, 5, what=_with_stats("delivered set trimmed"))
        st = stats(b.addr)
        assert st["delay_pending"] == "1" and int(st["delay_compacted"]) >= 1, st
        # the checkpoint file (its last 3 checkpoints) holds watermarks and at most a few
        # LIMITs of offsets, not N (8 bytes each)
        bound = 3 * (64 + 8 * 2 * LIMIT)
        wait_until(
            lambda: _checkpoint_bytes(b.data_dir) < bound, 5, what=_with_stats("small checkpoints")
        )
        b.restart(kill=True)
        st = stats(b.addr)
        assert st["delay_pending"] == "1", st  # the far message is still there, not due
        time.sleep(0.5)  # a mover round after the restart: nothing is delivered again
        got = Counter(r.payload for r in read_all(b.addr, "orders"))
        assert b"far" not in got, got
        assert len(got) == N and max(got.values()) == 1, got
    finally:
        b.stop()
