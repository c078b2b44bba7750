"""Segment files, rolling, recovery of torn tails, recovery points, disk full."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from notify.config import parse_config
from notify.errors import OffsetOutOfRangeError, StoreCorruptError, StoreFullError
from notify.protocol import records
from notify.store.idempotent import already_present
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from tests.conftest import IN_CI


def rec(i: int, size: int = 10) -> bytes:
    return records.encode(1000 + i, 0, bytes([i % 256]) * size)


def open_part(d: Path, seg: int = 4096, rp: int | None = None) -> Partition:
    return Partition.open("t", 0, d, seg, group_commit=False, recovery_point=rp)


def test_append_roll_and_read_across_segments(tmp_path: Path) -> None:
    p = open_part(tmp_path, seg=100)
    offsets = [p.append(rec(i)) for i in range(10)]  # 30 bytes each -> 3 per segment
    assert offsets == [i * 30 for i in range(10)]
    names = sorted(os.listdir(tmp_path))
    assert names == [f"{s:020d}.meta" for s in (0, 90, 180, 270)]
    # a slice never crosses a segment; the next get continues at the next segment
    sl = p.slice(60, 1000, 1000)
    assert sl is not None and (sl.offset, sl.length) == (60, 30)
    assert p.nearest_offset(100) == 90
    assert p.nearest_offset(10**9) == 300
    got = []
    off = 0
    while data := p.read(off, 1000):
        rs, used = records.decode_all(data, off)
        got += rs
        off += used
    assert [r.msg_id for r in got] == list(range(1000, 1010))
    with pytest.raises(OffsetOutOfRangeError) as e:
        p.slice(301, 10, 10)
    assert e.value.nearest == 300
    p.close()
    # reopen: segments come back, appends continue at the end
    p2 = open_part(tmp_path, seg=100)
    assert (p2.min_offset, p2.end) == (0, 300)
    assert p2.append(rec(11)) == 300
    p2.close()


@pytest.mark.parametrize(
    "tail,reason",
    [
        (rec(5)[:13], "incomplete header"),
        (rec(5)[:25], "incomplete payload"),
        (b"\x00" * 64, "zero msgId"),
        (rec(5)[:20] + b"\xff" * 10, "checksum mismatch"),
        (b"\x7f\xff\xff\xff" + b"\x01" * 30, "incomplete payload"),
    ],
)
def test_torn_tail_is_truncated_and_reported(tmp_path: Path, tail: bytes, reason: str) -> None:
    p = open_part(tmp_path)
    for i in range(3):
        p.append(rec(i))
    p.close()
    seg = tmp_path / f"{0:020d}.meta"
    with open(seg, "ab") as f:
        f.write(tail)
    p2 = open_part(tmp_path)
    assert p2.recovery is not None
    assert p2.recovery.truncated_bytes == len(tail)
    assert p2.recovery.reason == reason
    assert p2.end == 90 and seg.stat().st_size == 90
    assert p2.append(rec(9)) == 90
    p2.close()


def test_recovery_scans_only_after_recovery_point(tmp_path: Path) -> None:
    p = open_part(tmp_path, seg=1 << 20)
    for i in range(100):
        p.append(rec(i))
    p.close()
    p2 = open_part(tmp_path, seg=1 << 20, rp=2400)
    assert p2.recovery is not None and p2.recovery.scanned_bytes == 600
    p2.close()


def test_gap_between_segments_is_refused(tmp_path: Path) -> None:
    p = open_part(tmp_path, seg=100)
    for i in range(7):
        p.append(rec(i))
    p.close()
    first = tmp_path / f"{0:020d}.meta"
    os.truncate(first, 60)
    with pytest.raises(StoreCorruptError, match="ends at 60"):
        open_part(tmp_path, seg=100)


def test_store_recovery_points_roundtrip(tmp_path: Path) -> None:
    cfg = parse_config(f"[system]\ndataPath={tmp_path}\n[topic=a]\nnumPartitions=2\n")
    s = MessageStore(cfg)
    s.open()
    a0 = s.get("a", 0)
    assert a0 is not None
    for i in range(10):
        a0.append(rec(i))
    s.close()
    text = (tmp_path / "recovery-points").read_text()
    assert "a 0 300" in text and "a 1 0" in text
    s2 = MessageStore(cfg)
    reports = s2.open()
    assert {(r.partition, r.scanned_bytes) for r in reports} == {(0, 0), (1, 0)}
    s2.close()
    # damaged file: full scan, still correct
    (tmp_path / "recovery-points").write_text("garbage")
    s3 = MessageStore(cfg)
    reports3 = s3.open()
    assert {(r.partition, r.scanned_bytes) for r in reports3} == {(0, 300), (1, 0)}
    s3.close()


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def test_disk_full_leaves_no_partial_record(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "256k"):
        if IN_CI:
            pytest.fail("cannot mount a tmpfs for the disk-full test in CI")
        pytest.skip("mounting a tmpfs needs root")
    try:
        p = open_part(mnt / "t-0", seg=1 << 30)
        ok = 0
        with pytest.raises(StoreFullError):
            for i in range(100000):
                p.append(rec(i, size=1000))
                ok += 1
        end = p.end
        assert end == ok * 1020
        assert (mnt / "t-0" / f"{0:020d}.meta").stat().st_size == end
        p.close()
        p2 = open_part(mnt / "t-0", seg=1 << 30)
        assert p2.recovery is not None and p2.recovery.truncated_bytes == 0 and p2.end == end
        p2.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_an_fsync_round_vouches_for_nothing_taken_back_while_it_ran(tmp_path: Path) -> None:
    """A round starts (its target: the end now), held puts are refused and taken back, other
    bytes are appended in their place, then the round ends: it covers only what was below
    the cut, so those bytes are neither counted flushed nor shown (under group commit)."""
    p = Partition.open("t", 0, tmp_path / "t-0", 1 << 20, group_commit=True)
    p.append(rec(1))
    cut = p.end
    p.append(rec(2), hold=True)
    target = p.end
    p.begin_sync()  # the round's fsync runs in a worker thread meanwhile
    p.active.sync()
    p.drop_from(cut)  # the synchronous slave refused it: taken back
    p.append(rec(3, size=40))
    p.mark_flushed(target)  # the round ends
    assert p.flushed_end == p.visible_end == cut < p.end
    p.sync()
    assert p.flushed_end == p.visible_end == p.end
    p.close()


def test_a_share_is_found_when_its_hint_fell_inside_what_replaced_a_taken_back_put(
    tmp_path: Path,
) -> None:
    """A COMMIT's hint is its partition's end when it was logged; puts held then, refused and
    taken back, leave the hint inside what was appended in their place. Recovery's check for
    what is already there scans from the hint's segment start then, instead of reading
    garbage at the hint and appending the share a second time."""
    p = Partition.open("t", 0, tmp_path / "t-0", 1 << 20, group_commit=True)
    p.append(rec(1))
    cut = p.end
    p.append(rec(2), hold=True)
    hint = p.end  # the COMMIT is logged now
    p.drop_from(cut)  # refused, taken back
    p.append(rec(3, size=40))  # another put goes where it was...
    share = rec(4) + rec(5)
    at = p.append_covered(share)  # ...and the commit's share after it
    p.sync()
    p.scan_start = p.end  # (recovery found all of it durable)
    assert cut < hint < at
    assert already_present(p, hint, share) == (len(share), at)
    p.close()
