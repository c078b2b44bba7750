"""Item 1: only the master may write into a slave, and a broken replication is reported.

A hostile client connects to a synchronous slave and pushes forged records with ``msync``
and ``sync``; they are refused (replica role, ``replicationSecret``), replication goes on,
and after ``promote`` the slave serves exactly the acknowledged messages. A slave whose data
diverged from its master reports ``state=diverged`` with a non-zero lag, never "lag 0".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from notify.protocol import records
from notify.protocol.frames import encode_msync
from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, crc, stats, wait_until

REPL = "repl-secret"


def _end(addr: str, topic: str = "rep", part: int = 0) -> int:
    with WireClient(addr) as c:
        line = b"offset %s g %d 9223372036854775807 1\r\n" % (topic.encode(), part)
        r = c.call(line)
    # -1 until the broker has the partition (a slave learns its master's topics by pulling)
    return int(r.body) if r.code == 200 else -1


def _wait(cond: Callable[[], object], timeout: float = 15.0) -> None:
    wait_until(cond, timeout, step=0.05)


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
        # the slave shows what it holds once the master's next consistent cut reaches it
        _wait(lambda: _end(slave.addr) == _end(master.addr))
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
    master = BrokerProcess(tmp_path / "m", topics={"rep": 1}, system={"replicationSecret": REPL})
    master.start()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={},
        system={"replicationSecret": REPL},
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


def test_without_any_secret_nobody_holds_the_replica_role(tmp_path: Path) -> None:
    """No secret at all (the loopback default): plain clients may produce and consume, but a
    forged ``msync``/``sync`` into a slave and a read of ``__delay`` are refused; a
    ``replicationSecret`` holder naming another broker id is refused too."""
    master = BrokerProcess(tmp_path / "m", topics={"rep": 1}, system={"replicationSecret": REPL})
    master.start()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={"rep": 1},
        system={"replicationSecret": REPL},
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
    )
    plain = BrokerProcess(tmp_path / "p", topics={"rep": 1})  # no secret of any kind
    slave.start()
    plain.start()
    try:
        with WireClient(master.addr) as c:
            assert c.put("rep", 0, b"real", opaque=1).code == 200
        _wait(lambda: _end(slave.addr) == _end(master.addr) > 0)
        # the slave shows what it holds once the master's next consistent cut reaches it
        _wait(lambda: _end(slave.addr) == _end(master.addr))
        end = _end(slave.addr)
        forged = records.encode(4242, 0, b"FORGED")
        for target in (slave.addr, plain.addr):
            with WireClient(target) as evil:
                r = evil.call(encode_msync("rep", 0, forged, 1, _end(target), 7))
                assert r.code == 403, r
                r = evil.call(b"sync rep 0 6 0 4242 %d 8\r\nFORGED" % crc(b"FORGED"))
                assert r.code == 403, r
                if target == plain.addr:  # "auth" without secrets grants no replica role
                    assert evil.call(b"auth whatever 0 9\r\n").code == 200
                assert evil.call(b"get __delay g 0 0 65536 10\r\n").code == 403
                assert evil.call(b"offset __delay g 0 0 11\r\n").code == 403
        # the secret with another broker's id: refused and closed (a slave of broker 0 takes
        # writes from broker 0's master only)
        with WireClient(slave.addr) as evil:
            r = evil.call(b"auth %s 5 1\r\n" % REPL.encode())
            assert r.code == 403 and b"broker's id 0" in r.body, r
            assert evil.is_closed()
        assert _end(slave.addr) == end
        with WireClient(slave.addr) as c:
            g = c.call(b"get rep g 0 0 1048576 2\r\n")
        assert [r.body for r in records.decode_all(g.body)[0]] == [b"real"]
    finally:
        plain.stop()
        slave.stop()
        master.stop()


def test_slave_checks_its_masters_identity_and_reports_the_stall(tmp_path: Path) -> None:
    """A slave pointed at a broker of another id (sharing the secret) or at one without
    ``replicationSecret`` pulls nothing and says why; a slave whose master died reports
    ``stalled`` with a lag that is never 0."""
    other = BrokerProcess(
        tmp_path / "o", topics={"rep": 1}, system={"brokerId": 5, "replicationSecret": REPL}
    )
    nosecret = BrokerProcess(tmp_path / "n", topics={"rep": 1})
    other.start()
    nosecret.start()
    master = BrokerProcess(tmp_path / "m", topics={"rep": 1}, system={"replicationSecret": REPL})
    master.start()
    slaves: list[BrokerProcess] = []
    try:
        for b in (other, nosecret, master):
            with WireClient(b.addr) as c:
                assert c.put("rep", 0, b"x" * 100).code == 200
        for name, target in (("s1", other), ("s2", nosecret), ("s3", master)):
            s = BrokerProcess(
                tmp_path / name,
                topics={"rep": 1},
                system={"replicationSecret": REPL},
                slave={"slaveId": 1, "masterAddress": target.addr, "slaveMaxDelayInMills": 100},
            )
            slaves.append(s.start())
        s1, s2, s3 = slaves

        def stalled_with(s: BrokerProcess, text: str) -> bool:
            row = stats(s.addr).get("replication.rep-0", "")
            return "state=stalled" in row and text in row

        _wait(lambda: stalled_with(s1, "must name this broker's id 5"))
        _wait(lambda: stalled_with(s2, "granted no replica role"))
        assert _end(s1.addr) == 0 and _end(s2.addr) == 0
        for s in (s1, s2):
            assert stats(s.addr)["replication_state"] == "stalled"
        _wait(lambda: _end(s3.addr) == _end(master.addr))
        master.kill()
        _wait(lambda: stats(s3.addr).get("replication_state") == "stalled")
        row = stats(s3.addr)["replication.rep-0"]
        assert "state=stalled" in row and "lag_bytes=0 " not in row, row
    finally:
        for s in slaves:
            s.stop()
        master.kill()
        other.stop()
        nosecret.stop()


def test_broker_refuses_to_start_a_slave_without_replication_secret(tmp_path: Path) -> None:
    s = BrokerProcess(tmp_path / "s", topics={"rep": 1}, slave={"masterAddress": "127.0.0.1:1"})
    s.write_config()
    proc = subprocess.run(
        [sys.executable, "-m", "notify", "broker", "start", "-c", str(s.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "replicationSecret: required by [slave]" in proc.stderr
