"""Helpers of the wire attack tests: a broker's memory and CPU from /proc, raw sockets."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from notify.protocol.replies import parse_stats
from notify.testing import BrokerProcess
from tests.wireclient import WireClient

MIB = 1024 * 1024


def rss(b: BrokerProcess) -> int:
    """The broker's resident set size in bytes (VmRSS)."""
    for line in Path(f"/proc/{b.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("VmRSS missing")


def cpu_seconds(b: BrokerProcess) -> float:
    """User + system CPU the broker used so far."""
    fields = Path(f"/proc/{b.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw(addr: str, timeout: float = 10.0) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


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


def stats(addr: str, item: str = "", secret: str = "") -> dict[str, str]:
    with WireClient(addr) as c:
        if secret:
            assert c.call(b"auth %s 1\r\n" % secret.encode()).code == 200
        r = c.call(f"stats {item} 7\r\n".encode() if item else b"stats 7\r\n")
        assert r.code == 200, r
        return dict(parse_stats(r.body))


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
