"""Appending, rolling segments, replaying, configuration and the life cycle of TxLog."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from txlog_helpers import FsyncCounter

from notify.txlog import (
    ConfigError,
    LogRecord,
    Position,
    RecordType,
    TxLog,
    TxLogConfig,
    TxLogError,
)

SMALL = TxLogConfig(segment_bytes=256, max_record_bytes=4096)


def bodies(n: int) -> list[bytes]:
    return [f"record-{i}-".encode() * (i % 7 + 1) for i in range(n)]


def test_append_and_replay(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        items = [(RecordType.APPEND_MSG, b"m1"), (RecordType.PREPARE, b""), (77, b"custom")]
        positions = [log.append(t, b) for t, b in items]
        assert positions == sorted(positions)
        assert positions[0] == Position(0, 0)
        got = list(log.replay())
        assert got == [LogRecord(p, t, b) for p, (t, b) in zip(positions, items, strict=True)]
        assert got[1].type is RecordType.PREPARE
        position, rtype, body = got[2]  # unpacks as a plain triple
        assert (position, rtype, body) == (positions[2], 77, b"custom")
        assert log.end_position == Position(0, sum(9 + len(b) for _, b in items))
    assert (logdir / "redo.0").exists()


def test_roll_across_segments_and_reopen(logdir: Path) -> None:
    data = bodies(60)
    with TxLog.open(logdir, SMALL) as log:
        positions = [log.append(1, b) for b in data]
    files = sorted(p.name for p in logdir.iterdir())
    assert len(files) > 5
    assert files == sorted(f"redo.{n}" for n in range(len(files)))
    assert positions == sorted(positions)
    assert len({p.file_no for p in positions}) == len(files)
    for n in range(len(files) - 1):
        assert (logdir / f"redo.{n}").stat().st_size <= SMALL.segment_bytes
    with TxLog.open(logdir, SMALL) as log:
        assert log.recovery.records_scanned == len(data)
        assert log.recovery.truncated_bytes == 0
        got = list(log.replay())
        assert [r.body for r in got] == data
        assert [r.position for r in got] == positions
        more = log.append(2, b"after reopen")
        assert more > positions[-1]
        assert list(log.replay(more)) == [LogRecord(more, RecordType.PREPARE, b"after reopen")]


def test_append_many_is_one_write(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        log.append(1, b"first")
        writes = []
        real = log._pwrite

        def counting(fd: int, data: memoryview, offset: int) -> int:
            writes.append(len(data))
            return real(fd, data, offset)

        log._pwrite = counting  # type: ignore[method-assign]
        items = [(RecordType.BEGIN, b"b"), (RecordType.APPEND_MSG, b"msg" * 10), (4, b"")]
        positions = log.append_many(items)
        assert len(writes) == 1
        assert positions == [r.position for r in list(log.replay())[1:]]
        assert [(r.type, r.body) for r in list(log.replay())[1:]] == items
        assert log.append_many([]) == []
        assert len(writes) == 1


def test_batch_larger_than_a_segment_goes_whole_into_a_fresh_file(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        log.append(1, b"x")
        positions = log.append_many([(1, b"y" * 200), (1, b"z" * 200)])
        assert positions[0] == Position(1, 0)
        assert positions[1].file_no == 1
        assert log.append(1, b"next") == Position(2, 0)
        assert [r.body[:1] for r in log.replay()] == [b"x", b"y", b"z", b"n"]


def test_large_records_span_read_chunks(logdir: Path) -> None:
    big = [os.urandom(3 * 2**20 + 17), b"small", os.urandom(2**20)]
    with TxLog.open(logdir) as log:
        for body in big:
            log.append(1, body)
    with TxLog.open(logdir) as log:
        assert log.recovery.truncated_bytes == 0
        assert [r.body for r in log.replay()] == big


def test_replay_from_position_and_bounds(logdir: Path) -> None:
    with TxLog.open(logdir, SMALL) as log:
        positions = [log.append(1, b) for b in bodies(30)]
        assert [r.position for r in log.replay(positions[17])] == positions[17:]
        assert list(log.replay(log.end_position)) == []
        with pytest.raises(TxLogError, match="outside"):
            log.replay(Position(log.end_position.file_no + 1, 0))
        it = log.replay()
        log.append(1, b"later")  # not part of an iteration that already started
        assert len(list(it)) == 30


def test_bad_records_are_rejected(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(max_record_bytes=10)) as log:
        with pytest.raises(TxLogError):
            log.append(0, b"x")
        with pytest.raises(TxLogError):
            log.append(256, b"x")
        with pytest.raises(TxLogError, match="exceeds"):
            log.append(1, b"x" * 11)
        with pytest.raises(TxLogError):
            log.append_many([(1, b"ok"), (1, b"x" * 11)])
        assert log.end_position == Position(0, 0)


def test_close_is_idempotent_and_final(logdir: Path) -> None:
    log = TxLog.open(logdir)
    counter = FsyncCounter(log)
    pos = log.append(1, b"x")
    log.close()
    assert counter.calls == 1
    assert log.closed
    assert log.durable_position > pos
    log.close()
    assert counter.calls == 1
    with pytest.raises(TxLogError, match="closed"):
        log.append(1, b"y")
    with pytest.raises(TxLogError, match="closed"):
        log.commit(1, b"y")
    log.sync(pos)  # already durable: fine after close
    assert "closed" in repr(log)


def test_context_manager_closes(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        log.append(1, b"x")
    assert log.closed


def test_stray_files_are_ignored(logdir: Path) -> None:
    logdir.mkdir()
    (logdir / "redo.01").write_bytes(b"junk")
    (logdir / "redo.x").write_bytes(b"junk")
    (logdir / "notes.txt").write_bytes(b"junk")
    (logdir / "checkpoint.tmp").write_bytes(b"partial")
    with TxLog.open(logdir) as log:
        assert log.append(1, b"x") == Position(0, 0)
        assert [r.body for r in log.replay()] == [b"x"]
    assert not (logdir / "checkpoint.tmp").exists()
    assert (logdir / "redo.01").read_bytes() == b"junk"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"segment_bytes": 10},
        {"segment_bytes": 1.5},
        {"flush_at_commit": 3},
        {"flush_at_commit": True},
        {"flush_interval_s": 0},
        {"flush_interval_s": float("nan")},
        {"max_checkpoints": 0},
        {"max_record_bytes": -1},
        {"max_record_bytes": 2**32},
    ],
)
def test_config_validation(kwargs: dict[str, object]) -> None:
    field = next(iter(kwargs))
    with pytest.raises(ConfigError, match=field):
        TxLogConfig(**kwargs)  # type: ignore[arg-type]


def test_config_defaults() -> None:
    cfg = TxLogConfig()
    assert cfg.segment_bytes == 64 * 2**20
    assert cfg.flush_at_commit == 1
    assert cfg.flush_interval_s == 1.0
    assert cfg.max_checkpoints == 3
    assert cfg.max_record_bytes == 16 * 2**20
    with pytest.raises(AttributeError):
        cfg.segment_bytes = 1  # type: ignore[misc]
