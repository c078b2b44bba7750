"""Idempotent producer: a retried put after a lost acknowledgement is stored once,
also across a broker restart (SIGTERM or SIGKILL), against real broker processes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    ProducerConfig,
    connect,
)
from notify.client._identity import put_sequenced
from notify.client._message import build_payload
from notify.client.transport import BlockingConnection
from notify.errors import ProducerFencedError
from notify.protocol.frames import encode_mput, encode_put
from notify.protocol.identity import encode_claim, producer_id
from notify.protocol.records import checksum, encode
from notify.testing import BrokerProcess

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


class AckDropper:
    """A loopback TCP proxy to a broker that, when armed, swallows the next reply chunk
    the broker sends and cuts that client connection (the put reached the broker, its
    acknowledgement never reaches the client)."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies:
                    with self._lock:
                        drop = self.armed > 0
                        if drop:
                            self.armed -= 1
                            self.dropped += 1
                    if drop:
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


@pytest.fixture
def dropper(broker: BrokerProcess) -> Iterator[AckDropper]:
    d = AckDropper(broker.addr)
    yield d
    d.close()


SECRET_A, SECRET_K = "secret-of-prod-A", "secret-of-prod-K"
PROD_A, PROD_K = producer_id("", SECRET_A), producer_id("", SECRET_K)


def _claimed(addr: str, secret: str) -> BlockingConnection:
    """A connection that claimed the anonymous identity of ``secret``."""
    conn = BlockingConnection(addr)
    r = conn.request(lambda o: encode_claim(producer_id("", secret), secret, 0, "-", o))
    assert r.code == 200, r.body
    return conn


def _consume_all(addr: str, tmp_path: Path, topic: str) -> list[bytes]:
    with connect([addr], config=FAST) as s:
        c = s.create_consumer(ConsumerConfig(group="check", data_dir=tmp_path / "check"))
        return [m.data for m in c.messages(topic, idle_timeout_s=0.8)]


def test_broker_drops_a_repeated_put_and_mput_also_after_a_restart(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    p1, f1 = build_payload(b"one", None, producer_id=PROD_A, sequence=0)
    batch = [
        build_payload(b"b%d" % i, None, producer_id=PROD_A, sequence=1 + i) for i in range(3)
    ]
    body = b"".join(encode(0, f, p) for p, f in batch)

    def put(conn: BlockingConnection) -> bytes:
        r = conn.request(lambda o: encode_put("single", 0, p1, f1, o, checksum(p1)))
        assert r.code == 200, r.body
        return r.body

    def mput(conn: BlockingConnection) -> bytes:
        r = conn.request(lambda o: encode_mput("single", 0, body, 3, o))
        assert r.code == 200, r.body
        return r.body

    conn = _claimed(broker.addr, SECRET_A)
    first_put = put(conn)
    assert put(conn) == first_put  # the retry: same ack, not stored again
    first_mput = mput(conn)
    assert mput(conn) == first_mput
    # one message of the stored batch again: its own ack (the 2nd record of the mput)
    p2, f2 = build_payload(b"b1", None, producer_id=PROD_A, sequence=2)
    r = conn.request(lambda o: encode_put("single", 0, p2, f2, o, checksum(p2)))
    first_id, _, first_off, _ = (int(x) for x in first_mput.split())
    assert r.code == 200 and r.body == b"%d 0 %d" % (first_id + 1, first_off + 20 + len(p2))
    # older than the last batch (a client keeps one batch in flight): refused, not stored
    r = conn.request(lambda o: encode_put("single", 0, p1, f1, o, checksum(p1)))
    assert r.code == 400 and b"overlaps" in r.body
    conn.close()
    for kill in (False, True):
        broker.restart(kill=kill)
        conn = _claimed(broker.addr, SECRET_A)
        assert mput(conn) == first_mput
        conn.close()
    p3, f3 = build_payload(b"next", None, producer_id=PROD_A, sequence=4)
    conn = _claimed(broker.addr, SECRET_A)
    r = conn.request(lambda o: encode_put("single", 0, p3, f3, o, checksum(p3)))
    assert r.code == 200
    conn.close()
    assert _consume_all(broker.addr, tmp_path, "single") == [b"one", b"b0", b"b1", b"b2", b"next"]


def test_state_written_just_before_a_kill_is_not_lost(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Puts after the last snapshot are found again by the scan at start."""
    conn = _claimed(broker.addr, SECRET_K)
    acks = []
    for seq in range(20):
        p, f = build_payload(b"%d" % seq, None, producer_id=PROD_K, sequence=seq)
        acks.append(conn.request(lambda o, p=p, f=f: encode_put("single", 0, p, f, o)).body)
    conn.close()
    broker.restart(kill=True)  # within a second of the puts: the snapshot may predate them
    conn = _claimed(broker.addr, SECRET_K)
    p, f = build_payload(b"19", None, producer_id=PROD_K, sequence=19)
    assert conn.request(lambda o: encode_put("single", 0, p, f, o)).body == acks[-1]
    conn.close()
    assert len(_consume_all(broker.addr, tmp_path, "single")) == 20


@pytest.mark.parametrize("idempotent", [False, True])
def test_lost_ack_retried_by_the_client(
    broker: BrokerProcess, dropper: AckDropper, tmp_path: Path, idempotent: bool
) -> None:
    cfg = ProducerConfig(idempotent=idempotent, retries=5, retry_backoff_s=0.05)
    with connect([dropper.addr], config=FAST, partitions={"single": 1}) as s:
        p = s.create_producer(cfg)
        assert (p.producer_id is not None) == idempotent
        assert p.send("single", b"warm-up").success
        for i in range(5):
            dropper.armed = 1  # the put is stored, its ack lost, the client retries
            assert p.send("single", b"m%d" % i, key="k").success
        futs = [p.send_future("single", b"batch%d" % i) for i in range(50)]
        dropper.armed = 1
        assert all(f.result(30).success for f in futs)
        dropper.armed = 1
        assert p.send_batch("single", [b"bulk%d" % i for i in range(20)]).success
    assert dropper.dropped >= 7
    got = _consume_all(broker.addr, tmp_path, "single")
    expected = (
        [b"warm-up"]
        + [b"m%d" % i for i in range(5)]
        + [b"batch%d" % i for i in range(50)]
        + [b"bulk%d" % i for i in range(20)]
    )
    if idempotent:
        assert got == expected
    else:  # what happens without: the retries are stored again
        assert len(got) > len(expected) and set(got) == set(expected)


def test_lost_ack_then_broker_killed_before_the_retry(
    broker: BrokerProcess, dropper: AckDropper, tmp_path: Path
) -> None:
    cfg = ProducerConfig(idempotent=True, retries=10, retry_backoff_s=1.0)
    with connect([dropper.addr], config=FAST, partitions={"single": 1}) as s:
        p = s.create_producer(cfg)
        assert p.send("single", b"before").success
        dropper.armed = 1
        fut = p.send_future("single", b"lost-ack")
        threading.Event().wait(0.3)  # the put is stored and its ack dropped
        broker.restart(kill=True)  # same port: the client's retries reach the new process
        assert fut.result(60).success
    assert _consume_all(broker.addr, tmp_path, "single") == [b"before", b"lost-ack"]


def test_named_identity_a_new_instance_fences_the_old_and_goes_on_with_its_sequences(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Two sessions, one named identity: the first's last batch sent again by the second
    under the identity with explicit sequences (put_sequenced, the relay's way) is answered
    with the stored ack; the second's own sends go on after the first's sequences; its
    claim fenced the first (ProducerFencedError, not retried)."""
    secret = "shard-secret-0123456789"

    def cfg(epoch: int) -> ProducerConfig:
        return ProducerConfig(
            idempotent=True, producer_name="shard-7", producer_secret=secret,
            producer_epoch=epoch, retries=1, retry_backoff_s=0.05,
        )

    async def run() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST,
                                              partitions={"single": 1}) as s1:
            first = s1.create_producer(cfg(1))
            acks = [await first.send("single", b"a%d" % i) for i in range(3)]
            assert all(a.success for a in acks)
            async with AsyncMessageSessionFactory([broker.addr], config=FAST,
                                                  partitions={"single": 1}) as s2:
                second = s2.create_producer(cfg(2))
                assert second.producer_id == first.producer_id
                seqs = await second.producer_sequences("single")
                assert list(seqs.values()) == [2]
                ident = second.identity
                assert ident is not None
                conn = await s2.pool.get(broker.addr)
                again = await put_sequenced(conn, ident, "single", 0, [(b"a2", 0)], 2, 5.0)
                assert (again.first_msg_id, again.first_offset) == (acks[2].msg_id, acks[2].offset)
                assert (await second.send("single", b"b3")).success
                with pytest.raises(ProducerFencedError):  # never retried, raised
                    await first.send("single", b"zombie")

    asyncio.run(run())
    assert _consume_all(broker.addr, tmp_path, "single") == [b"a0", b"a1", b"a2", b"b3"]
