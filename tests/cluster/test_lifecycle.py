"""Start-up windows, with real broker processes and a real ZooKeeper.

A pausepoint (``NOTIFY_PAUSEPOINTS``, see :mod:`notify.faults`) holds the broker right after
it registered in ZooKeeper, before start-up finishes: the window in which a slow recovery or
a slow ZooKeeper keeps a real broker.
"""

from __future__ import annotations

import contextlib
import threading
import time

from kazoo.client import KazooClient

from notify.testing import BrokerProcess, free_port
from tests.cluster.conftest import SESSION_S, ZkBrokers
from tests.helpers import WireClient, timing, wait_until

PAUSE = "broker.start.registered:4"
REPL = "repl-secret"


def _start_in_background(b: BrokerProcess) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(RuntimeError):  # it may exit during start-up: the test
            b.start(timeout=30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_sigterm_during_start_up_stops_cleanly_and_deregisters(
    zk_brokers: ZkBrokers, kz: KazooClient, zk_root: str
) -> None:
    b = BrokerProcess(
        zk_brokers.tmp / "b9",
        topics={"t": 1},
        system={"brokerId": 9},
        env={"NOTIFY_PAUSEPOINTS": PAUSE},
        zookeeper={
            "zkEnable": True,
            "zkConnect": zk_brokers.zk.connect,
            "zkRoot": zk_root,
            "zkSessionTimeoutMs": int(SESSION_S * 1000),
        },
    )
    zk_brokers.started.append(b)
    t = _start_in_background(b)
    node = f"{zk_root}/brokers/ids/9/master"
    wait_until(lambda: kz.exists(node) is not None, 30)
    assert b.proc is not None and b.proc.poll() is None  # registered, still starting
    b.proc.send_signal(15)
    code = b.wait_exit(30)
    gone_at = time.monotonic()
    t.join(10)
    # a clean stop (not death by the signal: that would be -15) that deregistered at once,
    # not after the session expired
    assert code == 0, b.log_tail()
    assert kz.exists(node) is None, "still registered when the process exited"
    checked = time.monotonic() - gone_at
    timing(checked < SESSION_S, f"checked {checked:.2f} s after the exit, within the session")
    assert "broker stopped" in b.log_path.read_text()


def test_slave_refuses_producers_from_its_first_byte(
    zk_brokers: ZkBrokers, kz: KazooClient, zk_root: str
) -> None:
    """A [slave] broker's wire port answers as a slave as soon as it accepts: a put sent
    in the start-up window (before replication found its master) is refused, never stored."""
    master = zk_brokers.start(1, {"t": 1}, replicationSecret=REPL)
    port = free_port()
    s = BrokerProcess(
        zk_brokers.tmp / "s1",
        topics={"t": 1},
        system={"brokerId": 1, "replicationSecret": REPL},
        slave={"slaveId": 1, "masterAddress": master.addr},
        env={"NOTIFY_PAUSEPOINTS": PAUSE},
        zookeeper={
            "zkEnable": True,
            "zkConnect": zk_brokers.zk.connect,
            "zkRoot": zk_root,
            "zkSessionTimeoutMs": int(SESSION_S * 1000),
        },
    )
    s.port = port
    zk_brokers.started.append(s)
    t = _start_in_background(s)
    deadline = time.monotonic() + 30
    reply = None
    while time.monotonic() < deadline:
        try:
            with WireClient(f"127.0.0.1:{port}", timeout=10) as c:
                reply = c.put("t", 0, b"early")
                break
        except OSError:
            time.sleep(0.01)
    assert reply is not None, s.log_tail()
    assert s.proc is not None and s.proc.poll() is None
    assert reply.code != 200, reply
    t.join(30)
    assert s.port == port
    # nothing reached the slave's partition
    stored = [f for f in s.data_dir.rglob("*.meta") if f.stat().st_size]
    assert not stored, stored
