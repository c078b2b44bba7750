"""Master/slave replication with real broker processes: async slave, sync slave, failover."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from notify.client._message import build_payload
from notify.protocol import records
from notify.protocol.identity import encode_claim, producer_id
from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, crc, stats

TOPICS = {"rep": 3}


def ends(addr: str, topic: str, n: int) -> list[int]:
    with WireClient(addr) as c:
        return [
            int(c.call(b"offset %s g %d 9223372036854775807 1\r\n" % (topic.encode(), p)).body)
            for p in range(n)
        ]


def wait_equal(
    master: BrokerProcess,
    slave: BrokerProcess,
    topic: str = "rep",
    n: int = 3,
    timeout: float = 20.0,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ends(master.addr, topic, n) == ends(slave.addr, topic, n):
                return
        except (ConnectionError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(
        f"slave did not catch up: {ends(master.addr, topic, n)} vs {ends(slave.addr, topic, n)}"
    )


def segment_bytes(b: BrokerProcess, topic: str, part: int) -> bytes:
    d = b.data_dir / f"{topic}-{part}"
    return b"".join(p.read_bytes() for p in sorted(d.glob("*.meta")))


def wait_in_sync(addr: str, timeout_s: float) -> None:
    """Until the master at ``addr`` reports its synchronous slave ``in_sync``."""
    deadline = time.monotonic() + timeout_s
    while stats(addr)["sync_slave_state"] != "in_sync":
        assert time.monotonic() < deadline, stats(addr)
        time.sleep(0.05)


def produce(addr: str, n: int, start: int = 0, parts: int = 3) -> dict[int, tuple[int, int, bytes]]:
    """Pipelined puts; returns opaque -> (partition, offset, body) of acknowledged ones."""
    acked: dict[int, tuple[int, int, bytes]] = {}
    with WireClient(addr) as c:
        frames = []
        bodies = {}
        for i in range(start, start + n):
            body = b"m%07d" % i + b"x" * (i % 37)
            bodies[i] = body
            frames.append(
                b"put rep %d %d 0 %d %d\r\n%b" % (i % parts, len(body), crc(body), i, body)
            )
        c.send(b"".join(frames))
        for r in c.replies(n):
            if r.code == 200:
                _mid, p, off = (int(x) for x in r.body.split())
                acked[r.opaque] = (p, off, bodies[r.opaque])
    return acked


def test_async_slave_byte_identical_and_catch_up(tmp_path: Path) -> None:
    master = BrokerProcess(
        tmp_path / "m", topics=TOPICS, system={"maxSegmentSize": 65536, "replicationSecret": "rs"}
    )
    master.start()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={},
        system={"brokerId": 0, "replicationSecret": "rs"},
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 200},
    )
    try:
        produce(master.addr, 3000)
        slave.start()
        wait_equal(master, slave)
        for p in range(3):
            assert segment_bytes(master, "rep", p) == segment_bytes(slave, "rep", p)
        assert sorted(n.name for n in (slave.data_dir / "rep-0").glob("*.meta")) == sorted(
            n.name for n in (master.data_dir / "rep-0").glob("*.meta")
        )
        # the slave serves consumers, refuses producers
        with WireClient(slave.addr) as c:
            assert c.put("rep", 0, b"no").code == 403
            g = c.call(b"get rep g 0 0 4096 1\r\n")
            assert g.kind == "value" and records.decode_all(g.body)[0]
        st = stats(slave.addr)
        assert st["role"] == "slave" and "lag_bytes=" in st["replication.rep-0"]
        # lag stays bounded under load, and a stopped slave catches up from where it was
        slave.stop()
        produce(master.addr, 2000, start=3000)
        slave.start()
        wait_equal(master, slave)
        for p in range(3):
            assert segment_bytes(master, "rep", p) == segment_bytes(slave, "rep", p)
    finally:
        slave.stop()
        master.stop()


def _pair(
    tmp_path: Path, policy: str = "refuse", timeout_ms: int = 1000, pull_wait_ms: int = 200
) -> tuple[BrokerProcess, BrokerProcess]:
    # replicationSecret: the slave accepts msync only from a replica-authenticated master
    master = BrokerProcess(tmp_path / "m", topics=TOPICS, system={"replicationSecret": "rs"})
    master.port = free_port()
    slave = BrokerProcess(
        tmp_path / "s",
        topics=TOPICS,
        system={"replicationSecret": "rs"},
        slave={
            "slaveId": 1,
            "masterAddress": f"127.0.0.1:{master.port}",
            "slaveMaxDelayInMills": pull_wait_ms,
        },
    )
    slave.start()
    master.system.update(
        {
            "syncSlave": slave.addr,
            "syncSlaveTimeout": timeout_ms,
            "syncSlaveFailurePolicy": policy,
            "syncSlaveMaxFailures": 2,
        }
    )
    master.start()
    deadline = time.monotonic() + 10
    while stats(master.addr).get("sync_slave_connected") != "True":
        assert time.monotonic() < deadline, "master never connected to its sync slave"
        time.sleep(0.05)
    return master, slave


@pytest.mark.crash
def test_sync_slave_has_every_acknowledged_message_after_master_sigkill(tmp_path: Path) -> None:
    master, slave = _pair(tmp_path)
    acked: dict[int, tuple[int, int, bytes]] = {}
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            try:
                acked.update(produce(master.addr, 200, start=i))
            except (ConnectionError, OSError):
                return
            i += 200

    t = threading.Thread(target=load)
    try:
        t.start()
        time.sleep(1.5)
        master.kill()  # SIGKILL mid-load
        stop.set()
        t.join(10)
        assert len(acked) > 200
        # the slave shows its readers the last consistent cut of the master it reached; the
        # last acknowledged puts, pushed to it, show once it is promoted
        with WireClient(slave.addr) as c:
            assert c.call(b"promote 1\r\n").code == 200
        have: dict[tuple[int, int], bytes] = {}
        with WireClient(slave.addr) as c:
            for p in range(3):
                off = 0
                while True:
                    r = c.call(b"get rep g %d %d 1048576 1\r\n" % (p, off))
                    if r.code != 200:
                        break
                    recs, used = records.decode_all(r.body, off)
                    have.update({(p, x.offset): x.body for x in recs})
                    off += used
        missing = [o for o, (p, off, body) in acked.items() if have.get((p, off)) != body]
        assert not missing, f"{len(missing)} acknowledged messages missing on the sync slave"
        # failover: producers go on at the same offsets on the promoted slave
        with WireClient(slave.addr) as c:
            r = c.put("rep", 0, b"after failover")
            assert r.code == 200
            assert int(r.body.split()[2]) == max(
                off + 20 + len(b) for (p, off), b in have.items() if p == 0
            )
    finally:
        stop.set()
        slave.stop()
        master.stop()


def test_sync_slave_state_is_in_sync_only_once_confirmed(tmp_path: Path) -> None:
    """A master whose synchronous slave never answered reports ``connecting`` (not
    ``in_sync``, which told a waiting operator or test that puts were safe when they were
    acknowledged degraded), then ``in_sync`` once its probe saw the slave's ends match."""
    slave_port = free_port()
    master = BrokerProcess(
        tmp_path / "m",
        topics=TOPICS,
        system={
            "replicationSecret": "rs",
            "syncSlave": f"127.0.0.1:{slave_port}",
            "syncSlaveFailurePolicy": "async",
        },
    )
    master.start()
    slave = BrokerProcess(
        tmp_path / "s",
        topics=TOPICS,
        system={"replicationSecret": "rs"},
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 200},
    )
    slave.port = slave_port
    try:
        time.sleep(0.6)  # a probe or two found nobody there
        assert stats(master.addr)["sync_slave_state"] == "connecting"
        assert "no link yet" in master.log_path.read_text()
        slave.start()
        wait_in_sync(master.addr, 10)
        with WireClient(master.addr) as c:
            assert c.put("rep", 0, b"confirmed").code == 200
        assert stats(master.addr)["sync_slave_state"] == "in_sync"  # pushed, not degraded
    finally:
        slave.stop()
        master.stop()


@pytest.mark.parametrize("policy", ["refuse", "async"])
def test_sync_slave_failure_policies(tmp_path: Path, policy: str) -> None:
    master, slave = _pair(tmp_path, policy, timeout_ms=500)
    try:
        with WireClient(master.addr) as c:
            assert c.put("rep", 0, b"in sync").code == 200
        slave.kill()
        with WireClient(master.addr) as c:
            codes = [c.put("rep", 0, b"slave down %d" % i).code for i in range(4)]
        if policy == "refuse":
            assert codes == [503] * 4
            assert stats(master.addr)["sync_slave_state"] == "refusing"
        else:
            assert codes == [200] * 4
            assert stats(master.addr)["sync_slave_state"] == "degraded"
        slave.start()
        wait_in_sync(master.addr, 15)
        with WireClient(master.addr) as c:
            assert c.put("rep", 0, b"back").code == 200
            recs, _ = records.decode_all(c.call(b"get rep g 0 0 1048576 1\r\n").body, 0)
        stored = [b"slave down %d" % i for i in range(4)] if policy == "async" else []
        assert [r.body for r in recs] == [b"in sync", *stored, b"back"]  # 503: not stored
        wait_equal(master, slave)
        assert segment_bytes(master, "rep", 0) == segment_bytes(slave, "rep", 0)
    finally:
        slave.stop()
        master.stop()


def test_idempotent_retry_after_503_and_on_the_promoted_slave(tmp_path: Path) -> None:
    """With a sync slave down, a put answered 503 is not stored on the master (it
    is taken back); its retry is stored once, and a slave that replicated it (then
    promoted) drops a further retry."""
    secret = "secret-of-prod-R"
    pid = producer_id("", secret)

    def put(addr: str, seq: int) -> tuple[int, bytes]:
        payload, flag = build_payload(b"m%d" % seq, None, producer_id=pid, sequence=seq)
        with WireClient(addr) as c:  # a new connection each time: the identity claimed again
            assert c.call(encode_claim(pid, secret, 0, "-", 9)).code == 200
            r = c.put("rep", 0, payload, flag=flag)
        return r.code, r.body

    master, slave = _pair(tmp_path, "refuse", timeout_ms=500)
    try:
        assert put(master.addr, 0)[0] == 200
        slave.kill()
        codes = [put(master.addr, 1)[0] for _ in range(4)]  # the client retrying
        assert codes == [503] * 4
        slave.start()
        wait_in_sync(master.addr, 15)
        code1, ack1 = put(master.addr, 1)
        assert code1 == 200
        wait_equal(master, slave)
        with WireClient(master.addr) as c:
            recs, _ = records.decode_all(c.call(b"get rep g 0 0 1048576 1\r\n").body, 0)
        assert [r.body for r in recs] == [b"m0", b"m1"]  # stored once, not five times
        # a named identity taken over by a newer instance on the master
        relay_secret = "relay-secret-0123456789"
        relay = producer_id("relay", relay_secret)
        named, flag = build_payload(b"n0", None, producer_id=relay, sequence=0)
        with WireClient(master.addr) as old, WireClient(master.addr) as new:
            assert old.call(encode_claim(relay, relay_secret, 5, "old", 1)).code == 200
            assert new.call(encode_claim(relay, relay_secret, 6, "new", 2)).code == 200
            named_ack = new.put("rep", 0, named, opaque=3, flag=flag)
            assert named_ack.code == 200
        wait_equal(master, slave)
        deadline = time.monotonic() + 15  # the slave learns the holder with its next round
        while relay not in stats(slave.addr, "producers"):
            assert time.monotonic() < deadline, "the slave never learnt the named holder"
            time.sleep(0.1)
        master.kill()
        with WireClient(slave.addr) as c:
            assert c.call(b"promote 1\r\n").code == 200
        assert put(slave.addr, 1) == (200, ack1)  # the promoted slave knows the producer
        assert put(slave.addr, 0)[0] == 400  # older than its last batch
        assert put(slave.addr, 2)[0] == 200
        with WireClient(slave.addr) as old, WireClient(slave.addr) as new:
            assert old.call(encode_claim(relay, relay_secret, 5, "old", 1)).code == 409
            r = new.call(encode_claim(relay, relay_secret, 6, "new", 2))
            assert r.code == 200 and r.body.endswith(b"\nrep 0 0"), r
            assert new.put("rep", 0, named, opaque=3, flag=flag).body == named_ack.body
    finally:
        slave.stop()
        master.stop()


def test_sync_slave_pulling_at_its_pushed_end_is_not_sent_back(tmp_path: Path) -> None:
    """A synchronous slave holds bytes its master does not show yet (pushed before the
    slave's confirmation and the group commit's fsync made them visible there); its own pull
    at that end must wait for more, not be answered 301 to the master's visible end (which
    the slave took for a divergence: an error logged, its puller stopped for 5 s)."""
    master, slave = _pair(tmp_path, pull_wait_ms=2)  # the slave's pulls expire often
    try:
        wait_in_sync(master.addr, 10)
        deadline = time.monotonic() + 3
        n = 0
        while time.monotonic() < deadline:  # pushed, then confirmed, again and again
            acked = produce(master.addr, 300, start=n)
            assert len(acked) == 300
            n += 300
        wait_equal(master, slave)
        text = slave.log_path.read_text()
        assert "diverged" not in text and "ERROR" not in text, text[-2000:]
        st = stats(slave.addr)
        rows = {k: v for k, v in st.items() if k.startswith("replication.rep-")}
        assert len(rows) == 3 and all("error=" not in v for v in rows.values()), rows
    finally:
        slave.stop()
        master.stop()
