"""The hot loops (notify.protocol.hotpath): the mypyc build, the same source interpreted and
the interpreted fallback in records.py give identical results; a stale build is not used."""

from __future__ import annotations

import hashlib
import importlib
import logging
import random
import struct
import zlib
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any, NamedTuple

import pytest

from notify.protocol import accel, hotpath, records


class Msg(NamedTuple):
    topic: str
    partition: int
    offset: int
    msg_id: int
    flag: int
    payload: bytes


def _native() -> ModuleType:
    try:
        native = importlib.import_module(accel.NATIVE_NAME)
    except ImportError:
        pytest.skip("no compiled hot path (scripts/build_native.py builds it)")
    if accel.choose(native, accel.source_digest()) is None:
        pytest.skip("the compiled hot path is stale (scripts/build_native.py rebuilds it)")
    return native


def _buffers() -> list[bytes]:
    """Records of every shape: attributes, empty payloads, extreme and negative ids and
    flags, a trailing partial record, a bad checksum, a negative length."""
    rnd = random.Random(16)
    out: list[bytes] = [b"", b"\x00" * 19]
    ids = [1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62 + 5, 2**63 - 1, -1, -(2**63)]
    for n in (1, 2, 7, 50):
        parts = []
        for i in range(n):
            payload = rnd.randbytes(rnd.choice((0, 1, 20, 100, 1000)))
            if i % 3 == 1:
                payload, flag = records.make_payload(payload, f"tag-{i}")
            else:
                flag = rnd.choice((0, 2, 2**31 - 1, -1, -(2**31)))
            parts.append(records.encode(ids[i % len(ids)], flag, payload))
        whole = b"".join(parts)
        out.append(whole)
        out.append(whole + parts[-1][: len(parts[-1]) // 2])  # a fetch window ending mid-record
        bad = bytearray(whole)
        bad[len(whole) - 1 if parts[-1][20:] else 4] ^= 0x40  # last payload or crc byte
        out.append(bytes(bad))
        neg = whole + struct.pack(">iiqi", -5, 0, 1, 0) + b"x" * 10
        out.append(neg)
    return out


def _outcome(
    decode: Callable[[bytes, int, type[Msg], object, object], tuple[list[Msg], int]],
    buf: bytes,
) -> tuple[Any, ...]:
    try:
        msgs, pos = decode(buf, 4096, Msg, "t", 3)
    except records.CorruptRecordError as e:
        return ("error", str(e), e.position)
    return ("ok", [tuple(m) for m in msgs], pos, all(type(m) is Msg for m in msgs))


def test_hotpath_source_matches_the_interpreted_fallback() -> None:
    def hot(buf: bytes, base: int, cls: type[Msg], a: object, b: object) -> tuple[list[Msg], int]:
        return records.decode_as_with(hotpath.decode_records, buf, base, cls, a, b)

    for buf in _buffers():
        assert _outcome(hot, buf) == _outcome(records.decode_as_py, buf)
    payloads = [b"", b"a", bytes(range(256)) * 3]
    for flag, mid in ((0, 0), (1, 7), (-1, 2**63 - 1)):
        expect = b"".join(records.encode(mid, flag, p) for p in payloads)
        assert hotpath.encode_records(payloads, flag, mid) == expect


def test_compiled_hotpath_gives_identical_results() -> None:
    native = _native()
    assert type(native.decode_records).__name__ == "builtin_function_or_method"  # compiled

    def nat(buf: bytes, base: int, cls: type[Msg], a: object, b: object) -> tuple[list[Msg], int]:
        return records.decode_as_with(native.decode_records, buf, base, cls, a, b)

    for buf in _buffers():
        assert _outcome(nat, buf) == _outcome(records.decode_as_py, buf)
    payloads = [b"", b"a", bytes(range(256)) * 3]
    for flag, mid in ((0, 0), (1, 7), (-1, 2**63 - 1)):
        assert native.encode_records(payloads, flag, mid) == hotpath.encode_records(
            payloads, flag, mid
        )
    # and records.decode_as, what the consumer calls, runs it
    assert records._native_decode is native.decode_records


def test_a_stale_build_is_not_used(caplog: pytest.LogCaptureFixture) -> None:
    digest = accel.source_digest()
    assert digest is not None
    with open(hotpath.__file__, "rb") as f:
        source = f.read()
    assert digest == hashlib.sha256(source).hexdigest()
    edited = hashlib.sha256(source + b"# edited\n").hexdigest()
    fresh = SimpleNamespace(SOURCE_SHA256=digest, __file__="x.so")
    stale = SimpleNamespace(SOURCE_SHA256=edited, __file__="stale.so")
    assert accel.choose(fresh, digest) is fresh  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="notify.protocol.accel"):
        assert accel.choose(stale, digest) is None  # type: ignore[arg-type]
        assert accel.choose(SimpleNamespace(), digest) is None  # type: ignore[arg-type]
        assert accel.choose(fresh, None) is None  # type: ignore[arg-type]
    assert "stale.so" in caplog.text and "using pure Python" in caplog.text
    assert accel.choose(None, digest) is None
    try:  # the real build, against an edited source's hash
        native = importlib.import_module(accel.NATIVE_NAME)
    except ImportError:
        return
    assert accel.choose(native, edited) is None
    if accel.NATIVE is None:  # a build was found but not used: only because it is stale
        assert accel.choose(native, digest) is None
        assert records._native_decode is None


def _check_cases() -> list[tuple[bytes, int]]:
    """mput bodies: whole, a partial record, a bad checksum, negative and too long
    lengths, a short header, empty."""
    cases = [(b, 1 << 20) for b in _buffers()]
    whole = b"".join(records.encode(0, f, b"p" * n) for f, n in ((0, 5), (4, 300), (-1, 0)))
    cases += [(whole, 299), (whole, 300), (whole + b"\x00" * 7, 1 << 20), (b"", 0)]
    return cases


def test_check_records_builds_agree() -> None:
    expect = [records.check_records_py(b, m) for b, m in _check_cases()]
    assert [hotpath.check_records(b, m) for b, m in _check_cases()] == expect
    verdicts = {e[2] for e in expect}
    assert verdicts == {
        hotpath.OK,
        hotpath.BAD_LENGTH,
        hotpath.BAD_CHECKSUM,
        hotpath.SHORT_HEADER,
        hotpath.PAST_END,
    }
    ok = [e for e in expect if e[2] == hotpath.OK and e[0] == 3]
    assert ok and ok[0][1] == (0 | 4 | -1)  # the OR of the flags of the records passed
    native = _native()
    assert [native.check_records(b, m) for b, m in _check_cases()] == expect
    assert records._native_check is native.check_records


def _frame_cases() -> list[bytes]:
    """Redo-log frames: intact ones, then each way a walk must stop (a torn tail, a zero
    length, a length past the limit, a bad CRC, a zero type byte)."""
    from notify.txlog.records import encode

    rnd = random.Random(22)
    frames = [encode(rnd.randrange(1, 9), rnd.randbytes(rnd.randrange(60))) for _ in range(40)]
    whole = b"".join(frames)
    bad_crc = bytearray(frames[3])
    bad_crc[-1] ^= 1
    zero_type = bytearray(frames[4])
    zero_type[8] = 0
    return [
        b"",
        whole,
        whole + frames[0][:5],
        whole + frames[0][:-1],
        whole + b"\x00" * 12,
        whole + struct.pack(">II", 10_000, 0) + b"x" * 20,
        whole + bytes(bad_crc) + frames[5],
        whole + bytes(zero_type) + frames[5],
    ]


def test_frame_and_record_walks_stop_where_the_readers_check_agree() -> None:
    from notify.txlog.records import decode

    for buf in _frame_cases():
        out: list[int] = []
        pos = hotpath.intact_frames(buf, 0, 4096, out)
        res = decode(buf, max_record_bytes=4095)
        assert len(out) == len(res.records)  # the intact frames, and no more
        assert [r.offset for r in res.records] == out
        assert pos == (out[-1] + 9 + len(res.records[-1].body) if out else 0)
    for buf in _buffers():
        starts: list[int] = []
        oks: list[bool] = []
        pos = hotpath.walk_records(buf, 0, starts, oks)
        at = 0
        for s, ok in zip(starts, oks, strict=True):  # back to back, checksums as stored
            assert s == at
            length, crc = struct.unpack_from(">ii", buf, s)
            assert ok == (zlib.crc32(buf[s + 20 : s + 20 + length]) & 0x7FFFFFFF == crc)
            at = s + 20 + length
        assert pos == at
    native = _native()
    for buf in _frame_cases():
        a: list[int] = []
        b: list[int] = []
        assert native.intact_frames(buf, 0, 4096, a) == hotpath.intact_frames(buf, 0, 4096, b)
        assert a == b
    for buf in _buffers():
        s1: list[int] = []
        o1: list[bool] = []
        s2: list[int] = []
        o2: list[bool] = []
        assert native.walk_records(buf, 0, s1, o1) == hotpath.walk_records(buf, 0, s2, o2)
        assert (s1, o1) == (s2, o2)
