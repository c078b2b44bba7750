"""The delay queue's delivered set follows replication. The master's delay log
(MOVE / MOVED / CKPT records) travels to its slaves as the ``__delaylog`` stream, so after
``kill -9`` of the master and ``promote`` every delayed message is delivered exactly once:
the ones already moved are not moved again, the pending ones still come when due.

Real broker processes; the master dies by SIGKILL.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from notify.testing import BrokerProcess, free_port
from tests.broker.test_delay import dput, now_ms
from tests.helpers import WireClient, read_all, stats
from tests.replication.test_tx_failover import _pair, _wait


def _bodies(addr: str) -> Counter[bytes]:
    return Counter(r.payload for r in read_all(addr, "orders"))


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_promoted_slave_delivers_each_delayed_message_once(tmp_path: Path, sync: bool) -> None:
    master, slave = _pair(tmp_path, sync=sync)
    try:
        base = now_ms()
        with WireClient(master.addr) as c:
            for i in range(5):  # due at once: moved by the master before it dies
                dput(c, "orders", b"early%d" % i, base - 1000, opaque=i + 1)
            for i in range(5):  # due after the failover: moved by the promoted slave
                dput(c, "orders", b"late%d" % i, base + 2500, opaque=i + 10)
        _wait(lambda: len(_bodies(master.addr)) == 5, 5, "early messages moved on the master")
        if not sync:  # an async slave is exact once it has caught up (README)
            _wait(
                lambda: stats(slave.addr).get("replication.delaylog", "").split(" ")[0]
                == "slave_end=" + stats(master.addr)["delay_log_end"],
                5,
                "delay log caught up",
            )
            _wait(lambda: len(_bodies(slave.addr)) == 5, 5, "early messages on the slave")
        master.kill()
        with WireClient(slave.addr) as c:
            assert c.call(b"promote 1\r\n").code == 200
        want = Counter([b"early%d" % i for i in range(5)] + [b"late%d" % i for i in range(5)])
        _wait(lambda: len(_bodies(slave.addr)) >= 10, 8, "late messages moved by the slave")
        time.sleep(0.3)  # a second move of anything would show now
        assert _bodies(slave.addr) == want
        if sync:  # (once is enough) and the promoted slave's log recovers as a master's
            slave.restart(kill=True)
            time.sleep(0.3)
            assert _bodies(slave.addr) == want
            assert int(stats(slave.addr)["delay_pending"]) == 0
    finally:
        master.kill()
        slave.stop()


def test_slave_carries_the_bounded_delivered_set_and_trims_once_promoted(
    tmp_path: Path,
) -> None:
    """On a slave: ``delayMaxDelivered`` is applied by the master; a slave
    keeps no delivered set of its own but its master's CKPT states (bounded by the cap) and
    the MOVED records since, so it does not grow with the messages delivered behind a
    far-future one. Once promoted, its delivered set is at most the cap again (it trims as
    a master), the far message is still pending and every due one was delivered once."""
    limit, n = 16, 120
    system = {
        "replicationSecret": "repl-secret",
        "delayCheckpointInterval": 200,
        "delayMaxDelivered": limit,
        "unflushThreshold": 0,
    }
    master = BrokerProcess(tmp_path / "m", topics={"orders": 1}, system=system)
    master.port = free_port()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={"orders": 1},
        system=system,
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
    )
    slave.start()
    master.start()
    try:
        base = now_ms()
        with WireClient(master.addr) as c:
            dput(c, "orders", b"far", base + 3_600_000)
            for i in range(n):
                dput(c, "orders", b"now%03d" % i, base - 1000, opaque=i + 2)
        _wait(lambda: len(_bodies(master.addr)) == n, 10, "due messages moved on the master")
        _wait(lambda: int(stats(master.addr)["delay_delivered_tracked"]) <= limit, 5, "trim")
        time.sleep(0.5)  # a checkpoint after the trim: its CKPT record reaches the slave
        _wait(
            lambda: stats(slave.addr).get("replication.delaylog", "").split(" ")[0]
            == "slave_end=" + stats(master.addr)["delay_log_end"],
            5,
            "delay log caught up",
        )
        _wait(lambda: len(_bodies(slave.addr)) == n, 5, "moved messages on the slave")
        assert int(stats(slave.addr)["delay_delivered_tracked"]) == 0  # no set of its own
        master.kill()
        with WireClient(slave.addr) as c:
            assert c.call(b"promote 1\r\n").code == 200
        st = stats(slave.addr)
        assert int(st["delay_delivered_tracked"]) <= 2 * limit, st  # the cap + one interval
        _wait(lambda: int(stats(slave.addr)["delay_delivered_tracked"]) <= limit, 5, "trimmed")
        assert stats(slave.addr)["delay_pending"] == "1"
        time.sleep(0.3)  # a mover round: nothing moved again
        got = _bodies(slave.addr)
        assert b"far" not in got and len(got) == n and max(got.values()) == 1, got
    finally:
        master.kill()
        slave.stop()
