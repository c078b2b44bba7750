"""A member that rejoins keeping its (cut) delay-queue and queue-state logs and is
then promoted again delivers each delayed message once and redelivers no accepted queue
message.

A group of two real broker processes (:class:`tests.replication.test_auto_failover.Group`,
synchronous slave, 2 s ZooKeeper sessions). Epoch 1 on ``a``: delayed messages (some moved
at once, some due later), a queue group with accepted and in-flight messages. ``kill -9 a``:
``b`` takes over (epoch 2), moves the next delayed messages, redelivers the in-flight ones,
which are accepted there. The dead ``a`` is given a tail its successor never had (a MOVED
for messages not yet due and a DONE for messages not yet delivered: written as master,
never replicated); restarted, it cuts its delay and queue logs at ``b``'s take-over ends,
keeps them and pulls only the rest. ``kill -9 b``: ``a`` leads again (epoch 3) and must
know exactly what both epochs delivered and accepted.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from notify.broker.delay import _encode_moved, decode_envelope
from notify.protocol import queuelog, records
from notify.protocol.frames import Response
from notify.testing import BrokerProcess
from notify.txlog import TxLog
from tests.broker.test_delay import dput, now_ms
from tests.helpers import WireClient, queue_stats, read_all, stats
from tests.queues.test_queues import _publish, _pushes
from tests.replication.test_auto_failover import Group, _logs, _stats_or_empty, _wait
from tests.services import ZooKeeperServer

N = 30  # queue messages in "work"
LATE_MS = 9000  # due after the second take-over (the test waits for them)


@pytest.fixture
def group(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(
        tmp_path,
        zookeeper,
        zk_root,
        topics={"orders": 1, "work": 1},
        system={"queueCheckpointInterval": 300, "delayCheckpointInterval": 300},
    )
    yield g
    g.stop()


def _bodies(addr: str) -> Counter[bytes]:
    return Counter(r.payload for r in read_all(addr, "orders"))


def _ack(c: WireClient, msgs: list[tuple[int, int]], opaque: int, more: int) -> list[Response]:
    """Accept ``msgs``; the answer must be ``<n> 0``; returns the ``more`` pushes after it."""
    items = b"".join(b"A %d %d\n" % m for m in msgs)
    c.send(b"qack work g %d %d\r\n" % (len(items), opaque) + items)
    out = c.replies(1 + more)
    (rep,) = [r for r in out if r.kind == "result"]
    assert rep.code == 200 and rep.body.split(b"\n")[0] == b"%d 0" % len(msgs), rep
    return [r for r in out if r.kind == "qmsg"]


def _same_log(x: BrokerProcess, y: BrokerProcess, name: str) -> bool:
    return _logs(x, name) == _logs(y, name)


def _leader(addr: str, epoch: int) -> bool:
    st = _stats_or_empty(addr)
    want = ("True", str(epoch), "master")
    return (st.get("failover_leader"), st.get("failover_epoch"), st.get("role")) == want


def test_rejoined_member_promoted_again_keeps_delay_and_queue_state(group: Group) -> None:
    group.start()
    a, b = group.a, group.b
    _publish(a.addr, "work", N, 1)
    ends = {r.offset: r.offset + r.size for r in read_all(a.addr, "work")}
    offsets = sorted(ends)
    assert len(offsets) == N

    # epoch 1 (a): 10 accepted (a checkpoint between), 10 in flight
    c1 = WireClient(a.addr)
    assert c1.call(b"qsub work g 10 earliest 1\r\n").code == 200
    first = [(m.partition, m.offset) for m in _pushes(c1, 10)]
    pushed = _ack(c1, first[:5], 2, 5)
    time.sleep(0.4)  # a queue checkpoint (SNAPSHOT records in the log) travels too
    pushed += _ack(c1, first[5:], 3, 5)
    held1 = [(m.partition, m.offset) for m in pushed]
    accepted = set(first)
    assert not set(held1) & accepted

    base = now_ms()
    with WireClient(a.addr) as c:
        for i in range(5):
            dput(c, "orders", b"early%d" % i, base - 1000, opaque=i + 1)  # moved by a
        for i in range(5):
            dput(c, "orders", b"mid%d" % i, base + 1500, opaque=i + 10)  # moved by b
        for i in range(5):
            dput(c, "orders", b"late%d" % i, base + LATE_MS, opaque=i + 20)  # by a again
    _wait(lambda: len(_bodies(a.addr)) == 5, 5, "early messages moved on a")
    a.kill()
    c1.close()
    assert now_ms() < base + 1500, "too slow: a was to die before the mid messages were due"

    # a's tail its successor never had: a MOVED for the late messages and a DONE for the
    # last 10 queue messages (neither delivered yet); kept, they would lose both
    delay_data = b"".join(
        p.read_bytes() for p in sorted((a.data_dir / "__delay-0").iterdir()) if p.suffix == ".meta"
    )
    late = [
        r.offset
        for r in records.decode_all(delay_data, 0)[0]
        if decode_envelope(r.payload)[3].startswith(b"late")
    ]
    assert len(late) == 5
    never = offsets[20:]
    with TxLog.open(a.data_dir / "delay") as tail:
        tail.append(21, _encode_moved(1_000_000, late))  # MOVED
        tail.sync()
    with TxLog.open(a.data_dir / "queues") as tail:
        rows = [(0, o, ends[o], queuelog.ACKNOWLEDGED, 1, base) for o in never]
        tail.append(queuelog.DONE, queuelog.encode_done_rows("work", "g", rows))
        tail.sync()

    # epoch 2 (b): the in-flight ones come back and are accepted there; the mid ones moved
    _wait(lambda: _leader(b.addr, 2), 10, "b took over")
    c2 = WireClient(b.addr)
    assert c2.call(b"qsub work g 10 earliest 4\r\n").code == 200
    back = [(m.partition, m.offset) for m in _pushes(c2, 10)]
    assert set(back) == set(held1)  # no accepted one redelivered, the in-flight ones back
    held2 = [(m.partition, m.offset) for m in _ack(c2, back, 5, 10)]
    accepted |= set(back)
    assert {o for _p, o in held2} == set(never)
    _wait(lambda: len(_bodies(b.addr)) == 10, 8, "mid messages moved by b")

    # a rejoins: its delay and queue logs cut at b's take-over ends and kept
    a.start()
    _wait(lambda: _stats_or_empty(a.addr).get("role") == "slave", what="a rejoined")
    text = a.log_path.read_text()
    for what in ("delay log", "queue log"):
        m = re.search(what + r" \S+ kept up to \d+:\d+ \((\d+) bytes cut\)", text)
        assert m is not None and int(m.group(1)) > 0, what  # the tail was cut, not pulled
    assert "dropping" not in text
    for name in ("delay", "queues"):
        _wait(partial(_same_log, a, b, name), what=f"identical {name} logs")
    _wait(lambda: stats(b.addr).get("sync_slave_state") == "in_sync", what="a in sync")

    # epoch 3 (a again): b dies before the late messages are due, a moves them
    assert now_ms() < base + LATE_MS - 500, "too slow: the late messages would be b's"
    b.kill()
    c2.close()
    _wait(lambda: _leader(a.addr, 3), 10, "a took over again")
    print(f"epoch 3 began {(now_ms() - base) / 1000:.1f}s after the delayed puts")
    want = Counter(b"%s%d" % (k, i) for k in (b"early", b"mid", b"late") for i in range(5))
    _wait(lambda: len(_bodies(a.addr)) >= 15, LATE_MS / 1000 + 5, "late messages moved by a")
    time.sleep(0.3)  # a second move of anything would show now
    _wait(lambda: _stats_or_empty(a.addr).get("role") == "master", what="a (still) master")
    assert _bodies(a.addr) == want  # each delayed message once
    assert int(stats(a.addr)["delay_pending"]) == 0

    st = queue_stats(a.addr)["work/g"]
    assert st["dead_letters"] == "0" and st["acquired"] == "0", st
    with WireClient(a.addr) as c3:
        assert c3.call(b"qsub work g 30 earliest 6\r\n").code == 200
        got = [(m.partition, m.offset) for m in _pushes(c3, 10)]
        assert set(got) == set(held2)  # the ones in flight at the kill, nothing accepted
        r = c3.call(b"version 7\r\n")  # nothing else was pushed before this answer
        assert r.kind == "result" and r.code == 200, r
        st = queue_stats(a.addr)["work/g"]
        assert (st["acquired"], st["available"], st["dead_letters"]) == ("10", "0", "0"), st
        items = b"".join(b"A %d %d\n" % m for m in got)
        rep = c3.call(b"qack work g %d 8\r\n" % len(items) + items)
        assert rep.code == 200 and rep.body.split(b"\n")[0] == b"10 0", rep
        st = queue_stats(a.addr)["work/g"]
        assert st["tracked"] == "0" and st["low_water"] == f"0:{ends[offsets[-1]]}", st
