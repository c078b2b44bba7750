"""A broker takes its directories' locks and its ports before it opens, writes or registers
anything: a second broker started on a running broker's config fails at once naming the first
and changes no byte of its files; a start that fails on a busy port leaves nothing behind,
not even a ZooKeeper node.

Before, a second ``broker start`` on a running broker's config opened the store, ran recovery,
rewrote the running broker's delay and transaction checkpoints, recovery points and
producers' snapshot, and only then failed on "address already in use"; a broker whose HTTP
port was taken registered in ZooKeeper (as a slave) and answered on its wire port first.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, crc, timing
from tests.services import ZooKeeperServer

TOPICS: dict[str, dict[str, Any]] = {
    "orders": {"numPartitions": 2, "unflushThreshold": 0},
    "audit": {"numPartitions": 1},
}


def fingerprint(root: Path) -> dict[str, str]:
    """Every file under ``root`` and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def work(addr: str) -> None:
    """Something in every file: puts, a committed transaction, a delayed message."""
    with WireClient(addr) as c:
        for i in range(5):
            assert c.put("orders", i % 2, b"m%d" % i).code == 200
        assert c.call(b"transaction TX:s:1 s BEGIN 30 1\r\n").code == 200
        body = b"in a transaction"
        r = c.call(b"put orders 1 %d 0 %d TX:s:1 2\r\n%b" % (len(body), crc(body), body))
        assert r.code == 200
        assert c.call(b"transaction TX:s:1 s COMMIT_ONE_PHASE 3\r\n").code == 200
        at = int(time.time() * 1000) + 3_600_000
        r = c.call(b"dput audit 0 5 0 %d %d 4\r\nlater" % (crc(b"later"), at))
        assert r.code == 200, r


def all_nodes(kz: KazooClient, root: str) -> set[str]:
    if kz.exists(root) is None:
        return set()
    out = {root}
    for child in kz.get_children(root):
        out |= all_nodes(kz, f"{root}/{child}")
    return out


def test_a_second_broker_on_the_same_config_fails_at_once_and_changes_nothing(
    tmp_path: Path,
) -> None:
    first = BrokerProcess(tmp_path / "b", topics=TOPICS)
    first.start()
    first.write_config()  # its config names the port it took (as conf/server.ini does)
    try:
        work(first.addr)
        time.sleep(2.5)  # the periodic writes (recovery points, checkpoints) settle
        before = fingerprint(first.data_dir)
        assert any(k.startswith("delay/") for k in before), sorted(before)
        t0 = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "notify", "broker", "start", "-c", str(first.config_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - t0
        assert second.returncode != 0
        msg = second.stdout + second.stderr
        assert f"{first.data_dir} is in use by broker 0 (pid {first.pid}" in msg, msg
        assert f"listening on 127.0.0.1:{first.port}" in msg, msg
        assert "recovery" not in msg and "store open" not in msg, msg  # nothing was opened
        assert fingerprint(first.data_dir) == before
        # "at once": one process start, no store opened (counted above)
        timing(took < 20, f"a second broker on the same config exited after {took:.1f} s")
        with WireClient(first.addr) as c:  # the first one serves on, untouched
            assert c.put("orders", 0, b"still here").code == 200
    finally:
        first.stop()


def test_a_start_failing_on_a_busy_http_port_leaves_nothing_behind(
    tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    """Two brokers whose configs give the same ``dashboardHttpPort``: the second (a slave of
    the first, as two brokers on one machine left at the default) fails before it creates its
    data directory, listens on its wire port or registers in ZooKeeper."""
    zk = {"zkEnable": True, "zkConnect": zookeeper.connect, "zkRoot": zk_root}
    http = free_port()
    system = {"dashboardHttpPort": http, "replicationSecret": "rs"}
    master = BrokerProcess(tmp_path / "m", topics=TOPICS, system=system, zookeeper=zk)
    master.start()
    kz = KazooClient(hosts=zookeeper.connect, timeout=5.0)
    kz.start(timeout=10)
    try:
        nodes = all_nodes(kz, zk_root)
        ids = f"{zk_root}/brokers/ids/0"
        assert f"{ids}/master" in nodes, nodes
        seen: list[list[str]] = []  # every change of the group's members, however brief

        def watch(children: list[str]) -> None:
            seen.append(sorted(children))

        kz.ChildrenWatch(ids, watch)
        wire = free_port()
        slave = BrokerProcess(
            tmp_path / "s",
            topics=TOPICS,
            system=system,
            zookeeper=zk,
            slave={"slaveId": 1, "slaveGroup": "s1"},
        )
        slave.port = wire
        try:
            slave.start(timeout=30)
            raise AssertionError("the second broker started on a busy HTTP port")
        except RuntimeError as e:
            assert f"dashboardHttpPort: cannot listen on 127.0.0.1:{http}" in str(e), e
        assert not slave.data_dir.exists()  # no directory, no lock file, no store
        time.sleep(0.5)  # (a watch event in flight)
        assert all_nodes(kz, zk_root) == nodes
        assert all(not any(c.startswith("slave") for c in ch) for ch in seen), seen
        with socket.socket() as s:  # its wire port is free again
            s.bind(("127.0.0.1", wire))
    finally:
        kz.stop()
        kz.close()
        master.stop()
