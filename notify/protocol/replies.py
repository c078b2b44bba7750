"""Typed bodies of MetaQ replies: each format encoded and parsed here, and nowhere else.

A reply frame is ``result <code> <bodyLen> <opaque>\\r\\n<body>`` (see :mod:`.frames`); this
module defines what goes in ``<body>``. All numbers are ASCII decimal, tokens are separated
by one space, text is UTF-8. Byte layouts::

    put ack        (200 to put, dput, sync)   <msgId> <partition> <offset>
                   offset -1: not in the partition yet (transactional put, delayed put)
    mput ack       (200 to mput)              <firstMsgId> <partition> <firstOffset> <count>
                   record i has id firstMsgId+i; its offset follows from the sizes of the
                   records before it (firstOffset -1: inside a transaction)
    offset         (301 to get and msync: "continue at"; 200 to offset and msync)
                                              <offset>
    XA failure     (non-200 to transaction and to transactional puts)
                                              XAException:code=<n>,msg=<text>
                   <n> a javax.transaction.xa code (see :mod:`.xa`), <text> free UTF-8
    prepare vote   (200 to PREPARE)           <n>          0 XA_OK, 3 XA_RDONLY
    RECOVER        (200 to transaction RECOVER)
                                              <key>\\r\\n<key>...   (no trailing CRLF; empty
                                              body: nothing prepared)
    replica ack    (200 to a 4/5-token auth with replicationSecret)
                                              ok role=replica broker=<brokerId>[ epoch=<E>]
    stats          (200 to stats)             STATS\\r\\n<name> <value>\\r\\n...END\\r\\n
                   <name> has no space; <value> is the rest of the line, often
                   ``k=v k=v`` fields (``stats topics``: ``partitions=4 bytes=...``)

Parsers raise :class:`~notify.errors.ProtocolError` on a body that does not have the format;
they never return half-parsed values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from notify.errors import ProtocolError
from notify.protocol.records import HEADER_SIZE

_XA_PREFIX: Final = b"XAException:code="
_XA_RE: Final = re.compile(rb"XAException:code=(-?\d+),msg=(.*)", re.DOTALL)


def _malformed(what: str, body: bytes) -> ProtocolError:
    return ProtocolError(f"malformed {what} reply body {bytes(body[:80])!r}", 500)


def _ints(body: bytes, n: int, what: str) -> list[int]:
    parts = body.split()
    if len(parts) != n:
        raise _malformed(what, body)
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise _malformed(what, body) from None


# --------------------------------------------------------------------------- put / mput


@dataclass(frozen=True, slots=True)
class PutAck:
    """``<msgId> <partition> <offset>``: where one message went (offset -1: not yet)."""

    msg_id: int
    partition: int
    offset: int

    def encode(self) -> bytes:
        return b"%d %d %d" % (self.msg_id, self.partition, self.offset)

    @classmethod
    def parse(cls, body: bytes) -> PutAck:
        mid, part, off = _ints(body, 3, "put")
        return cls(mid, part, off)


def put_ack_msg_id(body: bytes) -> int:
    """The message id of a put ack (what half messages and transactional puts need)."""
    return PutAck.parse(body).msg_id


def encode_put_ack_body(msg_id: int, partition: int, offset: int) -> bytes:
    """:meth:`PutAck.encode` without the object (a transactional put's ack, offset -1)."""
    return b"%d %d %d" % (msg_id, partition, offset)


def encode_put_ack(partition: int, opaque: int, msg_id: int, offset: int) -> bytes:
    """The whole ``result 200`` frame of one put ack (the broker's lone put)."""
    body = b"%d %d %d" % (msg_id, partition, offset)
    return b"result 200 %d %d\r\n%b" % (len(body), opaque, body)


def encode_put_acks(partition: int, acks: Iterable[tuple[int, int, int]]) -> bytes:
    """Whole ``result 200`` frames for many put acks of one partition, as one bytes.

    ``acks`` yields ``(opaque, msg_id, offset)``. The broker's hot path after a group
    commit: one pass, two %-formats per ack, one join."""
    out: list[bytes] = []
    append = out.append
    for opaque, msg_id, offset in acks:
        body = b"%d %d %d" % (msg_id, partition, offset)
        append(b"result 200 %d %d\r\n%b" % (len(body), opaque, body))
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class MultiPutAck:
    """``<firstMsgId> <partition> <firstOffset> <count>``: where an mput's records went."""

    first_msg_id: int
    partition: int
    first_offset: int
    count: int

    def encode(self) -> bytes:
        return b"%d %d %d %d" % (self.first_msg_id, self.partition, self.first_offset, self.count)

    @classmethod
    def parse(cls, body: bytes) -> MultiPutAck:
        first, part, off, count = _ints(body, 4, "mput")
        if count < 0:
            raise _malformed("mput", body)
        return cls(first, part, off, count)

    def expand(self, payload_sizes: Sequence[int]) -> list[tuple[int, int]]:
        """``(msg_id, offset)`` of each record, given the payload size of each (in order);
        offsets are -1 when the first one is. Raises :class:`ProtocolError` when the ack
        does not cover exactly ``len(payload_sizes)`` records."""
        if self.count != len(payload_sizes):
            raise ProtocolError(
                f"mput reply acknowledges {self.count} of {len(payload_sizes)} messages", 500
            )
        first_id = self.first_msg_id
        if self.first_offset < 0:
            return [(first_id + i, -1) for i in range(self.count)]
        out: list[tuple[int, int]] = []
        off = self.first_offset
        for i, size in enumerate(payload_sizes):
            out.append((first_id + i, off))
            off += HEADER_SIZE + size
        return out


# --------------------------------------------------------------------------- offsets


@dataclass(frozen=True, slots=True)
class OffsetReply:
    """``<offset>``: a 301 redirect ("continue at", to get and msync) or the 200 reply to
    ``offset`` and ``msync``."""

    offset: int

    def encode(self) -> bytes:
        return b"%d" % self.offset

    @classmethod
    def parse(cls, body: bytes) -> OffsetReply:
        (off,) = _ints(body, 1, "offset")
        return cls(off)


#: The 301 reply body (same layout as every one-offset body).
Redirect = OffsetReply


def parse_offset(body: bytes) -> int:
    """The offset of a one-offset body (301 redirect, reply to ``offset``/``msync``)."""
    return OffsetReply.parse(body).offset


# --------------------------------------------------------------------------- XA


@dataclass(frozen=True, slots=True)
class XAFailure:
    """``XAException:code=<n>,msg=<text>``: a refused transaction step."""

    code: int
    message: str

    def encode(self) -> bytes:
        return b"XAException:code=%d,msg=%b" % (self.code, self.message.encode("utf-8", "replace"))

    @classmethod
    def parse(cls, body: bytes) -> XAFailure | None:
        """The failure in ``body``, or None when ``body`` is not an XA failure (a plain
        error text). Raises :class:`ProtocolError` when it starts like one but is broken."""
        body = body.strip()
        if not body.startswith(_XA_PREFIX):
            return None
        m = _XA_RE.fullmatch(body)
        if m is None:
            raise _malformed("XAException", body)
        return cls(int(m.group(1)), m.group(2).decode("utf-8", "replace"))


def encode_prepare_vote(code: int) -> bytes:
    """The 200 body of PREPARE: the XA vote code (0 XA_OK, 3 XA_RDONLY)."""
    return b"%d" % code


def parse_prepare_vote(body: bytes) -> int:
    """The vote of a PREPARE reply; an empty body (old brokers) counts as 0 (XA_OK)."""
    if not body.strip():
        return 0
    (code,) = _ints(body, 1, "PREPARE")
    return code


def encode_recover(keys: Iterable[str]) -> bytes:
    """The 200 body of RECOVER: transaction keys, one a line."""
    return "\r\n".join(keys).encode("utf-8")


def parse_recover(body: bytes) -> list[str]:
    """The keys of a RECOVER reply (blank lines ignored; ``\\n`` accepted too)."""
    return [line for line in body.decode("utf-8", "replace").splitlines() if line.strip()]


# --------------------------------------------------------------------------- stats


def encode_stats(items: Iterable[tuple[str, object]]) -> bytes:
    """``STATS\\r\\n<name> <value>\\r\\n...END\\r\\n`` (values through ``str``); a value of
    None gives a line with the name alone (MetaQ starts a topic's block with the bare name)."""
    lines = [b"STATS\r\n"]
    lines.extend(
        (f"{k}\r\n" if v is None else f"{k} {v}\r\n").encode("utf-8", "replace")
        for k, v in items
    )
    lines.append(b"END\r\n")
    return b"".join(lines)


def parse_stats(body: bytes) -> list[tuple[str, str]]:
    """``(name, value)`` pairs of a stats body, in order (the STATS/END lines dropped)."""
    out: list[tuple[str, str]] = []
    for raw in body.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line or line in ("STATS", "END"):
            continue
        k, _, v = line.partition(" ")
        out.append((k, v))
    return out


def stats_value(text: str) -> int | float | str:
    """A stats value as a number when it is one, else the text."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


StatsJson = int | float | bool | str | dict[str, "int | float | bool | str"]


def stats_json_value(text: str) -> StatsJson:
    """A stats value for JSON: a number, ``true``/``false`` as a boolean, ``k=v k=v``
    fields as an object of such values, anything else the text."""
    text = text.strip()
    tokens = text.split()
    if len(tokens) > 0 and all("=" in tok and not tok.startswith("=") for tok in tokens):
        return {k: _scalar(v) for k, v in (tok.split("=", 1) for tok in tokens)}
    return _scalar(text)


def _scalar(text: str) -> int | float | bool | str:
    if text in ("true", "false"):
        return text == "true"
    value = stats_value(text)
    if isinstance(value, float) and not math.isfinite(value):
        return text  # "nan"/"inf" stay text: JSON has no such numbers
    return value


def parse_stats_json(body: bytes) -> dict[str, StatsJson]:
    """A stats body as a JSON-ready object (:func:`stats_json_value` per value)."""
    return {k: stats_json_value(v) for k, v in parse_stats(body)}


def parse_stats_dict(body: bytes) -> dict[str, int | float | str]:
    """A stats body as ``{name: value}``, numbers converted (:func:`stats_value`)."""
    return {k: stats_value(v) for k, v in parse_stats(body)}


def parse_fields(value: str) -> dict[str, str]:
    """The ``k=v k=v`` fields of a stats value (tokens without ``=`` ignored)."""
    out: dict[str, str] = {}
    for tok in value.split():
        k, sep, v = tok.partition("=")
        if sep:
            out[k] = v
    return out


_PARTITION_KEYS: Final = ("partitions", "numPartitions", "num_partitions")


def parse_stats_topics(body: bytes) -> dict[str, int]:
    """A ``stats topics`` body as ``{topic: partition count}``.

    Lenient (other brokers format it differently): a ``partitions=N`` field (or
    ``numPartitions``/``num_partitions``), else a bare integer value; other lines ignored.
    """
    out: dict[str, int] = {}
    for topic, value in parse_stats(body):
        fields = parse_fields(value)
        for key in _PARTITION_KEYS:
            if fields.get(key, "").isdigit():
                out[topic] = int(fields[key])
                break
        else:
            if value.strip().isdigit():
                out[topic] = int(value.strip())
    return out


def parse_partition_count(body: bytes) -> int:
    """The ``partitions`` line of a ``stats <topic>`` body; 0 when there is none."""
    for k, v in parse_stats(body):
        if k == "partitions" and v.strip().isdigit():
            return int(v)
    return 0


# --------------------------------------------------------------------------- replication

#: The answer to a replication link's ``auth <replicationSecret> <brokerId>``.
REPLICA_ACK_PREFIX: Final = b"ok role=replica broker="


def encode_replica_ack(broker_id: int, epoch: int = 0) -> bytes:
    """``ok role=replica broker=<brokerId>[ epoch=<epoch>]``: the answering broker's identity
    and, with automatic failover, the failover epoch it is in."""
    ack = REPLICA_ACK_PREFIX + b"%d" % broker_id
    return ack + b" epoch=%d" % epoch if epoch else ack


def parse_replica_epoch(body: bytes) -> int:
    """The ``epoch=`` of a replica ``auth`` answer; 0 when absent (no automatic failover)."""
    for tok in body.split()[2:]:
        if tok.startswith(b"epoch=") and tok[6:].isdigit():
            return int(tok[6:])
    return 0


def parse_replica_ack(body: bytes) -> int | None:
    """The broker id in a replica ``auth`` answer; None when the peer granted no replica
    role (e.g. "authentication not required": it has no ``replicationSecret``)."""
    if not body.startswith(REPLICA_ACK_PREFIX):
        return None
    tail = body[len(REPLICA_ACK_PREFIX) :].split(b" ", 1)[0]
    return int(tail) if tail.isdigit() else None
