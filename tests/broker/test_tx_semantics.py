"""Transaction semantics at the wire, against a real broker process: a commit is readable the
moment it is acknowledged, a transaction whose put failed cannot commit, and a prepared local
transaction without a producer group never outlives its connection or its timeout."""

from __future__ import annotations

import threading
import time

from notify.protocol import records
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, crc, stats


def tx(c: WireClient, key: str, verb: str, extra: str = "", opaque: int = 9) -> tuple[int, bytes]:
    r = c.call(f"transaction {key} s1 {verb}{extra} {opaque}\r\n".encode())
    return r.code, r.body


def tput(c: WireClient, topic: str, part: int, body: bytes, key: str) -> tuple[int, bytes]:
    r = c.call(
        b"put %s %d %d 0 %d %s 7\r\n%s"
        % (topic.encode(), part, len(body), crc(body), key.encode(), body)
    )
    return r.code, r.body


def ids_from(c: WireClient, topic: str, part: int, offset: int) -> list[int]:
    r = c.call(b"get %s g %d %d 1048576 3\r\n" % (topic.encode(), part, offset))
    if r.code != 200:
        return []
    recs, _ = records.decode_all(r.body, offset)
    return [x.msg_id for x in recs]


def end_of(c: WireClient, topic: str, part: int) -> int:
    r = c.call(b"offset %s g %d 9223372036854775807 4\r\n" % (topic.encode(), part))
    return int(r.body)


def _commit_then_read(b: BrokerProcess, rounds: int, xa: bool) -> list[int]:
    """Commit one message per round; return the rounds whose message a reader on the same
    and on another connection did not see right after the 200."""
    misses = []
    with WireClient(b.addr) as c, WireClient(b.addr) as other:
        for i in range(rounds):
            key = f"XID:1:{i:04x}:aa:q" if xa else f"TX:s1:{i}"
            start = end_of(c, "test", 0)
            assert tx(c, key, "BEGIN")[0] == 200
            code, body = tput(c, "test", 0, b"m%d" % i, key)
            assert code == 200, body
            msg_id = int(body.split()[0])
            if xa:
                assert tx(c, key, "END")[0] == 200
                assert tx(c, key, "PREPARE") == (200, b"0")
                assert tx(c, key, "COMMIT_TWO_PHASE") == (200, b"")
            else:
                assert tx(c, key, "COMMIT_ONE_PHASE") == (200, b"")
            if msg_id not in ids_from(c, "test", 0, start) or msg_id not in ids_from(
                other, "test", 0, start
            ):
                misses.append(i)
    return misses


def test_commit_is_readable_when_acknowledged_idle(broker_factory: BrokerFactory) -> None:
    b = broker_factory(unflushThreshold=0, flushTxLogAtCommit=1)
    assert _commit_then_read(b, 200, xa=False) == []
    assert _commit_then_read(b, 50, xa=True) == []
    # no partition fsync was needed for that: commits were answered without waiting for one
    assert int(stats(b.addr)["tx_committed"]) == 250


def test_commit_is_readable_when_acknowledged_under_load(broker_factory: BrokerFactory) -> None:
    b = broker_factory(unflushThreshold=0, flushTxLogAtCommit=1)
    stop = threading.Event()

    def load() -> None:  # plain puts on the same partition, pipelined, under group commit
        with WireClient(b.addr) as c:
            n = 0
            while not stop.is_set():
                for _ in range(50):
                    body = b"load%d" % n
                    c.send(b"put test 0 %d 0 %d\r\n%s" % (len(body), n & 0xFFFF, body))
                    n += 1
                assert all(r.code == 200 for r in c.replies(50))

    th = threading.Thread(target=load, daemon=True)
    th.start()
    try:
        time.sleep(0.2)
        assert _commit_then_read(b, 100, xa=False) == []
    finally:
        stop.set()
        th.join(10)


def test_failed_put_makes_the_transaction_rollback_only(broker_factory: BrokerFactory) -> None:
    b = broker_factory(maxTxSize=1000)
    with WireClient(b.addr) as c:
        start = end_of(c, "test", 0)
        assert tx(c, "TX:s1:1", "BEGIN")[0] == 200
        assert tput(c, "test", 0, b"x" * 600, "TX:s1:1")[0] == 200
        code, body = tput(c, "test", 0, b"y" * 600, "TX:s1:1")  # over maxTxSize
        assert code == 500 and b"XAException:code=-3" in body and b"maxTxSize" in body
        code, body = tput(c, "test", 0, b"z", "TX:s1:1")  # nothing more is taken
        assert code == 500 and b"XAException:code=100" in body
        code, body = tx(c, "TX:s1:1", "COMMIT_ONE_PHASE")
        assert code == 500 and b"XAException:code=100" in body and b"rolled back" in body
        assert ids_from(c, "test", 0, start) == []
        assert tx(c, "TX:s1:1", "COMMIT_ONE_PHASE")[1].startswith(b"XAException:code=-4")
        # the same for PREPARE
        assert tx(c, "TX:s1:2", "BEGIN")[0] == 200
        assert tput(c, "test", 0, b"x" * 2000, "TX:s1:2")[0] == 500
        code, body = tx(c, "TX:s1:2", "PREPARE")
        assert code == 500 and b"XAException:code=100" in body
    b.restart()
    with WireClient(b.addr) as c:
        assert ids_from(c, "test", 0, start) == []


def test_prepared_local_without_group_ends_with_its_connection(
    broker_factory: BrokerFactory,
) -> None:
    b = broker_factory(maxTxTimeoutTimerCapacity=3)
    with WireClient(b.addr) as c:
        start = end_of(c, "test", 0)
        for n in range(3):
            key = f"TX:s1:{n}"
            assert tx(c, key, "BEGIN")[0] == 200
            assert tput(c, "test", 0, b"p%d" % n, key)[0] == 200
            assert tx(c, key, "PREPARE") == (200, b"0")
        # prepared ones count against the open-transaction cap
        code, body = tx(c, "TX:s1:9", "BEGIN")
        assert code == 503 and b"maxTxTimeoutTimerCapacity" in body
        assert stats(b.addr)["tx_state_prepared"] == "3"
    deadline = time.monotonic() + 5
    while stats(b.addr).get("tx_state_prepared") and time.monotonic() < deadline:
        time.sleep(0.05)
    st = stats(b.addr)
    assert "tx_state_prepared" not in st and st["tx_abandoned"] == "3"
    with WireClient(b.addr) as c:
        assert ids_from(c, "test", 0, start) == []
        assert tx(c, "TX:s1:9", "BEGIN")[0] == 200  # room again


def test_prepared_local_without_group_times_out_and_is_gone_after_restart(
    broker_factory: BrokerFactory,
) -> None:
    b = broker_factory()
    with WireClient(b.addr) as c:
        assert tx(c, "TX:s1:1", "BEGIN", " 1")[0] == 200
        assert tput(c, "test", 0, b"t", "TX:s1:1")[0] == 200
        assert tx(c, "TX:s1:1", "PREPARE") == (200, b"0")
        time.sleep(1.8)
        code, body = tx(c, "TX:s1:1", "COMMIT_TWO_PHASE")
        assert code == 500 and b"XAException:code=106" in body  # XA_RBTIMEOUT
        # and one prepared when the broker dies is rolled back by the restart
        assert tx(c, "TX:s1:2", "BEGIN")[0] == 200
        assert tput(c, "test", 0, b"u", "TX:s1:2")[0] == 200
        assert tx(c, "TX:s1:2", "PREPARE") == (200, b"0")
        start = end_of(c, "test", 0)
        b.restart(kill=True)
    st = stats(b.addr)
    assert "tx_state_prepared" not in st and st["tx_recovered_rolled_back"] == "1"
    with WireClient(b.addr) as c:
        assert ids_from(c, "test", 0, start) == []
        assert tx(c, "TX:s1:2", "COMMIT_TWO_PHASE")[1].startswith(b"XAException:code=-4")
