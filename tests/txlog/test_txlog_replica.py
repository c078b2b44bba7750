"""A replica redo log: frames copied at the source's positions, segment rolls included."""

from __future__ import annotations

from pathlib import Path

import pytest

from notify.errors import TxLogError
from txlog import Position, TxLog, TxLogConfig


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
