"""Delayed and scheduled messages: due order, restarts, crashes around the move, transactions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from notify.protocol import records
from notify.protocol.frames import encode_dput
from notify.protocol.replies import parse_stats
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, read_all


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_count(addr: str, topic: str, n: int, timeout: float = 10.0) -> list[records.Record]:
    deadline = time.monotonic() + timeout
    while True:
        got = read_all(addr, topic)
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def dput(
    c: WireClient, topic: str, body: bytes, due: int, opaque: int = 1, tx: str | None = None
) -> int:
    r = c.call(encode_dput(topic, 0, body, 0, -1, due, opaque, tx))
    assert r.code == 200, r.body
    mid, part, off = r.body.split()
    assert off == b"-1" and part == b"0"
    return int(mid)


def test_delivered_no_earlier_than_due_in_due_order(broker: BrokerProcess) -> None:
    base = now_ms()
    with WireClient(broker.addr) as c:
        ids = {}
        for i, delay in enumerate([1500, 900, 1200, 600]):
            ids[delay] = dput(c, "single", b"d%d" % delay, base + delay, opaque=i)
        ids[0] = dput(c, "single", b"now", base - 1000)  # in the past: at once
        assert c.call(b"put nosuch 0 1 0 5\r\nx").code == 404
        assert c.call(encode_dput("nosuch", 0, b"x", 0, -1, base, 6)).code == 404
        assert c.put("__delay", 0, b"x").code == 403  # internal topic
    first = wait_count(broker.addr, "single", 1, 2)
    assert [r.body for r in first] == [b"now"]
    assert now_ms() - base < 600 + 300 or len(first) == 1
    got = wait_count(broker.addr, "single", 5)
    assert [r.body for r in got] == [b"now", b"d600", b"d900", b"d1200", b"d1500"]
    assert [r.msg_id for r in got] == [ids[0], ids[600], ids[900], ids[1200], ids[1500]]
    assert now_ms() - base >= 1500


def test_pending_delayed_messages_survive_sigkill(broker: BrokerProcess) -> None:
    due = now_ms() + 1500
    with WireClient(broker.addr) as c:
        for i in range(50):
            dput(c, "single", b"p%02d" % i, due + i, opaque=i)
    broker.restart(kill=True)
    assert read_all(broker.addr, "single") == []
    got = wait_count(broker.addr, "single", 50)
    assert [r.body for r in got] == [b"p%02d" % i for i in range(50)]
    assert now_ms() >= due
    broker.restart()  # nothing delivered twice after a clean restart either
    time.sleep(0.5)
    assert len(read_all(broker.addr, "single")) == 50


@pytest.mark.crash
@pytest.mark.parametrize("point", ["after_move_intent", "mid_move", "after_move"])
def test_crash_around_the_move_delivers_exactly_once(tmp_path: Path, point: str) -> None:
    b = BrokerProcess(tmp_path, topics={"a": 1, "b": 1}, env={"NOTIFY_CRASHPOINTS": point})
    b.start()
    try:
        due = now_ms() + 300
        with WireClient(b.addr) as c:
            for i in range(10):
                for topic in ("a", "b"):
                    assert (
                        c.call(
                            encode_dput(topic, 0, b"%s%d" % (topic.encode(), i), 0, -1, due, i)
                        ).code
                        == 200
                    )
        assert b.wait_exit(10) is not None, "crashpoint not reached"
        b.env = {}
        b.start()
        a = wait_count(b.addr, "a", 10)
        bb = wait_count(b.addr, "b", 10)
        assert sorted(r.body for r in a) == sorted(b"a%d" % i for i in range(10))
        assert sorted(r.body for r in bb) == sorted(b"b%d" % i for i in range(10))
        b.restart()
        time.sleep(0.5)
        assert len(read_all(b.addr, "a")) == 10 and len(read_all(b.addr, "b")) == 10
    finally:
        b.stop()


def test_delayed_inside_transactions(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    due = now_ms() + 700
    with WireClient(b.addr) as c:
        assert c.call(b"transaction TX:s:1 s BEGIN 1\r\n").code == 200
        dput(c, "single", b"committed", due, tx="TX:s:1")
        assert c.call(b"transaction TX:s:1 s COMMIT_ONE_PHASE 2\r\n").code == 200
        assert c.call(b"transaction TX:s:2 s BEGIN 3\r\n").code == 200
        dput(c, "single", b"rolled back", due, tx="TX:s:2")
        assert c.call(b"transaction TX:s:2 s ROLLBACK 4\r\n").code == 200
    time.sleep(0.3)
    assert read_all(b.addr, "single") == []  # committed, but not due yet
    got = wait_count(b.addr, "single", 1)
    time.sleep(0.5)
    assert [r.body for r in read_all(b.addr, "single")] == [b"committed"]
    assert got and now_ms() >= due


def test_a_message_due_before_it_was_put_does_not_skew_lateness(broker: BrokerProcess) -> None:
    """deliverAt=0 (or any past time) is due when put: its lateness counts from the put,
    not from 1970 (the attack run saw delay_lateness_p50_ms at 1.8e12)."""
    with WireClient(broker.addr) as c:
        dput(c, "single", b"epoch", 0)
        dput(c, "single", b"past", now_ms() - 3_600_000, opaque=2)
    assert len(wait_count(broker.addr, "single", 2)) == 2
    with WireClient(broker.addr) as c:
        stats = dict(parse_stats(c.call(b"stats 3\r\n").body))
    assert 0 <= float(stats["delay_lateness_p99_ms"]) < 10_000, stats["delay_lateness_p99_ms"]
