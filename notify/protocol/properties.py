"""Message properties (key, typed headers, idempotence) inside MetaQ's attribute block.

A MetaQ message carries one optional attribute string (``flag & 1``, see
:mod:`notify.protocol.records`). notify keeps everything else a message has in that same
string, so a MetaQ client still reads it as the attribute::

    flag     |= FLAG_PROPERTIES (2)                  bit 1: the attribute holds properties
    attribute = <tag> RS <JSON object>               RS = U+001E (record separator)

``<tag>`` is the application's attribute (empty when it has none; it never contains RS),
so MetaQ consumers see ``tag`` as the text before RS. The JSON object (compact, UTF-8) has
the members that are set:

    "k": key          the message key: a string, or {"b64": "..."} for bytes
    "h": {name: v}    typed headers: v is a JSON string, integer, float, true/false, or
                      {"b64": "..."} for bytes
    "p": producer id  idempotent producer: its id (notify.protocol.identity)
    "s": sequence     and the message's sequence number in its partition (integer >= 0)

The producer members, when present, are the object's last two, in this order, written
compactly: the text ends with ``"p":"<producer id>","s":<sequence>}``. That suffix is the
only place anything reads them (:func:`producer_sequence`, the broker's checks and scans in
:mod:`notify.protocol.hotpath`): a ``"p"`` member elsewhere in the object is no producer.
A message without key, headers or producer id is encoded exactly as MetaQ encodes it
(``flag & 2`` unset). The functions are pure; bad input raises ValueError/TypeError.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from notify.protocol import hotpath
from notify.protocol.accel import NATIVE

#: Record flag bit: the attribute block carries properties after the tag.
FLAG_PROPERTIES = 2
#: Separates the tag from the properties' JSON in the attribute text.
SEPARATOR = "\x1e"
#: Longest producer id the encoder writes (the broker's ``maxProducerIdLength`` may be
#: lower; the suffix reader stops at :data:`notify.protocol.hotpath.MAX_ID_SCAN`).
MAX_PRODUCER_ID = 1024

HeaderValue = str | int | float | bool | bytes


@dataclass(frozen=True, slots=True)
class Properties:
    """What the attribute block of a message says: its tag and its properties."""

    attribute: str | None = None
    key: str | bytes | None = None
    headers: Mapping[str, HeaderValue] = field(default_factory=dict)
    producer_id: str | None = None
    sequence: int = -1

    @property
    def empty(self) -> bool:
        """True when only the tag is set (encoded as plain MetaQ)."""
        return self.key is None and not self.headers and self.producer_id is None


def _value(v: HeaderValue) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return {"b64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, bool | int | float | str):
        return v
    raise TypeError(f"header values are str, int, float, bool or bytes, not {type(v).__name__}")


def _unvalue(v: Any) -> HeaderValue:
    if isinstance(v, dict):
        return base64.b64decode(str(v["b64"]), validate=True)
    if isinstance(v, bool | int | float | str):
        return v
    raise ValueError(f"bad property value {v!r}")


def encode_attribute(props: Properties) -> str | None:
    """The attribute text of ``props`` (None: no attribute block at all)."""
    tag = props.attribute
    if tag is not None and SEPARATOR in tag:
        raise ValueError("an attribute must not contain U+001E (record separator)")
    if props.empty:
        return tag
    doc: dict[str, Any] = {}
    if props.key is not None:
        doc["k"] = _value(props.key)
    if props.headers:
        hdrs = {}
        for name, v in props.headers.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"header names are non-empty strings, not {name!r}")
            hdrs[name] = _value(v)
        doc["h"] = hdrs
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False) if doc else ""
    if props.producer_id is not None:
        pid, seq = props.producer_id, props.sequence
        if not 0 < len(pid) <= MAX_PRODUCER_ID or not _ID_CHARS.fullmatch(pid):
            raise ValueError(f"a producer id is 1-{MAX_PRODUCER_ID} of [A-Za-z0-9._~-]")
        if not 0 <= seq < 10**18 or isinstance(seq, bool):
            raise ValueError("a producer's sequence is an integer in 0..10^18-1")
        members = f'"p":"{pid}","s":{int(seq)}}}'
        text = text[:-1] + "," + members if text else "{" + members
    return (tag or "") + SEPARATOR + text


def flag_for(props: Properties) -> int:
    """The record flag bits for ``props`` (attribute bit 1, properties bit 2)."""
    if props.empty:
        return 0 if props.attribute is None else 1
    return 1 | FLAG_PROPERTIES


def decode_attribute(text: str | None, flag: int) -> Properties:
    """Inverse of :func:`encode_attribute` for a record's ``flag``; an attribute without
    properties (a MetaQ message) is the tag alone. Raises ValueError when the properties
    are malformed."""
    if text is None or not flag & FLAG_PROPERTIES:
        return Properties(text)
    tag, sep, raw = text.partition(SEPARATOR)
    if not sep:
        return Properties(text)
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("properties are not a JSON object")
        key = doc.get("k")
        headers = {str(k): _unvalue(v) for k, v in dict(doc.get("h") or {}).items()}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed message properties: {e}") from e
    producer = producer_sequence(text)
    return Properties(
        tag or None,
        None if key is None else _key(key),
        headers,
        None if producer is None else producer[0],
        -1 if producer is None else producer[1],
    )


def _key(v: Any) -> str | bytes:
    out = _unvalue(v)
    if not isinstance(out, str | bytes):
        raise ValueError(f"bad message key {v!r}")
    return out


def producer_sequence(attribute_text: str) -> tuple[str, int] | None:
    """``(producer id, sequence)`` of an attribute text with properties, read from its
    suffix (module doc), else None."""
    data = attribute_text.encode("utf-8")
    ps, pe, seq = _suffix(data, 0, len(data))
    return None if ps < 0 else (data[ps:pe].decode("ascii"), seq)


def record_producer(flag: int, payload: bytes) -> tuple[str, int] | None:
    """``(producer id, sequence)`` of one record's payload (its flag ``flag``), else None:
    the broker's reading of a put and of stored records."""
    if flag & 3 != 3 or len(payload) < 4:
        return None
    alen = int.from_bytes(payload[:4], "big", signed=True)
    if alen < 0 or 4 + alen > len(payload):
        return None
    ps, pe, seq = _suffix(payload, 4, 4 + alen)
    return None if ps < 0 else (payload[ps:pe].decode("ascii"), seq)


#: the suffix reader (compiled when the build matches: notify.protocol.accel)
_suffix = NATIVE.producer_suffix if NATIVE is not None else hotpath.producer_suffix
_ID_CHARS = re.compile(r"[A-Za-z0-9._~-]+")


def producer_member(producer_id: str) -> bytes:
    """The producer members :func:`with_producer` appends, up to the sequence:
    ``"p":"<producer id>","s":`` (the id checked as :func:`encode_attribute` does)."""
    if not 0 < len(producer_id) <= MAX_PRODUCER_ID or not _ID_CHARS.fullmatch(producer_id):
        raise ValueError(f"a producer id is 1-{MAX_PRODUCER_ID} of [A-Za-z0-9._~-]")
    return b'"p":"' + producer_id.encode("ascii") + b'","s":'


def with_producer(flag: int, payload: bytes, member: bytes, sequence: int) -> tuple[int, bytes]:
    """A record payload with an idempotent producer's members appended to its properties
    (``member``: :func:`producer_member`), everything else kept byte for byte: what
    :func:`encode_attribute` gives with the producer set (the members last, the suffix
    the broker reads), without decoding the key and headers again. ``payload`` must not
    carry a producer already."""
    if not 0 <= sequence < 10**18:
        raise ValueError("a producer's sequence is an integer in 0..10^18-1")
    members = member + str(sequence).encode() + b"}"
    if flag & 1:  # records.FLAG_ATTRIBUTE: 4-byte length, attribute text, data
        n = int.from_bytes(payload[:4], "big")
        attr = payload[4 : 4 + n]
        body = payload[4 + n :]
        if flag & FLAG_PROPERTIES:
            sep = attr.find(b"\x1e")
            if sep < 0 or attr[sep + 1 : sep + 2] != b"{" or not attr.endswith(b"}"):
                raise ValueError("properties flag without a properties object")
            obj = attr[sep + 1 :]
            attr = attr[: sep + 1] + (b"{" if obj == b"{}" else obj[:-1] + b",") + members
        else:
            attr = attr + b"\x1e{" + members
    else:
        attr = b"\x1e{" + members
        body = payload
    return flag | 1 | FLAG_PROPERTIES, len(attr).to_bytes(4, "big") + attr + body
