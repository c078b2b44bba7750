"""A static-mode client (broker addresses, no ZooKeeper) carries failover epochs.

It learns each address's group and epoch from the ``stats`` it asks for the broker id
(``failover_epoch``), declares the newest epoch it has seen on every connection to a member
of the group, and learns newer ones from the brokers' answers: a broker elected master of a
new epoch closes the client connections that declared an older one, so the client
reconnects, declares and learns it. The old master, paused (SIGSTOP) past its session and
woken, then refuses the static client by the epoch (503 ``stale master``); a queue consumer
connected to it before the pause is refused its acknowledgement (503 ``fenced``).

Real broker processes (the group of :mod:`tests.replication.test_auto_failover`) and a real
ZooKeeper with 2 s sessions.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from notify.client import ClientConfig, Partition, ProducerConfig, connect
from tests.helpers import WireClient, read_all, stats
from tests.queues.test_queues import _publish, _pushes
from tests.replication.test_auto_failover import (
    Group,
    _put_until_ok,
    _stats_or_empty,
    _wait,
)
from tests.services import ZooKeeperServer


@pytest.fixture
def group(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(tmp_path, zookeeper, zk_root)
    yield g
    g.stop()


def test_static_client_learns_the_new_epoch_and_fences_the_woken_master(group: Group) -> None:
    group.start()
    a, b = group.a, group.b
    assert a.proc is not None
    target = [a.addr]

    def pinned(topic: str, parts: Sequence[Partition], key: object, data: bytes) -> Partition:
        return next(p for p in parts if p.address == target[0])

    _publish(a.addr, "orders", 3, 1)
    q = WireClient(a.addr, timeout=10.0)  # a queue consumer of the old master
    cfg = ClientConfig(request_timeout_s=1.0, connect_timeout_s=0.5)
    try:
        assert q.call(b"qsub orders g 3 earliest 1\r\n").code == 200
        msgs = _pushes(q, 3)
        with connect([a.addr, b.addr], config=cfg) as session:
            producer = session.create_producer(
                ProducerConfig(retries=0, raise_on_error=False), selector=pinned
            )
            assert producer.send("orders", b"before").success
            pool = session.core.pool
            _wait(lambda: pool.epochs.get(1) == 1, 5.0, "the static client read epoch 1")
            assert int(stats(a.addr)["epoch_declared"]) >= 1  # declared to both members
            assert int(stats(b.addr)["epoch_declared"]) >= 1

            os.kill(a.proc.pid, signal.SIGSTOP)
            try:
                _put_until_ok(b.addr, b"b-first")  # b leads epoch 2
                target[0] = b.addr

                def sent_to_b() -> bool:
                    return producer.send("orders", b"after").success

                _wait(sent_to_b, 10.0, "the static client wrote to the new master")
                _wait(lambda: pool.epochs.get(1) == 2, 5.0, "the client learned epoch 2")
                # a stale queue acknowledgement, read by the old master when it wakes
                items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in msgs)
                q.send(b"qack orders g %d 2\r\n" % len(items) + items)
            finally:
                os.kill(a.proc.pid, signal.SIGCONT)
            (rep,) = q.replies(1)
            assert rep.opaque == 2 and rep.code == 503 and b"fenced" in rep.body, rep
            # the static client's connection to the old master declared epoch 2 while it
            # was stopped: the woken master refused it by the epoch
            _wait(lambda: pool.stale_answers >= 1, 5.0, "the old master answered stale")
            target[0] = a.addr
            r = producer.send("orders", b"to-the-old-master")
            assert not r.success, r
    finally:
        q.close()
    _wait(lambda: _stats_or_empty(a.addr).get("role") == "slave", what="a rejoined")
    stored = [x.body for x in read_all(b.addr, "orders", 0)]
    assert b"after" in stored and b"to-the-old-master" not in stored
