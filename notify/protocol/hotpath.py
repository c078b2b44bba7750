"""The per-record loops of the client's hot paths, in plain typed Python.

This module is the source of truth for two loops that run once per message: decoding the
records of a ``get`` reply (every checksum verified) and encoding records in their on-disk
layout for an ``mput``. It imports only the standard library and nothing of notify, so
mypyc can compile a copy of it on its own (``scripts/build_native.py``, run by
``scripts/setup.sh``); :mod:`notify.protocol.accel` uses that compiled copy only when it was
built from exactly this file's bytes, and this module otherwise. Both must give identical
results (``tests/protocol/test_hotpath.py`` runs the same cases against each).

The layout is the one of :mod:`notify.protocol.records` (not imported here, to keep this
module standalone): a 20-byte big-endian header (length, crc32 & 0x7FFFFFFF, msgId, flag)
then the payload.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

_HEADER: Final = struct.Struct(">iiqi")
_HEADER_SIZE: Final = 20
_CRC_MASK: Final = 0x7FFFFFFF

#: decode_records' verdict: the records decoded end where the buffer does (or mid-record)
OK: Final = 0
#: ... a record with a negative length stops decoding at ``pos``
BAD_LENGTH: Final = 1
#: ... a record whose checksum does not match stops decoding at ``pos``
BAD_CHECKSUM: Final = 2


def decode_records(
    data: bytes, base_offset: int, cls: type, first: object, second: object
) -> tuple[list[tuple[object, ...]], int, int]:
    """Decode the whole records at the start of ``data`` into ``cls`` tuples of
    ``(first, second, offset, msg_id, flag, payload)``, every checksum verified.

    Returns ``(items, pos, verdict)``: ``pos`` is where decoding stopped (the end of the
    last whole record, or the start of a bad one) and ``verdict`` :data:`OK`,
    :data:`BAD_LENGTH` or :data:`BAD_CHECKSUM` (the record at ``pos``).

    The header is read byte by byte: compiled, that is a few machine instructions (in the
    interpreter :func:`notify.protocol.records.decode_as`'s ``struct`` is quicker)."""
    n = len(data)
    pos = 0
    out: list[tuple[object, ...]] = []
    crc32 = zlib.crc32
    new = tuple.__new__
    while n - pos >= _HEADER_SIZE:
        length = (data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8) | data[pos + 3]
        if length & 0x80000000:
            return out, pos, BAD_LENGTH
        start = pos + _HEADER_SIZE
        end = start + length
        if end > n:
            break
        crc = (
            (data[pos + 4] << 24) | (data[pos + 5] << 16) | (data[pos + 6] << 8) | data[pos + 7]
        )
        hi = (data[pos + 8] << 24) | (data[pos + 9] << 16) | (data[pos + 10] << 8) | data[pos + 11]
        lo = (
            (data[pos + 12] << 24) | (data[pos + 13] << 16) | (data[pos + 14] << 8) | data[pos + 15]
        )
        if hi & 0x80000000:
            hi -= 0x100000000
        flag = (
            (data[pos + 16] << 24) | (data[pos + 17] << 16) | (data[pos + 18] << 8) | data[pos + 19]
        )
        if flag & 0x80000000:
            flag -= 0x100000000
        payload = data[start:end]
        if crc32(payload) & _CRC_MASK != crc:
            return out, pos, BAD_CHECKSUM
        out.append(new(cls, (first, second, base_offset + pos, (hi << 32) | lo, flag, payload)))
        pos = end
    return out, pos, OK


def encode_records(payloads: list[bytes], flag: int, msg_id: int) -> bytes:
    """The records of ``payloads`` (all with ``flag`` and ``msg_id``) back to back, their
    checksums computed: the body of an ``mput``."""
    pack = _HEADER.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    for p in payloads:
        parts.append(pack(len(p), crc32(p) & _CRC_MASK, msg_id, flag))
        parts.append(p)
    return b"".join(parts)


#: check_records' verdicts beyond OK, BAD_LENGTH (a length outside 0..max) and
#: BAD_CHECKSUM: fewer than a header's bytes are left ...
SHORT_HEADER: Final = 3
#: ... or a record's length runs past the end of the data
PAST_END: Final = 4


# --------------------------------------------------------------------- producer members
# The idempotent producer's members of a record's properties (notify.protocol.properties):
# the attribute text ``<tag> RS <JSON object>`` ends with ``"p":"<producer id>","s":<seq>}``
# (``,"p"`` after other members, or ``{"p"`` right after RS). The broker reads them from
# this suffix only, here, for one record and for a whole mput.

#: producer_batch's verdicts: no record carries producer members (plain messages)
NO_PRODUCER: Final = 0
#: every record carries the same producer id, the sequences consecutive in record order
ONE_PRODUCER: Final = 1
#: some records carry producer members and others not, two producer ids, or sequences that
#: are not consecutive
MIXED_PRODUCERS: Final = 2
#: the longest producer id the suffix reader accepts (the broker's setting is lower)
MAX_ID_SCAN: Final = 1024


#: 1 at the bytes a producer id is made of, ``[A-Za-z0-9._~-]``
_ID_BYTES: Final = bytes(
    1 if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c in (45, 46, 95, 126)) else 0
    for c in range(256)
)


def _closing_sequence(data: bytes, start: int, end: int) -> tuple[int, int]:
    """``data[start:end]`` ends with ``<digits>}`` (1 to 18 digits, no leading zero):
    ``(position before the digits, their value)``, else ``(-1, -1)``."""
    e = end - 1
    if e <= start or data[e] != 125:  # '}'
        return -1, -1
    i = e - 1
    seq = 0
    scale = 1
    while i >= start and 48 <= data[i] <= 57:
        seq += (data[i] - 48) * scale
        scale *= 10
        i -= 1
    ndig = e - 1 - i
    if ndig < 1 or ndig > 18 or (ndig > 1 and data[i + 1] == 48):
        return -1, -1
    return i, seq


def producer_suffix(data: bytes, start: int, end: int) -> tuple[int, int, int]:
    """The producer members of the attribute text ``data[start:end]``: ``(id start, id
    end, sequence)`` (positions in ``data``), or ``(-1, -1, -1)`` when its text does not end
    with them (``"p":"<id>","s":<seq>}``, id of ``[A-Za-z0-9._~-]``, 1 to 18 digits
    without a leading zero, inside the JSON object that follows the first RS)."""
    none = (-1, -1, -1)
    i, seq = _closing_sequence(data, start, end)
    if i < 0:
        return none
    # ,"s":  then  "  closing the id
    if i - 5 < start or data[i] != 58 or data[i - 1] != 34 or data[i - 2] != 115:
        return none
    if data[i - 3] != 34 or data[i - 4] != 44 or data[i - 5] != 34:
        return none
    pe = i - 5
    k = pe - 1
    low = max(start, pe - MAX_ID_SCAN - 1)
    ok = _ID_BYTES
    while k >= low and ok[data[k]]:
        k -= 1
    ps = k + 1
    if ps == pe:
        return none
    # "p":"  before the id, then ',' or '{'
    if k - 5 < start or data[k] != 34 or data[k - 1] != 58 or data[k - 2] != 34:
        return none
    if data[k - 3] != 112 or data[k - 4] != 34:
        return none
    b = k - 5
    rs = start  # the first RS: the JSON object starts right after it
    while rs < b and data[rs] != 30:
        rs += 1
    if rs >= b or data[rs + 1] != 123:
        return none
    c = data[b]
    if not (c == 44 and b > rs + 1) and not (c == 123 and b == rs + 1):
        return none
    return ps, pe, seq


def record_producer_span(data: bytes, pos: int) -> tuple[int, int, int]:
    """:func:`producer_suffix` of the whole record at ``data[pos:]`` (flag bits 0 and 1
    set, attribute block inside the payload), or ``(-1, -1, -1)``."""
    none = (-1, -1, -1)
    length = (data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8) | data[pos + 3]
    if data[pos + 19] & 3 != 3 or length < 4:
        return none
    p = pos + _HEADER_SIZE
    alen = (data[p] << 24) | (data[p + 1] << 16) | (data[p + 2] << 8) | data[p + 3]
    if alen & 0x80000000 or 4 + alen > length:
        return none
    return producer_suffix(data, p + 4, p + 4 + alen)


def _same_producer(data: bytes, pos: int, middle: bytes, seq: int) -> bool:
    """Whether the record at ``pos`` (flag bits 0 and 1 set) ends its attribute with
    ``middle`` (``"p":"<id>","s":`` of the batch's first record) and sequence ``seq``, as
    :func:`producer_suffix` reads it (the rest of the batch: one compare for the id)."""
    length = (data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8) | data[pos + 3]
    p = pos + _HEADER_SIZE
    if length < 4:
        return False
    alen = (data[p] << 24) | (data[p + 1] << 16) | (data[p + 2] << 8) | data[p + 3]
    start = p + 4
    if alen & 0x80000000 or 4 + alen > length:
        return False
    i, got = _closing_sequence(data, start, start + alen)
    if i < 0 or got != seq:
        return False
    ms = i + 1 - len(middle)
    if ms <= start or not data.startswith(middle, ms):
        return False
    b = ms - 1
    rs = start
    while rs < b and data[rs] != 30:
        rs += 1
    if rs >= b or data[rs + 1] != 123:
        return False
    c = data[b]
    return (c == 44 and b > rs + 1) or (c == 123 and b == rs + 1)


def check_records(data: bytes, max_length: int) -> tuple[int, int, int, int]:
    """Validate that ``data`` is whole records back to back, each length in
    0..``max_length`` and each checksum right (the broker's check of an ``mput`` body).

    Returns ``(count, flags, verdict, length)``: ``count`` records passed (on an error the
    bad one is record number ``count``), ``flags`` the OR of their flags, ``verdict``
    :data:`OK` or what is wrong with the bad record, ``length`` its length field."""
    r = check_batch(data, max_length)
    return r[0], r[1], r[2], r[3]


def check_batch(
    data: bytes, max_length: int
) -> tuple[int, int, int, int, int, int, int, int, int]:
    """:func:`check_records` and :func:`producer_batch` in one walk (a record's producer
    members are read while its header is at hand; a record without flag bits 0 and 1
    costs one test): ``(count, flags, verdict, length, producer verdict, id start, id end,
    first sequence, last sequence)``, the producer part valid when ``verdict`` is OK."""
    n = len(data)
    pos = 0
    count = 0
    flags = 0
    crc32 = zlib.crc32
    marked = 0
    ps0 = pe0 = -1
    first = last = -1
    mixed = False
    middle = b""
    while pos < n:
        if n - pos < _HEADER_SIZE:
            return count, flags, SHORT_HEADER, 0, NO_PRODUCER, -1, -1, -1, -1
        length = (data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8) | data[pos + 3]
        if length & 0x80000000:
            length -= 0x100000000
        if length < 0 or length > max_length:
            return count, flags, BAD_LENGTH, length, NO_PRODUCER, -1, -1, -1, -1
        end = pos + _HEADER_SIZE + length
        if end > n:
            return count, flags, PAST_END, length, NO_PRODUCER, -1, -1, -1, -1
        crc = (
            (data[pos + 4] << 24) | (data[pos + 5] << 16) | (data[pos + 6] << 8) | data[pos + 7]
        )
        if crc32(data[pos + _HEADER_SIZE : end]) & _CRC_MASK != crc:
            return count, flags, BAD_CHECKSUM, length, NO_PRODUCER, -1, -1, -1, -1
        flag = (
            (data[pos + 16] << 24) | (data[pos + 17] << 16) | (data[pos + 18] << 8) | data[pos + 19]
        )
        if flag & 0x80000000:
            flag -= 0x100000000
        flags |= flag
        if flag & 3 == 3 and not mixed:
            if marked == 0:
                ps0, pe0, first = record_producer_span(data, pos)
                if ps0 >= 0:
                    last = first
                    marked = 1
                    mixed = count != 0
                    middle = data[ps0 - 5 : pe0 + 6]  # "p":"<id>","s":
            elif _same_producer(data, pos, middle, last + 1):
                last += 1
                marked += 1
            else:
                mixed = True
        pos = end
        count += 1
    if marked == 0:
        return count, flags, OK, 0, NO_PRODUCER, -1, -1, -1, -1
    verdict = MIXED_PRODUCERS if mixed or marked != count else ONE_PRODUCER
    return count, flags, OK, 0, verdict, ps0, pe0, first, last


def intact_frames(buf: bytes, pos: int, max_length: int, out: list[int]) -> int:
    """Walk redo-log frames (``length:u32 · crc:u32 · payload``, the payload's first byte
    its type) from ``pos``: append the position of each intact frame to ``out`` (length
    1..``max_length``, whole in ``buf``, CRC-32 of the payload right, type not 0) and return
    where the walk stopped, at the first frame that is not, or the end. What is wrong there
    (or whether more bytes are needed) is for the caller's own check to say: this loop only
    skips the frames that check would pass (the audit's bulk reader of ``txlog``)."""
    n = len(buf)
    crc32 = zlib.crc32
    while n - pos >= 8:
        length = (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
        if length == 0 or length > max_length:
            break
        end = pos + 8 + length
        if end > n:
            break
        crc = (buf[pos + 4] << 24) | (buf[pos + 5] << 16) | (buf[pos + 6] << 8) | buf[pos + 7]
        if crc32(buf[pos + 8 : end]) != crc or buf[pos + 8] == 0:
            break
        out.append(pos)
        pos = end
    return pos


def walk_records(buf: bytes, pos: int, starts: list[int], oks: list[bool]) -> int:
    """Walk partition records (the 20-byte header above, then the payload) from ``pos``:
    append the position of each whole record with a positive length to ``starts`` and
    whether its payload matches its checksum to ``oks``; return where the walk stopped (a
    length of 0 or less, a record past the end of ``buf``, or the end). The caller's own
    loop says what a stop means (the audit's segment reader)."""
    n = len(buf)
    crc32 = zlib.crc32
    while n - pos >= _HEADER_SIZE:
        length = (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
        if length & 0x80000000 or length == 0:
            break
        end = pos + _HEADER_SIZE + length
        if end > n:
            break
        crc = (buf[pos + 4] << 24) | (buf[pos + 5] << 16) | (buf[pos + 6] << 8) | buf[pos + 7]
        starts.append(pos)
        oks.append(crc32(buf[pos + _HEADER_SIZE : end]) & _CRC_MASK == crc)
        pos = end
    return pos


def producer_batch(data: bytes) -> tuple[int, int, int, int, int]:
    """The producer members of ``data``, whole validated records back to back (an mput):
    ``(verdict, id start, id end, first sequence, last sequence)`` with the id of the first
    record; :data:`ONE_PRODUCER` only when every record names that id and the sequences
    follow each other (``first + i`` for record ``i``)."""
    r = check_batch(data, 0x7FFFFFFF)
    return r[4], r[5], r[6], r[7], r[8]
