"""Bodies of the queue-state log records (``<dataLogPath>/queues/``; the txlog frames them).

All integers big-endian; ``str`` is ``u16 length`` + UTF-8 bytes. ``state`` codes:
1 acknowledged, 2 rejected, 3 dead (delivery limit reached).

=======  ====  ===============================================================================
record   type  body
=======  ====  ===============================================================================
GROUP    1     topic:str group:str n:u32 n*(partition:u32 start:i64)
               a queue group was created (or grew partitions): where each partition starts
DONE     2     topic:str group:str n:u32 n*(partition:u32 offset:i64 next:i64 state:u8
               count:u16 at_ms:i64)   messages that reached a finished state (group-committed
               before the acknowledgement is answered); ``next`` is the offset after the
               record, so the low-water offset can pass it without reading the store
REPLAY   3     topic:str group:str n:u32 n*(partition:u32 offset:i64 length:u32)
               dead letters an admin sent back to available
DELIVER  4     topic:str group:str n:u32 n*(partition:u32 offset:i64 count:u16)
               messages pushed to consumers and their delivery counts (group-committed
               after the push): a restart resumes the counts, so the delivery limit holds
               across crashes
SNAPSHOT 5     index:u32 last:u8 chunk   one chunk (at most SNAPSHOT_CHUNK bytes) of the
               checkpoint state below; a checkpoint appends all chunks of its state (index 0,
               1, ...; ``last`` = 1 on the final one) and points at chunk 0, so the log alone
               holds the state and replicas (stream ``__queuelog``) need only its frames
ACKED    6     topic:str group:str n:u32 n*(partition:u32 from:i64 to:i64 at_ms:i64)
               ranges of accepted messages: every message whose record starts in
               ``[from, to)`` was acknowledged (a range holds whole records, ``to`` is the
               offset after its last one); what a ``qack`` accepts, one range per run
DELIVRUN 7     topic:str group:str n:u32 n*(partition:u32 count:u16 k:u32 k*offset:i64)
               DELIVER in runs: the ``k`` messages at these offsets were pushed with
               delivery count ``count``
DROP     8     topic:str group:str   the group was deleted (an admin's ``qdel`` / REST
               DELETE, or it expired with no consumer and nothing pending): it and its
               state are gone; a later GROUP record creates it anew
=======  ====  ===============================================================================

Records 6 and 7 replace DONE (for accepts) and DELIVER since the batched push: a broker
reads logs written before them (types 1-5) as they were, while an older broker does not
know them (a queue log written by this version needs this version or a newer one). An
older broker skips record 8: a group dropped would come back there.
A checkpoint's finished exceptions may span several records (``next`` beyond the first
record's end): consecutive accepted messages are kept as one range.

The checkpoint state (:func:`encode_snapshot`) is the compact form of every group:
``n:u32`` groups, each ``topic:str group:str parts:u32 parts*(partition:u32 low_water:i64
k:u32 k*(offset:i64 next:i64 state:u8 count:u16)) dead:u32 dead*(partition:u32 offset:i64
length:u32 count:u16 state:u8 at_ms:i64) replayed:u32 replayed*(partition:u32 offset:i64
length:u32)``, then (optional, absent in older checkpoints) ``m:u32 m*(group:u32
partition:u32 offset:i64 count:u16)``: delivery counts of unfinished messages, ``group``
indexing the groups above. Replay applies the records after the checkpoint on top of it; a
record about an offset below a partition's low-water offset changes nothing (idempotent).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from notify.errors import ProtocolError

GROUP: Final = 1
DONE: Final = 2
REPLAY: Final = 3
DELIVER: Final = 4
SNAPSHOT: Final = 5
ACKED: Final = 6
DELIVER_RUNS: Final = 7
DROP: Final = 8
#: Largest chunk of a SNAPSHOT record (a replication frame carries whole records).
SNAPSHOT_CHUNK: Final = 1 << 20

ACKNOWLEDGED: Final = 1
REJECTED: Final = 2
DEAD: Final = 3

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_START = struct.Struct(">Iq")
_DONE = struct.Struct(">IqqBHq")
_REPLAY = struct.Struct(">IqI")
_LOW = struct.Struct(">IqI")
_EXC = struct.Struct(">qqBH")
_DEAD = struct.Struct(">IqIHBq")
_DELIVER = struct.Struct(">IqH")
_COUNT = struct.Struct(">IIqH")
_CHUNK = struct.Struct(">IB")
_ACKED = struct.Struct(">Iqqq")
_RUN = struct.Struct(">IHI")


@dataclass(frozen=True, slots=True)
class DoneItem:
    partition: int
    offset: int
    next_offset: int
    state: int
    count: int
    at_ms: int


@dataclass(slots=True)
class GroupSnapshot:
    """The compact form of one queue group."""

    topic: str
    group: str
    #: partition -> (low-water offset, [(offset, next, state, count)] finished above it)
    parts: dict[int, tuple[int, list[tuple[int, int, int, int]]]] = field(default_factory=dict)
    #: (partition, offset, length, count, state, at_ms)
    dead: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    #: (partition, offset, length)
    replayed: list[tuple[int, int, int]] = field(default_factory=list)
    #: (partition, offset, delivery count) of unfinished messages delivered before
    counts: list[tuple[int, int, int]] = field(default_factory=list)


def _s(text: str) -> bytes:
    b = text.encode()
    return _U16.pack(len(b)) + b


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def s(self) -> str:
        (n,) = _U16.unpack_from(self.buf, self.pos)
        self.pos += 2
        out = self.buf[self.pos : self.pos + n].decode()
        self.pos += n
        return out

    def st(self, st: struct.Struct) -> tuple[int, ...]:
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v


def encode_group(topic: str, group: str, starts: dict[int, int]) -> bytes:
    return _s(topic) + _s(group) + _U32.pack(len(starts)) + b"".join(
        _START.pack(p, o) for p, o in sorted(starts.items())
    )


def decode_group(body: bytes) -> tuple[str, str, dict[int, int]]:
    try:
        r = _Reader(body)
        topic, group = r.s(), r.s()
        (n,) = r.st(_U32)
        starts = {}
        for _ in range(n):
            p, o = r.st(_START)
            starts[p] = o
        return topic, group, starts
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue GROUP record: {e}") from None


def encode_drop(topic: str, group: str) -> bytes:
    return _s(topic) + _s(group)


def decode_drop(body: bytes) -> tuple[str, str]:
    try:
        r = _Reader(body)
        return r.s(), r.s()
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue DROP record: {e}") from None


def encode_done(topic: str, group: str, items: list[DoneItem]) -> bytes:
    return encode_done_rows(
        topic,
        group,
        [(i.partition, i.offset, i.next_offset, i.state, i.count, i.at_ms) for i in items],
    )


def encode_done_rows(
    topic: str, group: str, rows: list[tuple[int, int, int, int, int, int]]
) -> bytes:
    """DONE body from ``(partition, offset, next_offset, state, count, at_ms)`` rows (the
    broker's per-acknowledgement path: no DoneItem per message)."""
    pack = _DONE.pack
    return _s(topic) + _s(group) + _U32.pack(len(rows)) + b"".join(
        [pack(p, o, nx, st, c if c < 65535 else 65535, at) for p, o, nx, st, c, at in rows]
    )


def decode_done(body: bytes) -> tuple[str, str, list[DoneItem]]:
    try:
        r = _Reader(body)
        topic, group = r.s(), r.s()
        (n,) = r.st(_U32)
        return topic, group, [DoneItem(*r.st(_DONE)) for _ in range(n)]
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue DONE record: {e}") from None


def encode_replay(topic: str, group: str, items: list[tuple[int, int, int]]) -> bytes:
    return _s(topic) + _s(group) + _U32.pack(len(items)) + b"".join(
        _REPLAY.pack(*i) for i in items
    )


def decode_replay(body: bytes) -> tuple[str, str, list[tuple[int, int, int]]]:
    try:
        r = _Reader(body)
        topic, group = r.s(), r.s()
        (n,) = r.st(_U32)
        out: list[tuple[int, int, int]] = []
        for _ in range(n):
            p, o, length = r.st(_REPLAY)
            out.append((p, o, length))
        return topic, group, out
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue REPLAY record: {e}") from None


def encode_deliver(topic: str, group: str, items: list[tuple[int, int, int]]) -> bytes:
    """DELIVER body: ``(partition, offset, count)`` items (count capped at 65535)."""
    return _s(topic) + _s(group) + _U32.pack(len(items)) + b"".join(
        _DELIVER.pack(p, o, min(c, 65535)) for p, o, c in items
    )


def decode_deliver(body: bytes) -> tuple[str, str, list[tuple[int, int, int]]]:
    try:
        r = _Reader(body)
        topic, group = r.s(), r.s()
        (n,) = r.st(_U32)
        out: list[tuple[int, int, int]] = []
        for _ in range(n):
            p, o, c = r.st(_DELIVER)
            out.append((p, o, c))
        return topic, group, out
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue DELIVER record: {e}") from None


def encode_acked(topic: str, group: str, ranges: list[tuple[int, int, int]], at_ms: int) -> bytes:
    """ACKED body: ``(partition, from, to)`` ranges of accepted messages."""
    pack = _ACKED.pack
    return _s(topic) + _s(group) + _U32.pack(len(ranges)) + b"".join(
        [pack(p, a, b, at_ms) for p, a, b in ranges]
    )


def decode_acked(body: bytes) -> tuple[str, str, list[tuple[int, int, int, int]]]:
    """``(topic, group, [(partition, from, to, at_ms)])`` of an ACKED record."""
    try:
        r = _Reader(body)
        topic, group = r.s(), r.s()
        (n,) = r.st(_U32)
        out: list[tuple[int, int, int, int]] = []
        for _ in range(n):
            p, a, b, at = r.st(_ACKED)
            if b <= a:
                raise struct.error(f"empty range {a}..{b}")
            out.append((p, a, b, at))
        return topic, group, out
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue ACKED record: {e}") from None


def encode_deliver_runs(
    topic: str, group: str, runs: list[tuple[int, int, list[int]]]
) -> bytes:
    """DELIVRUN body: ``(partition, count, offsets)`` runs (count capped at 65535)."""
    out = [_s(topic), _s(group), _U32.pack(len(runs))]
    for p, c, offs in runs:
        out.append(_RUN.pack(p, min(c, 65535), len(offs)))
        out.append(struct.pack(f">{len(offs)}q", *offs))
    return b"".join(out)


def decode_deliver_runs(body: bytes) -> tuple[str, str, list[tuple[int, int, int]]]:
    """``(topic, group, [(partition, offset, count)])`` of a DELIVRUN record."""
    try:
        r = _Reader(body)
        topic, group = r.s(), r.s()
        (n,) = r.st(_U32)
        out: list[tuple[int, int, int]] = []
        for _ in range(n):
            p, c, k = r.st(_RUN)
            offs = struct.unpack_from(f">{k}q", r.buf, r.pos)
            r.pos += 8 * k
            out += [(p, o, c) for o in offs]
        return topic, group, out
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue DELIVRUN record: {e}") from None


def encode_snapshot(groups: list[GroupSnapshot]) -> bytes:
    out = [_U32.pack(len(groups))]
    for g in groups:
        out += [_s(g.topic), _s(g.group), _U32.pack(len(g.parts))]
        for p, (low, fin) in sorted(g.parts.items()):
            out.append(_LOW.pack(p, low, len(fin)))
            out += [_EXC.pack(o, nxt, st, min(c, 65535)) for o, nxt, st, c in fin]
        out.append(_U32.pack(len(g.dead)))
        out += [_DEAD.pack(p, o, ln, min(c, 65535), st, at) for p, o, ln, c, st, at in g.dead]
        out.append(_U32.pack(len(g.replayed)))
        out += [_REPLAY.pack(*x) for x in g.replayed]
    counts = [(i, p, o, c) for i, g in enumerate(groups) for p, o, c in g.counts]
    out.append(_U32.pack(len(counts)))
    out += [_COUNT.pack(i, p, o, min(c, 65535)) for i, p, o, c in counts]
    return b"".join(out)


def decode_snapshot(body: bytes) -> list[GroupSnapshot]:
    if not body:
        return []
    try:
        r = _Reader(body)
        (n,) = r.st(_U32)
        out = []
        for _ in range(n):
            g = GroupSnapshot(r.s(), r.s())
            (np_,) = r.st(_U32)
            for _ in range(np_):
                p, low, k = r.st(_LOW)
                fin: list[tuple[int, int, int, int]] = []
                for _ in range(k):
                    o, nxt, st, c = r.st(_EXC)
                    fin.append((o, nxt, st, c))
                g.parts[p] = (low, fin)
            (nd,) = r.st(_U32)
            for _ in range(nd):
                p, o, ln, c, st, at = r.st(_DEAD)
                g.dead.append((p, o, ln, c, st, at))
            (nr,) = r.st(_U32)
            for _ in range(nr):
                p, o, ln = r.st(_REPLAY)
                g.replayed.append((p, o, ln))
            out.append(g)
        if r.pos < len(body):  # delivery counts (checkpoints written since they exist)
            (m,) = r.st(_U32)
            for _ in range(m):
                i, p, o, c = r.st(_COUNT)
                if i >= len(out):
                    raise struct.error(f"delivery count of group #{i} of {len(out)}")
                out[i].counts.append((p, o, c))
        return out
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"corrupt queue checkpoint state: {e}") from None


def encode_snapshot_chunks(state: bytes) -> list[bytes]:
    """The SNAPSHOT record bodies carrying ``state`` (at least one)."""
    n = max(1, -(-len(state) // SNAPSHOT_CHUNK))
    return [
        _CHUNK.pack(i, i == n - 1) + state[i * SNAPSHOT_CHUNK : (i + 1) * SNAPSHOT_CHUNK]
        for i in range(n)
    ]


def decode_snapshot_chunk(body: bytes) -> tuple[int, bool, bytes]:
    """``(index, last, chunk)`` of a SNAPSHOT record."""
    try:
        i, last = _CHUNK.unpack_from(body, 0)
    except struct.error as e:
        raise ProtocolError(f"corrupt queue SNAPSHOT record: {e}") from None
    return i, bool(last), body[_CHUNK.size :]


class SnapshotAssembler:
    """Joins the SNAPSHOT chunks met while reading the log; a chunk out of sequence (the
    log was read from the middle of a snapshot) drops what was gathered until a chunk 0."""

    def __init__(self) -> None:
        self._chunks: list[bytes] | None = None

    def add(self, body: bytes) -> bytes | None:
        """The whole state once ``body`` was its last chunk, else None."""
        i, last, chunk = decode_snapshot_chunk(body)
        if i == 0:
            self._chunks = []
        if self._chunks is None or i != len(self._chunks):
            self._chunks = None
            return None
        self._chunks.append(chunk)
        if not last:
            return None
        out, self._chunks = b"".join(self._chunks), None
        return out
