"""The storage seam: every file operation the redo log and the message store make.

:class:`FileSystem` is a :class:`typing.Protocol` of the calls the log (:mod:`notify.txlog`) and the
message store (:mod:`notify.store`) need; :class:`OsFileSystem` is the real one (``os.*`` calls,
bound once as static methods, so going through it costs one attribute lookup, like ``os.X``).
``notify.sim.disk.SimFileSystem`` is an in-memory one that models what survives a crash.

It lives in :mod:`notify.txlog` because that package is below the rest (it imports nothing
of notify but :mod:`notify.errors`); :mod:`notify.fs` re-exports it.

Conventions: handles are ``int`` (real descriptors for :class:`OsFileSystem`, fake numbers for a
simulated one); ``open`` takes ``os.O_*`` flags (``O_RDONLY``/``O_WRONLY``/``O_RDWR``,
``O_CREAT``, ``O_EXCL``, ``O_TRUNC``, ``O_CLOEXEC``); errors are :class:`OSError` with the
usual ``errno``, whichever implementation raises them.

Durability contract the callers follow (and the simulator enforces): file data is durable only
after ``fdatasync``/``fsync`` of a descriptor of that file; a directory entry (a created,
renamed or unlinked name, a new subdirectory) only after ``fsync_dir`` of its directory.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final, Protocol

__all__ = [
    "FSYNC_FAILED",
    "OS_FS",
    "Buf",
    "FileSystem",
    "OsFileSystem",
    "StrPath",
    "ensure_dir",
    "leave_marker",
    "write_file_atomically",
]

StrPath = str | os.PathLike[str]
Buf = bytes | bytearray | memoryview

#: Marker file a failed fsync leaves in a redo-log or partition directory (not fsynced: it
#: only has to outlive the process, not the machine); the next open rewrites the unsynced
#: tail, which the page cache may show as clean pages the disk never got.
FSYNC_FAILED: Final = "fsync-failed"


def leave_marker(fs: FileSystem, path: StrPath) -> None:
    """Create an empty file at ``path`` without fsync (see :data:`FSYNC_FAILED`)."""
    fs.close(fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


_DIR_FLAGS: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC


class FileSystem(Protocol):
    """File operations of the log and the store; see the module docstring for conventions."""

    def open(self, path: StrPath, flags: int, mode: int = 0o644, /) -> int:
        """Open ``path`` with ``os.O_*`` ``flags``; return a handle."""
        ...

    def close(self, fd: int, /) -> None:
        """Close a handle."""
        ...

    def dup(self, fd: int, /) -> int:
        """A second handle on the same open file (closing one leaves the other usable)."""
        ...

    def pwrite(self, fd: int, data: Buf, offset: int, /) -> int:
        """Write ``data`` at ``offset``; return the bytes written (may be short)."""
        ...

    def write(self, fd: int, data: Buf, /) -> int:
        """Write ``data`` at the handle's file position and advance it."""
        ...

    def pread(self, fd: int, length: int, offset: int, /) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at end of file)."""
        ...

    def ftruncate(self, fd: int, size: int, /) -> None:
        """Cut (or zero-extend) the file to ``size`` bytes."""
        ...

    def fdatasync(self, fd: int, /) -> None:
        """Make the file's data (and its size) durable."""
        ...

    def fsync(self, fd: int, /) -> None:
        """Make the file's data and metadata durable."""
        ...

    def fsize(self, fd: int, /) -> int:
        """Current size in bytes of an open file (``fstat(fd).st_size``)."""
        ...

    def size(self, path: StrPath, /) -> int:
        """Current size in bytes of the file at ``path`` (``stat(path).st_size``)."""
        ...

    def read_file(self, path: StrPath, /) -> bytes:
        """The whole content of ``path`` (FileNotFoundError when it does not exist)."""
        ...

    def listdir(self, path: StrPath, /) -> list[str]:
        """Names of the entries of directory ``path`` (any order)."""
        ...

    def list_files(self, path: StrPath, /) -> list[str]:
        """Names of the regular files (not following symlinks) in directory ``path``."""
        ...

    def exists(self, path: StrPath, /) -> bool:
        """Whether ``path`` names an existing file or directory."""
        ...

    def mkdir(self, path: StrPath, /) -> None:
        """Create one directory (FileExistsError if it exists, FileNotFoundError if its parent
        does not). Durable only after ``fsync_dir`` of the parent; see :func:`ensure_dir`."""
        ...

    def fsync_dir(self, path: StrPath, /) -> None:
        """Make the entries of directory ``path`` (creations, renames, unlinks) durable."""
        ...

    def replace(self, src: StrPath, dst: StrPath, /) -> None:
        """Atomically rename ``src`` to ``dst``, replacing ``dst``."""
        ...

    def unlink(self, path: StrPath, /) -> None:
        """Remove the name ``path`` (FileNotFoundError if missing)."""
        ...


def _read_file(path: StrPath) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _list_files(path: StrPath) -> list[str]:
    with os.scandir(path) as entries:
        return [e.name for e in entries if e.is_file(follow_symlinks=False)]


def _size(path: StrPath) -> int:
    return os.stat(path).st_size


def _fsize(fd: int) -> int:
    return os.fstat(fd).st_size


def _fsync_dir(path: StrPath) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: StrPath) -> None:
    os.mkdir(path, 0o777)


class OsFileSystem:
    """The real file system: each method is the ``os`` function itself (no wrapper frame)."""

    open = staticmethod(os.open)
    close = staticmethod(os.close)
    dup = staticmethod(os.dup)
    pwrite = staticmethod(os.pwrite)
    write = staticmethod(os.write)
    pread = staticmethod(os.pread)
    ftruncate = staticmethod(os.ftruncate)
    fdatasync = staticmethod(getattr(os, "fdatasync", os.fsync))
    fsync = staticmethod(os.fsync)
    fsize = staticmethod(_fsize)
    size = staticmethod(_size)
    read_file = staticmethod(_read_file)
    listdir = staticmethod(os.listdir)
    list_files = staticmethod(_list_files)
    exists = staticmethod(os.path.exists)
    mkdir = staticmethod(_mkdir)
    fsync_dir = staticmethod(_fsync_dir)
    replace = staticmethod(os.replace)
    unlink = staticmethod(os.unlink)

    def __repr__(self) -> str:
        return "OsFileSystem()"


#: The process-wide real file system, the default of every ``fs=`` argument.
OS_FS: Final[FileSystem] = OsFileSystem()


def ensure_dir(fs: FileSystem, path: StrPath) -> bool:
    """Create ``path`` and its missing parents durably; return whether anything was created.

    Each directory created is made durable by an ``fsync_dir`` of its parent (POSIX does not
    promise that a new directory survives a crash otherwise, even when files in it were
    fsynced). An existing directory costs one ``exists`` call.
    """
    p = Path(path)
    if fs.exists(p):
        return False
    missing: list[Path] = []
    while not fs.exists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            fs.mkdir(d)
        except FileExistsError:
            continue  # created concurrently
        fs.fsync_dir(d.parent)
    return True


def write_file_atomically(
    fs: FileSystem, path: StrPath, data: bytes, tmp_suffix: str = ".tmp"
) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    Writes ``<path><tmp_suffix>``, fsyncs it, renames it over ``path`` and fsyncs the
    directory. Raises OSError (the temporary file is removed then; ``path`` is untouched).
    """
    target = Path(path)
    tmp = target.with_name(target.name + tmp_suffix)
    try:
        fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[fs.write(fd, view) :]
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.unlink(tmp)
        raise
    fs.fsync_dir(target.parent)
