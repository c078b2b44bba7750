"""The outbox's pure parts: rows from ``send``'s arguments (every bad input refused with a
clear error), the formats, the relay's planning, the publisher's stamping."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from notify.broker.idempotence import batch_producer
from notify.client import key_hash as client_key_hash
from notify.client._publisher import stamped_body
from notify.outbox import OutboxArgumentError, key_hash
from notify.outbox.plan import Backoff, Limits, RelayRow, plan_cycle
from notify.outbox.rows import (
    PendingBatch,
    SubBatch,
    build_marker,
    build_row,
    decode_pending,
    decode_seqs,
    encode_pending,
    encode_seqs,
    seqs_after,
    shard_of,
    signed32,
    unsigned32,
)
from notify.outbox.writer import OutboxConfig, pg_statements
from notify.protocol import records
from notify.protocol.identity import producer_id
from notify.protocol.properties import (
    Properties,
    decode_attribute,
    encode_attribute,
    flag_for,
    producer_member,
    producer_sequence,
    with_producer,
)


def test_a_row_is_what_producer_send_would_put() -> None:
    r = build_row("orders", b"o-1", 4, 0, key="user-7", headers={"n": 1, "b": b"\x00"})
    text, body = records.split_payload(r.payload, r.flag)
    assert body == b"o-1"
    props = decode_attribute(text, r.flag)
    assert props.key == "user-7" and props.headers == {"n": 1, "b": b"\x00"}
    assert props.producer_id is None
    assert unsigned32(r.khash or 0) == client_key_hash("user-7") == key_hash("user-7")
    assert r.shard == client_key_hash("user-7") % 4 and r.due_ms is None
    plain = build_row("orders", bytearray(b"x"), 4, 7)
    assert (plain.payload, plain.flag, plain.khash, plain.shard) == (b"x", 0, None, 3)
    tagged = build_row("orders", b"x", 4, 0, attribute="tag")
    assert records.split_payload(tagged.payload, tagged.flag) == ("tag", b"x")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"topic": "bad topic"}, "invalid topic"),
        ({"topic": ""}, "invalid topic"),
        ({"topic": "x" * 250}, "invalid topic"),
        ({"topic": ".."}, "invalid topic"),
        ({"topic": "__delay"}, "reserved"),
        ({"topic": 7}, "topic must be a str"),
        ({"data": "text"}, "data must be bytes"),
        ({"data": None}, "data must be bytes"),
        ({"key": 42}, "key must be str or bytes"),
        ({"attribute": "a\x1eb"}, "U\\+001E"),
        ({"attribute": b"tag"}, "attribute must be a str"),
        ({"headers": [("a", 1)]}, "headers must be a mapping"),
        ({"headers": {"a": [1]}}, "header values"),
        ({"headers": {"": 1}}, "header names"),
        ({"headers": {1: 1}}, "header names"),
        ({"delay": -1}, "delay must be finite and >= 0"),
        ({"delay": math.nan}, "delay must be finite"),
        ({"delay": math.inf}, "delay must be finite"),
        ({"delay": "5"}, "delay must be a number"),
        ({"delay": True}, "delay must be a number"),
        ({"delay": 10**9}, "max_delay_s"),
        ({"delay": 1, "deliver_at": 2.0}, "not both"),
        ({"deliver_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"deliver_at": "tomorrow"}, "deliver_at must be"),
        ({"deliver_at": math.inf}, "deliver_at must be finite"),
        ({"data": b"x" * 2_100_000}, "max_message_bytes"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_error(kwargs: dict, match: str) -> None:
    args = {"topic": "orders", "data": b"x", **kwargs}
    with pytest.raises(OutboxArgumentError, match=match):
        build_row(args.pop("topic"), args.pop("data"), 4, 0, **args)


def test_delays_and_limits() -> None:
    r = build_row("t", b"x", 4, 0, delay=30, now_s=1000.0)
    assert r.due_ms == 1_030_000
    at = datetime.now(UTC) + timedelta(days=1)
    assert build_row("t", b"x", 4, 0, deliver_at=at).due_ms == int(at.timestamp() * 1000)
    assert build_row("t", b"x", 4, 0, deliver_at=1.5e9).due_ms == 1_500_000_000_000  # past
    with pytest.raises(OutboxArgumentError, match="max_message_bytes 10"):
        build_row("t", b"x" * 11, 4, 0, max_message_bytes=10)
    soon = datetime.now(UTC) + timedelta(seconds=50)
    with pytest.raises(OutboxArgumentError, match="max_delay_s 10"):
        build_row("t", b"x", 4, 0, deliver_at=soon, max_delay_s=10)


def test_shards_and_hashes() -> None:
    for h in (0, 1, 2**31 - 1, 2**31, 2**32 - 1):
        assert unsigned32(signed32(h)) == h and -(2**31) <= signed32(h) < 2**31
    assert shard_of(None, 4, 9) == 1
    assert shard_of(signed32(2**32 - 1), 4, 0) == (2**32 - 1) % 4
    assert key_hash(b"\xff") == client_key_hash(b"\xff")
    with pytest.raises(OutboxArgumentError):
        build_marker("group with space", "TX:a:1")
    with pytest.raises(OutboxArgumentError):
        build_marker("g", "TX:a:1'; DROP TABLE x; --")
    assert build_marker("shop", "TX:a1b2:7").tx_key == "TX:a1b2:7"


def test_pending_and_sequence_codecs() -> None:
    batch = PendingBatch(
        (SubBatch("orders", "0-1", 17, (5, 9, 2**40)), SubBatch("t.é", "3-0", 0, (6,)))
    )
    raw = encode_pending(batch)
    assert decode_pending(raw) == batch and decode_pending(None) is None
    assert batch.row_ids == [5, 9, 2**40, 6] and batch.count == 4
    for bad in (raw[:-1], raw + b"\x00", b"\x02" + raw[1:], raw[:3]):
        with pytest.raises(ValueError):
            decode_pending(bad)
    seqs = {("orders", "0-1"): 20, ("a", "1-0"): 3}
    assert decode_seqs(encode_seqs(seqs)) == seqs and decode_seqs("") == {}
    for bad in ("[1]", '{"a": {"0-0": -1}}', '{"a": 1}', "{"):
        with pytest.raises(ValueError):
            decode_seqs(bad)
    assert seqs_after(seqs, batch.subs)[("orders", "0-1")] == 20
    assert seqs_after({}, batch.subs) == {("orders", "0-1"): 20, ("t.é", "3-0"): 1}


def _rows(spec: list[tuple[str, int | None]], size: int = 10) -> list[RelayRow]:
    return [
        (i + 1, topic, None if k is None else signed32(k), 0, b"x" * size)
        for i, (topic, k) in enumerate(spec)
    ]


def test_a_cycle_is_a_prefix_cut_per_partition() -> None:
    parts = {"a": ["0-0", "0-1", "0-2", "0-3"], "b": ["0-0"]}
    rows = _rows([("a", 1), ("a", 5), ("b", 2), ("a", 2), ("a", None), ("a", None)])
    plan = plan_cycle(rows, parts, {("a", "0-1"): 7}, Limits(), round_robin=2)
    subs = {(p.sub.topic, p.sub.partition): p.sub for p in plan.batches}
    assert subs[("a", "0-1")].row_ids == (1, 2) and subs[("a", "0-1")].first_seq == 7
    assert subs[("b", "0-0")].row_ids == (3,) and subs[("b", "0-0")].first_seq == 0
    assert subs[("a", "0-2")].row_ids == (4, 5, 6)  # keyless: together, round robin 2
    assert plan.count == 6 and plan.left == 0 and not plan.unroutable
    # limits: the first row that does not fit ends the batch (nothing after it)
    plan = plan_cycle(rows, parts, {}, Limits(max_rows=3), 0)
    assert sorted(i for p in plan.batches for i in p.sub.row_ids) == [1, 2, 3]
    assert plan.left == 3
    one = Limits(mput_max_count=1)
    plan = plan_cycle(rows, parts, {}, one, 0)
    assert [p.sub.row_ids for p in plan.batches] == [(1,)] and plan.left == 5
    big = _rows([("a", 1), ("a", 1), ("a", 1)], size=600)
    plan = plan_cycle(big, parts, {}, Limits(mput_max_bytes=1300), 0)
    assert plan.count == 2  # a third 620-byte record would pass 1300 bytes
    # a topic the broker does not know is set aside, it does not cut the others
    mixed = _rows([("x", 1), ("a", 1), ("x", 2)])
    plan = plan_cycle(mixed, {"a": ["0-0"], "x": None}, {}, Limits(), 0)
    assert plan.unroutable == {"x": [1, 3]} and plan.count == 1
    with pytest.raises(ValueError):
        Limits(mput_max_count=5000)


def test_backoff_doubles_and_resets() -> None:
    b = Backoff(0.001, 0.004)
    assert [b.empty() for _ in range(4)] == [0.001, 0.002, 0.004, 0.004]
    b.found()
    assert b.empty() == 0.001


def test_stamping_keeps_the_record_and_the_broker_sees_one_batch() -> None:
    cases = [(None, None, {}), ("tag", None, {}), (None, "k", {}), ("t", b"k", {"a": 1})]
    recs = []
    for attr, key, hdr in cases:
        r = build_row("t", b"DATA", 4, 0, attribute=attr, key=key, headers=hdr)
        recs.append((r.flag, r.payload))
    pid = producer_id("outbox-abc-1", "s" * 32)
    body = stamped_body(recs, pid, 40)
    got = records.decode_all(body, 0)[0]
    assert batch_producer(body) == (pid, 40, 43)  # what the broker reads of the mput
    for i, (rec, (attr, key, hdr)) in enumerate(zip(got, cases, strict=True)):
        text, data = records.split_payload(rec.payload, rec.flag)
        assert data == b"DATA"
        props = decode_attribute(text, rec.flag)
        assert props == Properties(attr, key, hdr, pid, 40 + i)
        assert text is not None and producer_sequence(text) == (pid, 40 + i)
        # byte for byte what the encoder writes with the producer set
        assert text == encode_attribute(Properties(attr, key, hdr, pid, 40 + i))
    p = Properties("t", "k", {"h": "v"})
    payload, _ = records.make_payload(b"d", encode_attribute(p))
    with pytest.raises(ValueError):
        with_producer(flag_for(p), payload[:4] + b"t\x1e[" + payload[7:], producer_member("x"), 1)
    for bad in ("x" * 1025, "a b", ""):
        with pytest.raises(ValueError):
            producer_member(bad)
    with pytest.raises(ValueError):
        with_producer(0, b"d", producer_member(pid), -1)


def test_postgres_statements_lock_keys_in_order_then_insert_in_send_order() -> None:
    cfg = OutboxConfig()
    rows = [build_row("t", b"a", 4, 0, key=k) for k in ("k2", "k1", "k2")]
    rows.append(build_row("t", b"z", 4, 1))
    stmts = pg_statements([(cfg, r) for r in rows]).decode().split(";")
    locks = [s for s in stmts if "pg_advisory_xact_lock" in s]
    assert len(locks) == 2 and locks == sorted(locks, key=lambda s: int(s.split(",")[1][:-1]))
    puts = [s for s in stmts if "notify_outbox_put" in s]
    assert len(puts) == 4 and stmts.index(puts[0]) > stmts.index(locks[-1])
    assert all(p.split(",")[-2] == "NULL" for p in puts)  # locked already, in order
    wakes = [p.split(",")[-1] for p in puts]  # the last row of each shard wakes its relay
    shards = [r.shard for r in rows]
    assert [w != "NULL)" for w in wakes] == [
        i == max(j for j, s in enumerate(shards) if s == shards[i]) for i in range(4)
    ]
    one = pg_statements([(cfg, rows[0])]).decode()
    assert "pg_advisory_xact_lock" not in one and f",{cfg.pg_lock_base}," in one
    delayed = build_row("t", b"a", 4, 0, delay=5)
    assert "notify_outbox_delayed" in pg_statements([(cfg, delayed)]).decode()
