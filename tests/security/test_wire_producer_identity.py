"""Idempotent producers' identities under attack (second security round, items 1 and 2).

Item 1: every record carries its producer id and sequence, readable by any consumer; a
client that copied them into its own put used to be answered 200 and then had the victim's
own put answered with the forged record's id and offset (the victim's message silently
gone). Item 2: producer ids of any length were kept (1 MiB ids: RSS +64 MiB, a 48 MiB
``producer-states.json`` rewritten while the broker was idle). Raw sockets against real
broker processes; the victim is the notify client.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from notify.client import ClientConfig, ProducerConfig, connect
from notify.client._message import build_payload
from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.protocol.identity import encode_claim, producer_id
from notify.protocol.properties import decode_attribute
from notify.protocol.records import encode, make_payload
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import MIB, WireClient, stats

FAST = ClientConfig(request_timeout_s=5.0)


def _stored(addr: str, topic: str) -> list[records.Record]:
    with WireClient(addr) as c:
        r = c.call(b"get %s g 0 0 16777216 1\r\n" % topic.encode())
        return [] if r.code == 404 else records.decode_all(r.body, 0)[0]


def _producer_of(rec: records.Record) -> tuple[str, int]:
    text, _ = records.split_payload(rec.payload, rec.flag)
    props = decode_attribute(text, rec.flag)
    assert props.producer_id is not None
    return props.producer_id, props.sequence


def _mput(c: WireClient, recs: list[tuple[bytes, int]], opaque: int) -> tuple[int, bytes]:
    body = b"".join(encode(0, f, p) for p, f in recs)
    r = c.call(encode_mput("single", 0, body, len(recs), opaque))
    return r.code, r.body


def test_a_forged_producer_id_is_refused_and_the_victims_message_stored(
    broker: BrokerProcess,
) -> None:
    """Item 1 as reported, plus what a forger would try next: an mput over several of the
    victim's sequences, claiming the victim's id without its secret, slipping the victim's
    id into the middle of its own batch (first and last record its own), and a
    transactional put naming it. Each is refused; the victim's next put is stored."""
    with connect([broker.addr], config=FAST, partitions={"single": 1}) as s:
        victim = s.create_producer(ProducerConfig(idempotent=True))
        assert victim.send("single", b"v0").success and victim.send("single", b"v1").success
        pid, seq = _producer_of(_stored(broker.addr, "single")[-1])
        assert pid == victim.producer_id and seq == 1
        with WireClient(broker.addr) as a:
            forged, flag = build_payload(b"FORGED", None, producer_id=pid, sequence=seq + 1)
            r = a.put("single", 0, forged, opaque=1, flag=flag)
            assert r.code == 403 and b"not claimed on this connection" in r.body, r
            many = [
                build_payload(b"F%d" % i, None, producer_id=pid, sequence=seq + 1 + i)
                for i in range(3)
            ]
            code, body = _mput(a, many, 2)
            assert code == 403, body
            r = a.call(encode_claim(pid, "a-guessed-secret-0000", 0, "-", 3))
            assert r.code == 403 and b"does not prove" in r.body, r
            own_secret = "the-attackers-own-secret"
            own = producer_id("", own_secret)
            assert a.call(encode_claim(own, own_secret, 0, "-", 4)).code == 200
            mixed = [
                build_payload(b"own0", None, producer_id=own, sequence=0),
                build_payload(b"FORGED", None, producer_id=pid, sequence=seq + 1),
                build_payload(b"own2", None, producer_id=own, sequence=2),
            ]
            code, body = _mput(a, mixed, 5)
            assert code == 400 and b"mixes" in body, body
            key = b"TX:attacker:1"
            assert a.call(b"transaction %s s BEGIN 6\r\n" % key).code == 200
            r = a.call(
                b"put single 0 %d %d %s 7\r\n%b" % (len(forged), flag, key, forged)
            )
            assert r.code == 400 and b"transaction" in r.body, r
        result = victim.send("single", b"victim-important")
        assert result.success
    stored = _stored(broker.addr, "single")
    assert [rec.body for rec in stored] == [b"v0", b"v1", b"victim-important"]
    assert stored[-1].offset == result.offset


def test_huge_producer_ids_keep_nothing_and_an_idle_broker_writes_nothing(
    broker: BrokerProcess,
) -> None:
    """Item 2 as reported (default settings): puts naming 1 MiB producer ids, each another
    one, keep nothing (the snapshot stays tiny); an idle broker does not rewrite it."""
    snapshot = broker.data_dir / "producer-states.json"
    with WireClient(broker.addr) as c:
        for i in range(16):
            huge = "~" + chr(ord("A") + i) * MIB
            attr = "\x1e" + json.dumps({"p": huge, "s": 0}, separators=(",", ":"))
            payload, flag = make_payload(b"x", attr)
            assert c.put("single", 0, payload, opaque=i, flag=flag | 2).code in (200, 403)
    time.sleep(1.5)  # a snapshot round
    before = snapshot.stat().st_mtime_ns, snapshot.read_bytes()
    assert len(before[1]) < 4096
    time.sleep(2.5)  # two and a half snapshot rounds with nothing happening
    assert (snapshot.stat().st_mtime_ns, snapshot.read_bytes()) == before


def test_producer_state_is_bounded_by_its_settings(broker_factory: BrokerFactory) -> None:
    """An id over maxProducerIdLength cannot be claimed; identities filling
    producerStateMaxBytes get a clear 503 while their connections hold them and are
    forgotten (least recently used first) once those closed."""
    b = broker_factory({"single": 1}, producerStateMaxBytes=64 * 1024, maxProducerIdLength=64)
    with WireClient(b.addr) as c:
        long_id = producer_id("n" * 60, "a-secret-for-a-long-name")
        r = c.call(encode_claim(long_id, "a-secret-for-a-long-name", 1, "abc", 99))
        assert r.code == 400 and b"maxProducerIdLength 64" in r.body, r
    conns: list[WireClient] = []
    full = None
    for i in range(400):  # each identity stores one batch: ~110 fit in 64 KiB
        secret = f"identity-secret-{i:08d}"
        pid = producer_id("", secret)
        if i % 100 == 0:
            conns.append(WireClient(b.addr))
        c = conns[-1]
        assert c.call(encode_claim(pid, secret, 0, "-", 1)).code == 200
        p, f = build_payload(b"m", None, producer_id=pid, sequence=0)
        r = c.put("single", 0, p, opaque=2, flag=f)
        if r.code != 200:
            full = (i, r)
            break
    assert full is not None and full[1].code == 503, full
    assert b"producerStateMaxBytes=65536" in full[1].body
    held = int(stats(b.addr)["producer_state_bytes"])
    assert 60 * 1024 < held <= 64 * 1024
    for c in conns:
        c.close()
    time.sleep(0.3)
    with WireClient(b.addr) as c:  # the closed connections' identities make room
        secret = "identity-secret-after"
        pid = producer_id("", secret)
        assert c.call(encode_claim(pid, secret, 0, "-", 1)).code == 200
        p, f = build_payload(b"after", None, producer_id=pid, sequence=0)
        assert c.put("single", 0, p, opaque=2, flag=f).code == 200
    assert int(stats(b.addr)["idempotent_evicted"]) >= 1
    assert (b.data_dir / "producer-states.json").stat().st_size < 64 * 1024 + 16 * 1024


def test_a_new_instance_of_a_named_identity_fences_the_old_and_continues_its_sequences(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """A named identity (the outbox relay's fail-over): the second instance's claim fences
    the first (its later puts: 409, not retried), answers the last sequence stored, and a
    batch the first instance stored, re-sent by the second with the same sequences, is
    answered with the stored acks, not stored again; the first instance cannot take the
    identity back (older epoch), an attacker cannot claim it without the secret, and the
    same instance re-claims on a new connection without fencing itself."""
    secret = "relay-shard-3-secret-xyz"
    cfg = ProducerConfig(
        idempotent=True, producer_name="shard-3", producer_secret=secret, producer_epoch=10
    )
    with connect([broker.addr], config=FAST, partitions={"single": 1}) as s:
        first = s.create_producer(cfg)
        acks = [first.send("single", b"a%d" % i) for i in range(3)]
        assert all(a.success for a in acks)
        pid = first.producer_id
        assert pid is not None and pid.startswith("shard-3~")
    with WireClient(broker.addr) as old, WireClient(broker.addr) as new:
        assert old.call(encode_claim(pid, secret, 12, "aaaa", 1)).code == 200
        r = new.call(encode_claim(pid, secret, 13, "bbbb", 2))
        assert r.code == 200 and r.body.split(b"\n")[1:] == [b"single 0 2"], r
        p, f = build_payload(b"zombie", None, producer_id=pid, sequence=3)
        r = old.put("single", 0, p, opaque=3, flag=f)
        assert r.code == 409 and b"fenced" in r.body, r
        assert old.call(encode_claim(pid, secret, 12, "aaaa", 4)).code == 409
        with WireClient(broker.addr) as attacker:
            r = attacker.call(encode_claim(pid, "not-the-relay-secret", 99, "cccc", 5))
            assert r.code == 403
        again = build_payload(b"a2", None, producer_id=pid, sequence=2)
        r = new.put("single", 0, again[0], opaque=6, flag=again[1])
        assert r.code == 200 and r.body == b"%d 0 %d" % (acks[2].msg_id, acks[2].offset)
    with WireClient(broker.addr) as same:  # the holder on a new connection: not fenced
        assert same.call(encode_claim(pid, secret, 13, "bbbb", 1)).code == 200
        p, f = build_payload(b"b3", None, producer_id=pid, sequence=3)
        assert same.put("single", 0, p, opaque=2, flag=f).code == 200
    assert [r.body for r in _stored(broker.addr, "single")] == [b"a0", b"a1", b"a2", b"b3"]
