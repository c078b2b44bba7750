"""``Producer.send()`` one at a time over the calling thread's own socket (client/_direct)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from notify.client import ClientConfig, ConsumerConfig, Message, connect
from notify.testing import BrokerProcess
from tests.helpers import wait_until

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def _consume(addr: str, tmp_path: Path, count: int) -> list[Message]:
    got: list[Message] = []
    with connect([addr], config=FAST) as s:
        c = s.create_consumer(ConsumerConfig(group="g", data_dir=tmp_path / "c"))
        c.subscribe("test", got.append).complete_subscribe()
        wait_until(lambda: len(got) >= count)
        c.shutdown()
    return got


def test_send_goes_direct_and_stays_behind_messages_in_flight(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.publish("test")
        first = p.send("test", b"d0", key="k")
        mine = s.core.pool.blocking_of("send")
        assert first.success and list(mine) == [broker.addr]  # went over this thread's socket
        futs = [p.send_future("test", b"f%d" % i, key="k") for i in range(300)]
        after = p.send("test", b"after", key="k", headers={"h": 1})  # must queue behind them
        results = [f.result(10) for f in futs]
        assert after.success and all(r.success for r in results)
        last = p.send("test", b"last", attribute="tag", key="k")
        conn = mine[broker.addr]
        assert conn.is_open
    assert not conn.is_open  # closed with the session
    got = {m.data: m for m in _consume(broker.addr, tmp_path, 303)}
    assert got[b"d0"].offset == first.offset and got[b"d0"].msg_id == first.msg_id
    assert got[b"after"].offset > max(r.offset for r in results)
    assert got[b"after"].headers == {"h": 1} and got[b"after"].key == "k"
    assert got[b"last"].msg_id == last.msg_id and got[b"last"].attribute == "tag"
    assert last.partition == first.partition


def test_broken_direct_socket_falls_back_and_ended_threads_close_theirs(
    broker: BrokerProcess,
) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.publish("test")
        assert p.send("test", b"a").success
        conn = s.core.pool.blocking_of("send")[broker.addr]
        sock = conn._sock
        assert sock is not None
        sock.shutdown(socket.SHUT_RDWR)  # as if the broker dropped it
        r = p.send("test", b"b")  # the direct attempt fails: the loop path sends it
        assert r.success and r.msg_id > 0 and not conn.is_open
        s.core.pool._skip_until.clear()
        assert p.send("test", b"c").success and conn.is_open  # reconnected
        # connections of threads that ended are closed when another thread opens one
        conns = []

        def one() -> None:
            assert p.send("test", b"t").success
            conns.append(s.core.pool.blocking_of("send")[broker.addr])

        for _ in range(4):
            t = threading.Thread(target=one)
            t.start()
            t.join()
        assert p.send("test", b"main").success
        # (a new thread may get an ended one's id, and then its connection: also bounded)
        assert len({id(c) for c in conns if c.is_open}) <= 1
        assert len(s.core.pool._by_thread) <= 2
