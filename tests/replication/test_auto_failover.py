"""Automatic failover with fencing in ZooKeeper mode (``autoFailover=true``).

A group of two real broker processes (the configured master pushes to a synchronous slave)
and a real ZooKeeper with 2 s sessions: ``kill -9`` the master and the slave takes over by
itself (kazoo lock, epoch bumped in ZooKeeper, re-registered as master); no acknowledged put
or committed transaction is lost; the old master restarted rejoins as a slave and ends with
the same bytes; a master paused (SIGSTOP) past its session refuses writes when it wakes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from notify.client import ClientConfig, ConsumerConfig, Producer, ProducerConfig, connect
from notify.protocol import records
from notify.testing import BrokerProcess, free_port
from notify.txlog import TxLog
from tests.helpers import WireClient, read_all, stats, timing, tput, tx, wait_until, xid
from tests.services import ZooKeeperServer

REPL = "repl-secret"
#: the log lines a failed failover test prints: elections, errors, restarts
_TELLING = re.compile(r" (ERROR|CRITICAL) |notify\.failover|promoted|Traceback|Error:")
SESSION_MS = 2000


def _wait(cond: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> float:
    """:func:`wait_until`; a broker that refuses or drops the connection meanwhile
    (restarting in its process: a demoted master rejoins, as designed) is "not yet"."""
    retry = (ConnectionRefusedError, ConnectionResetError)
    return wait_until(cond, timeout, step=0.05, what=what, retry=retry)


class Group:
    """Broker id 1: ``a`` (configured master, syncSlave=b) and ``b`` ([slave] slaveId=1,
    syncSlave=a for when it is master)."""

    def __init__(
        self,
        tmp: Path,
        zk: ZooKeeperServer,
        root: str,
        topics: dict[str, int] | None = None,
        system: dict[str, object] | None = None,
    ):
        self.root = root
        self.zk = zk
        self.tmp = tmp
        pa, pb = free_port(), free_port()
        zkc = {
            "zkEnable": True,
            "zkConnect": zk.connect,
            "zkRoot": root,
            "zkSessionTimeoutMs": SESSION_MS,
            "zkConnectionTimeoutMs": 5000,
        }
        common = {
            "brokerId": 1,
            "replicationSecret": REPL,
            "autoFailover": "true",
            "syncSlaveTimeout": 1000,
            # availability after a failover: the new master's synchronous slave is the old
            # master, down or fenced; "async" acknowledges (flagged degraded) meanwhile
            "syncSlaveFailurePolicy": "async",
            **(system or {}),
        }
        topics = topics or {"orders": 1}
        self.a = BrokerProcess(
            tmp / "a",
            topics=topics,
            system={**common, "syncSlave": f"127.0.0.1:{pb}"},
            zookeeper=zkc,
        )
        self.a.port = pa
        self.b = BrokerProcess(
            tmp / "b",
            topics=topics,
            system={**common, "syncSlave": f"127.0.0.1:{pa}"},
            slave={"slaveId": 1, "masterAddress": f"127.0.0.1:{pa}", "slaveMaxDelayInMills": 100},
            zookeeper=zkc,
        )
        self.b.port = pb

    def start(self) -> None:
        self.a.start()
        self.b.start()
        _wait(lambda: stats(self.a.addr).get("sync_slave_state") == "in_sync", what="sync")
        _wait(lambda: stats(self.a.addr).get("sync_slave_connected") == "True", what="link")

    def stop(self) -> None:
        for b in (self.a, self.b):
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()
        print_decisions({"a": self.a, "b": self.b})


def print_decisions(members: dict[str, BrokerProcess]) -> None:
    """Print what each member decided, and why: elections, promotions, errors (pytest shows
    a fixture's output only when its test failed)."""
    for name, b in members.items():
        if b.log_path.exists():
            lines = b.log_path.read_text(errors="replace").splitlines()
            keep = [ln for ln in lines if _TELLING.search(ln)]
            print(f"--- {name} ({b.addr}): {len(keep)} of {len(lines)} log lines")
            print("\n".join(keep[-60:]))


@pytest.fixture
def group(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(tmp_path, zookeeper, zk_root)
    yield g
    g.stop()


def _zk_get(zk: ZooKeeperServer, path: str) -> bytes | None:
    kz = KazooClient(hosts=zk.connect, timeout=5.0)
    kz.start(timeout=10)
    try:
        return kz.get(path)[0] if kz.exists(path) else None
    finally:
        kz.stop()
        kz.close()


def _put_until_ok(addr: str, body: bytes, timeout: float = 15.0) -> float:
    """Seconds until a put on ``addr`` is acknowledged (connection errors retried)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with WireClient(addr, timeout=2.0) as c:
                if c.put("orders", 0, body).code == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no put acknowledged by {addr} within {timeout}s")


def _logs(b: BrokerProcess, name: str) -> dict[str, bytes]:
    d = b.data_dir / name
    return {p.name: p.read_bytes() for p in d.iterdir() if p.name.startswith("redo.")}


def _segments(b: BrokerProcess) -> bytes:
    d = b.data_dir / "orders-0"
    return b"".join(p.read_bytes() for p in sorted(d.iterdir()) if p.suffix == ".meta")


def _load(addr: str, tag: str, n: int) -> list[bytes]:
    """``n`` acknowledged puts and one committed local transaction; their bodies."""
    with WireClient(addr) as c:
        for i in range(n):
            assert c.put("orders", 0, b"%s%d" % (tag.encode(), i)).code == 200
        key = f"TX:{tag}:1"
        assert tx(c, key, "BEGIN")[0] == 200
        tput(c, "orders", 0, b"%s-tx" % tag.encode(), key)
        assert tx(c, key, "COMMIT_ONE_PHASE") == (200, b"")
    return [b"%s%d" % (tag.encode(), i) for i in range(n)] + [b"%s-tx" % tag.encode()]


def _client_send_until_ok(producer: Producer, body: bytes, timeout: float = 15.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if producer.send("orders", body).success:  # a producer that returns failures
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"the cluster-mode producer could not send within {timeout}s")


def test_failover_pause_kill_and_rejoin(group: Group) -> None:
    """SIGSTOP the master past its session: the slave takes over (epoch 2), the woken master
    refuses writes (503, fenced) and rejoins as a slave with the new master's bytes; then
    kill -9 the new master: the old one takes over again (epoch 3) with every acknowledged
    put and committed transaction, and the killed one restarted rejoins as a slave."""
    group.start()
    a, b = group.a, group.b
    assert stats(a.addr)["failover_epoch"] == "1" and stats(b.addr)["failover_epoch"] == "1"
    cfg = ClientConfig(zk_session_timeout_s=2.0, request_timeout_s=2.0, connect_timeout_s=0.5)
    with connect(zk=f"{group.zk.connect}{group.root}", config=cfg) as session:
        producer = session.create_producer(
            ProducerConfig(retries=1, retry_backoff_s=0.05, raise_on_error=False)
        )
        got: list[bytes] = []  # a cluster-mode consumer follows the master too
        consumer = session.create_consumer(
            ConsumerConfig(group="g", data_dir=str(group.tmp / "client"))
        )
        consumer.subscribe("orders", lambda m: got.append(m.data)).complete_subscribe()
        assert producer.send("orders", b"client-1").success
        want = [b"client-1", *_load(a.addr, "a", 20)]

        # 1. pause the master past its session timeout
        assert a.proc is not None
        stale = WireClient(a.addr, timeout=10.0)  # a producer still connected to it
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            took = _put_until_ok(b.addr, b"b-first")
            print(f"failover after SIGSTOP: the slave took writes {took:.2f}s later")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        r = stale.put("orders", 0, b"stale")  # woken: its lease lapsed while it was stopped
        stale.close()
        assert r.code == 503 and b"fenced" in r.body, r
        want.append(b"b-first")
        took = _client_send_until_ok(producer, b"client-2")
        print(f"cluster-mode producer moved to the new master within {took:.2f}s")
        want.append(b"client-2")
        st = stats(b.addr)
        assert st["failover_epoch"] == "2" and st["failover_leader"] == "True", st
        epoch = json.loads(_zk_get(group.zk, f"{group.root}/failover/1/epoch") or b"{}")
        assert epoch == {"epoch": 2, "member": 1, "address": b.addr}
        master_node = f"{group.root}/brokers/ids/1/master"
        assert _zk_get(group.zk, master_node) == b"meta://" + b.addr.encode()
        # the old master restarted in-process and follows the new one, same bytes
        _wait(lambda: _stats_or_empty(a.addr).get("role") == "slave", what="a rejoined")
        assert _stats_or_empty(a.addr)["failover_epoch"] == "2"
        with WireClient(a.addr) as c:
            assert c.put("orders", 0, b"no").code == 403
        want += _load(b.addr, "b", 20)
        assert [x.body for x in read_all(b.addr, "orders", 0)] == want
        _wait(lambda: _segments(a) == _segments(b), what="identical partition bytes")
        _wait(lambda: stats(b.addr).get("sync_slave_state") == "in_sync", what="a in sync")
        _wait(lambda: stats(a.addr).get("replication_state") == "ok", what="a sees lag 0")

        # 2. kill -9 the new master right after its last acknowledgement, one XA branch
        # prepared on it
        want += _load(b.addr, "c", 20)
        with WireClient(b.addr) as c:
            assert tx(c, xid(1), "BEGIN", " 60")[0] == 200
            tput(c, "orders", 0, b"xa-1", xid(1))
            assert tx(c, xid(1), "END")[0] == 200
            assert tx(c, xid(1), "PREPARE") == (200, b"0")
        b.kill()
        took = _put_until_ok(a.addr, b"a-again")
        print(f"failover after kill -9: producers write again {took:.2f}s later")
        timing(took < 10.0, f"producers wrote again {took:.2f} s after the kill")
        want.append(b"a-again")
        took = _client_send_until_ok(producer, b"client-3")
        timing(took < 10.0, f"the cluster-mode producer sent again after {took:.2f} s")
        want.append(b"client-3")
        assert [x.body for x in read_all(a.addr, "orders", 0)] == want  # nothing lost
        assert stats(a.addr)["failover_epoch"] == "3"
        with WireClient(a.addr) as c:  # the coordinator resolves the branch on the new master
            r = c.call(b"transaction null s9 RECOVER q1 4\r\n")
            assert r.code == 200 and r.body == xid(1).encode(), r
            assert tx(c, xid(1), "COMMIT_TWO_PHASE") == (200, b"")
        want.append(b"xa-1")
        assert [x.body for x in read_all(a.addr, "orders", 0)] == want
        _wait(lambda: b"xa-1" in got, what="the consumer read from the new master")
        assert set(got) <= set(want)

    # 3. the killed master comes back as a slave of epoch 3 with the same bytes; give it a
    # tail the new master never had (a batch it appended but never got acknowledged, and
    # records in its delay-queue, queue-state and redo logs: each is cut where the new
    # master's copy ended at its take-over and kept; only the rest is pulled)
    seg = max(p for p in (b.data_dir / "orders-0").iterdir() if p.suffix == ".meta")
    with seg.open("ab") as f:
        f.write(records.encode(123456789, 0, b"never-replicated"))
    for name in ("delay", "queues", "transactions"):
        with TxLog.open(b.data_dir / name) as extra:
            extra.append(1, b"a record the new master never had")
            extra.sync()
    b.start()
    st = stats(b.addr)
    assert st["role"] == "slave" and st["failover_epoch"] == "3", st
    text = b.log_path.read_text()
    assert "cutting" in text and "dropping" not in text  # every log cut and kept
    for what in ("redo log", "delay log", "queue log"):
        assert re.search(what + r" \S+ kept up to \d+:\d+ \(\d+ bytes cut\)", text), what
    with WireClient(a.addr) as c:
        assert c.put("orders", 0, b"later").code == 200
        now_ms = int(time.time() * 1000)  # a delayed message due now: a MOVE in a's delay log
        r = c.call(b"dput orders 0 5 0 -1 %d 3\r\ndelay" % now_ms)
        assert r.code == 200, r
    _wait(lambda: _segments(a) == _segments(b), what="identical partition bytes")
    for name in ("delay", "queues", "transactions"):  # the new master's, not b's own tail
        _wait(lambda n=name: _logs(a, n) == _logs(b, n), what=f"identical {name} logs")


def _stats_or_empty(addr: str) -> dict[str, str]:
    try:
        return stats(addr)
    except OSError:
        return {}
