"""Checkpoints: kept N, fall back past damage, drive retention and where replay starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from notify.txlog import Position, TxLog, TxLogConfig, TxLogError
from notify.txlog.checkpoint import Checkpoint, read_checkpoints, write_checkpoints
from notify.txlog.segment import fsync_dir

SMALL = TxLogConfig(segment_bytes=256, max_record_bytes=4096, max_checkpoints=3)


def segments(logdir: Path) -> list[int]:
    return sorted(int(p.suffix[1:]) for p in logdir.glob("redo.*"))


def append_some(log: TxLog, n: int, tag: str = "r") -> list[Position]:
    return [log.append(1, f"{tag}{i}".encode() * 8) for i in range(n)]


def test_keeps_the_last_n(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        assert log.latest_checkpoint() is None
        made = []
        for i in range(5):
            append_some(log, 3, f"c{i}")
            made.append(log.checkpoint(log.end_position, f"state{i}".encode()))
        assert log.checkpoints() == made[-3:]
        assert log.latest_checkpoint() == made[-1]
    on_disk, damaged = read_checkpoints(logdir, SMALL.max_record_bytes)
    assert (on_disk, damaged) == (made[-3:], 0)
    with TxLog.open(logdir, SMALL) as log:
        assert log.latest_checkpoint() == made[-1]
        assert log.recovery.checkpoint == made[-1]
        assert log.latest_checkpoint().state == b"state4"  # type: ignore[union-attr]


def test_replay_and_recovery_start_at_the_checkpoint(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        append_some(log, 20, "old")
        live = append_some(log, 1, "live-begin")[0]  # a transaction still open
        append_some(log, 20, "new")
        log.checkpoint(live, b"in-flight: tx1")
        later = append_some(log, 5, "after")
        expected = [r.position for r in log.replay(live)]
        assert [r.position for r in log.replay()] == expected
    with TxLog.open(logdir, SMALL) as log:
        assert log.recovery.start == live
        assert log.recovery.records_scanned == 1 + 20 + 5
        got = list(log.replay())
        assert got[0].body.startswith(b"live-begin")
        assert [r.position for r in got] == expected
        assert got[-1].position == later[-1]


def test_old_segments_are_deleted_behind_the_oldest_kept_checkpoint(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        cps = []
        for i in range(4):
            append_some(log, 30, f"round{i}")
            cps.append(log.checkpoint(log.end_position))
        kept = log.checkpoints()
        assert kept == cps[-3:]
        oldest = kept[0].position
        assert segments(logdir)[0] == oldest.file_no
        assert log.first_position == Position(oldest.file_no, 0)
        # every kept checkpoint is still replayable
        for cp in kept:
            assert list(log.replay(cp.position)) is not None
    with TxLog.open(logdir, SMALL) as log:
        assert log.recovery.start == cps[-1].position
        assert log.recovery.records_scanned == 0


def test_corrupt_newest_checkpoint_falls_back(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        append_some(log, 5)
        first = log.checkpoint(log.end_position, b"one")
        append_some(log, 5, "x")
        second = log.checkpoint(log.end_position, b"two")
        append_some(log, 5, "y")
        all_after_first = [r.position for r in log.replay(first.position)]
        assert second.position > first.position
    path = logdir / "checkpoint"
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x55  # inside the newest entry's state
    path.write_bytes(bytes(data))
    with TxLog.open(logdir, SMALL) as log:
        assert log.latest_checkpoint() == first
        assert log.recovery.checkpoints_discarded == 1
        assert log.recovery.start == first.position
        assert [r.position for r in log.replay()] == all_after_first
        # the next checkpoint rewrites the file from the intact entries
        third = log.checkpoint(log.end_position, b"three")
    assert read_checkpoints(logdir, SMALL.max_record_bytes) == ([first, third], 0)


def test_garbage_checkpoint_file_means_replay_from_the_start(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        positions = append_some(log, 5)
        log.checkpoint(log.end_position)
    (logdir / "checkpoint").write_bytes(b"\x00\x00\x00\x05garbage")
    with TxLog.open(logdir, SMALL) as log:
        assert log.latest_checkpoint() is None
        assert log.recovery.checkpoints_discarded == 1
        assert [r.position for r in log.replay()] == positions


def test_checkpoint_pointing_nowhere_is_ignored(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        append_some(log, 5)
        good = log.checkpoint(log.end_position)
    bogus = Checkpoint(Position(99, 0), b"", good.created + 1)
    write_checkpoints(logdir, [good, bogus], SMALL.max_record_bytes, lambda fd: None, fsync_dir)
    with TxLog.open(logdir, SMALL) as log:
        assert log.latest_checkpoint() == good
        assert log.recovery.checkpoints_discarded == 1


def test_checkpoint_position_must_be_a_record_boundary(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        positions = append_some(log, 5)
        with pytest.raises(TxLogError, match="not the start of a record"):
            log.checkpoint(Position(0, positions[1].offset + 3))
        with pytest.raises(TxLogError, match="outside"):
            log.checkpoint(Position(5, 0))
        with pytest.raises(TxLogError, match="exceeds"):
            log.checkpoint(positions[1], b"s" * 5000)
        log.checkpoint(positions[1])
        log.checkpoint(Position(0, 0))
        assert log.latest_checkpoint().position == Position(0, 0)  # type: ignore[union-attr]


def test_checkpoint_syncs_the_log_first(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(flush_at_commit=0)) as log:
        log.commit(1, b"not yet durable")
        assert log.durable_position < log.end_position
        log.checkpoint(log.end_position)
        assert log.durable_position == log.end_position


def test_truncate_before_is_clamped(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        append_some(log, 30)
        cp = log.checkpoint(Position(2, 0))
        assert segments(logdir)[0] == 2
        append_some(log, 30)
        # the kept checkpoint still needs segment 2: nothing is deleted
        assert log.truncate_before(log.end_position) == []
        assert log.first_position == Position(2, 0)
        log.checkpoint(log.end_position)
        log.checkpoint(log.end_position)
        log.checkpoint(log.end_position)  # cp is no longer kept
        assert cp not in log.checkpoints()
        assert segments(logdir) == [log.end_position.file_no]


def test_truncate_before_without_checkpoints_keeps_current(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        positions = append_some(log, 30)
        current = log.end_position.file_no
        deleted = log.truncate_before(Position(current + 5, 0))
        assert deleted == list(range(current))
        assert segments(logdir) == [current]
        assert [r.position for r in log.replay()] == [p for p in positions if p.file_no == current]
    with TxLog.open(logdir, SMALL) as log:
        assert log.first_position == Position(current, 0)
