"""A replica redo log: frames copied at the source's positions, segment rolls included."""

from __future__ import annotations

from pathlib import Path

import pytest

from notify.errors import TxLogError
from notify.txlog import Position, TxLog, TxLogConfig, cut_log


def test_replica_copies_frames_and_rolls_at_the_same_positions(tmp_path: Path) -> None:
    cfg = TxLogConfig(segment_bytes=4096)
    src = TxLog.open(tmp_path / "src", cfg)
    shipped: list[tuple[Position, bytes]] = []
    src.on_write = lambda pos, data: shipped.append((pos, data))
    for i in range(200):
        src.append(1, b"record %d " % i * 3)
    assert src.end_position.file_no > 0  # it rolled
    # pushed: every write and every roll, applied in order
    dst = TxLog.open(tmp_path / "dst", cfg)
    for pos, data in shipped:
        if data:
            dst.append_frames(pos, data)
        else:
            assert dst.end_position == pos
            dst.append_frames(Position(pos.file_no + 1, 0), b"")
    assert dst.end_position == src.end_position
    assert list(dst.replay(Position(0, 0))) == list(src.replay(Position(0, 0)))
    # pulled: read_frames walks the source, 301-like "next segment" at each closed end
    pulled = TxLog.open(tmp_path / "pulled", cfg)
    while pulled.end_position != src.end_position:
        at = pulled.end_position
        data, nxt = src.read_frames(at, 1000)
        if nxt is not None:
            pulled.append_frames(nxt, b"")
        else:
            assert data
            pulled.append_frames(at, data)
    assert list(pulled.replay(Position(0, 0))) == list(src.replay(Position(0, 0)))
    # frames that do not continue the log, or torn frames, are refused and nothing is written
    end = pulled.end_position
    with pytest.raises(TxLogError):
        pulled.append_frames(Position(end.file_no, end.offset + 1), shipped[-1][1])
    with pytest.raises(TxLogError):
        pulled.append_frames(end, shipped[-1][1][:-1])
    with pytest.raises(TxLogError):
        src.read_frames(Position(0, 3), 100)  # not a frame boundary
    assert pulled.end_position == end
    for log in (src, dst, pulled):
        log.close()


def test_cut_log_keeps_a_prefix_and_forgets_checkpoints(tmp_path: Path) -> None:
    """``cut_log`` (a failover member rejoining): later segments go, the cut one is
    truncated, checkpoints are dropped (recovery scans from the oldest segment); a log
    missing an older segment than ``need_from`` is left alone."""
    cfg = TxLogConfig(segment_bytes=2048)
    log = TxLog.open(tmp_path / "l", cfg)
    positions = [log.append(1, b"record %d " % i * 3) for i in range(200)]
    cut_at, ckpt = positions[150], positions[100]
    assert ckpt.file_no >= 1 and positions[-1].file_no > cut_at.file_no
    log.checkpoint(ckpt)  # the segments before the checkpoint's go
    log.close()
    first = ckpt.file_no
    assert cut_log(tmp_path / "l", cut_at, need_from=first - 1) is None  # that one is gone
    assert (tmp_path / "l" / "checkpoint").exists()
    removed = cut_log(tmp_path / "l", cut_at, need_from=first)
    assert removed is not None and removed > 0
    again = TxLog.open(tmp_path / "l", cfg)
    assert again.end_position == cut_at and again.latest_checkpoint() is None
    kept = [p for p in positions[:150] if p.file_no >= first]
    assert [r.position for r in again.replay(Position(first, 0))] == kept
    again.close()
    assert cut_log(tmp_path / "l", cut_at, need_from=first) == 0  # a prefix: nothing to do
