"""What a broker takes before it opens anything: an exclusive lock on every directory it writes
and every port it listens on.

Locks: ``broker.lock`` in ``dataPath``, in ``dataLogPath`` (the redo, delay and queue logs) and
in each topic's own ``dataPath``, held with ``flock(LOCK_EX)`` for the broker's life (the
kernel drops it when the process dies, even by SIGKILL). The file says who holds it
(``{"pid", "brokerId", "host", "port", "httpPort", "since"}``), so a second broker started on
the same config fails at once naming the first, before it opens any file of the store.

Order, so that a start that fails leaves nothing behind: first every *existing* lock file is
locked (a running broker's directories exist: the second start stops here, having created
nothing); then the ports are bound and put in listening state (connections wait in the
backlog, unanswered, until the broker serves); only then are missing directories and lock
files created and locked, and the holder written into every lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from notify.config import ServerConfig
from notify.errors import DirectoryLockedError, StartupError

LOCK_FILE: Final = "broker.lock"
BACKLOG: Final = 1024


def locked_directories(config: ServerConfig) -> list[Path]:
    """Every directory the broker writes, once each (resolved)."""
    sysc = config.system
    dirs = [sysc.data_path]
    if sysc.data_log_path is not None:
        dirs.append(sysc.data_log_path)
    dirs += [t.data_path for t in config.topics.values() if t.data_path is not None]
    out: list[Path] = []
    seen: set[Path] = set()
    for d in dirs:
        r = d.resolve()
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def _holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0)
        info: dict[str, Any] = json.loads(raw) if raw else {}
    except (OSError, ValueError):
        info = {}
    if not info:
        return "a broker that is starting"
    addr = f"{info.get('host', '?')}:{info.get('port', '?')}"
    http = f", HTTP port {info['httpPort']}" if info.get("httpPort") else ""
    return (
        f"broker {info.get('brokerId', '?')} (pid {info.get('pid', '?')}, listening on "
        f"{addr}{http}, since {info.get('since', '?')})"
    )


class DirectoryLocks:
    """The locks of one broker's directories (see the module doc)."""

    def __init__(self, dirs: Iterable[Path]) -> None:
        self.dirs = list(dirs)
        self._fds: dict[Path, int] = {}

    def _lock(self, d: Path, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            self.release()
            raise DirectoryLockedError(
                f"{d} is in use by {holder}: stop that broker first, or give this one "
                "its own dataPath (nothing was changed)"
            ) from None
        except OSError as e:
            os.close(fd)
            self.release()
            raise StartupError(f"cannot lock {d / LOCK_FILE}: {e.strerror}") from e
        self._fds[d] = fd

    def lock_existing(self) -> None:
        """Lock every lock file that exists already (creating nothing)."""
        for d in self.dirs:
            try:
                fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError as e:
                self.release()
                raise StartupError(f"cannot open {d / LOCK_FILE}: {e.strerror}") from e
            self._lock(d, fd)

    def lock_rest(self) -> None:
        """Create the missing directories and lock files, and lock them."""
        for d in self.dirs:
            if d in self._fds:
                continue
            try:
                d.mkdir(parents=True, exist_ok=True)
                fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                self.release()
                raise StartupError(f"cannot create {d / LOCK_FILE}: {e.strerror}") from e
            self._lock(d, fd)

    def describe(self, info: dict[str, Any]) -> None:
        """Write who holds the locks into every lock file (best effort: the lock is what
        counts, the text only names the holder to the next broker)."""
        data = json.dumps(info).encode()
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)

    def release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def listen(host: str, port: int, what: str) -> socket.socket:
    """A socket bound to ``host:port`` and listening (connections wait unanswered until the
    broker serves them). StartupError names the setting when the port is taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise StartupError(f"{what}: cannot resolve {host!r}: {e}") from e
    family, _type, _proto, _name, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise StartupError(f"{what}: cannot listen on {host}:{port}: {e.strerror}") from e
    sock.setblocking(False)
    return sock


def holder_info(config: ServerConfig, host: str, port: int, http_port: int) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "brokerId": config.system.broker_id,
        "host": host,
        "port": port,
        "httpPort": http_port,
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
