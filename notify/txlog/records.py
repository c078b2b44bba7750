"""Record codec of the redo transaction log: bytes in, bytes out, no I/O.

Byte layout of one record (a *frame*), all integers big-endian::

    offset  size  field
    0       4     length   u32, number of bytes of ``type`` + ``body`` (always >= 1)
    4       4     crc      u32, ``zlib.crc32(type byte + body)``
    8       1     type     u8, 1..255 (see :class:`RecordType`; 0 is never written)
    9       n     body     opaque bytes, ``n = length - 1``

A frame therefore occupies ``8 + length`` bytes. Frames are written back to back with no
padding, so a segment file is simply a sequence of frames. Bodies are opaque to the log: the
broker and the 2PC coordinator encode their own.

:func:`decode` scans a buffer frame by frame and stops at the first frame that is not intact,
reporting why (:class:`CorruptReason`): a header cut short, a body cut short (the length runs
past the end of the buffer), a length above the maximum record size, a zero length, a CRC
mismatch, or a zero-filled area (what a crashed file system leaves in pre-allocated blocks).
The caller (log recovery) decides whether that is a torn tail to truncate or real corruption.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from enum import IntEnum, StrEnum
from typing import Final, NamedTuple

from notify.errors import TxLogError

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "HEADER",
    "CorruptReason",
    "DecodeResult",
    "Record",
    "RecordType",
    "decode",
    "encode",
    "encode_many",
    "frame_size",
    "header_error",
    "record_type",
]

#: Bytes of the ``length`` and ``crc`` fields that precede the type byte.
HEADER = 8
#: Default upper bound of a record body (the ``length`` field may be at most this + 1).
DEFAULT_MAX_RECORD_BYTES = 16 * 2**20

_HDR = struct.Struct(">II")
_HDR_TYPE = struct.Struct(">IIB")
_MAX_TYPE = 255


class RecordType(IntEnum):
    """Well-known record types. Any int 1..255 is accepted; these are the reserved ones."""

    APPEND_MSG = 1
    PREPARE = 2
    COMMIT = 3
    ROLLBACK = 4
    BEGIN = 5
    CHECKPOINT = 6  # reserved: used by the checkpoint file, never appended to redo files
    DECISION = 7
    FORGET = 8


_KNOWN_TYPES: dict[int, RecordType] = {int(t): t for t in RecordType}


def record_type(value: int) -> RecordType | int:
    """Return ``value`` as a :class:`RecordType` member when it is one, else the plain int."""
    return _KNOWN_TYPES.get(value, value)


class CorruptReason(StrEnum):
    """Why :func:`decode` stopped before the end of its buffer."""

    TRUNCATED_HEADER = "truncated header"
    TRUNCATED_RECORD = "length larger than the remaining bytes"
    TOO_LARGE = "length beyond the maximum record size"
    BAD_LENGTH = "zero length"
    CRC_MISMATCH = "crc mismatch"
    BAD_TYPE = "record type 0"
    ZERO_FILLED = "zero-filled area"


class Record(NamedTuple):
    """One decoded frame; ``offset`` is where the frame starts in the decoded buffer."""

    offset: int
    type: RecordType | int
    body: bytes


class DecodeResult(NamedTuple):
    """Outcome of :func:`decode`.

    ``records`` are the intact frames from the start of the buffer, ``consumed`` the number of
    bytes they occupy, and ``error`` is ``None`` when the whole buffer was consumed, or the
    reason the frame at offset ``consumed`` could not be decoded.
    """

    records: list[Record]
    consumed: int
    error: CorruptReason | None


#: CRC32 of each record type's byte: where a frame's checksum starts
_TYPE_CRC: Final = tuple(zlib.crc32(bytes((t,))) for t in range(256))


def _check(rtype: int, body: bytes, max_record_bytes: int) -> None:
    if not 1 <= rtype <= _MAX_TYPE:
        raise TxLogError(f"record type must be in 1..255, got {rtype}")
    if len(body) > max_record_bytes:
        raise TxLogError(f"record body of {len(body)} bytes exceeds the maximum {max_record_bytes}")


def encode(
    rtype: int, body: bytes = b"", *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> bytes:
    """Encode one record as a frame.

    Raises :class:`~notify.errors.TxLogError` when ``rtype`` is outside 1..255 or the body is
    larger than ``max_record_bytes``.
    """
    if not 1 <= rtype <= _MAX_TYPE or len(body) > max_record_bytes:
        _check(rtype, body, max_record_bytes)  # raises, saying which
    crc = zlib.crc32(body, _TYPE_CRC[rtype])
    return _HDR_TYPE.pack(len(body) + 1, crc, rtype) + body


def encode_many(
    records: Iterable[tuple[int, bytes]], *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> bytes:
    """Encode ``(type, body)`` pairs as consecutive frames in one buffer."""
    return b"".join(encode(t, b, max_record_bytes=max_record_bytes) for t, b in records)


def frame_size(buf: bytes | memoryview, offset: int = 0) -> int | None:
    """Total size of the frame starting at ``offset``, or ``None`` if the header is incomplete."""
    if len(buf) - offset < HEADER:
        return None
    length, _ = _HDR.unpack_from(buf, offset)
    return HEADER + int(length)


def header_error(length: int, crc: int, max_length: int) -> CorruptReason | None:
    """What a frame header alone shows to be wrong (``max_length``: the largest frame
    length allowed), or None: the one check of every reader of the redo log."""
    if length == 0:
        return CorruptReason.ZERO_FILLED if crc == 0 else CorruptReason.BAD_LENGTH
    if length > max_length:
        return CorruptReason.TOO_LARGE
    return None


def decode(
    buf: bytes | bytearray | memoryview, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> DecodeResult:
    """Decode consecutive frames from the start of ``buf`` until its end or the first bad frame.

    Never returns a frame whose CRC does not match; see :class:`DecodeResult`.
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    out: list[Record] = []
    max_length = max_record_bytes + 1
    error: CorruptReason | None = None
    while pos < end:
        remaining = end - pos
        if remaining < HEADER:
            tail = view[pos:end]
            error = CorruptReason.ZERO_FILLED if not any(tail) else CorruptReason.TRUNCATED_HEADER
            break
        length, crc = _HDR.unpack_from(view, pos)
        error = header_error(length, crc, max_length)
        if error is not None:
            break
        if HEADER + length > remaining:
            error = CorruptReason.TRUNCATED_RECORD
            break
        payload = view[pos + HEADER : pos + HEADER + length]
        if zlib.crc32(payload) != crc:
            error = CorruptReason.CRC_MISMATCH
            break
        rtype = payload[0]
        if rtype == 0:
            error = CorruptReason.BAD_TYPE
            break
        out.append(Record(pos, _KNOWN_TYPES.get(rtype, rtype), bytes(payload[1:])))
        pos += HEADER + length
    return DecodeResult(out, pos, error)
