"""Atomic visibility of a transaction that spans two partitions, watched while it commits.

A producer commits transactions with one message in partition ``a`` and one in ``b``; a
reader keeps reading ``a`` to its end and then ``b`` to its end. Since ``b`` is read after
``a``, every transaction whose message the reader saw in ``a`` must be visible in ``b``
too; otherwise a consumer saw part of a transaction (README: "A consumer never sees part of
a transaction").
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from notify.protocol import records
from notify.testing import BrokerProcess
from tests.faults import summary
from tests.helpers import WireClient, crc

pytestmark = pytest.mark.slow


def _watch(b: BrokerProcess, seconds: float) -> tuple[int, int, int]:
    """Returns (transactions committed, reader passes, passes that saw a partial one)."""
    stop = threading.Event()
    stats = {"passes": 0, "partial": 0}

    def reader() -> None:
        offs = {"a": 0, "b": 0}
        seen: dict[str, set[bytes]] = {"a": set(), "b": set()}
        with WireClient(b.addr) as c:
            while not stop.is_set():
                for t in ("a", "b"):
                    for _ in range(10_000):
                        r = c.call(b"get %s g 0 %d 1048576 1\r\n" % (t.encode(), offs[t]))
                        if r.code != 200:
                            break
                        recs, used = records.decode_all(r.body, offs[t])
                        offs[t] += used
                        seen[t].update(x.body.split(b"|")[0] for x in recs)
                stats["passes"] += 1
                if seen["a"] - seen["b"]:
                    stats["partial"] += 1
                    stop.set()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    n = 0
    deadline = time.monotonic() + seconds
    with WireClient(b.addr) as c:
        while time.monotonic() < deadline and not stop.is_set():
            n += 1
            key = b"TX:v:%d" % n
            ba, bb = b"%d|a" % n, b"%d|b" % n
            c.send(
                b"transaction %s v BEGIN 30 1\r\n" % key
                + b"put a 0 %d 0 %d %s 2\r\n%b" % (len(ba), crc(ba), key, ba)
                + b"put b 0 %d 0 %d %s 3\r\n%b" % (len(bb), crc(bb), key, bb)
                + b"transaction %s v COMMIT_ONE_PHASE 4\r\n" % key
            )
            assert all(r.code == 200 for r in c.replies(4))
    stop.set()
    th.join(10)
    return n, stats["passes"], stats["partial"]


def _run(tmp_path: Path, threshold: int, seconds: float) -> None:
    b = BrokerProcess(
        tmp_path,
        topics={"a": 1, "b": 1},
        system={"unflushThreshold": threshold},
        log_level="warning",
    )
    b.start()
    try:
        n, passes, partial = _watch(b, seconds)
    finally:
        b.stop()
    summary.record(
        "visibility",
        **{
            f"threshold{threshold}": {
                "transactions": n,
                "reader_passes": passes,
                "partial_observed": partial,
            }
        },
    )
    assert passes > 10
    assert partial == 0, f"a reader saw part of a transaction ({n} transactions, {passes} passes)"


def test_two_partition_transaction_appears_at_once(tmp_path: Path) -> None:
    _run(tmp_path, 1, 3.0)


def test_two_partition_transaction_appears_at_once_under_group_commit(tmp_path: Path) -> None:
    _run(tmp_path, 0, 10.0)
