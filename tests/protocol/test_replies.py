"""The typed reply bodies of notify.protocol.replies: round trips, layouts, broken bodies."""

from __future__ import annotations

import pytest

from notify.errors import ProtocolError
from notify.protocol import records
from notify.protocol.frames import ResponseParser, encode_result
from notify.protocol.replies import (
    MultiPutAck,
    OffsetReply,
    PutAck,
    Redirect,
    XAFailure,
    encode_prepare_vote,
    encode_put_acks,
    encode_recover,
    encode_stats,
    parse_fields,
    parse_offset,
    parse_partition_count,
    parse_prepare_vote,
    parse_recover,
    parse_stats,
    parse_stats_dict,
    parse_stats_topics,
    put_ack_msg_id,
)


def test_put_ack_layout_and_round_trip() -> None:
    ack = PutAck(123456789012, 3, 4096)
    assert ack.encode() == b"123456789012 3 4096"
    assert PutAck.parse(ack.encode()) == ack
    assert PutAck.parse(b"7 0 -1") == PutAck(7, 0, -1)  # transactional / delayed put
    assert put_ack_msg_id(b"7 0 -1") == 7


@pytest.mark.parametrize("body", [b"", b"1 2", b"1 2 3 4", b"a 2 3", b"1 2 x"])
def test_put_ack_rejects_malformed(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed put reply"):
        PutAck.parse(body)


def test_mput_ack_expands_offsets_from_record_sizes() -> None:
    ack = MultiPutAck(100, 1, 1000, 3)
    assert ack.encode() == b"100 1 1000 3"
    assert MultiPutAck.parse(ack.encode()) == ack
    h = records.HEADER_SIZE
    assert ack.expand([5, 0, 7]) == [(100, 1000), (101, 1000 + h + 5), (102, 1000 + 2 * h + 5)]
    assert MultiPutAck(100, 1, -1, 2).expand([5, 9]) == [(100, -1), (101, -1)]
    with pytest.raises(ProtocolError, match="acknowledges 3 of 2"):
        ack.expand([1, 2])
    with pytest.raises(ProtocolError):
        MultiPutAck.parse(b"1 2 3")
    with pytest.raises(ProtocolError):
        MultiPutAck.parse(b"1 2 3 -4")


def test_bulk_put_acks_are_the_frames_a_client_parses() -> None:
    acks = [(11, 500, 0), (12, 501, 25), (2**31 - 1, 2**62, 2**40)]
    data = encode_put_acks(7, acks)
    assert data == b"".join(
        encode_result(200, o, PutAck(m, 7, off).encode()) for o, m, off in acks
    )
    replies = ResponseParser().feed(data)
    assert [(r.opaque, PutAck.parse(r.body)) for r in replies] == [
        (o, PutAck(m, 7, off)) for o, m, off in acks
    ]
    assert encode_put_acks(0, []) == b""


def test_offset_reply_and_redirect() -> None:
    assert Redirect is OffsetReply
    assert Redirect(2**40).encode() == b"1099511627776"
    assert parse_offset(b"42") == 42
    assert parse_offset(b"-1\r\n") == -1
    for bad in (b"", b"x", b"1 2"):
        with pytest.raises(ProtocolError, match="malformed offset"):
            parse_offset(bad)


def test_xa_failure_both_directions() -> None:
    f = XAFailure(-4, "unknown transaction XID:1:ab:cd:q, with a comma")
    body = f.encode()
    assert body == b"XAException:code=-4,msg=unknown transaction XID:1:ab:cd:q, with a comma"
    assert XAFailure.parse(body) == f
    assert XAFailure.parse(b"XAException:code=106,msg=multi\nline") == XAFailure(106, "multi\nline")
    assert XAFailure.parse(XAFailure(100, "é").encode()) == XAFailure(100, "é")
    assert XAFailure.parse(b"topic not found") is None
    with pytest.raises(ProtocolError):
        XAFailure.parse(b"XAException:code=abc,msg=x")


def test_prepare_vote_and_recover() -> None:
    assert parse_prepare_vote(encode_prepare_vote(3)) == 3
    assert parse_prepare_vote(b"0") == 0
    assert parse_prepare_vote(b"") == 0
    with pytest.raises(ProtocolError):
        parse_prepare_vote(b"yes")
    keys = ["XID:1:ab:cd:q", "XID:1:ef:01:q"]
    assert encode_recover(keys) == b"XID:1:ab:cd:q\r\nXID:1:ef:01:q"
    assert parse_recover(encode_recover(keys)) == keys
    assert parse_recover(encode_recover([])) == []


def test_stats_round_trip_and_typed_views() -> None:
    body = encode_stats([("version", "1.4.0"), ("topics", 3), ("ratio", 0.5), ("up", True)])
    assert body == b"STATS\r\nversion 1.4.0\r\ntopics 3\r\nratio 0.5\r\nup True\r\nEND\r\n"
    assert parse_stats(body) == [
        ("version", "1.4.0"),
        ("topics", "3"),
        ("ratio", "0.5"),
        ("up", "True"),
    ]
    assert parse_stats_dict(body) == {"version": "1.4.0", "topics": 3, "ratio": 0.5, "up": "True"}
    assert parse_stats(b"STATS\r\nEND\r\n") == []
    topics = encode_stats(
        [("test", "partitions=4 bytes=10 accept_publish=true"), ("legacy", 3), ("odd", "x=1")]
    )
    assert parse_stats_topics(topics) == {"test": 4, "legacy": 3}
    assert parse_fields("partitions=4 bytes=10 junk") == {"partitions": "4", "bytes": "10"}
    assert parse_partition_count(encode_stats([("topic", "t"), ("partitions", 2)])) == 2
    assert parse_partition_count(encode_stats([("topic", "t")])) == 0
