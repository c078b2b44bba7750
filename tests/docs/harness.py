"""What the README's and the documentation's runnable examples run against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from notify.testing import BrokerProcess
from tests.services import ZooKeeperServer
from tests.services_conftest import running

#: conf/server.ini's sample topics, which the examples use
TOPICS = {"demo": 4, "orders": 2, "audit": 1, "jobs": 2}


def example_broker(
    tmp_path: Path, request: pytest.FixtureRequest, *, zookeeper: bool, system: dict[str, Any]
) -> tuple[BrokerProcess, str | None]:
    """A started broker with the sample topics (stopped at the test's end), registered under
    a fresh root of the session's ZooKeeper when ``zookeeper``; and that root's URL
    (``host:port/root``, what ``connect(zk=...)`` takes) or None."""
    zk_url = zk_conf = None
    if zookeeper:
        zk: ZooKeeperServer = running(request.getfixturevalue("zookeeper"))
        root: str = request.getfixturevalue("zk_root")
        zk_url = f"{zk.connect}{root}"
        zk_conf = {"zkEnable": True, "zkConnect": zk.connect, "zkRoot": root}
    broker = BrokerProcess(tmp_path / "broker", topics=TOPICS, system=system, zookeeper=zk_conf)
    request.addfinalizer(broker.stop)
    broker.start()
    return broker, zk_url
