"""The simulated disk behaves like the real file system, crashes aside: the same calls on
OsFileSystem (in a temporary directory) and on SimFileSystem give the same results."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify.fs import OS_FS, FileSystem, OsFileSystem, ensure_dir, write_file_atomically
from notify.sim.disk import SimFileSystem

RW_CREATE = os.O_RDWR | os.O_CREAT


@pytest.fixture(params=["os", "sim"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FileSystem, Path]]:
    if request.param == "os":
        yield OsFileSystem(), tmp_path
    else:
        fs = SimFileSystem(random.Random(0))
        ensure_dir(fs, "/root")
        yield fs, Path("/root")


def errno_of(fn: object, *args: object) -> int | None:
    try:
        fn(*args)  # type: ignore[operator]
    except OSError as e:
        return e.errno
    return None


def test_file_calls(env: tuple[FileSystem, Path]) -> None:
    fs, root = env
    f = root / "f"
    fd = fs.open(f, RW_CREATE, 0o644)
    try:
        assert fs.pwrite(fd, b"hello", 0) == 5
        assert fs.pwrite(fd, memoryview(b"xyz")[1:], 7) == 2
        assert fs.pread(fd, 100, 0) == b"hello\0\0yz"
        assert fs.pread(fd, 3, 8) == b"z" and fs.pread(fd, 3, 50) == b""
        assert fs.fsize(fd) == 9 and fs.size(f) == 9
        fs.ftruncate(fd, 4)
        assert fs.read_file(f) == b"hell"
        fs.ftruncate(fd, 6)
        assert fs.read_file(f) == b"hell\0\0"
        fs.fdatasync(fd)
        fs.fsync(fd)
        other = fs.dup(fd)
        fs.close(other)
        assert fs.pread(fd, 2, 0) == b"he"  # closing the dup leaves the original open
    finally:
        fs.close(fd)
    assert errno_of(fs.close, fd) == errno.EBADF
    w = fs.open(root / "w", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    assert fs.write(w, b"ab") == 2 and fs.write(w, b"cd") == 2  # write advances
    assert errno_of(fs.pread, w, 1, 0) == errno.EBADF  # write-only
    fs.close(w)
    assert fs.read_file(root / "w") == b"abcd"
    r = fs.open(root / "w", os.O_RDONLY)
    assert errno_of(fs.pwrite, r, b"x", 0) == errno.EBADF
    fs.close(r)


def test_namespace_calls(env: tuple[FileSystem, Path]) -> None:
    fs, root = env
    assert errno_of(fs.open, root / "missing", os.O_RDONLY) == errno.ENOENT
    assert errno_of(fs.open, root / "no" / "f", RW_CREATE, 0o644) == errno.ENOENT
    fs.close(fs.open(root / "a", RW_CREATE, 0o644))
    assert errno_of(fs.open, root / "a", RW_CREATE | os.O_EXCL, 0o644) == errno.EEXIST
    fs.mkdir(root / "d")
    assert errno_of(fs.mkdir, root / "d") == errno.EEXIST
    assert errno_of(fs.open, root / "d", os.O_RDWR) == errno.EISDIR
    assert sorted(fs.listdir(root)) == ["a", "d"]
    assert fs.list_files(root) == ["a"]
    assert fs.exists(root / "d") and not fs.exists(root / "zz") and not fs.exists(root / "a/x")
    write_file_atomically(fs, root / "cfg", b"one")
    write_file_atomically(fs, root / "cfg", b"two")
    assert fs.read_file(root / "cfg") == b"two" and not fs.exists(root / "cfg.tmp")
    fs.replace(root / "cfg", root / "a")
    assert fs.read_file(root / "a") == b"two" and not fs.exists(root / "cfg")
    assert errno_of(fs.replace, root / "cfg", root / "b") == errno.ENOENT
    fs.unlink(root / "a")
    assert errno_of(fs.unlink, root / "a") == errno.ENOENT
    assert errno_of(fs.read_file, root / "a") == errno.ENOENT
    fs.fsync_dir(root)
    assert ensure_dir(fs, root / "x" / "y") and not ensure_dir(fs, root / "x" / "y")
    assert fs.listdir(root / "x") == ["y"]


def test_os_fs_is_the_os_functions() -> None:
    """The real path adds no Python frame: the methods are the os functions themselves."""
    assert OS_FS.pwrite is os.pwrite and OS_FS.pread is os.pread
    assert OS_FS.fdatasync is getattr(os, "fdatasync", os.fsync)
