"""A group of three (master ``a``, synchronous slave ``b``, asynchronous slave ``c``)
with real broker processes and a real ZooKeeper (2 s sessions): when the master dies, the
in-sync slave with the most data leads, even when another eligible slave got the lock
first, and the other slave follows the new master."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, read_all, stats
from tests.replication.test_auto_failover import (
    REPL,
    SESSION_MS,
    _segments,
    _stats_or_empty,
    _wait,
    print_decisions,
)
from tests.services import ZooKeeperServer


@pytest.fixture
def trio(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[list[BrokerProcess]]:
    pa, pb, pc = free_port(), free_port(), free_port()
    zkc = {
        "zkEnable": True,
        "zkConnect": zookeeper.connect,
        "zkRoot": zk_root,
        "zkSessionTimeoutMs": SESSION_MS,
        "zkConnectionTimeoutMs": 5000,
    }
    common = {
        "brokerId": 1,
        "replicationSecret": REPL,
        "autoFailover": "true",
        "failoverMaxLagBytes": 1 << 20,  # c is eligible though behind: the size decides
        "syncSlaveTimeout": 1000,
        "syncSlaveFailurePolicy": "async",
    }
    slave = {"masterAddress": f"127.0.0.1:{pa}", "slaveMaxDelayInMills": 100}
    a = BrokerProcess(
        tmp_path / "a",
        topics={"orders": 1},
        system={**common, "syncSlave": f"127.0.0.1:{pb}"},
        zookeeper=zkc,
    )
    b = BrokerProcess(
        tmp_path / "b",
        topics={"orders": 1},
        system={**common, "syncSlave": f"127.0.0.1:{pa}"},
        slave={**slave, "slaveId": 1},
        zookeeper=zkc,
    )
    c = BrokerProcess(
        tmp_path / "c", topics={"orders": 1}, system=common, slave={**slave, "slaveId": 2},
        zookeeper=zkc,
    )  # fmt: skip
    a.port, b.port, c.port = pa, pb, pc
    yield [a, b, c]
    for x in (a, b, c):
        if x.proc is not None and x.proc.poll() is None:
            os.kill(x.proc.pid, signal.SIGCONT)
        x.kill()
    print_decisions({"a": a, "b": b, "c": c})


def test_slave_with_most_data_leads_and_the_other_follows(trio: list[BrokerProcess]) -> None:
    a, b, c = trio
    a.start()
    c.start()  # c queues for the group's lock first: it gets it first when a dies
    _wait(lambda: stats(c.addr).get("failover_contending") == "True", what="c contending")
    b.start()
    _wait(lambda: stats(a.addr).get("sync_slave_state") == "in_sync", what="b in sync")
    _wait(lambda: stats(b.addr).get("failover_contending") == "True", what="b contending")
    with WireClient(a.addr) as w:
        for i in range(5):
            assert w.put("orders", 0, b"both-%d" % i).code == 200
    _wait(lambda: _segments(c) == _segments(a), what="c caught up")
    assert c.proc is not None
    os.kill(c.proc.pid, signal.SIGSTOP)  # c misses the next puts; b (synchronous) has them
    try:
        with WireClient(a.addr) as w:
            for i in range(20):
                assert w.put("orders", 0, b"b-only-%d" % i).code == 200
        a.kill()
    finally:
        os.kill(c.proc.pid, signal.SIGCONT)
    # b holds the group's lock a moment before its broker turns master: wait for both
    _wait(
        lambda: (
            _stats_or_empty(b.addr).get("failover_leader") == "True"
            and _stats_or_empty(b.addr).get("role") == "master"
        ),
        what="b leads and is master",
    )
    assert stats(b.addr)["failover_epoch"] == "2"
    assert "handing the lock on" in c.log_path.read_text()  # c had the lock first
    want = [b"both-%d" % i for i in range(5)] + [b"b-only-%d" % i for i in range(20)]
    with WireClient(b.addr) as w:
        assert w.put("orders", 0, b"after").code == 200
    assert [x.body for x in read_all(b.addr, "orders", 0)] == [*want, b"after"]
    # c follows the new master and ends with its bytes
    # (c may restart in its process on the way: a follower that sees a newer epoch rejoins)
    _wait(
        lambda: (
            _stats_or_empty(c.addr).get("failover_epoch") == "2"
            and _stats_or_empty(c.addr).get("role") == "slave"
        ),
        what="c follows b",
    )
    _wait(lambda: _segments(c) == _segments(b), what="c has b's bytes")
