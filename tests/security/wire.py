"""Tools of the wire attack tests: sending for a while, reading until closed (the probes and
the raw sockets are in :mod:`tests.helpers`)."""

from __future__ import annotations

import socket
import time

# the probes and raw sockets, still importable from here (they live in tests.helpers)
from tests.helpers import MIB, cpu_seconds, raw, rss, stats

__all__ = ["MIB", "closed_within", "cpu_seconds", "raw", "rss", "send_for", "stats"]


def send_for(s: socket.socket, data: bytes, seconds: float, stall: float | None = None) -> int:
    """Send as much of ``data`` as the peer accepts within ``seconds``; bytes sent. With
    ``stall``: stop as soon as the peer has taken nothing for that long (it stopped
    reading: the back-pressure a test waits for), rather than at the deadline."""
    s.setblocking(False)
    sent = 0
    now = time.monotonic()
    deadline, moved = now + seconds, now
    view = memoryview(data)
    while sent < len(data) and now < deadline:
        try:
            sent += s.send(view[sent : sent + 65536])
            moved = now
        except BlockingIOError:
            if stall is not None and now - moved > stall:
                break
            time.sleep(0.005)
        now = time.monotonic()
    s.setblocking(True)
    return sent


def closed_within(s: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Read until EOF or ``seconds``; (closed, what was received)."""
    s.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = s.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True, got
        if not data:
            return True, got
        got += data
    return False, got
