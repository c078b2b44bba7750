"""Transaction state follows replication. The master's redo log is shipped to its
slaves at the same positions (pushed to a synchronous slave before a force is acknowledged,
pulled by every slave); ``promote`` recovers it exactly as a restarted master would.

Real broker processes; the master dies by SIGKILL right after its last acknowledgement.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from notify.protocol import records
from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, read_all, stats, tput, tx, wait_until, xid

REPL = "repl-secret"


def _wait(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    wait_until(cond, timeout, step=0.05, what=what)


def _pair(tmp: Path, sync: bool) -> tuple[BrokerProcess, BrokerProcess]:
    system = {"replicationSecret": REPL, "txCheckBackDelay": 300}
    master = BrokerProcess(tmp / "m", topics={"orders": 1}, system=system)
    master.port = free_port()
    slave = BrokerProcess(
        tmp / "s",
        topics={"orders": 1},
        system=system,
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
    )
    slave.start()
    if sync:
        master.system.update({"syncSlave": slave.addr, "syncSlaveTimeout": 3000})
    master.start()
    if sync:
        _wait(lambda: stats(master.addr).get("sync_slave_connected") == "True", what="link")
    return master, slave


def _load(c: WireClient, p1: WireClient) -> None:
    """Two prepared XA branches, one committed local transaction, one half message whose
    producer is gone, and a committed XA branch."""
    for n in (1, 2, 3):
        assert tx(c, xid(n), "BEGIN", " 60")[0] == 200
        tput(c, "orders", 0, b"xa%d" % n, xid(n))
        assert tx(c, xid(n), "END")[0] == 200
        assert tx(c, xid(n), "PREPARE") == (200, b"0")
    assert tx(c, xid(3), "COMMIT_TWO_PHASE") == (200, b"")
    assert tx(c, "TX:s1:1", "BEGIN")[0] == 200
    tput(c, "orders", 0, b"local", "TX:s1:1")
    assert tx(c, "TX:s1:1", "COMMIT_ONE_PHASE") == (200, b"")
    assert p1.call(b"register shop 1\r\n").code == 200
    assert tx(p1, "TX:p1:1", "BEGIN")[0] == 200
    tput(p1, "orders", 0, b"half", "TX:p1:1")
    assert tx(p1, "TX:p1:1", "PREPARE") == (200, b"0")


def _failover_and_resolve(slave: BrokerProcess) -> None:
    with WireClient(slave.addr) as c:
        assert c.call(b"promote 1\r\n").code == 200
        r = c.call(b"transaction null s9 RECOVER q1 4\r\n")
        assert r.code == 200 and sorted(r.body.split(b"\r\n")) == [xid(1).encode(), xid(2).encode()]
        assert tx(c, xid(1), "COMMIT_TWO_PHASE") == (200, b"")
        assert tx(c, xid(2), "ROLLBACK") == (200, b"")
        assert c.call(b"transaction null s9 RECOVER q1 5\r\n").body == b""
    with WireClient(slave.addr) as p2:  # check-backs of the half message go on
        assert p2.call(b"register shop 1\r\n").code == 200
        (msg,) = p2.replies(1)
        assert msg.kind == "check" and msg.tx_key == "TX:p1:1", msg
        (rec,), _ = records.decode_all(msg.body)
        assert rec.body == b"half"
        r = p2.call(b"transaction TX:p1:1 s2 COMMIT_TWO_PHASE 77\r\n")
        assert r.code == 200, r
    got = sorted(r.body for r in read_all(slave.addr, "orders", 0))
    assert got == [b"half", b"local", b"xa1", b"xa3"]
    with WireClient(slave.addr) as c:  # a promoted slave takes new transactions
        assert tx(c, xid(9), "BEGIN", " 60")[0] == 200
        tput(c, "orders", 0, b"after", xid(9))
        assert tx(c, xid(9), "COMMIT_ONE_PHASE")[0] == 200


def test_sync_slave_keeps_every_acknowledged_transaction_state(tmp_path: Path) -> None:
    master, slave = _pair(tmp_path, sync=True)
    try:
        with WireClient(master.addr) as c, WireClient(master.addr) as p1:
            _load(c, p1)
            master.kill()  # SIGKILL right after the last acknowledgement
        _failover_and_resolve(slave)
        slave.restart(kill=True)  # the promoted slave's own log is a master's log now
        got = sorted(r.body for r in read_all(slave.addr, "orders", 0))
        assert got == [b"after", b"half", b"local", b"xa1", b"xa3"]
    finally:
        master.kill()
        slave.stop()


def _redo_end(st: dict[str, str], key: str) -> tuple[int, int]:
    m = re.search(r"(\d+)\D+(\d+)", st[key])
    assert m is not None, st[key]
    return int(m.group(1)), int(m.group(2))


def test_async_slave_pulls_the_redo_log(tmp_path: Path) -> None:
    master, slave = _pair(tmp_path, sync=False)
    try:
        with WireClient(master.addr) as c, WireClient(master.addr) as p1:
            _load(c, p1)

            def caught_up() -> bool:
                want = _redo_end(stats(master.addr), "txlog_end")
                return _redo_end(stats(slave.addr), "replication.redo") == want

            _wait(caught_up, what="redo log caught up")
            _wait(
                lambda: len(read_all(slave.addr, "orders", 0)) == 2, what="partitions caught up"
            )
            master.kill()
        _failover_and_resolve(slave)
    finally:
        master.kill()
        slave.stop()
