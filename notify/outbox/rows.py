"""The outbox's formats, defined once: its rows, the relay's pending batch and sequences.

Table ``notify_outbox``: one row per message written by an application's transaction and
not yet acknowledged by the broker::

    column      PostgreSQL / MySQL, MariaDB / SQLite       meaning
    shard       SMALLINT                                    relay shard: khash mod shards
                                                            (keyless: round robin)
    id          BIGINT identity / BIGINT AUTO_INCREMENT /   order of the rows of one key =
                INTEGER rowid                               the order their transactions
                                                            committed (taken at commit,
                                                            under the key's lock)
    topic       VARCHAR(249)                                [A-Za-z0-9._-], not "__..."
    khash       INTEGER NULL                                CRC32 of the key (its UTF-8
                                                            bytes) as a signed int32: the
                                                            client's KeyHashSelector hash;
                                                            NULL: no key
    flag        INTEGER                                     record flag of ``payload``
    payload     BYTEA / LONGBLOB / BLOB                     the MetaQ record payload as
                                                            ``producer.send`` builds it
    created_ms  BIGINT                                      database clock, Unix ms

    primary key (shard, id); MySQL also KEY (id) (AUTO_INCREMENT needs it); SQLite: id is
    the rowid and (shard, id) an index

``payload`` is exactly what the broker stores as the record's payload: without attribute,
key or headers the data itself (flag 0); with an attribute only, MetaQ's layout (flag 1)::

    attribute length   int32 big-endian
    attribute          UTF-8: <tag> [U+001E <JSON {"k": key, "h": headers}>]
    data               the rest

(flag bit 1 set when the JSON part is there; see :mod:`notify.protocol.properties`). The
relay adds the idempotent producer's id and sequence when it publishes (the publisher's
job), nothing else: no per-message encoding between the row and the ``mput`` frame.

Table ``notify_outbox_delayed``: the same columns plus ``due_ms`` (Unix ms): messages sent
with ``delay=``/``deliver_at=``; the shard's relay moves each into ``notify_outbox`` when
it is due (it then takes a new id: a delayed message is ordered by when it becomes due).

Table ``notify_outbox_relay``: one row per shard (their number is the shard count)::

    shard        INTEGER primary key
    producer_name VARCHAR(64)  the name of the broker identity this shard publishes under:
                               "outbox-<12 hex of the outbox's random id>-<shard>"
    producer_secret VARCHAR(64) the identity's secret (random, the same for every shard of
                               an outbox): the producer id is <name>~<tag of name and
                               secret> (notify.protocol.identity); whoever may read this
                               table may publish as the outbox
    epoch        BIGINT        leadership generation: a new leader adds one, and every
                               write of a relay is conditional on its epoch (fencing)
    owner        VARCHAR(255)  the leading relay instance (for people)
    seqs         TEXT          next sequence per partition, JSON
                               {"<topic>": {"<brokerId>-<partition>": next}}
    pending      BLOB NULL     the batch recorded before it is published (below)
    published    BIGINT        rows published since the shard was created
    updated_ms   BIGINT        database clock at the leader's last write

``pending`` (big-endian)::

    u8  version (1)
    u16 sub-batches, then for each:
        u16 + UTF-8   topic
        u16 + UTF-8   partition ("<brokerId>-<partition>")
        i64           first sequence number
        u32 n, n x i64   the row ids, in publishing order

Table ``notify_outbox_instances``: the relay instances alive (heartbeats, the shards each
leads), from which each computes the shards it should lead; ``notify_outbox_dead``: rows
the broker refused for good, with the error; ``notify_outbox_half``: markers of half messages (see
:mod:`notify.outbox.half`).

Everything here is pure: building rows from :meth:`~notify.outbox.Outbox.send`'s
arguments (bad input raises :class:`OutboxArgumentError`), hashing keys, the codecs.
"""

from __future__ import annotations

import json
import math
import re
import struct
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, NamedTuple

from notify.config import RESERVED_PREFIX, validate_topic
from notify.errors import InvalidTopicError, NotifyError
from notify.protocol.properties import HeaderValue, Properties, encode_attribute, flag_for
from notify.protocol.records import make_payload

__all__ = [
    "DEFAULT_MAX_DELAY_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_SHARDS",
    "OutboxArgumentError",
    "OutboxError",
    "PendingBatch",
    "Row",
    "SubBatch",
    "build_row",
    "decode_pending",
    "decode_seqs",
    "encode_pending",
    "encode_seqs",
    "key_hash",
    "producer_name",
    "shard_of",
]

TABLE: Final = "notify_outbox"
DELAYED_TABLE: Final = "notify_outbox_delayed"
RELAY_TABLE: Final = "notify_outbox_relay"
INSTANCES_TABLE: Final = "notify_outbox_instances"
DEAD_TABLE: Final = "notify_outbox_dead"
HALF_TABLE: Final = "notify_outbox_half"

#: Largest message payload (attribute block + data) ``send`` accepts: the broker's default
#: ``maxMessageSize`` (a MetaQ Java consumer's 2 MiB read buffer minus 1 KiB).
DEFAULT_MAX_MESSAGE_BYTES: Final = 2 * 1024 * 1024 - 1024
#: Longest delay ``send`` accepts: the broker's default ``maxDelay`` (90 days).
DEFAULT_MAX_DELAY_S: Final = 90 * 24 * 3600.0
#: Most shards an outbox may have (``notify outbox shards``).
MAX_SHARDS: Final = 1024
#: Longest topic name (the broker's rule).
MAX_TOPIC: Final = 249

_PENDING_VERSION: Final = 1
_ATTR_LEN: Final = struct.Struct(">i")
_U16: Final = struct.Struct(">H")
_SUB: Final = struct.Struct(">qI")


class OutboxError(NotifyError):
    """Root of the outbox's errors (:mod:`notify.outbox`)."""


class OutboxArgumentError(OutboxError, ValueError):
    """A ``send`` argument the outbox cannot turn into a message (the message says which);
    nothing was written."""


class Row(NamedTuple):
    """One message as the writer inserts it (the columns above, less id and times)."""

    shard: int
    topic: str
    khash: int | None
    flag: int
    payload: bytes
    due_ms: int | None  # None: publish now (notify_outbox), else notify_outbox_delayed


class Marker(NamedTuple):
    """A half message's marker as the writer inserts it (``notify_outbox_half``, state 1:
    its transaction committed)."""

    group: str
    tx_key: str


#: Producer groups and transaction keys a marker may hold (safe as SQL literals).
_MARKER_TEXT: Final = re.compile(r"[A-Za-z0-9:._@-]{1,255}")


def build_marker(group: str, tx_key: str) -> Marker:
    """Check a half message's group and transaction key (:class:`OutboxArgumentError`)."""
    for what, v in (("group", group), ("transaction key", tx_key)):
        if not isinstance(v, str) or not _MARKER_TEXT.fullmatch(v):
            raise OutboxArgumentError(
                f"half-message {what} must match [A-Za-z0-9:._@-]{{1,255}}, not {v!r}"
            )
    return Marker(group, tx_key)


def key_hash(key: bytes | str) -> int:
    """CRC32 of the key's UTF-8 bytes, unsigned: :class:`notify.client.KeyHashSelector`'s
    hash, so an outbox message lands on the partition a producer would pick for its key."""
    raw = key.encode("utf-8") if isinstance(key, str) else key
    return zlib.crc32(raw)


def signed32(h: int) -> int:
    """An unsigned 32-bit hash as the signed int32 stored in ``khash``."""
    return h - (1 << 32) if h >= 1 << 31 else h


def unsigned32(h: int) -> int:
    """Inverse of :func:`signed32`."""
    return h + (1 << 32) if h < 0 else h


def shard_of(khash: int | None, shards: int, fallback: int) -> int:
    """The shard of a row: its key hash modulo the shard count; a keyless row takes
    ``fallback`` (the writer's round robin) modulo the count."""
    if khash is None:
        return fallback % shards
    return unsigned32(khash) % shards


def producer_name(outbox_id: str, shard: int) -> str:
    """The name of ``shard``'s broker identity (<= 64 characters)."""
    return f"outbox-{outbox_id[:12]}-{shard}"


#: Topic names already checked (bounded: cleared when it grows past 4096).
_good_topics: set[str] = set()


def _check_topic(topic: object) -> str:
    if topic in _good_topics:
        return topic
    if not isinstance(topic, str):
        raise OutboxArgumentError(f"topic must be a str, not {type(topic).__name__}")
    try:
        validate_topic(topic)
    except InvalidTopicError as e:
        raise OutboxArgumentError(str(e)) from None
    if topic.startswith(RESERVED_PREFIX):
        raise OutboxArgumentError(f"topic {topic[:60]!r} is reserved for the broker")
    if len(_good_topics) >= 4096:
        _good_topics.clear()
    _good_topics.add(topic)
    return topic


def _due_ms(
    delay: float | None, deliver_at: datetime | float | None, now_s: float, max_delay_s: float
) -> int | None:
    if delay is None and deliver_at is None:
        return None
    if delay is not None and deliver_at is not None:
        raise OutboxArgumentError("give delay= or deliver_at=, not both")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise OutboxArgumentError(f"delay must be a number of seconds, not {delay!r}")
        if not math.isfinite(delay) or delay < 0:
            raise OutboxArgumentError(f"delay must be finite and >= 0, not {delay!r}")
        due_s = now_s + delay
    elif isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None:
            raise OutboxArgumentError("deliver_at must be timezone-aware (e.g. UTC)")
        due_s = deliver_at.timestamp()
    elif isinstance(deliver_at, int | float) and not isinstance(deliver_at, bool):
        due_s = float(deliver_at)
        if not math.isfinite(due_s):
            raise OutboxArgumentError(f"deliver_at must be finite, not {deliver_at!r}")
    else:
        raise OutboxArgumentError(
            f"deliver_at must be an aware datetime or Unix seconds, not {deliver_at!r}"
        )
    if due_s - now_s > max_delay_s:
        raise OutboxArgumentError(
            f"the message is due {due_s - now_s:.0f} s ahead: more than the outbox's "
            f"max_delay_s {max_delay_s:.0f}"
        )
    return int(due_s * 1000)


def build_row(
    topic: str,
    data: bytes | bytearray | memoryview,
    shards: int,
    fallback_shard: int,
    *,
    attribute: str | None = None,
    key: bytes | str | None = None,
    headers: Mapping[str, HeaderValue] | None = None,
    delay: float | None = None,
    deliver_at: datetime | float | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_delay_s: float = DEFAULT_MAX_DELAY_S,
    now_s: float | None = None,
) -> Row:
    """Check ``send``'s arguments and build the row (raises :class:`OutboxArgumentError`).

    The same arguments as ``producer.send``: ``data`` bytes-like, ``attribute`` MetaQ's
    tag (no U+001E), ``key`` str or bytes (picks the partition and the shard), ``headers``
    ``{str: str | int | float | bool | bytes}``, ``delay`` seconds from now or
    ``deliver_at`` (aware datetime or Unix seconds)."""
    topic = _check_topic(topic)
    if type(data) is not bytes:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise OutboxArgumentError(f"message data must be bytes, not {type(data).__name__}")
        data = bytes(data)
    if key is not None and not isinstance(key, str | bytes):
        raise OutboxArgumentError(f"key must be str or bytes, not {type(key).__name__}")
    if attribute is not None and not isinstance(attribute, str):
        raise OutboxArgumentError(f"attribute must be a str, not {type(attribute).__name__}")
    if headers is not None and not isinstance(headers, Mapping):
        raise OutboxArgumentError(f"headers must be a mapping, not {type(headers).__name__}")
    if attribute is None and key is None and not headers:
        payload, flag = data, 0
    elif attribute is None and not headers and type(key) is str:
        # the common keyed message, as encode_attribute writes it (without a dict)
        attr = ('\x1e{"k":' + json.dumps(key, ensure_ascii=False) + "}").encode()
        payload, flag = _ATTR_LEN.pack(len(attr)) + attr + data, 3
    else:
        props = Properties(attribute, key, dict(headers or {}))
        try:
            text = encode_attribute(props)
        except (TypeError, ValueError) as e:
            raise OutboxArgumentError(str(e)) from None
        payload, _ = make_payload(data, text)
        flag = flag_for(props)
    if len(payload) > max_message_bytes:
        raise OutboxArgumentError(
            f"message of {len(payload)} bytes (data, key, headers) exceeds the outbox's "
            f"max_message_bytes {max_message_bytes}"
        )
    due = None
    if delay is not None or deliver_at is not None:
        due = _due_ms(delay, deliver_at, time.time() if now_s is None else now_s, max_delay_s)
    khash = None if key is None else signed32(key_hash(key))
    return Row(shard_of(khash, shards, fallback_shard), topic, khash, flag, payload, due)


# ---------------------------------------------------------------------------- pending batch


@dataclass(frozen=True, slots=True)
class SubBatch:
    """The rows of one cycle going to one partition: one ``mput`` with sequence numbers
    ``first_seq .. first_seq + len(row_ids) - 1``."""

    topic: str
    partition: str
    first_seq: int
    row_ids: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.row_ids)


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """What a relay records before publishing (``notify_outbox_relay.pending``)."""

    subs: tuple[SubBatch, ...]

    @property
    def row_ids(self) -> list[int]:
        return [i for s in self.subs for i in s.row_ids]

    @property
    def count(self) -> int:
        return sum(s.count for s in self.subs)


def _put_text(out: list[bytes], text: str) -> None:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("name too long for the pending batch")
    out.append(_U16.pack(len(raw)))
    out.append(raw)


def encode_pending(batch: PendingBatch) -> bytes:
    """The ``pending`` column of ``batch`` (layout at the top of this module)."""
    out: list[bytes] = [bytes([_PENDING_VERSION]), _U16.pack(len(batch.subs))]
    for s in batch.subs:
        _put_text(out, s.topic)
        _put_text(out, s.partition)
        out.append(_SUB.pack(s.first_seq, len(s.row_ids)))
        out.append(struct.pack(f">{len(s.row_ids)}q", *s.row_ids))
    return b"".join(out)


def decode_pending(raw: bytes | None) -> PendingBatch | None:
    """Inverse of :func:`encode_pending` (None: nothing pending); ValueError when the
    bytes are not a pending batch of this version."""
    if not raw:
        return None
    buf = bytes(raw)
    if buf[0] != _PENDING_VERSION:
        raise ValueError(f"pending batch of unknown version {buf[0]}")
    try:
        (n,) = _U16.unpack_from(buf, 1)
        pos = 3
        subs: list[SubBatch] = []
        for _ in range(n):
            names: list[str] = []
            for _k in range(2):
                (ln,) = _U16.unpack_from(buf, pos)
                names.append(buf[pos + 2 : pos + 2 + ln].decode("utf-8"))
                pos += 2 + ln
            first, count = _SUB.unpack_from(buf, pos)
            pos += _SUB.size
            ids = struct.unpack_from(f">{count}q", buf, pos)
            pos += 8 * count
            subs.append(SubBatch(names[0], names[1], first, ids))
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"truncated pending batch: {e}") from None
    if pos != len(buf):
        raise ValueError(f"pending batch has {len(buf) - pos} trailing bytes")
    return PendingBatch(tuple(subs))


Seqs = dict[tuple[str, str], int]


def encode_seqs(seqs: Mapping[tuple[str, str], int]) -> str:
    """The ``seqs`` column: next sequence per (topic, partition)."""
    doc: dict[str, dict[str, int]] = {}
    for (topic, part), nxt in sorted(seqs.items()):
        doc.setdefault(topic, {})[part] = nxt
    return json.dumps(doc, separators=(",", ":"))


def decode_seqs(text: str | None) -> Seqs:
    """Inverse of :func:`encode_seqs`; ValueError when malformed."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
        out = {
            (str(t), str(p)): int(n)
            for t, parts in dict(doc).items()
            for p, n in dict(parts).items()
        }
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"malformed relay sequences: {e}") from None
    if any(n < 0 for n in out.values()):
        raise ValueError("negative relay sequence")
    return out


def seqs_after(seqs: Mapping[tuple[str, str], int], subs: Sequence[SubBatch]) -> Seqs:
    """``seqs`` once ``subs`` took their numbers."""
    out = dict(seqs)
    for s in subs:
        out[(s.topic, s.partition)] = max(out.get((s.topic, s.partition), 0), s.first_seq + s.count)
    return out
