"""Item 1: only the master may write into a slave, and a broken replication is reported.

A hostile client connects to a synchronous slave and pushes forged records with ``msync``
and ``sync``; they are refused (replica role, ``replicationSecret``), replication goes on,
and after ``promote`` the slave serves exactly the acknowledged messages. A slave whose data
diverged from its master reports ``state=diverged`` with a non-zero lag, never "lag 0".
"""

from __future__ import annotations

import time
from pathlib import Path

from notify.protocol import records
from notify.protocol.frames import encode_msync
from notify.testing import BrokerProcess, free_port
from tests.security.wire import stats
from tests.wireclient import WireClient, crc

REPL = "repl-secret"


def _end(addr: str, topic: str = "rep", part: int = 0) -> int:
    with WireClient(addr) as c:
        line = b"offset %s g %d 9223372036854775807 1\r\n" % (topic.encode(), part)
        return int(c.call(line).body)


def _wait(cond: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_forged_msync_and_sync_are_refused(tmp_path: Path) -> None:
    master = BrokerProcess(tmp_path / "m", topics={"rep": 1}, system={"replicationSecret": REPL})
    master.port = free_port()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={"rep": 1},
        system={"replicationSecret": REPL},
        slave={"slaveId": 1, "masterAddress": f"127.0.0.1:{master.port}"},
    )
    slave.start()
    master.system.update({"syncSlave": slave.addr, "syncSlaveTimeout": 2000})
    master.start()
    try:
        _wait(lambda: stats(master.addr).get("sync_slave_connected") == "True")
        acked = []
        with WireClient(master.addr) as c:
            for i in range(20):
                r = c.put("rep", 0, b"real-%02d" % i, opaque=i)
                assert r.code == 200, r
                acked.append(b"real-%02d" % i)
        end = _end(slave.addr)
        forged = records.encode(4242, 0, b"FORGED")
        with WireClient(slave.addr) as evil:
            r = evil.call(encode_msync("rep", 0, forged, 1, end, 7))
            assert r.code == 403 and b"replica role" in r.body, r
            body = b"FORGED"
            r = evil.call(b"sync rep 0 %d 0 4242 %d 8\r\n%b" % (len(body), crc(body), body))
            assert r.code == 403, r
            # guessing the secret does not help: a wrong auth closes the connection
            assert evil.call(b"auth guess 9\r\n").code == 403
        assert _end(slave.addr) == end
        # replication goes on after the attack
        with WireClient(master.addr) as c:
            assert c.put("rep", 0, b"real-20", opaque=20).code == 200
            acked.append(b"real-20")
        _wait(lambda: _end(slave.addr) == _end(master.addr))
        master.kill()
        with WireClient(slave.addr) as c:
            assert c.call(b"promote 1\r\n").code == 200
            g = c.call(b"get rep g 0 0 1048576 2\r\n")
        assert [r.body for r in records.decode_all(g.body)[0]] == acked
    finally:
        master.kill()
        slave.stop()


def test_diverged_slave_reports_it_never_zero_lag(tmp_path: Path) -> None:
    master = BrokerProcess(tmp_path / "m", topics={"rep": 1})
    master.start()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={},
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
    )
    try:
        with WireClient(master.addr) as c:
            for i in range(5):
                assert c.put("rep", 0, b"m%d" % i).code == 200
        slave.start()
        _wait(lambda: _end(slave.addr) == _end(master.addr) > 0)
        assert stats(slave.addr)["replication_state"] in ("ok", "catching_up")
        slave.stop()
        # a record the master never wrote lands at the slave's end (what a forged msync did)
        seg = sorted((slave.data_dir / "rep-0").glob("*.meta"))[-1]
        with seg.open("ab") as f:
            f.write(records.encode(99, 0, b"not from the master"))
        slave.start()
        def diverged() -> bool:
            st = stats(slave.addr)
            row = st.get("replication.rep-0", "")
            return st.get("replication_state") == "diverged" and "state=diverged" in row
        _wait(diverged)
        row = stats(slave.addr)["replication.rep-0"]
        assert "lag_bytes=0 " not in row, row
    finally:
        slave.stop()
        master.stop()
