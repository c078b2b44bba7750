"""Issue 21: automatic failover with fencing in ZooKeeper mode (``autoFailover=true``).

A group of two real broker processes (the configured master pushes to a synchronous slave)
and a real ZooKeeper with 2 s sessions: ``kill -9`` the master and the slave takes over by
itself (kazoo lock, epoch bumped in ZooKeeper, re-registered as master); no acknowledged put
or committed transaction is lost; the old master restarted rejoins as a slave and ends with
the same bytes; a master paused (SIGSTOP) past its session refuses writes when it wakes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from notify.testing import BrokerProcess, free_port
from tests.broker.test_transactions import read_all, stats, tput, tx
from tests.services import ZooKeeperServer
from tests.wireclient import WireClient

REPL = "repl-secret"
SESSION_MS = 2000


def _wait(cond: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - t0


class Group:
    """Broker id 1: ``a`` (configured master, syncSlave=b) and ``b`` ([slave] slaveId=1,
    syncSlave=a for when it is master)."""

    def __init__(self, tmp: Path, zk: ZooKeeperServer, root: str):
        self.root = root
        self.zk = zk
        pa, pb = free_port(), free_port()
        zkc = {
            "zkEnable": True,
            "zkConnect": zk.connect,
            "zkRoot": root,
            "zkSessionTimeoutMs": SESSION_MS,
            "zkConnectionTimeoutMs": 5000,
        }
        common = {
            "brokerId": 1,
            "replicationSecret": REPL,
            "autoFailover": "true",
            "syncSlaveTimeout": 1000,
        }
        self.a = BrokerProcess(
            tmp / "a",
            topics={"orders": 1},
            system={**common, "syncSlave": f"127.0.0.1:{pb}"},
            zookeeper=zkc,
        )
        self.a.port = pa
        self.b = BrokerProcess(
            tmp / "b",
            topics={"orders": 1},
            system={**common, "syncSlave": f"127.0.0.1:{pa}", "syncSlaveFailurePolicy": "async"},
            slave={"slaveId": 1, "masterAddress": f"127.0.0.1:{pa}", "slaveMaxDelayInMills": 100},
            zookeeper=zkc,
        )
        self.b.port = pb

    def start(self) -> None:
        self.a.start()
        self.b.start()
        _wait(lambda: stats(self.a.addr).get("sync_slave_state") == "in_sync", what="sync")
        _wait(lambda: stats(self.a.addr).get("sync_slave_connected") == "True", what="link")

    def stop(self) -> None:
        for b in (self.a, self.b):
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()


@pytest.fixture
def group(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(tmp_path, zookeeper, zk_root)
    yield g
    g.stop()


def _zk_get(zk: ZooKeeperServer, path: str) -> bytes | None:
    kz = KazooClient(hosts=zk.connect, timeout=5.0)
    kz.start(timeout=10)
    try:
        return kz.get(path)[0] if kz.exists(path) else None
    finally:
        kz.stop()
        kz.close()


def _put_until_ok(addr: str, body: bytes, timeout: float = 15.0) -> float:
    """Seconds until a put on ``addr`` is acknowledged (connection errors retried)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with WireClient(addr, timeout=2.0) as c:
                if c.put("orders", 0, body).code == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no put acknowledged by {addr} within {timeout}s")


def _segments(b: BrokerProcess) -> bytes:
    d = b.data_dir / "orders-0"
    return b"".join(p.read_bytes() for p in sorted(d.iterdir()) if p.suffix == ".meta")


def test_kill_master_slave_takes_over_and_old_master_rejoins(group: Group) -> None:
    group.start()
    a, b = group.a, group.b
    assert stats(a.addr)["failover_epoch"] == "1" and stats(b.addr)["failover_epoch"] == "1"
    with WireClient(a.addr) as c:
        for i in range(50):
            assert c.put("orders", 0, b"m%d" % i).code == 200
        assert tx(c, "TX:s1:1", "BEGIN")[0] == 200
        tput(c, "orders", 0, b"tx-committed", "TX:s1:1")
        assert tx(c, "TX:s1:1", "COMMIT_ONE_PHASE") == (200, b"")
    a.kill()  # SIGKILL right after the last acknowledgement
    took = _put_until_ok(b.addr, b"after")
    print(f"failover: producers write again {took:.2f}s after kill -9")
    assert took < 10.0
    st = stats(b.addr)
    assert st["failover_epoch"] == "2" and st["failover_leader"] == "True", st
    epoch = json.loads(_zk_get(group.zk, f"{group.root}/failover/1/epoch") or b"{}")
    assert epoch == {"epoch": 2, "member": 1, "address": b.addr}
    # discovery: the MetaQ layout names the promoted broker as broker 1's master
    master_node = f"{group.root}/brokers/ids/1/master"
    want = b"meta://" + b.addr.encode()
    _wait(lambda: _zk_get(group.zk, master_node) == want, what="re-registered as master")
    bodies = [r.body for r in read_all(b.addr, "orders", 0)]
    assert bodies == [b"m%d" % i for i in range(50)] + [b"tx-committed", b"after"]
    # the old master comes back: it is a slave of the new epoch, with the same bytes
    a.start()
    st = stats(a.addr)
    assert st["role"] == "slave" and st["failover_epoch"] == "2", st
    with WireClient(a.addr) as c:
        assert c.put("orders", 0, b"no").code == 403
    with WireClient(b.addr) as c:
        assert c.put("orders", 0, b"later").code == 200
    _wait(lambda: _segments(a) == _segments(b), what="identical partition bytes")
    _wait(lambda: stats(b.addr).get("sync_slave_state") == "in_sync", what="back in sync")


def test_paused_master_is_fenced_and_rejoins(group: Group) -> None:
    group.start()
    a, b = group.a, group.b
    with WireClient(a.addr) as c:
        assert c.put("orders", 0, b"before").code == 200
    assert a.proc is not None
    c = WireClient(a.addr, timeout=10.0)  # a producer connected to the master
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        took = _put_until_ok(b.addr, b"new-epoch")
        print(f"failover: producers write again {took:.2f}s after SIGSTOP")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # the woken master refuses at once: its lease lapsed while it was stopped
    r = c.put("orders", 0, b"stale")
    c.close()
    assert r.code == 503 and b"fenced" in r.body, r
    # then it rejoins as a slave of the new master (in-process restart)
    _wait(lambda: _stats_or_empty(a.addr).get("role") == "slave", what="old master rejoined")
    assert b"stale" not in [x.body for x in read_all(b.addr, "orders", 0)]
    _wait(lambda: _segments(a) == _segments(b), what="identical partition bytes")


def _stats_or_empty(addr: str) -> dict[str, str]:
    try:
        return stats(addr)
    except OSError:
        return {}
