"""Tools of the wire attack tests: sending for a while, reading until closed (the probes and
the raw sockets are in :mod:`tests.helpers`)."""

from __future__ import annotations

import socket
import time


def send_for(s: socket.socket, data: bytes, seconds: float) -> int:
    """Send as much of ``data`` as the peer accepts within ``seconds``; bytes sent."""
    s.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    view = memoryview(data)
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += s.send(view[sent : sent + 65536])
        except BlockingIOError:
            time.sleep(0.005)
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
