"""With a synchronous slave and ``syncSlaveFailurePolicy=refuse``, a put answered
503 is not stored. The master appends each batch *held* (invisible to consumers) and takes it
back before answering 503; a slave that got it late is cut back to the master's end, so the
client's retry stores the message exactly once on both.

Real broker processes; the slave is frozen with SIGSTOP so it receives the pushes but
answers too late.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from notify.protocol import records
from tests.helpers import WireClient
from tests.replication.test_replication import _pair, segment_bytes, stats, wait_equal


def _bodies(addr: str) -> list[bytes]:
    with WireClient(addr) as c:
        r = c.call(b"get rep g 0 0 1048576 1\r\n")
    return [] if r.code != 200 else [x.body for x in records.decode_all(r.body, 0)[0]]


def test_put_answered_503_is_not_stored_and_its_retry_is_stored_once(tmp_path: Path) -> None:
    master, slave = _pair(tmp_path, "refuse", timeout_ms=400)
    try:
        with WireClient(master.addr) as c:
            assert c.put("rep", 0, b"in sync").code == 200
        os.kill(slave.pid, signal.SIGSTOP)  # gets the pushes, answers none in time
        try:
            with WireClient(master.addr) as c:
                codes = [c.put("rep", 0, b"refused").code for _ in range(3)]
            assert codes == [503, 503, 503]
            assert _bodies(master.addr) == [b"in sync"]  # never visible, and taken back
        finally:
            os.kill(slave.pid, signal.SIGCONT)
        # the slave now appends what it had queued; the master's probe cuts it back
        deadline = time.monotonic() + 10
        while stats(master.addr)["sync_slave_state"] != "in_sync":
            assert time.monotonic() < deadline, stats(master.addr)
            time.sleep(0.1)
        assert int(stats(master.addr)["sync_refused_taken_back"]) >= 1
        with WireClient(master.addr) as c:
            rr = c.put("rep", 0, b"refused")
            assert rr.code == 200, rr  # the client retry
        wait_equal(master, slave)
        assert _bodies(master.addr) == [b"in sync", b"refused"]  # stored once
        assert segment_bytes(master, "rep", 0) == segment_bytes(slave, "rep", 0)
        master.restart(kill=True)  # nothing refused comes back after a crash either
        assert _bodies(master.addr) == [b"in sync", b"refused"]
    finally:
        slave.stop()
        master.stop()
