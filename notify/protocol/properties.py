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
    "p": producer id  idempotent producer: its id (string, <= 64 chars)
    "s": sequence     and the message's sequence number in its partition (integer >= 0)

A message without key, headers or producer id is encoded exactly as MetaQ encodes it
(``flag & 2`` unset). The functions are pure; bad input raises ValueError/TypeError.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Record flag bit: the attribute block carries properties after the tag.
FLAG_PROPERTIES = 2
#: Separates the tag from the properties' JSON in the attribute text.
SEPARATOR = "\x1e"
#: Longest producer id.
MAX_PRODUCER_ID = 64

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
    if props.producer_id is not None:
        if not 0 < len(props.producer_id) <= MAX_PRODUCER_ID or props.sequence < 0:
            raise ValueError("a producer id is 1-64 characters with a sequence >= 0")
        doc["p"] = props.producer_id
        doc["s"] = props.sequence
    return (tag or "") + SEPARATOR + json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


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
        pid = doc.get("p")
        seq = int(doc.get("s", -1))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed message properties: {e}") from e
    return Properties(
        tag or None,
        None if key is None else _key(key),
        headers,
        None if pid is None else str(pid),
        seq,
    )


def _key(v: Any) -> str | bytes:
    out = _unvalue(v)
    if not isinstance(out, str | bytes):
        raise ValueError(f"bad message key {v!r}")
    return out


def producer_sequence(attribute_text: str) -> tuple[str, int] | None:
    """``(producer id, sequence)`` of an attribute text with properties, else None (the
    broker's dedup check; only called for records with ``flag & FLAG_PROPERTIES``)."""
    _tag, sep, raw = attribute_text.partition(SEPARATOR)
    if not sep or '"p"' not in raw:
        return None
    try:
        doc = json.loads(raw)
        pid, seq = doc["p"], doc["s"]
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(pid, str) or not isinstance(seq, int) or isinstance(seq, bool):
        return None
    return pid, seq
