"""Queue verbs are fenced like puts and transactions under automatic failover.

A master of an ``autoFailover`` group refuses ``qsub``/``qack``/``qunsub``/``qdlq`` from a
connection that declared a newer epoch (503 ``stale master``) and, once replaced, refuses
them all (503 ``fenced``); an acknowledgement waiting for its fsync and its synchronous
slave while the master is replaced is answered 503, not 200 (the new master decides: it
redelivers what it did not see accepted).

Real broker processes (the group of :mod:`tests.replication.test_auto_failover`) and a real
ZooKeeper with 2 s sessions.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.helpers import WireClient, stats
from tests.queues.test_queues import _publish, _pushes
from tests.replication.test_auto_failover import Group
from tests.services import ZooKeeperServer


@pytest.fixture
def group(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(tmp_path, zookeeper, zk_root)
    yield g
    g.stop()


def test_queue_verbs_refused_by_a_stale_epoch_and_acks_fenced_at_release(group: Group) -> None:
    group.start()
    a, b = group.a, group.b
    _publish(a.addr, "orders", 20, 1)
    with WireClient(a.addr) as newer:  # a consumer that saw epoch 2 of broker 1
        assert newer.call(b"epoch 1 2 1\r\n").code == 503
        for verb in (
            b"qsub orders g 10 earliest 2\r\n",
            b"qack orders g 6 3\r\nA 0 0\n",
            b"qunsub orders g 4\r\n",
        ):
            r = newer.call(verb)
            assert r.code == 503 and b"stale master" in r.body, (verb, r)
    assert int(stats(a.addr)["epoch_refused"]) >= 4

    c = WireClient(a.addr)
    try:
        assert c.call(b"qsub orders g 10 earliest 5\r\n").code == 200
        msgs = _pushes(c, 10)
        first = msgs[:5]
        items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in first)
        c.send(b"qack orders g %d 6\r\n" % len(items) + items)
        (rep,) = [r for r in c.replies(6) if r.kind == "result"]  # answer + 5 new pushes
        assert rep.code == 200 and rep.body.split(b"\n")[0] == b"5 0", rep

        # b paused: the next acknowledgement waits for it; meanwhile the group elects b
        # (as it would once a's session ended): a is replaced before the ack is released
        assert b.proc is not None
        kz = KazooClient(hosts=group.zk.connect, timeout=5.0)
        kz.start(timeout=10)
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            rest = msgs[5:]
            items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in rest)
            c.send(b"qack orders g %d 7\r\n" % len(items) + items)
            time.sleep(0.2)
            value = {"epoch": 2, "member": 1, "address": b.addr}
            kz.set(f"{group.root}/failover/1/epoch", json.dumps(value).encode())
            deadline = time.monotonic() + 10
            rep = None
            while rep is None and time.monotonic() < deadline:
                for r in c.replies(1):
                    if r.kind == "result":
                        rep = r
            assert rep is not None and rep.opaque == 7, rep
            assert rep.code == 503 and b"not acknowledged" in rep.body, rep
            assert b"fenced" in rep.body, rep
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
            kz.stop()
            kz.close()
    finally:
        c.close()


@pytest.fixture
def short_locks(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(tmp_path, zookeeper, zk_root, system={"queueLockTimeout": 1000})
    yield g
    g.stop()


def test_woken_replaced_master_pushes_nothing(short_locks: Group) -> None:
    """Messages acquired on a master whose locks run out while it is paused past its
    session: woken, it is fenced and must not push them again (the new master delivers
    them); it closes the consumer's connection when it rejoins as a slave."""
    group = short_locks
    group.start()
    a, b = group.a, group.b
    _publish(a.addr, "orders", 10, 1)
    c = WireClient(a.addr, timeout=0.5)
    try:
        assert c.call(b"qsub orders g 10 earliest 1\r\n").code == 200
        assert len(_pushes(c, 10)) == 10  # held, never acknowledged
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:  # b elected (a's session ended) and a's locks past their deadline meanwhile
            t0 = time.monotonic()
            while stats(b.addr).get("role") != "master":
                assert time.monotonic() - t0 < 15, "b did not take over"
                time.sleep(0.1)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        pushed = []
        deadline = time.monotonic() + 2.0  # until a rejoins as a slave (closes c) or 2 s
        while time.monotonic() < deadline:
            try:
                pushed += [r for r in c.replies(1) if r.kind == "qmsg"]
            except TimeoutError:
                continue
            except OSError:  # closed by the rejoin (ConnectionError is an OSError)
                break
        assert pushed == [], f"{len(pushed)} messages pushed by the replaced master"
    finally:
        c.close()
    with WireClient(b.addr) as c2:  # the new master delivers them
        assert c2.call(b"qsub orders g 10 earliest 2\r\n").code == 200
        assert len(_pushes(c2, 10)) == 10
