"""The record codec: round trips, and detection of torn or corrupted data."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notify.txlog import (
    CorruptReason,
    RecordType,
    TxLogError,
    decode,
    encode,
    encode_many,
    record_type,
)
from notify.txlog.records import HEADER, frame_size

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

record_st = st.tuples(st.integers(1, 255), st.binary(max_size=64))
stream_st = st.lists(record_st, min_size=1, max_size=8)


def boundaries(records: list[tuple[int, bytes]]) -> list[int]:
    out, pos = [0], 0
    for _, body in records:
        pos += HEADER + 1 + len(body)
        out.append(pos)
    return out


def test_layout_is_length_crc_type_body() -> None:
    frame = encode(RecordType.COMMIT, b"abc")
    length, crc, rtype = struct.unpack(">IIB", frame[:9])
    assert (length, rtype, frame[9:]) == (4, 3, b"abc")
    assert crc == zlib.crc32(b"\x03abc")
    assert frame_size(frame) == len(frame) == 12


def test_roundtrip_known_and_custom_types() -> None:
    items = [(t.value, bytes([t.value]) * t.value) for t in RecordType] + [(200, b""), (255, b"z")]
    result = decode(encode_many(items))
    assert result.error is None
    assert result.consumed == sum(HEADER + 1 + len(b) for _, b in items)
    assert [(r.type, r.body) for r in result.records] == items
    assert result.records[2].type is RecordType.COMMIT
    assert type(result.records[-1].type) is int
    assert [r.offset for r in result.records] == boundaries(items)[:-1]


def test_record_type_mapping() -> None:
    assert record_type(2) is RecordType.PREPARE
    assert record_type(99) == 99


@pytest.mark.parametrize("rtype", [0, 256, -1])
def test_encode_rejects_bad_type(rtype: int) -> None:
    with pytest.raises(TxLogError, match="type"):
        encode(rtype, b"x")


def test_encode_rejects_oversized_body() -> None:
    with pytest.raises(TxLogError, match="exceeds"):
        encode(1, b"x" * 11, max_record_bytes=10)
    assert encode(1, b"x" * 10, max_record_bytes=10)


def test_empty_buffer() -> None:
    assert decode(b"") == ([], 0, None)


def test_truncated_header_and_record() -> None:
    frame = encode(1, b"hello")
    assert decode(frame[:5]).error is CorruptReason.TRUNCATED_HEADER
    assert decode(frame[:-1]).error is CorruptReason.TRUNCATED_RECORD


def test_length_beyond_maximum() -> None:
    frame = encode(1, b"x" * 100)
    result = decode(frame + b"\0" * 100, max_record_bytes=50)
    assert result == ([], 0, CorruptReason.TOO_LARGE)


def test_crc_mismatch() -> None:
    good = encode(1, b"first")
    bad = bytearray(encode(2, b"second"))
    bad[-1] ^= 0x40
    result = decode(good + bytes(bad))
    assert [r.body for r in result.records] == [b"first"]
    assert result.consumed == len(good)
    assert result.error is CorruptReason.CRC_MISMATCH


def test_zero_filled_area_after_records() -> None:
    good = encode(1, b"a") + encode(2, b"b")
    for zeros in (3, 8, 4096):
        result = decode(good + b"\0" * zeros)
        assert len(result.records) == 2
        assert result.consumed == len(good)
        assert result.error is CorruptReason.ZERO_FILLED


def test_zero_length_with_crc_and_type_zero() -> None:
    assert decode(struct.pack(">II", 0, 7)).error is CorruptReason.BAD_LENGTH
    typeless = struct.pack(">II", 1, zlib.crc32(b"\0")) + b"\0"
    assert decode(typeless).error is CorruptReason.BAD_TYPE


@SETTINGS
@given(stream_st)
def test_property_roundtrip(records: list[tuple[int, bytes]]) -> None:
    result = decode(encode_many(records))
    assert result.error is None
    assert [(r.type, r.body) for r in result.records] == records


@SETTINGS
@given(stream_st, st.data())
def test_property_truncation_is_detected(
    records: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    stream = encode_many(records)
    cut = data.draw(st.integers(0, len(stream) - 1), label="cut")
    result = decode(stream[:cut])
    bounds = boundaries(records)
    whole = max(i for i, b in enumerate(bounds) if b <= cut)  # frames fully inside the cut
    assert [(r.type, r.body) for r in result.records] == records[:whole]
    assert result.consumed == bounds[whole]
    assert (result.error is None) == (cut == bounds[whole])


@SETTINGS
@given(stream_st, st.data())
def test_property_single_byte_corruption_is_detected(
    records: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    stream = bytearray(encode_many(records))
    index = data.draw(st.integers(0, len(stream) - 1), label="index")
    stream[index] ^= data.draw(st.integers(1, 255), label="xor")
    result = decode(bytes(stream))
    bounds = boundaries(records)
    hit = max(i for i, b in enumerate(bounds) if b <= index)  # frame holding the bad byte
    # everything before the damaged frame comes back unchanged, nothing from it or after it
    assert [(r.type, r.body) for r in result.records] == records[:hit]
    assert result.consumed == bounds[hit]
    assert result.error is not None
