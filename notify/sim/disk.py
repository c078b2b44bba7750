"""A simulated disk: an in-memory :class:`~notify.fs.FileSystem` that forgets at a crash.

The model (POSIX as a careful program must assume it, not what a forgiving ext4 does):

* A file has the bytes reads see (the page cache) and its *durable* bytes. Every ``pwrite`` /
  ``write`` / ``ftruncate`` is appended to the file's list of unsynced operations;
  ``fdatasync``/``fsync`` of any descriptor of the file applies that list, in order, to the
  durable bytes. Cost: one bytearray slice assignment and one list append per write.
* A directory has its entries (what lookups see) and its durable entries. Creating, renaming
  or unlinking a name and creating a subdirectory change the entries only; ``fsync_dir``
  makes the whole directory's entries durable. A name whose directory was never fsynced since
  it appeared is gone after a crash; an unlinked name comes back.
* :meth:`SimFileSystem.crash` is a power cut and reboot: every descriptor is closed, every
  unsynced operation is lost and the live state becomes the durable one. Options:
  ``tear`` keeps a random strict prefix of the last unsynced write of one random file (a torn
  write; the bytes between the durable end and that write read as zeros, as after delayed
  allocation); ``writeback`` first applies a random prefix of each file's unsynced operations
  and, with probability 1/2, a directory's entries (the kernel wrote some back on its own).
* Crash points: :meth:`SimFileSystem.arm_crash` makes the n-th next mutating operation raise
  :class:`SimCrash` instead of running; from then on every call raises it until
  :meth:`SimFileSystem.crash`. So a crash can fall between any two effects of the real code
  (between a checkpoint's write and its rename, between an append and its fsync...).
* Faults: ``capacity`` (bytes; a write that would need more is short, then ``ENOSPC``) and
  :meth:`SimFileSystem.fail_fsync` (the next fsyncs raise ``EIO``; with ``drop_dirty`` the
  file's unsynced operations are discarded without reaching the durable bytes while reads
  still see them, as Linux does since 4.13 — a later fsync then succeeds without them).

Everything is deterministic: the only randomness is the ``random.Random`` given at
construction, drawn from only in :meth:`SimFileSystem.crash`. Paths are normalised POSIX
paths; relative ones are taken from the root. Only one thread may use an instance at a time
(the simulation is single-threaded).
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from notify.fs import Buf, StrPath

if TYPE_CHECKING:
    from notify.fs import FileSystem

__all__ = ["SimCrash", "SimFileSystem"]

_ACCMODE: Final = os.O_ACCMODE
_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)

#: an unsynced operation: ``(offset, payload)`` for a write, ``(size, None)`` for a truncate
_Op = tuple[int, bytes | None]


class SimCrash(BaseException):
    """The simulated machine lost power at an armed crash point.

    A :class:`BaseException` (like :class:`KeyboardInterrupt`) on purpose: the code under
    test must not be able to catch and survive it, since a real power cut does not return.
    """


class _File:
    __slots__ = ("data", "durable", "links", "pending")

    def __init__(self) -> None:
        self.data = bytearray()
        self.durable = bytearray()
        self.pending: list[_Op] = []
        self.links = 1


class _Dir:
    __slots__ = ("durable", "entries")

    def __init__(self) -> None:
        self.entries: dict[str, _File | _Dir] = {}
        self.durable: dict[str, _File | _Dir] = {}


class _Handle:
    __slots__ = ("node", "path", "pos", "readable", "writable")

    def __init__(self, node: _File | _Dir, path: str, readable: bool, writable: bool) -> None:
        self.node = node
        self.path = path
        self.readable = readable
        self.writable = writable
        self.pos = 0


def _err(code: int, path: StrPath | None = None) -> OSError:
    if path is None:
        return OSError(code, os.strerror(code))
    return OSError(code, os.strerror(code), os.fspath(path))


def _apply(buf: bytearray, ops: list[_Op]) -> None:
    for off, payload in ops:
        if payload is None:
            if off < len(buf):
                del buf[off:]
            else:
                buf.extend(bytes(off - len(buf)))
        else:
            if off > len(buf):
                buf.extend(bytes(off - len(buf)))
            buf[off : off + len(payload)] = payload


class SimFileSystem:
    """In-memory, crash-aware :class:`~notify.fs.FileSystem`; see the module docstring."""

    def __init__(self, rng: random.Random, capacity: int | None = None) -> None:
        self.rng = rng
        #: bytes the disk holds at most (``None``: unlimited); writes past it fail with ENOSPC
        self.capacity = capacity
        self._root = _Dir()
        self._pcache: dict[str, list[str]] = {}
        self._files: list[_File] = []
        self._fds: dict[int, _Handle] = {}
        self._next_fd = 1000
        self._used = 0
        self._down = False
        self._crash_at: int | None = None
        self._fsync_failures = 0
        self._fsync_errno = errno.EIO
        self._fsync_drop = True
        #: mutating operations run so far (the clock of :meth:`arm_crash`)
        self.ops = 0
        self.crashes = 0
        self.fsyncs = 0
        self.bytes_written = 0
        #: ``(path, offset, kept, length)`` of the write the last crash tore, or None
        self.last_tear: tuple[str, int, int, int] | None = None
        #: called with a one-line description of each mutating operation (debugging a seed)
        self.trace: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ faults

    def arm_crash(self, after_ops: int) -> None:
        """Make the ``after_ops``-th next mutating operation (1 = the next one) raise
        :class:`SimCrash` without running; every later call raises it too, until
        :meth:`crash`."""
        if after_ops < 1:
            raise ValueError("after_ops must be at least 1")
        self._crash_at = self.ops + after_ops

    def disarm_crash(self) -> None:
        """Cancel a crash point armed with :meth:`arm_crash` that has not fired."""
        self._crash_at = None

    @property
    def down(self) -> bool:
        """True between a fired crash point and :meth:`crash`."""
        return self._down

    def fail_fsync(self, count: int = 1, code: int = errno.EIO, drop_dirty: bool = True) -> None:
        """Make the next ``count`` file fsyncs raise ``OSError(code)``; with ``drop_dirty``
        the file's unsynced operations are lost for the disk (reads still see them)."""
        self._fsync_failures = count
        self._fsync_errno = code
        self._fsync_drop = drop_dirty

    # ------------------------------------------------------------------ crash

    def crash(self, tear: bool = False, writeback: bool = False) -> None:
        """Power cut and reboot: keep only durable state (see the module docstring)."""
        rng = self.rng
        self.crashes += 1
        self.last_tear = None
        torn: list[tuple[_File, int, bytes]] = []
        for f in self._files:
            if not f.pending:
                continue
            keep = rng.randint(0, len(f.pending)) if writeback else 0
            if keep:
                _apply(f.durable, f.pending[:keep])
            if not tear:
                continue
            rest = f.pending[keep:]
            # with writeback the operation that was in flight, else the last unsynced write
            cand = rest[:1] if writeback else [op for op in rest if op[1] is not None][-1:]
            if cand and cand[0][1] is not None and len(cand[0][1]) > 1:
                torn.append((f, cand[0][0], cand[0][1]))
        if torn:
            f, off, payload = torn[rng.randrange(len(torn))]
            cut = rng.randrange(1, len(payload))
            _apply(f.durable, [(off, payload[:cut])])
            self.last_tear = (self._name_of(f), off, cut, len(payload))
        if writeback:
            for d in self._dirs():
                if d.entries != d.durable and rng.random() < 0.5:
                    d.durable = dict(d.entries)
        # reboot: the live state is what the disk holds
        self._fds.clear()
        self._down = False
        self._crash_at = None
        self._fsync_failures = 0
        files: list[_File] = []
        seen: set[int] = set()
        stack = [self._root]
        while stack:
            d = stack.pop()
            d.entries = dict(d.durable)
            for node in d.entries.values():
                if isinstance(node, _Dir):
                    stack.append(node)
                elif id(node) in seen:
                    node.links += 1
                else:
                    seen.add(id(node))
                    node.links = 1
                    node.data = bytearray(node.durable)
                    node.pending = []
                    files.append(node)
        self._files = files
        self._used = sum(len(f.data) for f in files)

    def _dirs(self) -> list[_Dir]:
        out: list[_Dir] = []
        stack = [self._root]
        seen: set[int] = set()
        while stack:
            d = stack.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            out.append(d)
            for m in (d.entries, d.durable):
                stack.extend(n for n in m.values() if isinstance(n, _Dir))
        return out

    def _name_of(self, f: _File) -> str:
        stack: list[tuple[str, _Dir]] = [("", self._root)]
        while stack:
            prefix, d = stack.pop()
            for m in (d.entries, d.durable):
                for name, node in m.items():
                    if node is f:
                        return f"{prefix}/{name}"
                    if isinstance(node, _Dir):
                        stack.append((f"{prefix}/{name}", node))
        return "<unlinked>"

    # ------------------------------------------------------------------ inspection

    def durable_bytes(self, path: StrPath) -> bytes | None:
        """What a crash right now would leave at ``path`` (ignoring tears), or None."""
        node: _File | _Dir | None = self._root
        for part in self._parts(path):
            if not isinstance(node, _Dir):
                return None
            node = node.durable.get(part)
        if not isinstance(node, _File):
            return None
        return bytes(node.durable)

    def unsynced_ops(self, path: StrPath) -> int:
        """How many operations on the file at ``path`` a crash would lose."""
        node = self._lookup(path)
        if not isinstance(node, _File):
            raise _err(errno.ENOENT, path)
        return len(node.pending)

    @property
    def used(self) -> int:
        """Bytes held by linked files (what ``capacity`` limits)."""
        return self._used

    # ------------------------------------------------------------------ internals

    def _op(self, what: str = "", arg: object = None, detail: object = "") -> None:
        """Account one mutating operation; fire an armed crash point."""
        if self._down:
            raise SimCrash("the simulated machine is down")
        self.ops += 1
        if self.trace is not None:
            if isinstance(arg, int) and arg in self._fds:
                arg = self._fds[arg].path
            self.trace(f"#{self.ops} {what} {arg} {detail}")
        if self._crash_at is not None and self.ops >= self._crash_at:
            self._down = True
            self._crash_at = None
            raise SimCrash(f"crash point at operation {self.ops}")

    def _up(self) -> None:
        if self._down:
            raise SimCrash("the simulated machine is down")

    def _parts(self, path: StrPath) -> list[str]:
        key = os.fspath(path)
        out = self._pcache.get(key)
        if out is not None:
            return out
        out = []
        for part in key.split("/"):
            if not part or part == ".":
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            out.append(part)
        if len(self._pcache) > 4096:
            self._pcache.clear()
        self._pcache[key] = out
        return out

    def _lookup(self, path: StrPath) -> _File | _Dir | None:
        node: _File | _Dir | None = self._root
        for part in self._parts(path):
            if not isinstance(node, _Dir):
                return None
            node = node.entries.get(part)
        return node

    def _parent(self, path: StrPath) -> tuple[_Dir, str]:
        parts = self._parts(path)
        if not parts:
            raise _err(errno.EBUSY, path)
        d: _File | _Dir | None = self._root
        for part in parts[:-1]:
            assert isinstance(d, _Dir)
            d = d.entries.get(part)
            if d is None:
                raise _err(errno.ENOENT, path)
            if not isinstance(d, _Dir):
                raise _err(errno.ENOTDIR, path)
        assert isinstance(d, _Dir)
        return d, parts[-1]

    def _dir(self, path: StrPath) -> _Dir:
        node = self._lookup(path)
        if node is None:
            raise _err(errno.ENOENT, path)
        if not isinstance(node, _Dir):
            raise _err(errno.ENOTDIR, path)
        return node

    def _file(self, fd: int) -> tuple[_Handle, _File]:
        h = self._fds.get(fd)
        if h is None:
            raise _err(errno.EBADF)
        if not isinstance(h.node, _File):
            raise _err(errno.EISDIR, h.path)
        return h, h.node

    def _truncate(self, f: _File, size: int) -> None:
        old = len(f.data)
        if size < old:
            del f.data[size:]
        elif size > old:
            if self.capacity is not None and f.links and self._used + size - old > self.capacity:
                raise _err(errno.ENOSPC)
            f.data.extend(bytes(size - old))
        if f.links:
            self._used += size - old
        f.pending.append((size, None))

    def _unlinked(self, node: _File | _Dir) -> None:
        if isinstance(node, _File):
            node.links -= 1
            if node.links == 0:
                self._used -= len(node.data)

    # ------------------------------------------------------------------ FileSystem

    def open(self, path: StrPath, flags: int, mode: int = 0o644, /) -> int:
        """Open (``O_CREAT``, ``O_EXCL``, ``O_TRUNC``, ``O_DIRECTORY`` and the access mode are
        honoured; other flags are ignored). Creating or truncating counts as an operation."""
        if flags & (os.O_CREAT | os.O_TRUNC):
            self._op("open", path, f"flags={flags:#x}")
        else:
            self._up()
        parts = self._parts(path)
        node: _File | _Dir | None
        if not parts:
            node = self._root
        else:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                if not flags & os.O_CREAT or flags & _DIRECTORY:
                    raise _err(errno.ENOENT, path)
                node = _File()
                parent.entries[name] = node
                self._files.append(node)
            elif flags & os.O_CREAT and flags & os.O_EXCL:
                raise _err(errno.EEXIST, path)
        acc = flags & _ACCMODE
        readable = acc in (os.O_RDONLY, os.O_RDWR)
        writable = acc in (os.O_WRONLY, os.O_RDWR)
        if isinstance(node, _Dir):
            if writable:
                raise _err(errno.EISDIR, path)
        elif flags & _DIRECTORY:
            raise _err(errno.ENOTDIR, path)
        elif flags & os.O_TRUNC and writable:
            self._truncate(node, 0)
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = _Handle(node, os.fspath(path), readable, writable)
        return fd

    def close(self, fd: int, /) -> None:
        """Close a handle (EBADF if it is not open)."""
        self._up()
        if self._fds.pop(fd, None) is None:
            raise _err(errno.EBADF)

    def dup(self, fd: int, /) -> int:
        """A second handle on the same file, same access mode."""
        self._up()
        h = self._fds.get(fd)
        if h is None:
            raise _err(errno.EBADF)
        new = self._next_fd
        self._next_fd += 1
        self._fds[new] = _Handle(h.node, h.path, h.readable, h.writable)
        return new

    def pwrite(self, fd: int, data: Buf, offset: int, /) -> int:
        """Write at ``offset``: visible at once, durable after the next fsync of the file."""
        self._op("pwrite", fd, f"{len(data)} B at {offset}")
        h, f = self._file(fd)
        if not h.writable:
            raise _err(errno.EBADF)
        if offset < 0:
            raise _err(errno.EINVAL)
        n = len(data)
        if n == 0:
            return 0
        size = len(f.data)
        growth = offset + n - size
        if growth > 0 and self.capacity is not None and f.links:
            room = self.capacity - self._used
            if growth > room:
                n = size + room - offset
                if n <= 0:
                    raise _err(errno.ENOSPC)
                growth = offset + n - size
        payload = bytes(data) if n == len(data) else bytes(memoryview(data)[:n])
        if offset > size:
            f.data.extend(bytes(offset - size))
        f.data[offset : offset + n] = payload
        f.pending.append((offset, payload))
        if growth > 0 and f.links:
            self._used += growth
        self.bytes_written += n
        return n

    def write(self, fd: int, data: Buf, /) -> int:
        """Write at the handle's position and advance it."""
        h = self._fds.get(fd)
        if h is None:
            self._up()
            raise _err(errno.EBADF)
        n = self.pwrite(fd, data, h.pos)
        h.pos += n
        return n

    def pread(self, fd: int, length: int, offset: int, /) -> bytes:
        """Up to ``length`` bytes at ``offset`` of what was written (synced or not)."""
        self._up()
        h, f = self._file(fd)
        if not h.readable:
            raise _err(errno.EBADF)
        return bytes(f.data[offset : offset + length])

    def ftruncate(self, fd: int, size: int, /) -> None:
        """Cut or zero-extend the file; durable after the next fsync of the file."""
        self._op("ftruncate", fd, size)
        h, f = self._file(fd)
        if not h.writable:
            raise _err(errno.EINVAL)
        self._truncate(f, size)

    def fdatasync(self, fd: int, /) -> None:
        """Make the file's unsynced operations durable (or fail, see :meth:`fail_fsync`)."""
        self._op("fsync", fd, "FAILS" if self._fsync_failures else "")
        h = self._fds.get(fd)
        if h is None:
            raise _err(errno.EBADF)
        node = h.node
        if isinstance(node, _Dir):
            node.durable = dict(node.entries)
            return
        self.fsyncs += 1
        if self._fsync_failures:
            self._fsync_failures -= 1
            if self._fsync_drop:
                node.pending.clear()
            raise _err(self._fsync_errno)
        if node.pending:
            _apply(node.durable, node.pending)
            node.pending.clear()

    fsync = fdatasync

    def fsize(self, fd: int, /) -> int:
        """Current size of the open file."""
        self._up()
        return len(self._file(fd)[1].data)

    def size(self, path: StrPath, /) -> int:
        """Current size of the file at ``path``."""
        self._up()
        node = self._lookup(path)
        if node is None:
            raise _err(errno.ENOENT, path)
        return len(node.data) if isinstance(node, _File) else 0

    def read_file(self, path: StrPath, /) -> bytes:
        """Whole current content of the file at ``path``."""
        self._up()
        node = self._lookup(path)
        if node is None:
            raise _err(errno.ENOENT, path)
        if isinstance(node, _Dir):
            raise _err(errno.EISDIR, path)
        return bytes(node.data)

    def listdir(self, path: StrPath, /) -> list[str]:
        """Entry names of the directory, in creation order."""
        self._up()
        return list(self._dir(path).entries)

    def list_files(self, path: StrPath, /) -> list[str]:
        """Names of the files (not subdirectories) of the directory."""
        self._up()
        return [n for n, node in self._dir(path).entries.items() if isinstance(node, _File)]

    def exists(self, path: StrPath, /) -> bool:
        """Whether ``path`` exists now."""
        self._up()
        return self._lookup(path) is not None

    def mkdir(self, path: StrPath, /) -> None:
        """Create a directory; durable once its parent is fsynced."""
        self._op("mkdir", path)
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _err(errno.EEXIST, path)
        parent.entries[name] = _Dir()

    def fsync_dir(self, path: StrPath, /) -> None:
        """Make the directory's current entries durable."""
        self._op("fsync_dir", path)
        d = self._dir(path)
        d.durable = dict(d.entries)

    def replace(self, src: StrPath, dst: StrPath, /) -> None:
        """Rename atomically; durable once the directories are fsynced."""
        self._op("replace", src, f"-> {os.fspath(dst)}")
        sp, sn = self._parent(src)
        node = sp.entries.get(sn)
        if node is None:
            raise _err(errno.ENOENT, src)
        dp, dn = self._parent(dst)
        old = dp.entries.get(dn)
        if old is node:
            return
        if isinstance(old, _Dir):
            raise _err(errno.EISDIR, dst)
        if old is not None and isinstance(node, _Dir):
            raise _err(errno.ENOTDIR, dst)
        del sp.entries[sn]
        if old is not None:
            self._unlinked(old)
        dp.entries[dn] = node

    def unlink(self, path: StrPath, /) -> None:
        """Remove a file's name; durable once the directory is fsynced."""
        self._op("unlink", path)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise _err(errno.ENOENT, path)
        if isinstance(node, _Dir):
            raise _err(errno.EISDIR, path)
        del parent.entries[name]
        self._unlinked(node)


if TYPE_CHECKING:
    _conforms: FileSystem = SimFileSystem(random.Random(0))
