"""Semantics of the simulated disk (notify.sim.disk.SimFileSystem)."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from notify.fs import ensure_dir, write_file_atomically
from notify.sim.disk import SimCrash, SimFileSystem

RW_CREATE = os.O_RDWR | os.O_CREAT


def disk(seed: int = 0, capacity: int | None = None) -> SimFileSystem:
    fs = SimFileSystem(random.Random(seed), capacity)
    ensure_dir(fs, "/d")
    return fs


def durable_file(fs: SimFileSystem, path: str, data: bytes) -> int:
    """Create ``path`` with ``data``, fsync it and its directory; return the open fd."""
    fd = fs.open(path, RW_CREATE)
    fs.pwrite(fd, data, 0)
    fs.fdatasync(fd)
    fs.fsync_dir(str(Path(path).parent))
    return fd


def test_reads_see_unsynced_writes() -> None:
    fs = disk()
    fd = fs.open("/d/f", RW_CREATE)
    assert fs.pwrite(fd, b"hello", 0) == 5
    assert fs.pwrite(fd, b"!", 7) == 1  # past the end: a hole of zeros
    assert fs.pread(fd, 100, 0) == b"hello\0\0!"
    assert fs.fsize(fd) == 8
    assert fs.read_file("/d/f") == b"hello\0\0!"
    assert fs.unsynced_ops("/d/f") == 2


def test_unsynced_write_is_lost_at_crash_synced_survives() -> None:
    fs = disk()
    fd = durable_file(fs, "/d/f", b"synced")
    fs.pwrite(fd, b"-lost", 6)
    fs.crash()
    assert fs.read_file("/d/f") == b"synced"
    with pytest.raises(OSError) as info:
        fs.pread(fd, 1, 0)  # every descriptor died with the machine
    assert info.value.errno == errno.EBADF


def test_fsync_covers_every_descriptor_of_the_file() -> None:
    fs = disk()
    fd = durable_file(fs, "/d/f", b"a")
    other = fs.dup(fd)
    fs.pwrite(fd, b"b", 1)
    fs.close(fd)
    fs.fdatasync(other)
    fs.crash()
    assert fs.read_file("/d/f") == b"ab"


def test_unsynced_truncate_is_undone_and_synced_one_kept() -> None:
    fs = disk()
    fd = durable_file(fs, "/d/f", b"0123456789")
    fs.ftruncate(fd, 4)
    assert fs.read_file("/d/f") == b"0123"
    fs.crash()
    assert fs.read_file("/d/f") == b"0123456789"
    fd = fs.open("/d/f", os.O_RDWR)
    fs.ftruncate(fd, 4)
    fs.fdatasync(fd)
    fs.crash()
    assert fs.read_file("/d/f") == b"0123"


def test_torn_write_keeps_a_strict_prefix_of_the_last_unsynced_write() -> None:
    seen: set[int] = set()
    for seed in range(40):
        fs = disk(seed)
        fd = durable_file(fs, "/d/f", b"base")
        fs.pwrite(fd, b"x" * 10, 4)
        fs.pwrite(fd, b"ABCDEFGHIJ", 14)
        fs.crash(tear=True)
        assert fs.last_tear is not None
        path, off, kept, length = fs.last_tear
        assert (path, off, length) == ("/d/f", 14, 10)
        assert 1 <= kept < 10
        # the earlier unsynced write is lost: zeros between the durable end and the torn one
        assert fs.read_file("/d/f") == b"base" + bytes(10) + b"ABCDEFGHIJ"[:kept]
        seen.add(kept)
    assert len(seen) > 3  # the prefix length is random


def test_writeback_keeps_an_ordered_prefix_of_unsynced_operations() -> None:
    outcomes = set()
    for seed in range(60):
        fs = disk(seed)
        fd = durable_file(fs, "/d/f", b"")
        for i in range(3):
            fs.pwrite(fd, bytes([65 + i]) * 2, 2 * i)
        fs.crash(writeback=True)
        data = fs.read_file("/d/f")
        assert data in (b"", b"AA", b"AABB", b"AABBCC")
        outcomes.add(data)
    assert len(outcomes) == 4


def test_new_file_needs_a_directory_fsync() -> None:
    fs = disk()
    fd = fs.open("/d/f", RW_CREATE)
    fs.pwrite(fd, b"data", 0)
    fs.fdatasync(fd)  # the data is durable, the name is not
    fs.crash()
    assert not fs.exists("/d/f")
    fd = fs.open("/d/g", RW_CREATE)
    fs.fsync_dir("/d")
    fs.crash()
    assert fs.exists("/d/g") and fs.read_file("/d/g") == b""


def test_unlink_is_undone_without_a_directory_fsync() -> None:
    fs = disk()
    durable_file(fs, "/d/f", b"keep")
    fs.unlink("/d/f")
    assert not fs.exists("/d/f")
    fs.crash()
    assert fs.read_file("/d/f") == b"keep"
    fs.unlink("/d/f")
    fs.fsync_dir("/d")
    fs.crash()
    assert not fs.exists("/d/f")


def test_rename_durability() -> None:
    fs = disk()
    durable_file(fs, "/d/target", b"old")
    durable_file(fs, "/d/tmp", b"new")
    fs.replace("/d/tmp", "/d/target")
    assert fs.read_file("/d/target") == b"new" and not fs.exists("/d/tmp")
    fs.crash()
    assert fs.read_file("/d/target") == b"old" and fs.read_file("/d/tmp") == b"new"
    fs.replace("/d/tmp", "/d/target")
    fs.fsync_dir("/d")
    fs.crash()
    assert fs.read_file("/d/target") == b"new" and not fs.exists("/d/tmp")


def test_write_file_atomically_leaves_old_or_new_at_every_crash_point() -> None:
    for point in range(1, 12):
        fs = disk(point)
        write_file_atomically(fs, "/d/cfg", b"old")
        fs.arm_crash(point)
        try:
            write_file_atomically(fs, "/d/cfg", b"new content")
            fs.disarm_crash()
        except SimCrash:
            pass
        fs.crash(tear=True)
        assert fs.read_file("/d/cfg") in (b"old", b"new content")


def test_new_directory_needs_its_parent_fsynced() -> None:
    fs = disk()
    fs.mkdir("/d/sub")
    durable_file(fs, "/d/sub/f", b"x")  # fsyncs /d/sub, not /d
    fs.crash()
    assert not fs.exists("/d/sub")
    ensure_dir(fs, "/d/sub2/deeper")  # creates both levels durably
    durable_file(fs, "/d/sub2/deeper/f", b"x")
    fs.crash()
    assert fs.read_file("/d/sub2/deeper/f") == b"x"


def test_enospc_short_write_then_error_and_truncate_frees() -> None:
    fs = disk(capacity=10)
    fd = fs.open("/d/f", RW_CREATE)
    assert fs.pwrite(fd, b"12345678", 0) == 8
    assert fs.pwrite(fd, b"abcd", 8) == 2  # short write: the disk is full
    with pytest.raises(OSError) as info:
        fs.pwrite(fd, b"z", 10)
    assert info.value.errno == errno.ENOSPC
    assert fs.pwrite(fd, b"ZZ", 0) == 2  # overwriting needs no space
    fs.ftruncate(fd, 4)
    assert fs.used == 4
    assert fs.pwrite(fd, b"......", 4) == 6
    g = fs.open("/d/g", RW_CREATE)
    with pytest.raises(OSError):
        fs.pwrite(g, b"x", 0)
    fs.unlink("/d/f")
    assert fs.pwrite(g, b"x", 0) == 1


def test_fsync_eio_drops_the_dirty_data_and_the_next_fsync_succeeds() -> None:
    fs = disk()
    fd = durable_file(fs, "/d/f", b"ok")
    fs.pwrite(fd, b"-dropped", 2)
    fs.fail_fsync(1, errno.EIO, drop_dirty=True)
    with pytest.raises(OSError) as info:
        fs.fdatasync(fd)
    assert info.value.errno == errno.EIO
    assert fs.read_file("/d/f") == b"ok-dropped"  # the page cache still has it
    fs.pwrite(fd, b"!", 10)
    fs.fdatasync(fd)  # "succeeds", but the dropped pages never reach the disk
    fs.crash()
    assert fs.read_file("/d/f") == b"ok" + bytes(8) + b"!"


def test_crash_point_stops_everything_until_reboot() -> None:
    fs = disk()
    fd = durable_file(fs, "/d/f", b"")
    fs.arm_crash(2)
    fs.pwrite(fd, b"a", 0)
    with pytest.raises(SimCrash):
        fs.fdatasync(fd)
    assert fs.down
    with pytest.raises(SimCrash):
        fs.pread(fd, 1, 0)
    with pytest.raises(SimCrash):
        fs.close(fd)
    fs.crash()
    assert not fs.down
    assert fs.read_file("/d/f") == b""  # the fsync never ran


def test_errors_carry_the_posix_errno() -> None:
    fs = disk()
    with pytest.raises(FileNotFoundError):
        fs.open("/d/missing", os.O_RDONLY)
    with pytest.raises(FileNotFoundError):
        fs.open("/nodir/f", RW_CREATE)
    fs.open("/d/f", RW_CREATE)
    with pytest.raises(FileExistsError):
        fs.open("/d/f", RW_CREATE | os.O_EXCL)
    with pytest.raises(FileExistsError):
        fs.mkdir("/d")
    with pytest.raises(IsADirectoryError):
        fs.open("/d", os.O_RDWR)
    fd = fs.open("/d/f", os.O_RDONLY)
    with pytest.raises(OSError) as info:
        fs.pwrite(fd, b"x", 0)
    assert info.value.errno == errno.EBADF
    assert sorted(fs.listdir("/")) == ["d"]
    assert fs.list_files("/d") == ["f"]


def test_same_seed_same_outcome() -> None:
    def run(seed: int) -> bytes:
        fs = disk(seed)
        fd = durable_file(fs, "/d/f", b"")
        rng = random.Random(seed)
        for _ in range(30):
            fs.pwrite(fd, bytes([rng.randrange(256)]) * rng.randrange(1, 9),
                      rng.randrange(40))
            if rng.random() < 0.2:
                fs.fdatasync(fd)
        fs.crash(tear=True, writeback=True)
        return fs.read_file("/d/f")

    assert run(7) == run(7)
    assert len({run(s) for s in range(10)}) > 1
