"""Recovery on open: torn tails are cut and reported, older damage is an error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from notify.txlog import (
    CorruptReason,
    Position,
    TxLog,
    TxLogConfig,
    TxLogCorruptError,
    encode,
)

SMALL = TxLogConfig(segment_bytes=256, max_record_bytes=4096)


def fill(logdir: Path, n: int, config: TxLogConfig | None = None) -> list[Position]:
    with TxLog.open(logdir, config) as log:
        return [log.append(1, f"rec{i}".encode() * 5) for i in range(n)]


def last_segment(logdir: Path) -> Path:
    return max(logdir.glob("redo.*"), key=lambda p: int(p.suffix[1:]))


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (encode(3, b"torn commit record")[:-4], CorruptReason.TRUNCATED_RECORD),
        (encode(3, b"torn")[:5], CorruptReason.TRUNCATED_HEADER),
        (b"\0" * 4096, CorruptReason.ZERO_FILLED),
        (b"\xff" * 64, CorruptReason.TOO_LARGE),
    ],
)
def test_torn_tail_is_truncated_and_reported(
    logdir: Path, tail: bytes, reason: CorruptReason, caplog: pytest.LogCaptureFixture
) -> None:
    positions = fill(logdir, 10)
    seg = last_segment(logdir)
    good_size = seg.stat().st_size
    with seg.open("ab") as f:
        f.write(tail)
    with caplog.at_level(logging.WARNING, logger="notify.txlog.log"), TxLog.open(logdir) as log:
        report = log.recovery
        assert report.truncated_bytes == len(tail)
        assert report.truncated_file == 0
        assert report.truncated_at == Position(0, good_size)
        assert report.reason == str(reason)
        assert report.records_scanned == 10
        assert report.duration_s >= 0
        assert seg.stat().st_size == good_size
        assert [r.position for r in log.replay()] == positions
        after = log.append(4, b"appended after recovery")
        assert after == Position(0, good_size)
    assert "truncated" in caplog.text
    with TxLog.open(logdir) as log:
        assert log.recovery.truncated_bytes == 0
        assert list(log.replay())[-1].body == b"appended after recovery"


def test_corrupt_record_in_last_file_cuts_from_there(logdir: Path) -> None:
    positions = fill(logdir, 10)
    seg = last_segment(logdir)
    data = bytearray(seg.read_bytes())
    data[positions[6].offset + 12] ^= 1
    seg.write_bytes(bytes(data))
    with TxLog.open(logdir) as log:
        assert log.recovery.reason == str(CorruptReason.CRC_MISMATCH)
        assert log.recovery.truncated_at == positions[6]
        assert [r.position for r in log.replay()] == positions[:6]


def test_torn_tail_of_last_segment_after_rolls(logdir: Path) -> None:
    positions = fill(logdir, 40, SMALL)
    seg = last_segment(logdir)
    with seg.open("ab") as f:
        f.write(encode(1, b"x" * 100)[:50])
    with TxLog.open(logdir, SMALL) as log:
        assert log.recovery.truncated_bytes == 50
        assert log.recovery.truncated_file == positions[-1].file_no
        assert [r.position for r in log.replay()] == positions


def test_damage_in_an_older_segment_is_an_error(logdir: Path) -> None:
    fill(logdir, 40, SMALL)
    seg = logdir / "redo.1"
    data = bytearray(seg.read_bytes())
    data[20] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(TxLogCorruptError, match=r"redo\.1"):
        TxLog.open(logdir, SMALL)


def test_torn_older_segment_is_an_error(logdir: Path) -> None:
    fill(logdir, 40, SMALL)
    seg = logdir / "redo.2"
    with seg.open("ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(TxLogCorruptError, match="torn tail"):
        TxLog.open(logdir, SMALL)


def test_missing_segment_is_an_error(logdir: Path) -> None:
    fill(logdir, 40, SMALL)
    (logdir / "redo.2").unlink()
    with pytest.raises(TxLogCorruptError, match="missing"):
        TxLog.open(logdir, SMALL)


def test_replay_reports_damage_found_later(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        for i in range(40):
            log.append(1, f"rec{i}".encode() * 5)
        seg = logdir / "redo.1"
        data = bytearray(seg.read_bytes())
        data[30] ^= 0xFF
        seg.write_bytes(bytes(data))
        with pytest.raises(TxLogCorruptError, match=r"redo\.1"):
            list(log.replay())


def test_empty_and_clean_open(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        report = log.recovery
        assert (report.start, report.end) == (Position(0, 0), Position(0, 0))
        assert report.truncated_bytes == 0 and report.reason is None
        assert report.checkpoint is None
    with TxLog.open(logdir) as log:
        assert log.recovery.files_scanned == 1
        assert log.durable_position == log.end_position == Position(0, 0)


def test_whole_last_file_garbage(logdir: Path) -> None:
    positions = fill(logdir, 40, SMALL)
    last = positions[-1].file_no
    (logdir / f"redo.{last}").write_bytes(b"garbage!" * 10)
    with TxLog.open(logdir, SMALL) as log:
        assert log.recovery.truncated_at == Position(last, 0)
        assert log.recovery.truncated_bytes == 80
        assert [r.position for r in log.replay()] == [p for p in positions if p.file_no < last]
        assert log.append(1, b"fresh") == Position(last, 0)
