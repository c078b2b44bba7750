"""Durability bugs the simulated disk found in the store and the redo log, one test each.

Each test runs the real code on SimFileSystem and crashes it where POSIX lets a crash lose or
bring back what the code assumed settled. The fixed ones failed before their fix (see the
commit that added this file).
"""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from notify.errors import StoreError, StoreFullError, TxLogError
from notify.protocol import records
from notify.sim.disk import SimFileSystem
from notify.store.partition import Partition
from notify.store.segment import segment_name
from notify.txlog import TxLog, TxLogConfig

PART = Path("/data/t-0")
LOG = Path("/data/txlog")


def rec(i: int, size: int = 50) -> bytes:
    return records.encode(i, 0, bytes([i % 256]) * size)


def open_part(fs: SimFileSystem, seg: int = 4096) -> Partition:
    return Partition.open("t", 0, PART, seg, group_commit=True, fs=fs)


def contents(p: Partition) -> bytes:
    return b"".join(s.read(0, s.size) for s in p.segments)


def test_new_partition_and_log_directories_survive_a_crash() -> None:
    """Directories were created with mkdir(parents=True) and only the directory itself was
    fsynced: its entry in the parent was not durable, so a crash could take the whole
    partition (or redo log) with its fsynced data. ensure_dir fsyncs each parent."""
    fs = SimFileSystem(random.Random(1))
    p = open_part(fs)
    p.append(rec(1))
    p.sync()
    log = TxLog.open(LOG, TxLogConfig(flush_at_commit=1), fs=fs)
    log.commit(7, b"decided")
    fs.crash()
    assert contents(open_part(fs)) == rec(1)
    assert [r.body for r in TxLog.open(LOG, fs=fs).replay()] == [b"decided"]


def test_a_failed_append_does_not_come_back_after_a_crash() -> None:
    """A disk-full append was cut back with ftruncate but not synced: the kernel could
    write back the partial write's pages and lose the truncate, so a record the producer
    was told failed reappeared after a crash. The cut-back is now synced."""
    for seed in range(40):
        fs = SimFileSystem(random.Random(seed))
        p = open_part(fs)
        p.append(rec(1))
        p.sync()
        fs.capacity = fs.used + 100  # the first of two 70-byte records fits
        with pytest.raises(StoreFullError):
            p.append(rec(2) + rec(3))
        fs.capacity = None
        assert fs.unsynced_ops(PART / segment_name(0)) == 0
        fs.crash(tear=True, writeback=True)
        assert contents(open_part(fs)) == rec(1), seed


def test_a_failed_log_write_does_not_come_back_after_a_crash() -> None:
    """Same for the redo log: a frame whose write failed ("nothing was appended") could be
    replayed after a crash, e.g. a commit decision the caller had rolled back."""
    for seed in range(40):
        fs = SimFileSystem(random.Random(seed))
        log = TxLog.open(LOG, TxLogConfig(flush_at_commit=0), fs=fs)
        log.append(1, b"a" * 20)
        log.sync()
        fs.capacity = fs.used + 30
        with pytest.raises(TxLogError, match="nothing was appended"):
            log.append_many([(2, b"b" * 10), (3, b"c" * 40)])
        fs.capacity = None
        fs.crash(tear=True, writeback=True)
        assert [r.body for r in TxLog.open(LOG, fs=fs).replay()] == [b"a" * 20], seed


def test_rollback_across_a_segment_roll_survives_a_crash() -> None:
    """rollback_to unlinked the segments it dropped without fsyncing the directory. After a
    crash the segment came back: with the rolled-back records (consumers would see a
    transaction that failed), or, once the previous segment had grown again, with a gap that
    made the partition refuse to open (StoreCorruptError: the broker does not start)."""
    fs = SimFileSystem(random.Random(3))
    p = open_part(fs, seg=4096)
    for i in range(1, 4):
        p.append(rec(i, 1200))
    p.sync()
    offset = p.append(rec(4, 1200))  # rolls: the segment holds 3 records
    assert len(p.segments) == 2 and offset == p.segments[1].start
    p.rollback_to(offset)  # the transaction's apply failed elsewhere
    p.append(rec(5, 100))  # the old segment is active again and grows past `offset`
    p.sync()
    fs.crash()
    try:
        recovered = contents(open_part(fs))
    except StoreError as e:
        pytest.fail(f"the partition does not open after the crash: {e}")
    assert recovered == b"".join(rec(i, 1200) for i in range(1, 4)) + rec(5, 100)


def test_rolled_back_records_do_not_reappear_after_a_crash() -> None:
    for seed in range(40):
        fs = SimFileSystem(random.Random(seed))
        p = open_part(fs, seg=4096)
        for i in range(1, 4):
            p.append(rec(i, 1200))
        p.sync()
        offset = p.append(rec(4, 1200))
        p.rollback_to(offset)
        fs.crash(tear=True, writeback=True)
        assert contents(open_part(fs)) == b"".join(rec(i, 1200) for i in range(1, 4)), seed


def test_records_acknowledged_after_a_failed_fsync_survive_a_crash() -> None:
    """After a failed fsync the kernel may have dropped the dirty pages and marked them
    clean, so a later fsync "succeeds" over a hole and records acknowledged after it were cut
    off by recovery. The log is now fail-stop: nothing is acknowledged until it is reopened,
    and what is acknowledged after reopening survives a crash."""
    fs = SimFileSystem(random.Random(5))
    log = TxLog.open(LOG, TxLogConfig(flush_at_commit=1), fs=fs)
    log.commit(1, b"before")
    fs.fail_fsync(1, errno.EIO, drop_dirty=True)
    with pytest.raises(TxLogError):
        log.commit(1, b"fsync fails")  # outcome unknown: fine either way
    assert log.failed is not None
    for attempt in (lambda: log.commit(1, b"refused"), log.sync, lambda: log.append(1, b"x")):
        with pytest.raises(TxLogError, match="reopen"):
            attempt()
    log.close()
    assert fs.exists(LOG / "fsync-failed")
    # same boot: the page cache still shows "fsync fails" (clean, never on disk); the reopen
    # rewrites the newest segment so nothing acknowledged later sits behind a hole
    log = TxLog.open(LOG, TxLogConfig(flush_at_commit=1), fs=fs)
    assert log.failed is None and not fs.exists(LOG / "fsync-failed")
    log.commit(1, b"after")  # acknowledged as durable
    fs.crash()
    bodies = [r.body for r in TxLog.open(LOG, fs=fs).replay()]
    assert bodies[0] == b"before" and b"after" in bodies and b"refused" not in bodies, bodies


def test_partition_records_after_a_failed_fsync_and_restart_survive_a_crash() -> None:
    """The partition's half of the same finding: after a failed fsync the broker makes the
    partition read-only (the flusher calls ``fail``); the restart, in the same boot, reads the
    never-written records from the page cache. Without the rewrite, records appended and
    fsynced after the restart were cut off by the next crash's recovery at the hole."""
    fs = SimFileSystem(random.Random(7))
    p = open_part(fs)
    p.append(rec(1))
    p.sync()
    p.append(rec(2))
    fs.fail_fsync(1, errno.EIO, drop_dirty=True)
    with pytest.raises(OSError):
        p.sync()
    p.fail("fsync failed")  # what the flusher does
    p.close()
    assert fs.exists(PART / "fsync-failed")
    p = open_part(fs)  # same boot: rec(2) is visible from the page cache
    assert not fs.exists(PART / "fsync-failed") and p.failed is None
    p.append(rec(3))
    p.sync()
    fs.crash()
    assert contents(open_part(fs)) == rec(1) + rec(2) + rec(3)
