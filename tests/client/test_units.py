"""Unit tests of the client's pure pieces (no network)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

import notify.client as client
from notify.client import (
    DuplicateWindow,
    FetchSizer,
    FileOffsetStore,
    KeyHashSelector,
    MemoryOffsetStore,
    Message,
    OffsetStore,
    Partition,
    RecoverStore,
    RoundRobinSelector,
    SendResult,
    TopicPartitionOffset,
    list_dead_letters,
    list_pending_recovery,
    parse_stats_topics,
    replay_dead_letters,
)
from notify.client._batch import BatchItem, Item, mput_body
from notify.client._spool import Spool, existing_spools
from notify.client._subscription import make_filter as _make_filter
from notify.client._subscription import share as _share
from notify.client.core import wire
from notify.client.transport import split_address
from notify.errors import BrokerError, ClientError
from notify.protocol import records
from notify.protocol.frames import Response

PARTS = [Partition(0, p, "h:1") for p in range(4)] + [Partition(1, p, "h:2") for p in range(4)]


def test_public_surface() -> None:
    assert sorted(client.__all__) == client.__all__
    for name in client.__all__:
        assert getattr(client, name) is not None
    assert {
        "connect",
        "MessageSessionFactory",
        "AsyncMessageSessionFactory",
        "SendResult",
        "OffsetStore",
        "BrokerDirectory",
        "list_dead_letters",
        "replay_dead_letters",
    } <= set(client.__all__)
    assert all(not n.startswith("_") for n in client.__all__)


def test_partition_id_roundtrip() -> None:
    p = Partition(3, 7, "a:1")
    assert str(p) == "3-7"
    assert Partition.parse("3-7", "a:1") == p
    assert sorted([Partition(1, 0, "x:1"), Partition(0, 1, "y:1")])[0].broker_id == 0
    with pytest.raises(ValueError):
        Partition.parse("37", "")


def test_split_address() -> None:
    assert split_address("127.0.0.1:8123") == ("127.0.0.1", 8123)
    assert split_address("meta://h:1") == ("h", 1)
    with pytest.raises(ClientError):
        split_address("nohost")


def test_round_robin_covers_all_partitions() -> None:
    sel = RoundRobinSelector()
    got = [sel("t", PARTS, None, b"") for _ in range(16)]
    assert got[:8] == PARTS and got[8:] == PARTS


def test_key_hash_is_stable_and_per_key() -> None:
    sel = KeyHashSelector()
    keys: list[bytes | str] = ["order-1", "order-2", b"\x00bin", "ключ"]
    for key in keys:
        raw = key.encode() if isinstance(key, str) else key
        want = PARTS[zlib.crc32(raw) % len(PARTS)]
        assert {sel("t", PARTS, key, b"") for _ in range(5)} == {want}
    spread = {sel("t", PARTS, f"k{i}", b"") for i in range(200)}
    assert len(spread) == len(PARTS)
    # without a key: round robin
    assert len({sel("t", PARTS, None, b"") for _ in range(8)}) == 8


def test_selectors_reject_empty_topic() -> None:
    with pytest.raises(ClientError):
        RoundRobinSelector()("t", [], None, b"")


def test_parse_stats_topics_is_lenient() -> None:
    body = (
        b"STATS\r\ntest partitions=4 bytes=10 put_messages=0\r\norders partitions=2\r\n"
        b"legacy 3\r\nweird something\r\n\r\nEND\r\n"
    )
    assert parse_stats_topics(body) == {"test": 4, "orders": 2, "legacy": 3}
    assert parse_stats_topics(b"STATS\r\nEND\r\n") == {}


def test_share_is_contiguous_and_complete() -> None:
    for count in range(1, 10):
        shares = [_share(PARTS, i, count) for i in range(count)]
        assert [p for s in shares for p in s] == PARTS
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)


# ---------------------------------------------------------------- offset stores


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> OffsetStore:
    if request.param == "file":
        return FileOffsetStore(tmp_path)
    return MemoryOffsetStore()


def test_offset_store_roundtrip(store: OffsetStore) -> None:
    assert isinstance(store, OffsetStore)
    assert store.load("g", "t", "0-1") is None
    first = [TopicPartitionOffset("t", "0-1", 120, 77), TopicPartitionOffset("t", "0-2", 5)]
    store.commit("g", first)
    store.commit("g", [TopicPartitionOffset("t", "0-1", 240, 78)])
    assert store.load("g", "t", "0-1") == TopicPartitionOffset("t", "0-1", 240, 78)
    assert store.load("g", "t", "0-2") == TopicPartitionOffset("t", "0-2", 5, -1)
    assert store.load("other", "t", "0-1") is None
    store.close()


def test_file_offset_store_persists_across_instances(tmp_path: Path) -> None:
    s1 = FileOffsetStore(tmp_path)
    s1.commit("g", [TopicPartitionOffset("t", "0-0", 42, 9)])
    s1.close()
    s2 = FileOffsetStore(tmp_path)
    assert s2.load("g", "t", "0-0") == TopicPartitionOffset("t", "0-0", 42, 9)
    assert not list(tmp_path.glob("*.tmp"))


def test_file_offset_store_failed_fsync_keeps_old_file(tmp_path: Path) -> None:
    s = FileOffsetStore(tmp_path)
    s.commit("g", [TopicPartitionOffset("t", "0-0", 1)])

    def boom(fd: int) -> None:
        raise OSError(5, "EIO")

    s._fsync = boom  # type: ignore[method-assign]
    with pytest.raises(ClientError):
        s.commit("g", [TopicPartitionOffset("t", "0-0", 2)])
    # the committed file is untouched; a fresh reader sees the old offset
    fresh = FileOffsetStore(tmp_path)
    assert fresh.load("g", "t", "0-0") == TopicPartitionOffset("t", "0-0", 1)


def test_file_offset_store_ignores_stray_tmp_and_rejects_garbage(tmp_path: Path) -> None:
    s = FileOffsetStore(tmp_path)
    s.commit("g", [TopicPartitionOffset("t", "0-0", 1)])
    (tmp_path / "g.offsets.json.tmp").write_bytes(b"{half")
    assert FileOffsetStore(tmp_path).load("g", "t", "0-0") is not None
    (tmp_path / "h.offsets.json").write_bytes(b"not json")
    with pytest.raises(ClientError):
        FileOffsetStore(tmp_path).load("h", "t", "0-0")
    with pytest.raises(ClientError):
        s.path("../evil")


# ---------------------------------------------------------------- recover store


def _msg(offset: int, data: bytes = b"x", attr: str | None = None) -> Message:
    payload, flag = records.make_payload(data, attr)
    return Message("t", Partition(0, 1, "h:1"), offset, 1000 + offset, flag, payload)


def test_recover_store_persists_and_dead_letters(tmp_path: Path) -> None:
    rs = RecoverStore(tmp_path, "g")
    rs.add(_msg(0, b"a", "tag"), "ValueError('x')")
    rs.add(_msg(25, b"b"), "boom")
    again = RecoverStore(tmp_path, "g")  # a restarted consumer
    pend = again.pending()
    assert [(m.offset, m.data, m.attribute) for m in pend] == [(0, b"a", "tag"), (25, b"b", None)]
    assert pend[0].to_message("h:1") == _msg(0, b"a", "tag")
    assert list_pending_recovery(tmp_path) == pend
    assert not again.failed(pend[0], "again", max_attempts=2)
    assert again.pending()[0].attempts == 1
    assert again.failed(again.pending()[0], "still", max_attempts=2)
    dead = list_dead_letters(tmp_path)
    assert [(d.offset, d.attempts, d.last_error, d.group) for d in dead] == [(0, 2, "still", "g")]
    assert list_dead_letters(tmp_path, "nope") == []
    assert [m.offset for m in again.pending()] == [25]
    again.remove(again.pending()[0])
    assert again.pending() == []
    # replay puts the dead letter back in the queue with a fresh attempt count
    assert replay_dead_letters(tmp_path, "g") == 1
    assert list_dead_letters(tmp_path) == []
    back = RecoverStore(tmp_path, "g").pending()
    assert [(m.offset, m.attempts, m.data) for m in back] == [(0, 0, b"a")]
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_recover_store_purge_and_replay_by_id(tmp_path: Path) -> None:
    rs = RecoverStore(tmp_path, "g")
    for off in (0, 10, 20):
        sm = rs.add(_msg(off), "e")
        rs.failed(sm, "e", max_attempts=1)
    ids = [d.id for d in rs.dead()]
    assert replay_dead_letters(tmp_path, "g", ids=[ids[1]]) == 1
    assert rs.purge_dead([ids[0]]) == 1
    assert [d.offset for d in rs.dead()] == [20]
    assert [p.offset for p in rs.pending()] == [10]
    with pytest.raises(ClientError):
        RecoverStore(tmp_path, "a/b")


# ---------------------------------------------------------------- small pieces


def test_duplicate_window_remembers_the_last_capacity_keys_and_stays_bounded() -> None:
    w = DuplicateWindow(3)
    for k in (1, 2, 3):
        w.add(k)
    assert w.seen(1)  # refreshes 1
    for k in (4, 5):
        w.add(k)
    # the last three distinct keys touched (1 refreshed, 4, 5) are always remembered
    assert 1 in w and 4 in w and 5 in w
    w.add(6)
    assert 2 not in w and 3 not in w  # older than two generations
    assert w.seen(5) and not w.seen(2)
    big = DuplicateWindow(100)
    for start in range(0, 10_000, 7):
        keys = list(range(start, start + 7))
        assert big.none_seen(keys)
        big.add_new(keys)
        assert all(k in big for k in range(max(0, start + 7 - 100), start + 7))
        assert len(big) <= 2 * 100 + 7
    assert not big.none_seen([20_000, 20_000])  # not distinct
    assert not big.none_seen([9_990, 20_001])  # one remembered
    assert big.forget(lambda k: k % 2 == 0) > 0 and 9_990 not in big and 9_991 in big
    off = DuplicateWindow(0)
    off.add(1)
    assert not off.seen(1)
    with pytest.raises(ValueError):
        DuplicateWindow(-1)


def test_fetch_sizer_grows_to_the_record_and_shrinks_back() -> None:
    s = FetchSizer(1024, 64 << 20)
    big = records.encode(1, 0, b"z" * 100_000)
    assert s.no_whole_record(big[:1024]) == len(big)  # header says how much is needed
    assert s.grown
    s.got_records()
    assert s.current == 1024
    assert s.no_whole_record(b"\x00\x00") == 2048  # header unreadable: double
    small = FetchSizer(1024, 4096)
    assert small.no_whole_record(big[:1024]) == 4096 and small.exhausted
    with pytest.raises(ValueError):
        FetchSizer(10, 100)


def test_make_filter() -> None:
    f = _make_filter({"a", "b"})
    assert f is not None
    assert f(_msg(0, attr="a")) and not f(_msg(0, attr="c")) and not f(_msg(0))
    g = _make_filter(lambda m: m.offset > 5)
    assert g is not None and g(_msg(6)) and not g(_msg(1))
    assert _make_filter(None) is None


def test_mput_reply_offsets_follow_record_sizes() -> None:
    part = PARTS[2]
    items: list[Item | BatchItem] = [
        Item(b"a" * 10, 0, None),  # type: ignore[arg-type]
        BatchItem([b"", b"b" * 30, b"c"], 1, None),  # type: ignore[arg-type]
        Item(b"d" * 5, 0, None),  # type: ignore[arg-type]
    ]
    r = Response("result", 200, 1, b"500 2 1000 5")
    ack = wire.mput_ack(r, 5)
    assert not isinstance(ack, ClientError)
    mid, off, got = ack.first_msg_id, ack.first_offset, []
    for it in items:
        got.append(it.acked(part, mid, off))
        mid += it.count
        off += it.nbytes
    assert got[0] == SendResult(True, part, 1000, 500)
    assert list(got[1].msg_ids) == [501, 502, 503]
    assert list(got[1].offsets) == [1030, 1050, 1100]
    assert got[2] == SendResult(True, part, 1121, 504)
    # the records go out in one body, flags per run, ids 0 (the broker assigns them)
    body = mput_body(items)
    recs, used = records.decode_all(body, 1000)
    assert used == len(body) and [(x.offset, x.flag, x.payload) for x in recs] == [
        (1000, 0, b"a" * 10),
        (1030, 1, b""),
        (1050, 1, b"b" * 30),
        (1100, 1, b"c"),
        (1121, 0, b"d" * 5),
    ]
    short = wire.mput_ack(Response("result", 200, 1, b"500 2 1000 2"), 5)
    assert isinstance(short, ClientError) and "2 of 5" in str(short)
    assert isinstance(wire.mput_ack(Response("result", 200, 1, b"garbage"), 5), ClientError)
    refused = wire.mput_ack(Response("result", 503, 1, b"busy"), 5)
    assert isinstance(refused, BrokerError) and refused.retriable
    assert wire.unknown_command(Response("result", 400, 1, b"unknown command 'mput'"))
    assert not wire.unknown_command(Response("result", 400, 1, b"checksum mismatch"))


def test_encode_batch_matches_record_encoding() -> None:
    payloads = [b"x" * n for n in (0, 1, 100, 7)]
    assert records.encode_batch(payloads, 1) == b"".join(
        records.encode(0, 1, p) for p in payloads
    )
    assert records.record_offsets(40, payloads) == [40, 60, 81, 201]
    assert records.record_offsets(0, []) == []


def test_decode_as_builds_messages_and_checks_every_crc() -> None:
    part = PARTS[1]
    buf = records.encode(5, 0, b"one") + records.encode(6, 1, b"\x00\x00\x00\x01atwo")
    msgs, used = records.decode_as(buf + b"\x00\x00", 100, Message, "t", part)
    assert used == len(buf) and msgs == [
        Message("t", part, 100, 5, 0, b"one"),
        Message("t", part, 123, 6, 1, b"\x00\x00\x00\x01atwo"),
    ]
    assert msgs[1].attribute == "a" and msgs[1].data == b"two"
    bad = bytearray(buf)
    bad[-1] ^= 1
    with pytest.raises(records.CorruptRecordError) as ei:
        records.decode_as(bytes(bad), 100, Message, "t", part)
    assert ei.value.position == 123


def test_spool_append_peek_advance_and_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "t" / "0-1.spool"
    sp = Spool(path)
    assert sp.empty
    sp.append([(0, b"one"), (1, b"\x00\x00\x00\x01atwo")])
    sp.append([(0, b"three")])
    msgs, end = sp.peek(2, 1 << 20)
    assert msgs == [(0, b"one"), (1, b"\x00\x00\x00\x01atwo")]
    sp.advance(end)
    with open(path, "ab") as f:  # a crash in the middle of an append
        f.write(records.encode(0, 0, b"four")[:9])
    again = Spool(path)  # restart: position kept, torn tail cut
    assert again.peek(10, 1 << 20)[0] == [(0, b"three")]
    assert list(existing_spools(tmp_path)) == [("t", "0-1", path)]
    _, end = again.peek(10, 1 << 20)
    again.advance(end)
    assert again.empty and not path.exists()
    # a record larger than max_bytes is still returned whole
    big = Spool(path)
    big.append([(0, b"q" * 5000)])
    assert big.peek(5, 100)[0] == [(0, b"q" * 5000)]
    assert os.path.getsize(path) == 5020


def test_file_offset_stores_sharing_a_directory_merge(tmp_path: Path) -> None:
    a, b = FileOffsetStore(tmp_path), FileOffsetStore(tmp_path)
    a.load("g", "t", "0-0")
    b.load("g", "t", "0-1")
    a.commit("g", [TopicPartitionOffset("t", "0-0", 10)])
    b.commit("g", [TopicPartitionOffset("t", "0-1", 20)])
    a.commit("g", [TopicPartitionOffset("t", "0-0", 11)])
    fresh = FileOffsetStore(tmp_path)
    assert fresh.load("g", "t", "0-0") == TopicPartitionOffset("t", "0-0", 11)
    assert fresh.load("g", "t", "0-1") == TopicPartitionOffset("t", "0-1", 20)
