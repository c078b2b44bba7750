"""The broker's idempotent-producer state as data: claims, fencing, the byte budget and its
estimate, the snapshot; and the one reader of a record's producer members (compiled and
interpreted alike)."""

from __future__ import annotations

import importlib
import json
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from notify.broker import idempotence
from notify.broker.idempotence import (
    ANONYMOUS,
    ENTRY_BYTES,
    SNAPSHOT_FILE,
    Holder,
    LastBatch,
    ProducerStates,
    batch_producer,
)
from notify.client._message import build_payload
from notify.protocol import accel, hotpath, records
from notify.protocol.identity import Claim, ClaimReply, producer_id
from notify.protocol.properties import producer_sequence, record_producer
from notify.store.partition import Partition


@dataclass
class _Part:
    topic: str
    index: int
    end: int = 1 << 40
    min_offset: int = 0


def Part(topic: str, index: int, end: int = 1 << 40) -> Partition:
    """A partition as the state sees one (topic, index, end)."""
    return cast(Partition, _Part(topic, index, end))


def _claim(pid: str, secret: str, epoch: int = 0, instance: str = "-") -> Claim:
    return Claim(pid, secret, epoch, instance, 1)


def test_claims_bind_fence_and_refuse() -> None:
    st = ProducerStates(100)
    secret = "s" * 20
    anon = producer_id("", secret)
    held: dict[str, Holder] = {}
    assert st.claim(held, _claim(anon, secret))[0] == 200 and held[anon] is ANONYMOUS
    assert st.claim(held, _claim(anon, "t" * 20))[0] == 403  # not the secret of that id
    assert st.refusal({}, anon) is not None and st.refusal(held, anon) is None
    name = producer_id("relay", secret)
    old: dict[str, Holder] = {}
    new: dict[str, Holder] = {}
    assert st.claim(old, _claim(name, secret, 5, "a"))[0] == 200
    assert st.claim(old, _claim(name, secret, 5, "a"))[0] == 200  # the same instance again
    assert st.refusal(old, name) is None
    code, body = st.claim(new, _claim(name, secret, 6, "b"))
    assert code == 200 and ClaimReply.parse(body).epoch == 6
    refused = st.refusal(old, name)
    assert refused is not None and refused[0] == 409 and "fenced" in refused[1]
    assert st.claim(old, _claim(name, secret, 5, "a"))[0] == 409  # an older epoch
    assert st.claim({}, _claim(name, secret, 6, "c"))[0] == 409  # same epoch, another one
    st.release(old)
    st.release(new)
    assert st.named[name] == Holder(6, "b")


def test_per_connection_cap_and_id_length() -> None:
    st = ProducerStates(100, max_id_length=30, max_per_connection=2)
    held: dict[str, Holder] = {}
    for i in range(2):
        s = f"secret-number-{i:06d}"
        assert st.claim(held, _claim(producer_id("", s), s))[0] == 200
    s = "secret-number-000009"
    code, body = st.claim(held, _claim(producer_id("", s), s))
    assert code == 503 and b"maxProducerIdsPerConnection=2" in body
    s = "secret-of-a-long-name"
    code, body = st.claim({}, _claim(producer_id("a-long-name", s), s, 1, "x"))
    assert code == 400 and b"maxProducerIdLength 30" in body


def test_budget_forgets_what_no_connection_holds_least_recently_used_first() -> None:
    part = Part("t", 0)
    st = ProducerStates(1000, max_bytes=10 * (ENTRY_BYTES + 23))
    held: dict[str, Holder] = {}
    pids = []
    for i in range(10):
        s = f"secret-number-{i:06d}"
        pid = producer_id("", s)
        pids.append(pid)
        assert st.claim(held, _claim(pid, s))[0] == 200
        assert st.room_for(part, pid) is None
        st.record(part, pid, LastBatch(0, 0, i, i * 30, i * 30 + 30))
    s = "secret-number-000010"
    extra = producer_id("", s)
    assert st.claim(held, _claim(extra, s))[0] == 200
    full = st.room_for(part, extra)
    assert full is not None and b"producerStateMaxBytes" in full  # all ten are held
    assert st.room_for(part, pids[3]) is None  # has its entry
    st.release(held)
    st.record(part, pids[0], LastBatch(1, 1, 99, 300, 330))  # used
    assert st.room_for(part, extra) is None
    st.record(part, extra, LastBatch(0, 0, 100, 330, 360))
    assert st.last(part, pids[1]) is None  # the least recently used
    assert st.last(part, pids[0]) is not None
    assert st.evicted == 1 and st.bytes <= st.max_bytes


def test_the_budget_estimate_is_not_below_what_the_entries_take() -> None:
    """ENTRY_BYTES + the id per entry, against tracemalloc's count of what 5,000 last
    batches (and their ids) allocate: the estimate may be a little high, never low."""
    st = ProducerStates(10**7, 1 << 40)
    parts = [Part("t", i) for i in range(8)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(5000):
            pid = producer_id(f"n{i}" if i % 2 else "", f"secret-{i:016d}")
            batch = LastBatch(i, i + 99, 2**50 + i, 2**33 + i * 2000, 2**33 + i * 2000 + 9)
            st.record(parts[i % 8], pid, batch)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert used <= st.bytes < 1.3 * used


def test_snapshot_keeps_named_holders_and_drops_ids_no_one_can_claim(tmp_path: Path) -> None:
    part = Part("t", 0, end=1000)
    st = ProducerStates(100, max_id_length=64)
    secret = "s" * 20
    name = producer_id("relay", secret)
    assert st.claim({}, _claim(name, secret, 7, "abc"))[0] == 200
    st.record(part, name, LastBatch(0, 4, 1, 0, 100))
    doc = json.loads(st.snapshot([part]))
    doc["partitions"]["t-0"]["producers"]["prod-A"] = [0, 0, 9, 100, 130]  # an old random id
    doc["partitions"]["t-0"]["producers"]["~" + "A" * 5000] = [0, 0, 9, 130, 160]
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps(doc))
    again = ProducerStates(100, max_id_length=64)
    again.load(tmp_path, [part])
    assert again.named == {name: Holder(7, "abc")}
    assert again.sequences(name) == {("t", 0): 4}
    assert again.last(part, "prod-A") is None
    mark_and_snap = again.snapshot_if_changed([part])
    assert mark_and_snap is not None
    again.saved(mark_and_snap[0])
    assert again.snapshot_if_changed([part]) is None  # unchanged
    cast(_Part, part).end = 1100
    assert again.snapshot_if_changed([part]) is not None


def _rec(body: bytes, pid: str | None, seq: int = 0, key: str | None = None) -> bytes:
    payload, flag = build_payload(body, "tag" if key else None, key, {"h": 1}, pid, seq)
    return records.encode(0, flag, payload)


def _batch_readers() -> list[object]:
    out: list[object] = [hotpath.producer_batch]
    try:
        native = importlib.import_module(accel.NATIVE_NAME)
    except ImportError:  # not built
        return out
    if accel.choose(native, accel.source_digest()) is not None:
        out.append(native.producer_batch)
    return out


@pytest.mark.parametrize("reader", _batch_readers())
def test_batch_producer_reads_every_record(
    reader: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An mput names one producer with consecutive sequences in every record, or none;
    a record in the middle naming another id (its ends the batch's own) is caught."""
    monkeypatch.setattr(idempotence, "_producer_batch", reader)
    a, b = "~" + "a" * 22, "~" + "b" * 22
    assert batch_producer(_rec(b"x", None) + _rec(b"y", None, key="k")) is None
    assert batch_producer(b"".join(_rec(b"m", a, 5 + i) for i in range(4))) == (a, 5, 8)
    mixed = [_rec(b"m", a, 0), _rec(b"m", b, 1), _rec(b"m", a, 2)]
    assert isinstance(batch_producer(b"".join(mixed)), str)
    gap = [_rec(b"m", a, 0), _rec(b"m", a, 2)]
    assert isinstance(batch_producer(b"".join(gap)), str)
    partly = [_rec(b"m", a, 0), _rec(b"m", None)]
    assert isinstance(batch_producer(b"".join(partly)), str)
    late = [_rec(b"m", None), _rec(b"m", a, 1)]
    assert isinstance(batch_producer(b"".join(late)), str)
    keyed = [_rec(b"m", a, 3, key="k"), _rec(b"m", a, 4), _rec(b"m", a, 5, key="k2")]
    assert batch_producer(b"".join(keyed)) == (a, 3, 5)
    longer = [_rec(b"m", a, 0), _rec(b"m", "x" + a, 1)]
    assert isinstance(batch_producer(b"".join(longer)), str)
    elsewhere, _ = records.make_payload(b"m", '\x1e{"p":"' + a + '","s":1,"k":"x"}')
    bad = records.encode(0, 3, elsewhere)  # "p" not at the end: no producer, so mixed
    assert isinstance(batch_producer(_rec(b"m", a, 0) + bad), str)


def test_producer_members_are_read_from_the_suffix_only() -> None:
    """A "p" member anywhere but at the end of the object names no producer, for every
    reader (the broker's checks and scans, the client's decoding)."""
    assert producer_sequence('\x1e{"p":"~x","s":5,"k":"v"}') is None
    assert producer_sequence('\x1e{"h":{"p":"~x","s":5}}') is None
    assert producer_sequence('\x1e{"h":{},"p":"~x","s":05}') is None
    assert producer_sequence('t,"p":"~x","s":5}\x1e{"k":1}') is None
    assert producer_sequence('tag\x1e{"k":"v","p":"~x","s":5}') == ("~x", 5)
    payload, flag = build_payload(b"body", "t", "k", {"a": b"\x00"}, "n~tag", 7)
    assert record_producer(flag, payload) == ("n~tag", 7)
    assert record_producer(flag & ~2, payload) is None
