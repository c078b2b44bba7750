"""Message key, timestamp and typed headers in MetaQ's attribute block."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from notify.client import ClientConfig, ConsumerConfig, Message, connect
from notify.errors import ClientError
from notify.protocol.properties import (
    FLAG_PROPERTIES,
    HeaderValue,
    Properties,
    decode_attribute,
    encode_attribute,
    flag_for,
)
from notify.protocol.records import make_payload, split_payload
from notify.testing import BrokerProcess

FAST = ClientConfig(request_timeout_s=2.0)


def test_properties_round_trip_and_plain_metaq_stays_plain() -> None:
    hdrs: dict[str, HeaderValue] = {"n": 5, "pi": 3.5, "ok": True, "s": "é", "raw": b"\x00\xff"}
    props = Properties("tag", b"k\x01", hdrs, "p-1", 7)
    text = encode_attribute(props)
    assert text is not None and text.startswith("tag\x1e{")
    assert json.loads(text.split("\x1e", 1)[1])["h"]["raw"] == {"b64": "AP8="}
    back = decode_attribute(text, flag_for(props))
    assert back == Properties("tag", b"k\x01", hdrs, "p-1", 7)
    assert type(back.headers["n"]) is int and type(back.headers["ok"]) is bool
    # only a tag: MetaQ's own encoding, flag 1; nothing: flag 0
    assert encode_attribute(Properties("tag")) == "tag" and flag_for(Properties("tag")) == 1
    assert encode_attribute(Properties()) is None and flag_for(Properties()) == 0
    # a MetaQ attribute containing RS is not mistaken for properties without the flag bit
    assert decode_attribute("a\x1e{}", 1) == Properties("a\x1e{}")
    with pytest.raises(TypeError):
        encode_attribute(Properties(headers={"x": [1]}))  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        encode_attribute(Properties("a\x1eb", "k"))
    with pytest.raises(ValueError):
        decode_attribute("t\x1e{not json", 3)


def test_key_headers_and_timestamp_on_consumed_messages(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        t0 = time.time()
        r = p.send(
            "single", b"body", attribute="tag", key="user-7", headers={"n": 1, "b": b"\x01"}
        )
        t1 = time.time()
        assert r.success
        p.send("single", b"plain", attribute="tag").raise_for_error()
        p.send("single", b"bare").raise_for_error()
        p.send("single", b"bytes-key", key=b"\x00k").raise_for_error()
        with p.transaction():
            p.send("single", b"in-tx", key="tx-key", headers={"kind": "tx"})
        with pytest.raises(ClientError):
            p.send("single", b"x", attribute="bad\x1e")
        c = s.create_consumer(ConsumerConfig(group="g", data_dir=tmp_path))
        got = {m.data: m for m in c.messages("single", idle_timeout_s=2.0)}
        c.shutdown()
    m = got[b"body"]
    assert (m.attribute, m.key, m.headers) == ("tag", "user-7", {"n": 1, "b": b"\x01"})
    # stored between the send and its answer (the id holds whole milliseconds)
    assert m.msg_id == r.msg_id and int(t0 * 1000) / 1000 <= m.timestamp <= t1
    assert m.datetime.timestamp() == m.timestamp
    # what a MetaQ client reads: the attribute string, tag first
    raw_attr, body = split_payload(m.payload, m.flag & 1)
    assert body == b"body" and raw_attr is not None and raw_attr.startswith("tag\x1e")
    assert m.flag & FLAG_PROPERTIES
    plain = got[b"plain"]
    assert plain.flag == 1 and plain.payload == make_payload(b"plain", "tag")[0]
    assert (plain.attribute, plain.key, plain.headers) == ("tag", None, {})
    assert got[b"bare"].flag == 0 and got[b"bare"].attribute is None
    assert got[b"bytes-key"].key == b"\x00k" and got[b"bytes-key"].attribute is None
    assert (got[b"in-tx"].key, got[b"in-tx"].headers) == ("tx-key", {"kind": "tx"})


def test_filter_on_attribute_sees_the_tag(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.send("single", b"a", attribute="keep", key="k1", headers={"x": 1}).raise_for_error()
        p.send("single", b"b", attribute="drop", key="k1").raise_for_error()
        got: list[Message] = []
        c = s.create_consumer(ConsumerConfig(group="f", data_dir=tmp_path))
        c.subscribe("single", got.append, filter={"keep"}).complete_subscribe()
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert [m.data for m in got] == [b"a"]
