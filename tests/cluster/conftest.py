"""Cluster fixtures: configserver backends (embedded twin and real ZooKeeper), broker
processes registered in ZooKeeper, a kazoo client to read the tree.

``backend`` runs a test on both configserver backends (``embedded`` needs no server);
``zk_brokers`` starts broker child processes with ``[zookeeper] zk.zkEnable=true`` under
this test's fresh root.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from notify.configserver import ConfigServer, MemoryNodeStore, MemoryZooKeeper
from notify.configserver._kazoo import KazooNodeStore
from notify.testing import BrokerProcess
from tests.helpers import wait_until as wait_until  # imported from here by earlier tests
from tests.services import ZooKeeperServer

#: ZooKeeper session of the brokers and clients of these tests (tickTime 500 ms allows 1-10 s)
SESSION_S = 2.0


@dataclass
class Backend:
    """Makes configservers on one backend (same tree/root for all of a test)."""

    name: str
    root: str
    zk: ZooKeeperServer | None = None
    tree: MemoryZooKeeper = field(default_factory=MemoryZooKeeper)

    def make(self) -> ConfigServer:
        if self.zk is None:
            return ConfigServer.embedded(self.tree, self.root)
        return ConfigServer.zookeeper(self.zk.connect, self.root, session_timeout_s=SESSION_S)

    def expire(self, server: ConfigServer) -> None:
        """Expire ``server``'s session as ZooKeeper does after a timeout."""
        store = server.store
        if isinstance(store, MemoryNodeStore):
            store.tree.expire(store)
            return
        assert isinstance(store, KazooNodeStore) and self.zk is not None
        sid, passwd = store.client.client_id
        # the classic trick: a second client on the same session closes it
        other = KazooClient(hosts=self.zk.connect, client_id=(sid, passwd))
        other.start(timeout=10)
        other.stop()
        other.close()


@pytest.fixture(params=["embedded", "zookeeper"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "embedded":
        return Backend("embedded", "/meta")
    zk: ZooKeeperServer = request.getfixturevalue("zookeeper")
    root: str = request.getfixturevalue("zk_root")
    return Backend("zookeeper", root, zk)


@pytest.fixture
def kz(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client on the test ZooKeeper."""
    client = KazooClient(
        hosts=zookeeper.connect,
        timeout=5.0,
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 0.5},
    )
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def zk_clients(zk: ZooKeeperServer) -> int:
    """Client connections ZooKeeper has now (``stat``; the asking one not counted)."""
    text = zk.four_letter(b"stat")
    return max(0, sum(1 for line in text.splitlines() if line.strip().startswith("/")) - 1)


def dump_tree(kz: KazooClient, path: str) -> dict[str, tuple[bytes, bool]]:
    """``{path: (value, ephemeral)}`` of every node under ``path`` (not ``path`` itself)."""
    out: dict[str, tuple[bytes, bool]] = {}
    try:
        kids = kz.get_children(path)
    except Exception:
        return out
    for k in sorted(kids):
        p = f"{path}/{k}"
        with contextlib.suppress(Exception):
            data, stat = kz.get(p)
            out[p] = (data, bool(stat.ephemeralOwner))
            out.update(dump_tree(kz, p))
    return out


class ZkBrokers:
    """Broker child processes registered in ZooKeeper under one root."""

    def __init__(self, tmp: Path, zk: ZooKeeperServer, root: str):
        self.tmp = tmp
        self.zk = zk
        self.root = root
        self.started: list[BrokerProcess] = []

    @property
    def url(self) -> str:
        return f"{self.zk.connect}{self.root}"

    def start(
        self,
        broker_id: int,
        topics: dict[str, Any],
        *,
        slave: dict[str, Any] | None = None,
        **system: Any,
    ) -> BrokerProcess:
        name = f"b{broker_id}" + ("" if slave is None else f"s{slave.get('slaveId', 0)}")
        b = BrokerProcess(
            self.tmp / name,
            topics=topics,
            system={"brokerId": broker_id, **system},
            slave=slave,
            zookeeper={
                "zkEnable": True,
                "zkConnect": self.zk.connect,
                "zkRoot": self.root,
                "zkSessionTimeoutMs": int(SESSION_S * 1000),
                "zkConnectionTimeoutMs": 5000,
            },
        )
        self.started.append(b)
        return b.start()

    def stop_all(self) -> None:
        for b in self.started:
            b.stop()


@pytest.fixture
def zk_brokers(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[ZkBrokers]:
    bs = ZkBrokers(tmp_path, zookeeper, zk_root)
    yield bs
    bs.stop_all()
