"""Bodies of the broker's redo-log records (the txlog frames them: length, CRC, type).

All integers big-endian; ``str`` is ``u16 length`` + UTF-8 bytes.

=============  ====  ==========================================================================
record         type  body
=============  ====  ==========================================================================
APPEND_MSG     1     key:str topic:str partition:u32 count:u32 records:rest
                     (``records`` are ``count`` whole records in the partition layout,
                     message ids already assigned: applying a commit writes these bytes)
PREPARE        2     key:str prepared_at_ms:i64 timeout_s:u32 group:str
                     (``group`` = producer group to check back with, empty for none)
COMMIT         3     key:str decided_at_ms:i64 n:u16 n*(topic:str partition:u32 hint:i64)
                     the commit decision, durable before any message is applied; ``hint``
                     is the partition's end when the decision was written: the messages
                     go at or after it
ROLLBACK       4     key:str reason:str
APPLIED        9     key:str n:u16 n*(topic:str partition:u32 offset:i64 count:u32 bytes:u64)
                     where the messages went; never forced: written with the next redo
                     write after the apply (at once after a recovery's re-apply, which
                     may land below the COMMIT's hint) and before every checkpoint
HEURISTIC      10    key:str outcome:u8 (1 commit, 2 rollback) by:str  (an admin's decision)
FORGET         8     key:str
=============  ====  ==========================================================================

A transaction whose BEGIN, puts and COMMIT_ONE_PHASE arrive together writes its APPEND_MSG
records and its COMMIT in one write (``TxLog.append_many``): the same records, so recovery
reads them as any other.

Recovery replays these in order: a key with COMMIT but no APPLIED is applied again
idempotently (the messages' ids tell what is already in the partition); a key with
APPEND_MSG and no decision is rolled back; a PREPARED key comes back PREPARED.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

APPEND_MSG: Final = 1
PREPARE: Final = 2
COMMIT: Final = 3
ROLLBACK: Final = 4
FORGET: Final = 8
APPLIED: Final = 9
HEURISTIC: Final = 10

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U8 = struct.Struct(">B")
_PREP = struct.Struct(">qI")
_HINT = struct.Struct(">Iq")
_PLACE = struct.Struct(">IqIQ")
_U32U32 = struct.Struct(">II")
_I64U16 = struct.Struct(">qH")


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def s(self) -> str:
        (n,) = _U16.unpack_from(self.buf, self.pos)
        self.pos += 2
        v = self.buf[self.pos : self.pos + n].decode("utf-8")
        if len(v.encode()) != n:
            raise ValueError("string runs past the record")
        self.pos += n
        return v

    def st(self, st: struct.Struct) -> tuple[int, ...]:
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return tuple(int(x) for x in v)

    def rest(self) -> bytes:
        v = self.buf[self.pos :]
        self.pos = len(self.buf)
        return v


def _s(v: str) -> bytes:
    b = v.encode("utf-8")
    return _U16.pack(len(b)) + b


def key_of(body: bytes) -> str:
    """The transaction key every record body starts with."""
    return _Reader(body).s()


@dataclass(slots=True)
class AppendMsg:
    key: str
    topic: str
    partition: int
    count: int
    records: bytes

    def encode(self) -> bytes:
        key = self.key.encode("utf-8")
        topic = self.topic.encode("utf-8")
        return b"".join(
            (
                _U16.pack(len(key)),
                key,
                _U16.pack(len(topic)),
                topic,
                _U32U32.pack(self.partition, self.count),
                self.records,
            )
        )

    @classmethod
    def decode(cls, body: bytes) -> AppendMsg:
        r = _Reader(body)
        key, topic = r.s(), r.s()
        (part,) = r.st(_U32)
        (count,) = r.st(_U32)
        return cls(key, topic, part, count, r.rest())


@dataclass(slots=True)
class Prepare:
    key: str
    prepared_at_ms: int
    timeout_s: int
    group: str

    def encode(self) -> bytes:
        return _s(self.key) + _PREP.pack(self.prepared_at_ms, self.timeout_s) + _s(self.group)

    @classmethod
    def decode(cls, body: bytes) -> Prepare:
        r = _Reader(body)
        key = r.s()
        at, timeout = r.st(_PREP)
        return cls(key, at, timeout, r.s())


@dataclass(slots=True)
class Commit:
    key: str
    decided_at_ms: int
    hints: tuple[tuple[str, int, int], ...]  # (topic, partition, end offset at decision)

    def encode(self) -> bytes:
        key = self.key.encode("utf-8")
        hints = self.hints
        parts = [_U16.pack(len(key)), key, _I64U16.pack(self.decided_at_ms, len(hints))]
        add = parts.append
        for topic, part, hint in hints:
            t = topic.encode("utf-8")
            add(_U16.pack(len(t)))
            add(t)
            add(_HINT.pack(part, hint))
        return b"".join(parts)

    @classmethod
    def decode(cls, body: bytes) -> Commit:
        r = _Reader(body)
        key = r.s()
        (at,) = r.st(_I64)
        (n,) = r.st(_U16)
        hints = []
        for _ in range(n):
            topic = r.s()
            part, hint = r.st(_HINT)
            hints.append((topic, part, hint))
        return cls(key, at, tuple(hints))


@dataclass(slots=True)
class Applied:
    key: str
    placements: tuple[tuple[str, int, int, int, int], ...]  # topic, partition, offset, n, bytes

    def encode(self) -> bytes:
        key = self.key.encode("utf-8")
        placements = self.placements
        parts = [_U16.pack(len(key)), key, _U16.pack(len(placements))]
        add = parts.append
        for topic, part, off, n, nbytes in placements:
            t = topic.encode("utf-8")
            add(_U16.pack(len(t)))
            add(t)
            add(_PLACE.pack(part, off, n, nbytes))
        return b"".join(parts)

    @classmethod
    def decode(cls, body: bytes) -> Applied:
        r = _Reader(body)
        key = r.s()
        (n,) = r.st(_U16)
        out = []
        for _ in range(n):
            topic = r.s()
            part, off, count, nbytes = r.st(_PLACE)
            out.append((topic, part, off, count, nbytes))
        return cls(key, tuple(out))


@dataclass(slots=True)
class Rollback:
    key: str
    reason: str

    def encode(self) -> bytes:
        return _s(self.key) + _s(self.reason)

    @classmethod
    def decode(cls, body: bytes) -> Rollback:
        r = _Reader(body)
        return cls(r.s(), r.s())


@dataclass(slots=True)
class Heuristic:
    key: str
    commit: bool
    by: str

    def encode(self) -> bytes:
        return _s(self.key) + _U8.pack(1 if self.commit else 2) + _s(self.by)

    @classmethod
    def decode(cls, body: bytes) -> Heuristic:
        r = _Reader(body)
        key = r.s()
        (outcome,) = r.st(_U8)
        return cls(key, outcome == 1, r.s())


@dataclass(slots=True)
class Forget:
    key: str

    def encode(self) -> bytes:
        return _s(self.key)

    @classmethod
    def decode(cls, body: bytes) -> Forget:
        return cls(_Reader(body).s())
