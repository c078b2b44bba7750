"""Pure parts of the configserver: MetaQ's layout and values, strategies, URLs."""

from __future__ import annotations

import json

import pytest

import notify.configserver as configserver
from notify.configserver import (
    BrokerRegistration,
    ConfigServerError,
    ConsistentHashStrategy,
    ContiguousStrategy,
    Layout,
    PartitionInfo,
    TopicRegistration,
    get_strategy,
    parse_url,
)
from notify.configserver._layout import (
    decode_address,
    decode_topic_broker,
    decode_topics,
    encode_topic_broker,
    parse_broker_key,
)


def test_public_surface() -> None:
    assert sorted(configserver.__all__) == configserver.__all__
    for name in configserver.__all__:
        assert hasattr(configserver, name), name


def test_broker_nodes_are_metaq_layout() -> None:
    reg = BrokerRegistration(
        7,
        "10.0.0.5",
        8123,
        (
            TopicRegistration("orders", 4),
            TopicRegistration("audit", 2, accept_publish=False),
            TopicRegistration("feed", 1, accept_subscribe=False),
        ),
    )
    assert Layout("/meta").broker_nodes(reg) == {
        "/meta/brokers/ids/7/master": b"meta://10.0.0.5:8123",
        "/meta/brokers/topics/audit/7-m": b"2",
        "/meta/brokers/topics-sub/audit/7-m": b'{"numParts":2,"broker":"7-m"}',
        "/meta/brokers/topics/feed/7-m": b"1",
        "/meta/brokers/topics-pub/feed/7-m": b'{"numParts":1,"broker":"7-m"}',
        "/meta/brokers/topics/orders/7-m": b"4",
        "/meta/brokers/topics-pub/orders/7-m": b'{"numParts":4,"broker":"7-m"}',
        "/meta/brokers/topics-sub/orders/7-m": b'{"numParts":4,"broker":"7-m"}',
    }


def test_slave_registers_subscribe_side_only() -> None:
    reg = BrokerRegistration(3, "h", 1, (TopicRegistration("t", 2),), slave_id=1)
    assert Layout("meta/").broker_nodes(reg) == {
        "/meta/brokers/ids/3/slave1": b"meta://h:1",
        "/meta/brokers/topics/t/3-s1": b"2",
        "/meta/brokers/topics-sub/t/3-s1": b'{"numParts":2,"broker":"3-s1"}',
    }


def test_consumer_paths() -> None:
    lay = Layout("/")
    assert lay.consumer_node("g", "g_h-1-2-3") == "/consumers/g/ids/g_h-1-2-3"
    assert lay.owner_node("g", "t", "0-3") == "/consumers/g/owners/t/0-3"
    assert lay.offset_node("g", "t", "0-3") == "/consumers/g/offsets/t/0-3"
    with pytest.raises(ConfigServerError, match="invalid group"):
        lay.consumer_ids("a/b")


def test_values_round_trip() -> None:
    raw = encode_topic_broker(16, "2-m")
    assert json.loads(raw) == {"numParts": 16, "broker": "2-m"}
    assert decode_topic_broker(raw) == (16, "2-m")
    assert decode_topic_broker(b"5") == (5, "")  # legacy topics/ value
    assert decode_address(b"meta://127.0.0.1:8123") == "127.0.0.1:8123"
    assert decode_topics(b"a,b") == ("a", "b") and decode_topics(b"") == ()
    assert parse_broker_key("12-m") == (12, None)
    assert parse_broker_key("12-s3") == (12, 3)
    with pytest.raises(ValueError):
        parse_broker_key("x-m")


def _parts(n_brokers: int, per: int) -> list[PartitionInfo]:
    return [PartitionInfo(b, p) for b in range(n_brokers) for p in range(per)]


@pytest.mark.parametrize(("members", "parts"), [(1, 12), (4, 12), (5, 12), (3, 2), (4, 0)])
def test_contiguous_split_is_metaqs(members: int, parts: int) -> None:
    ps = _parts(1, parts)
    ids = [f"c{i}" for i in range(members)][::-1]  # any order in
    share = ContiguousStrategy().assign(ids, ps)
    flat = [p for c in sorted(share) for p in share[c]]
    assert flat == ps  # contiguous runs in member order, every partition once
    sizes = [len(share[c]) for c in sorted(share)]
    per, extra = divmod(parts, members)
    assert sizes == [per + 1] * extra + [per] * (members - extra)  # first P % C get one more


def test_consistent_hash_moves_little() -> None:
    ps = _parts(4, 16)
    s = get_strategy("consistent_hash")
    assert isinstance(s, ConsistentHashStrategy)
    before = s.assign(["a", "b", "c", "d"], ps)
    after = s.assign(["a", "b", "c", "d", "e"], ps)
    assert sorted(p for v in after.values() for p in v) == sorted(ps)
    owner_before = {p: c for c, v in before.items() for p in v}
    moved = [p for c, v in after.items() for p in v if owner_before[p] != c]
    assert all(p in after["e"] for p in moved)  # only the newcomer takes partitions
    assert len(moved) < len(ps) // 2
    with pytest.raises(ValueError, match="unknown assignment strategy"):
        get_strategy("random")


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("127.0.0.1:2181/meta", ("127.0.0.1:2181", "/meta", False)),
        ("127.0.0.1:2181", ("127.0.0.1:2181", "/meta", False)),
        ("zookeeper://h1:1,h2:2/x/meta", ("h1:1,h2:2", "/x/meta", False)),
        ("zk://h:1/", ("h:1", "/meta", False)),
        ("embedded://", ("", "/meta", True)),
    ],
)
def test_parse_url(url: str, parsed: tuple[str, str, bool]) -> None:
    assert parse_url(url) == parsed


def test_parse_url_rejects() -> None:
    with pytest.raises(ConfigServerError):
        parse_url("http://h:1/meta")
    with pytest.raises(ConfigServerError):
        parse_url("/meta")
