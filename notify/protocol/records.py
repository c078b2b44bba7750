"""Message records: the one byte layout shared by the segment files and the ``get`` reply.

Pure functions over bytes; no I/O. All integers big-endian (MetaQ 1.4 layout)::

    offset  size  field
    0       4     length    int32, payload length in bytes (attribute block included)
    4       4     checksum  int32, zlib.crc32(payload) & 0x7FFFFFFF
    8       8     msgId     int64, snowflake-like id assigned by the broker
    16      4     flag      int32, bit 0 (FLAG_ATTRIBUTE) = payload starts with an attribute
    20      len   payload

    payload when flag & 1:
    0       4     attrLen   int32, length of the UTF-8 attribute
    4       n     attribute UTF-8 text
    4+n     ...   body      the application's bytes

A record is 20 + length bytes. Offsets in a partition are byte offsets of the first header
byte; records never span segment files.
"""

from __future__ import annotations

import gc
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from operator import add
from typing import NamedTuple, TypeVar

from notify.protocol import hotpath
from notify.protocol.accel import NATIVE

HEADER = struct.Struct(">iiqi")
HEADER_SIZE = HEADER.size  # 20
FLAG_ATTRIBUTE = 1
_ATTR_LEN = struct.Struct(">i")
_CRC_MASK = 0x7FFFFFFF


def checksum(payload: bytes | memoryview) -> int:
    """MetaQ's message checksum: CRC32 of the payload masked to a positive int32."""
    return zlib.crc32(payload) & _CRC_MASK


def make_payload(body: bytes, attribute: str | None) -> tuple[bytes, int]:
    """Return ``(payload, flag)`` for a body and optional attribute, as MetaQ clients build it."""
    if attribute is None:
        return body, 0
    attr = attribute.encode("utf-8")
    return _ATTR_LEN.pack(len(attr)) + attr + body, FLAG_ATTRIBUTE


def split_payload(payload: bytes, flag: int) -> tuple[str | None, bytes]:
    """Inverse of :func:`make_payload`: ``(attribute, body)``.

    Raises ValueError when the attribute block does not fit in the payload.
    """
    if not flag & FLAG_ATTRIBUTE:
        return None, payload
    if len(payload) < 4:
        raise ValueError("payload too short for its attribute length")
    (n,) = _ATTR_LEN.unpack_from(payload, 0)
    if n < 0 or 4 + n > len(payload):
        raise ValueError(f"attribute length {n} does not fit a {len(payload)}-byte payload")
    return payload[4 : 4 + n].decode("utf-8"), payload[4 + n :]


def encode(msg_id: int, flag: int, payload: bytes, crc: int | None = None) -> bytes:
    """Encode one record (header + payload)."""
    if crc is None:
        crc = checksum(payload)
    return HEADER.pack(len(payload), crc, msg_id, flag) + payload


def encode_batch(payloads: Sequence[bytes], flag: int = 0, msg_id: int = 0) -> bytes:
    """Encode records for ``payloads`` (all with ``flag`` and ``msg_id``) back to back, in
    one join: the body of an ``mput``. Equal to ``b"".join(encode(msg_id, flag, p) ...)``."""
    pack = HEADER.pack
    crc32 = zlib.crc32
    m = _CRC_MASK
    parts: list[bytes] = [b""] * (2 * len(payloads))
    parts[::2] = [pack(len(p), crc32(p) & m, msg_id, flag) for p in payloads]
    parts[1::2] = payloads
    return b"".join(parts)


def record_offsets(first_offset: int, payloads: Sequence[bytes]) -> list[int]:
    """Byte offsets of the records of ``payloads`` written back to back from
    ``first_offset`` (computed in C: no per-record Python frame)."""
    if not payloads:
        return []
    prefix = accumulate(map(len, payloads[:-1]), initial=first_offset)
    return list(map(add, prefix, range(0, HEADER_SIZE * len(payloads), HEADER_SIZE)))


class Record(NamedTuple):
    """One decoded record. ``offset`` is its byte offset in the partition."""

    offset: int
    msg_id: int
    flag: int
    payload: bytes

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.payload)

    @property
    def attribute(self) -> str | None:
        return split_payload(self.payload, self.flag)[0]

    @property
    def body(self) -> bytes:
        return split_payload(self.payload, self.flag)[1]


class CorruptRecordError(ValueError):
    """A record whose length or checksum is invalid (not merely incomplete)."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


def scan(
    buf: bytes | bytearray | memoryview,
    max_payload: int = 2**31 - 1,
    reject_zero_id: bool = True,
) -> tuple[int, str | None]:
    """Validate whole records at the start of ``buf`` without building objects.

    Returns ``(valid_bytes, reason)``: ``valid_bytes`` is the length of the prefix made of
    whole, checksum-correct records; ``reason`` is None when the buffer ends exactly on a
    record boundary, otherwise why scanning stopped (``"incomplete header"``,
    ``"incomplete payload"``, ``"bad length"``, ``"checksum mismatch"``, ``"zero msgId"``).
    The broker never assigns message id 0, so a zero id (a zero-filled area a crash left
    behind, which would otherwise pass as an empty record with CRC 0) ends the valid prefix.
    """
    mv = memoryview(buf)
    n = len(mv)
    pos = 0
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    while pos < n:
        if n - pos < HEADER_SIZE:
            return pos, "incomplete header"
        length, crc, mid, _flag = unpack(mv, pos)
        if length < 0 or length > max_payload:
            return pos, "bad length"
        if mid == 0 and reject_zero_id:
            return pos, "zero msgId"
        end = pos + HEADER_SIZE + length
        if end > n:
            return pos, "incomplete payload"
        if crc32(mv[pos + HEADER_SIZE : end]) & _CRC_MASK != crc:
            return pos, "checksum mismatch"
        pos = end
    return pos, None


def decode_all(
    buf: bytes | bytearray | memoryview, base_offset: int = 0, verify: bool = True
) -> tuple[list[Record], int]:
    """Decode the whole records at the start of ``buf``.

    Returns ``(records, consumed)``. A trailing partial record (a fetch window that ends
    mid-record) is not an error: it is left unconsumed. A record whose checksum does not
    match raises :class:`CorruptRecordError` when ``verify`` is set.
    """
    data = bytes(buf) if not isinstance(buf, bytes) else buf
    n = len(data)
    pos = 0
    out: list[Record] = []
    append = out.append
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    new = tuple.__new__
    while n - pos >= HEADER_SIZE:
        length, crc, mid, flag = unpack(data, pos)
        if length < 0:
            raise CorruptRecordError(f"negative record length {length}", base_offset + pos)
        start = pos + HEADER_SIZE
        end = start + length
        if end > n:
            break
        payload = data[start:end]
        if verify and crc32(payload) & _CRC_MASK != crc:
            raise CorruptRecordError(
                f"checksum mismatch in record at offset {base_offset + pos}", base_offset + pos
            )
        append(new(Record, (base_offset + pos, mid, flag, payload)))
        pos = end
    return out, pos


_T = TypeVar("_T", bound=tuple[object, ...])

#: ``hotpath.decode_records``'s signature: ``(data, base_offset, cls, first, second)`` ->
#: ``(items, pos, verdict)``
HotDecode = Callable[[bytes, int, type, object, object], tuple[list[tuple[object, ...]], int, int]]

#: The compiled decode loop when its build matches the source (see notify.protocol.accel)
_native_decode: HotDecode | None = NATIVE.decode_records if NATIVE is not None else None


#: The compiled check of an ``mput`` body when the build matches (see decode_as)
_native_check: Callable[[bytes, int], tuple[int, int, int, int]] | None = (
    NATIVE.check_records if NATIVE is not None else None
)


def check_records(data: bytes, max_length: int) -> tuple[int, int, int, int]:
    """:func:`notify.protocol.hotpath.check_records` (whole records, lengths in
    0..``max_length``, every checksum right): ``(count, flags, verdict, length)``; compiled
    when the build matches, else :func:`check_records_py`. Same results."""
    if _native_check is not None:
        return _native_check(data, max_length)
    return check_records_py(data, max_length)


#: The compiled check of an ``mput`` body with its producer members (see check_batch)
_native_batch: Callable[[bytes, int], tuple[int, int, int, int, int, int, int, int, int]] | None = (
    NATIVE.check_batch if NATIVE is not None else None
)


def check_batch(data: bytes, max_length: int) -> tuple[int, int, int, int, int, int, int, int, int]:
    """:func:`notify.protocol.hotpath.check_batch`: :func:`check_records` and the records'
    producer members in one compiled walk; interpreted, the two walks one after the other
    (same results)."""
    if _native_batch is not None:
        return _native_batch(data, max_length)
    r = check_records_py(data, max_length)
    if r[2] != hotpath.OK or not r[1] & 2:
        return (*r, hotpath.NO_PRODUCER, -1, -1, -1, -1)
    return (*r, *hotpath.producer_batch(data))


def check_records_py(data: bytes, max_length: int) -> tuple[int, int, int, int]:
    """:func:`check_records`'s interpreted loop (``struct`` and a memoryview: quicker than
    ``hotpath``'s byte-by-byte reads when not compiled)."""
    mv = memoryview(data)
    n = len(data)
    pos = 0
    count = 0
    flags = 0
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    try:
        while pos < n:
            if n - pos < HEADER_SIZE:
                return count, flags, hotpath.SHORT_HEADER, 0
            length, crc, _mid, flag = unpack(mv, pos)
            if length < 0 or length > max_length:
                return count, flags, hotpath.BAD_LENGTH, length
            end = pos + HEADER_SIZE + length
            if end > n:
                return count, flags, hotpath.PAST_END, length
            if crc32(mv[pos + HEADER_SIZE : end]) & _CRC_MASK != crc:
                return count, flags, hotpath.BAD_CHECKSUM, length
            flags |= flag
            pos = end
            count += 1
    finally:
        mv.release()
    return count, flags, hotpath.OK, 0


def decode_as(
    buf: bytes | bytearray | memoryview,
    base_offset: int,
    cls: type[_T],
    first: object,
    second: object,
) -> tuple[list[_T], int]:
    """:func:`decode_all` (checksums verified) straight into ``cls`` tuples of
    ``(first, second, offset, msg_id, flag, payload)`` (e.g. a consumer's message with its
    topic and partition): one object per record instead of a Record and a copy.

    With the compiled hot path (:mod:`notify.protocol.accel`) the loop runs there
    (:func:`decode_as_with`), else in :func:`decode_as_py`; same results."""
    data = bytes(buf) if not isinstance(buf, bytes) else buf
    if _native_decode is not None:
        return decode_as_with(_native_decode, data, base_offset, cls, first, second)
    return decode_as_py(data, base_offset, cls, first, second)


def decode_as_with(
    decode: HotDecode, data: bytes, base_offset: int, cls: type[_T], first: object, second: object
) -> tuple[list[_T], int]:
    """:func:`decode_as` through ``decode`` (a build of ``hotpath.decode_records``).

    The cyclic garbage collector is paused for the call: the thousands of tuples a fetch
    decodes (which cannot form cycles) otherwise set off several collections that each
    walk them again (~1/3 of the decode's time). The compiled loop holds the GIL
    throughout, so no other thread runs while it is paused."""
    if gc.isenabled():
        gc.disable()
        try:
            items, pos, verdict = decode(data, base_offset, cls, first, second)
        finally:
            gc.enable()
    else:
        items, pos, verdict = decode(data, base_offset, cls, first, second)
    if verdict == hotpath.OK:
        return items, pos  # type: ignore[return-value]  # cls tuples, as asked
    at = base_offset + pos
    if verdict == hotpath.BAD_LENGTH:
        (length,) = _ATTR_LEN.unpack_from(data, pos)
        raise CorruptRecordError(f"negative record length {length}", at)
    raise CorruptRecordError(f"checksum mismatch in record at offset {at}", at)


def decode_as_py(
    data: bytes, base_offset: int, cls: type[_T], first: object, second: object
) -> tuple[list[_T], int]:
    """:func:`decode_as`'s interpreted loop (``struct`` reads the header: quicker than
    ``hotpath``'s byte-by-byte reads when not compiled)."""
    n = len(data)
    pos = 0
    out: list[_T] = []
    append = out.append
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    new = tuple.__new__
    while n - pos >= HEADER_SIZE:
        length, crc, mid, flag = unpack(data, pos)
        if length < 0:
            raise CorruptRecordError(f"negative record length {length}", base_offset + pos)
        start = pos + HEADER_SIZE
        end = start + length
        if end > n:
            break
        payload = data[start:end]
        if crc32(payload) & _CRC_MASK != crc:
            raise CorruptRecordError(
                f"checksum mismatch in record at offset {base_offset + pos}", base_offset + pos
            )
        append(new(cls, (first, second, base_offset + pos, mid, flag, payload)))
        pos = end
    return out, pos


def iter_records(buf: bytes | bytearray | memoryview, base_offset: int = 0) -> Iterator[Record]:
    """Iterate the whole, verified records of ``buf`` (see :func:`decode_all`)."""
    records, _ = decode_all(buf, base_offset)
    yield from records


def first_record_size(header: bytes | bytearray | memoryview) -> int | None:
    """Total size of the record whose header starts ``header`` (None if under 4 bytes)."""
    if len(header) < 4:
        return None
    length: int = _ATTR_LEN.unpack_from(header, 0)[0]
    return HEADER_SIZE + length


def count_records(buf: bytes | bytearray | memoryview) -> tuple[int, int]:
    """``(count, size)`` of the whole records at the start of ``buf``, by their headers'
    lengths only (no checksum: for counting what is already stored)."""
    mv = memoryview(buf)
    n = len(mv)
    pos = count = 0
    unpack = _ATTR_LEN.unpack_from
    while n - pos >= HEADER_SIZE:
        length: int = unpack(mv, pos)[0]
        end = pos + HEADER_SIZE + length
        if length < 0 or end > n:
            break
        pos = end
        count += 1
    return count, pos


_ID_AT = struct.Struct(">q")


def stamp_ids(buf: bytearray, first_id: int) -> None:
    """Write consecutive message ids (``first_id``, ``first_id + 1``, ...) into the records
    of ``buf``, which must hold whole, already validated records."""
    pos = 0
    n = len(buf)
    mid = first_id
    unpack = HEADER.unpack_from
    pack_id = _ID_AT.pack_into
    while pos < n:
        length = unpack(buf, pos)[0]
        pack_id(buf, pos + 8, mid)
        mid += 1
        pos += HEADER_SIZE + length
