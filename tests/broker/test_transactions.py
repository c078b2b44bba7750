"""Broker transactions over the wire: local, XA, timeouts, half messages, crashes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from notify.protocol import records
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, crc, read_all, stats, tput, tx, wait_until, xid


def test_one_shot_transaction_is_answered_in_one_write(broker: BrokerProcess) -> None:
    """BEGIN, puts and COMMIT_ONE_PHASE sent in one write: the broker answers all of them
    together once the COMMIT is durable (not the BEGIN and put replies first, which would
    wake the client twice a transaction); each reply is the one it would be alone."""
    with WireClient(broker.addr) as c:
        for n in range(5):
            key = f"TX:s1:{100 + n}"
            bodies = [b"a%d" % n, b"b%d" % n]
            frames = [f"transaction {key} s1 BEGIN 10 1\r\n".encode()]
            frames += [
                b"put test 0 %d 0 %d %s %d\r\n%b" % (len(b), crc(b), key.encode(), 2 + i, b)
                for i, b in enumerate(bodies)
            ]
            frames.append(f"transaction {key} s1 COMMIT_ONE_PHASE msgs=2 4\r\n".encode())
            c.send(b"".join(frames))
            first = c.parser.feed(c.sock.recv(1 << 20))  # what the first write carried
            assert [(r.opaque, r.code) for r in first] == [(1, 200), (2, 200), (3, 200), (4, 200)]
            assert all(r.body.split()[2] == b"-1" for r in first[1:3])  # put acks, in a tx
    assert [r.body for r in read_all(broker.addr, "test", 0)][-10:] == [
        b"%s%d" % (x, n) for n in range(5) for x in (b"a", b"b")
    ]


def test_local_commit_is_all_or_nothing(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        assert tx(c, "TX:s1:1", "BEGIN", " 10") == (200, b"")
        ids = [tput(c, "test", i % 2, b"m%d" % i, "TX:s1:1") for i in range(4)]
        assert read_all(broker.addr, "test", 0) == [] and read_all(broker.addr, "test", 1) == []
        assert tx(c, "TX:s1:1", "COMMIT_ONE_PHASE") == (200, b"")
    got = read_all(broker.addr, "test", 0) + read_all(broker.addr, "test", 1)
    assert sorted(r.body for r in got) == [b"m0", b"m1", b"m2", b"m3"]
    assert sorted(r.msg_id for r in got) == sorted(int(i) for i in ids)
    with WireClient(broker.addr) as c:
        assert tx(c, "TX:s1:2", "BEGIN") == (200, b"")
        tput(c, "test", 3, b"gone", "TX:s1:2")
        assert tx(c, "TX:s1:2", "ROLLBACK") == (200, b"")
        code, body = tx(c, "TX:s1:2", "COMMIT_ONE_PHASE")
        assert code == 500 and b"code=-4" in body  # gone
    assert read_all(broker.addr, "test", 3) == []


def test_errors_and_votes(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        code, body = tx(c, "TX:s1:7", "COMMIT_ONE_PHASE")
        assert code == 500 and body.startswith(b"XAException:code=-4,msg=unknown transaction")
        r = c.call(b"put test 0 1 0 TX:s1:8 3\r\nx")
        assert r.code == 500 and b"code=-4" in r.body
        code, body = tx(c, "garbage-key", "BEGIN")
        assert code == 500 and b"code=-5" in body
        assert tx(c, "TX:s1:9", "BEGIN")[0] == 200
        code, body = tx(c, "TX:s1:9", "BEGIN")
        assert code == 500 and b"code=-8" in body
        assert tx(c, "TX:s1:9", "END") == (200, b"")  # MetaQ never answered END
        assert tx(c, "TX:s1:9", "PREPARE") == (200, b"3")  # no work: XA_RDONLY
        code, body = tx(c, "TX:s1:9", "COMMIT_TWO_PHASE")
        assert code == 500 and b"code=-4" in body  # read-only: forgotten after the vote
        assert tx(c, "TX:s1:10", "BEGIN")[0] == 200
        tput(c, "test", 0, b"x", "TX:s1:10")
        code, body = tx(c, "TX:s1:10", "COMMIT_TWO_PHASE")
        assert code == 500 and b"code=-6" in body  # not prepared
        with WireClient(broker.addr) as other:
            r2 = other.call(b"put test 0 1 0 TX:s1:10 3\r\nx")
            assert r2.code == 500 and b"another connection" in r2.body
        r3 = c.call(b"put nosuch 0 1 0 TX:s1:10 3\r\nx")
        assert r3.code == 404


def test_connection_drop_rolls_back_local_tx(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        assert tx(c, "TX:s1:1", "BEGIN")[0] == 200
        tput(c, "test", 0, b"lost", "TX:s1:1")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and stats(broker.addr).get("tx_connection_rollbacks") != "1":
        time.sleep(0.05)
    assert stats(broker.addr)["tx_connection_rollbacks"] == "1"
    assert read_all(broker.addr, "test", 0) == []


def test_timeout_rolls_back_and_capacity(broker_factory: BrokerFactory) -> None:
    b = broker_factory(maxTxTimeoutTimerCapacity=2, maxTxTimeoutInSeconds=1)
    with WireClient(b.addr) as c:
        assert tx(c, "TX:s1:1", "BEGIN", " 30")[0] == 200  # capped at 1 s
        tput(c, "test", 0, b"late", "TX:s1:1")
        assert tx(c, "TX:s1:2", "BEGIN")[0] == 200
        code, body = tx(c, "TX:s1:3", "BEGIN")
        assert code == 503 and b"maxTxTimeoutTimerCapacity" in body
        wait_until(lambda: stats(b.addr)["tx_timed_out"] == "2", what="both timed out")
        code, body = tx(c, "TX:s1:1", "COMMIT_ONE_PHASE")
        assert code == 500 and b"code=106" in body and b"timed out" in body
        assert tx(c, "TX:s1:3", "BEGIN")[0] == 200  # capacity is free again
    assert read_all(b.addr, "test", 0) == []
    assert stats(b.addr)["tx_timed_out"] == "2"


def test_xa_prepare_survives_restart_and_recover(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        for n in (1, 2, 3):
            assert tx(c, xid(n, "q1" if n < 3 else "q2"), "BEGIN", " 30")[0] == 200
            tput(c, "orders", 0, b"xa%d" % n, xid(n, "q1" if n < 3 else "q2"))
            assert tx(c, xid(n, "q1" if n < 3 else "q2"), "END")[0] == 200
            assert tx(c, xid(n, "q1" if n < 3 else "q2"), "PREPARE") == (200, b"0")
    broker.restart(kill=True)
    with WireClient(broker.addr) as c:
        r = c.call(b"transaction null s9 RECOVER q1 4\r\n")
        assert r.code == 200 and sorted(r.body.split(b"\r\n")) == [xid(1).encode(), xid(2).encode()]
        assert c.call(b"transaction null s9 RECOVER q2 5\r\n").body == xid(3, "q2").encode()
        assert read_all(broker.addr, "orders", 0) == []
        assert tx(c, xid(1), "COMMIT_TWO_PHASE") == (200, b"")
        assert tx(c, xid(2), "ROLLBACK") == (200, b"")
    broker.restart()
    assert [r.body for r in read_all(broker.addr, "orders", 0)] == [b"xa1"]
    with WireClient(broker.addr) as c:
        assert c.call(b"transaction null s9 RECOVER q1 4\r\n").body == b""
        assert tx(c, xid(3, "q2"), "COMMIT_TWO_PHASE") == (200, b"")
    assert [r.body for r in read_all(broker.addr, "orders", 0)] == [b"xa1", b"xa3"]


@pytest.mark.crash
@pytest.mark.parametrize("flush", [0, 1, 2])
@pytest.mark.parametrize(
    "point,visible",
    [
        ("after_append_msg", False),
        ("after_commit_record", True),
        ("mid_apply", True),
        ("after_apply", True),
        ("after_prepare_record", None),
    ],
)
def test_sigkill_at_each_step(tmp_path: Path, flush: int, point: str, visible: bool | None) -> None:
    b = BrokerProcess(
        tmp_path,
        topics={"a": 1, "b": 1},
        system={"flushTxLogAtCommit": flush},
        env={"NOTIFY_CRASHPOINTS": point},
    )
    b.start()
    # a prepared transaction that must survive the crash is an XA one: a prepared *local*
    # transaction without a producer group is rolled back with its connection (see below)
    key = xid(7) if point == "after_prepare_record" else "TX:s1:2"
    try:
        with WireClient(b.addr) as c:
            assert c.put("a", 0, b"plain-a").code == 200
            assert c.put("b", 0, b"plain-b").code == 200
            assert tx(c, key, "BEGIN")[0] == 200
            if point == "after_append_msg":
                c.send(b"put a 0 2 0 %d %s 4\r\na1" % (crc(b"a1"), key.encode()))
            else:
                tput(c, "a", 0, b"a1", key)
                tput(c, "b", 0, b"b1", key)
                verb = "PREPARE" if point == "after_prepare_record" else "COMMIT_ONE_PHASE"
                c.send(f"transaction {key} s1 {verb} 6\r\n".encode())
        assert b.wait_exit(10) is not None, "crashpoint not reached"
        b.env = {}
        b.start()
        a = [r.body for r in read_all(b.addr, "a", 0)]
        bb = [r.body for r in read_all(b.addr, "b", 0)]
        if visible is True:
            assert (a, bb) == ([b"plain-a", b"a1"], [b"plain-b", b"b1"])  # whole, exactly once
        else:
            assert (a, bb) == ([b"plain-a"], [b"plain-b"])  # nothing of it
        if visible is None:  # prepared: comes back prepared, then commits whole
            with WireClient(b.addr) as c:
                assert tx(c, key, "COMMIT_TWO_PHASE") == (200, b"")
            assert [r.body for r in read_all(b.addr, "a", 0)] == [b"plain-a", b"a1"]
            assert [r.body for r in read_all(b.addr, "b", 0)] == [b"plain-b", b"b1"]
        # and a second restart changes nothing (idempotent recovery)
        before = (read_all(b.addr, "a", 0), read_all(b.addr, "b", 0))
        b.restart()
        assert (read_all(b.addr, "a", 0), read_all(b.addr, "b", 0)) == before
    finally:
        b.stop()


def test_half_message_check_back_commit_and_exhaustion(broker_factory: BrokerFactory) -> None:
    b = broker_factory(txCheckBackDelay=300, txCheckBackMaxTimes=2)
    with WireClient(b.addr) as p1:
        assert p1.call(b"register shop 1\r\n").code == 200
        for n, body in ((1, b"order-1"), (2, b"order-2")):
            key = f"TX:p1:{n}"
            assert tx(p1, key, "BEGIN")[0] == 200
            tput(p1, "orders", 0, body, key)
            assert tx(p1, key, "PREPARE") == (200, b"0")
        # the producer dies before deciding
    assert read_all(b.addr, "orders", 0) == []
    with WireClient(b.addr) as p2:
        assert p2.call(b"register shop 1\r\n").code == 200
        seen: dict[str, int] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (seen.get("TX:p1:2", 0) < 2):
            (msg,) = p2.replies(1)
            if msg.kind != "check":
                continue
            assert msg.tx_key is not None
            seen[msg.tx_key] = seen.get(msg.tx_key, 0) + 1
            (rec,), _ = records.decode_all(msg.body)
            if msg.tx_key == "TX:p1:1":
                assert rec.body == b"order-1" and msg.topic == "orders"
                p2.send(b"transaction TX:p1:1 s2 COMMIT_TWO_PHASE 77\r\n")
            # TX:p1:2 stays unknown: no answer
        assert seen["TX:p1:1"] == 1  # resolved: never checked again
        assert seen["TX:p1:2"] == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and stats(b.addr).get("tx_check_back_exhausted") != "1":
        time.sleep(0.1)
    assert stats(b.addr)["tx_check_back_exhausted"] == "1"
    assert [r.body for r in read_all(b.addr, "orders", 0)] == [b"order-1"]
