"""Decision-log records of the 2PC coordinator: bodies in, bodies out, no I/O.

The txlog frames every record (``u32 length · u32 crc32 · u8 type · body``, see
:mod:`txlog.records`); this module only encodes bodies. All integers big-endian;
``str`` is ``u16 length`` + UTF-8, ``bin`` is ``u16 length`` + bytes.

=========  ====  ===========================================================================
record     type  body
=========  ====  ===========================================================================
DECISION   7     version:u8 (1) · outcome:u8 (1 commit, 2 rollback) · source:u8
                 (0 coordinator, 1 admin) · decided_at_ms:i64 · deadline_s:i64 ·
                 format_id:i32 · gtrid:bin · by:str · n:u16 · n * (name:str · bqual:bin)
                 The coordinator writes only commit decisions, fsynced before phase 2
                 (presumed abort: no record means rollback). An admin's decision (either
                 outcome) replaces an earlier decision for the same gtrid.
END        8     version:u8 (1) · gtrid:bin · at_ms:i64
                 Phase 2 finished for every branch: the decision may be forgotten.
                 Appended without fsync; losing it only makes recovery look again.
HEURISTIC  20    version:u8 (1) · gtrid:bin · name:str · bqual:bin · kind:u8
                 (1 commit, 2 rollback, 3 mixed, 4 hazard) · decided:u8 (0 none, 1 commit,
                 2 rollback) · source:u8 · at_ms:i64 · message:str
                 A branch whose outcome differs from the decision; fsynced; kept (and
                 listed) until acknowledged.
ACK        21    version:u8 (1) · gtrid:bin · at_ms:i64 · by:str
                 An admin acknowledged (forgot) the heuristic reports of gtrid.
=========  ====  ===========================================================================

Checkpoint state (the txlog's opaque checkpoint blob): a snapshot of everything still live,
so replay starts at the checkpoint and the log never grows with old transactions::

    magic:4 ("NXAS") · version:u8 (1) · coordinator_id:str · format_id:i32 ·
    n:u32 · n * (type:u8 · length:u32 · body)      (DECISION and HEURISTIC bodies as above)

:class:`DecisionTable` is the state those records describe; :meth:`DecisionTable.apply`
folds one record into it, the same way at run time and at replay.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Final

from notify.errors import TxLogCorruptError


class HeuristicKind(Enum):
    """What a branch did on its own, against (or without) the coordinator's decision."""

    COMMIT = 1  # committed
    ROLLBACK = 2  # rolled back
    MIXED = 3  # partly committed, partly rolled back
    HAZARD = 4  # unknown: the branch vanished or cannot tell


DECISION: Final = 7
END: Final = 8
HEURISTIC: Final = 20
ACK: Final = 21

_VERSION: Final = 1
SNAPSHOT_MAGIC: Final = b"NXAS"

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_DEC_HEAD = struct.Struct(">BBBqqi")
_HEUR_MID = struct.Struct(">BBBq")


class Outcome(IntEnum):
    """A decision's outcome (0 in a HEURISTIC record means "no decision existed")."""

    NONE = 0
    COMMIT = 1
    ROLLBACK = 2


class Source(IntEnum):
    """Who made a decision or saw a heuristic."""

    COORDINATOR = 0
    ADMIN = 1


@dataclass(frozen=True, slots=True)
class Branch:
    """One branch of a decided transaction: participant name and bqual."""

    name: str
    bqual: bytes


@dataclass(frozen=True, slots=True)
class Decision:
    """A durable decision for transaction ``gtrid``."""

    gtrid: bytes
    outcome: Outcome
    source: Source
    decided_at_ms: int
    deadline_s: int
    format_id: int
    branches: tuple[Branch, ...]
    by: str = ""


@dataclass(frozen=True, slots=True)
class EndRecord:
    """Phase 2 of ``gtrid`` is finished."""

    gtrid: bytes
    at_ms: int


@dataclass(frozen=True, slots=True)
class HeuristicRecord:
    """A branch whose outcome differs from the decision."""

    gtrid: bytes
    name: str
    bqual: bytes
    kind: HeuristicKind
    decided: Outcome
    source: Source
    at_ms: int
    message: str


@dataclass(frozen=True, slots=True)
class AckRecord:
    """An admin forgot the heuristic reports of ``gtrid``."""

    gtrid: bytes
    at_ms: int
    by: str


Record = Decision | EndRecord | HeuristicRecord | AckRecord


class _Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def st(self, s: struct.Struct, *v: int) -> _Writer:
        self.parts.append(s.pack(*v))
        return self

    def bin(self, b: bytes) -> _Writer:
        if len(b) > 0xFFFF:
            raise ValueError("field longer than 65535 bytes")
        self.parts.append(_U16.pack(len(b)) + b)
        return self

    def str(self, s: str) -> _Writer:
        return self.bin(s.encode("utf-8"))

    def done(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def st(self, s: struct.Struct) -> tuple[int, ...]:
        if self.pos + s.size > len(self.buf):
            raise ValueError("record body cut short")
        v = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return tuple(int(x) for x in v)

    def bin(self) -> bytes:
        (n,) = self.st(_U16)
        if self.pos + n > len(self.buf):
            raise ValueError("field runs past the record")
        v = self.buf[self.pos : self.pos + n]
        self.pos += n
        return v

    def str(self) -> str:
        return self.bin().decode("utf-8")

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise ValueError(f"{len(self.buf) - self.pos} trailing bytes")


def encode(rec: Record) -> tuple[int, bytes]:
    """``(record type, body)`` of a record."""
    w = _Writer()
    if isinstance(rec, Decision):
        w.st(
            _DEC_HEAD,
            _VERSION,
            rec.outcome,
            rec.source,
            rec.decided_at_ms,
            rec.deadline_s,
            rec.format_id,
        )
        w.bin(rec.gtrid).str(rec.by).st(_U16, len(rec.branches))
        for b in rec.branches:
            w.str(b.name).bin(b.bqual)
        return DECISION, w.done()
    if isinstance(rec, EndRecord):
        return END, w.st(_U8, _VERSION).bin(rec.gtrid).st(_I64, rec.at_ms).done()
    if isinstance(rec, HeuristicRecord):
        w.st(_U8, _VERSION).bin(rec.gtrid).str(rec.name).bin(rec.bqual)
        w.st(_HEUR_MID, rec.kind.value, rec.decided, rec.source, rec.at_ms)
        return HEURISTIC, w.str(rec.message).done()
    w.st(_U8, _VERSION).bin(rec.gtrid).st(_I64, rec.at_ms).str(rec.by)
    return ACK, w.done()


def decode(rtype: int, body: bytes) -> Record:
    """Decode a body of type ``rtype``; :class:`~notify.errors.TxLogCorruptError` if bad."""
    try:
        r = _Reader(body)
        rec: Record
        if rtype == DECISION:
            ver, outcome, source, at, deadline, fmt = r.st(_DEC_HEAD)
            _check_version(ver)
            gtrid = r.bin()
            by = r.str()
            (n,) = r.st(_U16)
            branches = tuple(Branch(r.str(), r.bin()) for _ in range(n))
            rec = Decision(gtrid, Outcome(outcome), Source(source), at, deadline, fmt, branches, by)
        elif rtype == END:
            _check_version(r.st(_U8)[0])
            gtrid = r.bin()
            rec = EndRecord(gtrid, r.st(_I64)[0])
        elif rtype == HEURISTIC:
            _check_version(r.st(_U8)[0])
            gtrid, name, bqual = r.bin(), r.str(), r.bin()
            kind, decided, source, at = r.st(_HEUR_MID)
            rec = HeuristicRecord(
                gtrid,
                name,
                bqual,
                HeuristicKind(kind),
                Outcome(decided),
                Source(source),
                at,
                r.str(),
            )
        elif rtype == ACK:
            _check_version(r.st(_U8)[0])
            gtrid = r.bin()
            at = r.st(_I64)[0]
            rec = AckRecord(gtrid, at, r.str())
        else:
            raise ValueError(f"unknown record type {rtype}")
        r.end()
        return rec
    except (ValueError, UnicodeDecodeError) as e:
        raise TxLogCorruptError(f"bad decision-log record (type {rtype}): {e}") from None


def _check_version(v: int) -> None:
    if v != _VERSION:
        raise ValueError(f"unsupported record version {v}")


@dataclass
class DecisionTable:
    """Live decisions and unacknowledged heuristic reports, keyed by gtrid."""

    coordinator_id: str
    format_id: int
    decisions: dict[bytes, Decision] = field(default_factory=dict)
    heuristics: dict[bytes, list[HeuristicRecord]] = field(default_factory=dict)

    def apply(self, rec: Record) -> None:
        """Fold one record into the table (idempotent for END and ACK)."""
        if isinstance(rec, Decision):
            self.decisions[rec.gtrid] = rec
        elif isinstance(rec, EndRecord):
            self.decisions.pop(rec.gtrid, None)
        elif isinstance(rec, HeuristicRecord):
            self.heuristics.setdefault(rec.gtrid, []).append(rec)
        else:
            self.heuristics.pop(rec.gtrid, None)

    def snapshot(self) -> bytes:
        """The checkpoint state blob (see the module docstring)."""
        items: list[Record] = [*self.decisions.values()]
        for hs in self.heuristics.values():
            items.extend(hs)
        w = _Writer()
        w.parts.append(SNAPSHOT_MAGIC)
        w.st(_U8, _VERSION).str(self.coordinator_id).st(_I32, self.format_id)
        w.st(_U32, len(items))
        for rec in items:
            rtype, body = encode(rec)
            w.st(_U8, rtype).st(_U32, len(body))
            w.parts.append(body)
        return w.done()

    @classmethod
    def from_snapshot(cls, blob: bytes) -> DecisionTable:
        """Inverse of :meth:`snapshot`; TxLogCorruptError when ``blob`` is not one."""
        if blob[:4] != SNAPSHOT_MAGIC:
            raise TxLogCorruptError("checkpoint state is not a decision-log snapshot")
        try:
            r = _Reader(blob)
            r.pos = 4
            _check_version(r.st(_U8)[0])
            cid = r.str()
            (fmt,) = r.st(_I32)
            table = cls(cid, fmt)
            (n,) = r.st(_U32)
            for _ in range(n):
                (rtype,) = r.st(_U8)
                (size,) = r.st(_U32)
                if r.pos + size > len(blob):
                    raise ValueError("snapshot entry runs past the blob")
                body = blob[r.pos : r.pos + size]
                r.pos += size
                table.apply(decode(rtype, body))
            r.end()
        except (ValueError, UnicodeDecodeError) as e:
            raise TxLogCorruptError(f"bad decision-log snapshot: {e}") from None
        return table
