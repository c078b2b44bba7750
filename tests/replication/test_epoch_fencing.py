"""Producers carry the failover epoch (``epoch <brokerId> <epoch> <opaque>``) and
transaction verbs are fenced at acknowledgement.

Real broker processes (the group of :mod:`tests.replication.test_auto_failover`: ``a``
configured master pushing to ``b``) and a real ZooKeeper with 2 s sessions.
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

from notify.client import ClientConfig, ProducerConfig, connect
from tests.helpers import WireClient, stats, tput, tx, xid
from tests.replication.test_auto_failover import (
    Group,
    _client_send_until_ok,
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


def test_declared_epoch_refuses_writes_and_tx_fenced_at_ack(group: Group) -> None:
    """A connection declaring a newer epoch than the master's is refused its writes (503
    "stale master") while the master's lease is valid and other connections write; then a
    PREPARE and a local COMMIT waiting for the (paused) synchronous slave while the master is
    replaced are not acknowledged (XAException, "fenced"), though the slave's link is torn
    down by the demotion (under ``async`` that used to release them as 200)."""
    group.start()
    a, b = group.a, group.b
    with WireClient(a.addr) as ok, WireClient(a.addr) as newer:
        r = ok.call(b"epoch 1 0 7\r\n")
        assert (r.code, r.body, r.opaque) == (200, b"1 1", 7), r
        assert ok.call(b"epoch 9 5 8\r\n").body == b"1 1"  # another group's epoch: ignored
        assert ok.call(b"epoch 1 x 3\r\n").code == 400
        r = newer.call(b"epoch 1 2 5\r\n")
        assert r.code == 503 and b"stale master" in r.body and b"epoch 2" in r.body, r
        r = newer.put("orders", 0, b"from-a-client-of-epoch-2")
        assert r.code == 503 and b"stale master" in r.body, r
        r = newer.call(b"transaction TX:n:1 s1 BEGIN 9\r\n")
        assert r.code == 503 and b"stale master" in r.body, r
        assert ok.put("orders", 0, b"epoch-1-client").code == 200  # lease valid: not fenced
        st = stats(a.addr)
        assert st["failover_leader"] == "True" and st["failover_fenced"] == "-", st
        assert int(st["epoch_refused"]) == 3 and int(st["epoch_declared"]) == 3, st

    # fenced at acknowledgement: b paused, so a's redo pushes wait (syncSlaveTimeout 1 s)
    assert b.proc is not None
    kz = KazooClient(hosts=group.zk.connect, timeout=5.0)
    kz.start(timeout=10)
    with WireClient(a.addr) as xa, WireClient(a.addr) as local:
        assert tx(xa, xid(1), "BEGIN", " 60")[0] == 200
        tput(xa, "orders", 0, b"xa-1", xid(1))
        assert tx(xa, xid(1), "END")[0] == 200
        assert tx(local, "TX:l:1", "BEGIN")[0] == 200
        tput(local, "orders", 0, b"local-1", "TX:l:1")
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            xa.send(f"transaction {xid(1)} s1 PREPARE 11\r\n".encode())
            local.send(b"transaction TX:l:1 s1 COMMIT_ONE_PHASE msgs=1 12\r\n")
            time.sleep(0.2)
            # the group elects b (as it would once a's session ended): a is replaced while
            # its acknowledgements wait for b
            value = {"epoch": 2, "member": 1, "address": b.addr}
            kz.set(f"{group.root}/failover/1/epoch", json.dumps(value).encode())
            for c, opaque in ((xa, 11), (local, 12)):
                r = c.replies(1)[0]
                assert r.opaque == opaque, r
                assert r.code != 200 and b"XAException" in r.body and b"fenced" in r.body, r
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
            kz.stop()
            kz.close()


def test_paused_master_refuses_a_producer_that_saw_the_new_epoch(group: Group) -> None:
    """SIGSTOP the master past its session; b leads epoch 2. A cluster-mode producer moves to
    b and learns epoch 2 (from ZooKeeper and b's answer, which the new master counts); a
    connection to the old master declaring that epoch is refused by the epoch (503 "stale
    master", before the lease is even looked at) when the old master wakes."""
    group.start()
    a, b = group.a, group.b
    assert a.proc is not None
    cfg = ClientConfig(zk_session_timeout_s=2.0, request_timeout_s=2.0, connect_timeout_s=0.5)
    with connect(zk=f"{group.zk.connect}{group.root}", config=cfg) as session:
        producer = session.create_producer(
            ProducerConfig(retries=1, retry_backoff_s=0.05, raise_on_error=False)
        )
        assert producer.send("orders", b"before").success
        pool = session.core.pool  # what the client learned
        _wait(lambda: pool.epochs.get(1) == 1, 5.0, "the client read epoch 1")
        assert producer.send("orders", b"before-2").success  # declared with it at least
        assert int(stats(a.addr)["epoch_declared"]) >= 1
        stale = WireClient(a.addr, timeout=10.0)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            _put_until_ok(b.addr, b"b-first")
            _client_send_until_ok(producer, b"after")
            _wait(lambda: pool.epochs.get(1) == 2, 5.0, "the client learned epoch 2")
            assert producer.send("orders", b"after-2").success  # declared with it at least
            assert int(stats(b.addr)["epoch_declared"]) >= 1
            # send() one at a time goes over this thread's own socket: it declared there too
            assert 2 in session.core.pool.blocking_declared.values()
            # a producer that saw epoch 2, on a connection to the old (paused) master
            stale.send(b"epoch 1 2 21\r\n")
            stale.send(b"put orders 0 5 0 22\r\nstale")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        try:
            r1, r2 = stale.replies(2)
        finally:
            stale.close()
        assert r1.opaque == 21 and r1.code == 503 and b"stale master" in r1.body, r1
        assert r2.opaque == 22 and r2.code == 503 and b"stale master" in r2.body, r2
        assert b"epoch 1" in r2.body and b"epoch 2" in r2.body, r2
        # a local transaction runs on the producer's own connections: they declare it too
        before = int(stats(b.addr)["epoch_declared"])
        with producer.transaction(timeout=10):
            producer.send("orders", b"in-a-transaction")
        assert int(stats(b.addr)["epoch_declared"]) > before
    _wait(lambda: _stats_or_empty(a.addr).get("role") == "slave", what="a rejoined")
