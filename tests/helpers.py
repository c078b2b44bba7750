"""What the tests share: waiting on a condition, a raw wire client and its requests, and
probes of a broker (its stats, its process's memory and CPU).

Waits poll a condition until it holds and fail the test with what was awaited after a
timeout: a test never sleeps a fixed time for something to happen. The timeouts are
generous (the suite runs on a loaded 2-core machine); a test that passes waits only as
long as the condition takes.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from notify.protocol import records
from notify.protocol.frames import Response, ResponseParser
from notify.protocol.replies import parse_fields, parse_stats
from notify.testing import BrokerProcess

__all__ = [
    "MIB",
    "WireClient",
    "cpu_seconds",
    "crc",
    "queue_stats",
    "raw",
    "read_all",
    "rss",
    "stats",
    "timing",
    "tput",
    "tx",
    "wait_until",
    "xid",
]

MIB = 1024 * 1024

# ---------------------------------------------------------------------------- waits


def wait_until(
    cond: Callable[[], object],
    timeout: float = 10.0,
    step: float = 0.02,
    what: str | Callable[[], str] = "condition",
    retry: tuple[type[BaseException], ...] = (),
) -> float:
    """Poll ``cond`` every ``step`` seconds until it returns something true; the seconds it
    took. After ``timeout`` seconds the test fails with ``what`` (or what it returns then,
    when callable). An exception of ``retry`` raised by ``cond`` counts as "not yet" (a
    broker restarting refuses connections); the last one is named in the failure."""
    t0 = time.monotonic()
    last = ""
    while True:
        try:
            if cond():
                return time.monotonic() - t0
        except retry as e:
            last = f" (last: {e!r})"
        if time.monotonic() - t0 > timeout:
            said = what() if callable(what) else what
            raise AssertionError(f"{said} not reached within {timeout}s{last}")
        time.sleep(step)


#: ``NOTIFY_TIMING_CHECKS=1``: :func:`timing` asserts (``bench/timing_checks.py`` runs the
#: tests that measure a duration so); unset, the suite only prints the figures
TIMING_CHECKS = os.environ.get("NOTIFY_TIMING_CHECKS", "") not in ("", "0")


def timing(ok: bool, figure: str) -> None:
    """A check on a duration, a rate or a ratio of them (``ok``) and what was measured
    (``figure``). The suite runs on a loaded machine, where any wall-clock bound fails
    some day: such a check is printed (``timing: ...``) and asserted only with
    :data:`TIMING_CHECKS`. What a test proves in the suite is counted or ordered (a timer
    fires no earlier than its timeout, the expected reply comes), never timed."""
    print(f"timing: {'ok' if ok else 'OVER'}: {figure}")
    if TIMING_CHECKS:
        assert ok, figure


# ---------------------------------------------------------------------------- the wire


def crc(body: bytes) -> int:
    """The checksum a put carries (CRC-32 of the body, positive)."""
    return zlib.crc32(body) & 0x7FFFFFFF


class WireClient:
    """A minimal blocking client for protocol tests: raw frames in, decoded replies out.
    ``ignore_checks``: drop the broker's check-back requests (what a reader of messages
    sees of a producer group it does not answer for)."""

    def __init__(self, addr: str, timeout: float = 10.0, ignore_checks: bool = False):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.parser = ResponseParser()
        self.pending: list[Response] = []
        self.ignore_checks = ignore_checks

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def replies(self, n: int) -> list[Response]:
        while len(self.pending) < n:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError(f"closed after {len(self.pending)} of {n} replies")
            got = self.parser.feed(data)
            self.pending += [r for r in got if r.kind != "check"] if self.ignore_checks else got
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def call(self, data: bytes) -> Response:
        self.send(data)
        return self.replies(1)[0]

    def put(
        self, topic: str, partition: int, body: bytes, opaque: int = 1, flag: int = 0
    ) -> Response:
        return self.call(
            b"put %s %d %d %d %d %d\r\n%b"
            % (topic.encode(), partition, len(body), flag, crc(body), opaque, body)
        )

    def is_closed(self, timeout: float = 2.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw(addr: str, timeout: float = 10.0) -> socket.socket:
    """A plain TCP socket to ``addr`` (no Nagle delay), for frames sent by hand."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def tput(c: WireClient, topic: str, part: int, body: bytes, key: str, opaque: int = 1) -> bytes:
    """A put inside transaction ``key`` (answered with the id, the partition and -1)."""
    r = c.call(
        b"put %s %d %d 0 %d %s %d\r\n%b"
        % (topic.encode(), part, len(body), crc(body), key.encode(), opaque, body)
    )
    assert r.code == 200, r.body
    mid, p, off = r.body.split()
    assert off == b"-1" and int(p) == part
    return mid


def tx(c: WireClient, key: str, verb: str, extra: str = "", opaque: int = 9) -> tuple[int, bytes]:
    """A ``transaction`` command: its reply's code and body."""
    r = c.call(f"transaction {key} s1 {verb}{extra} {opaque}\r\n".encode())
    return r.code, r.body


def xid(n: int, uq: str = "q1") -> str:
    """An XA transaction key (formatId 1, gtrid ``n``, bqual ``beef``, unique qualifier
    ``uq``)."""
    return f"XID:1:{n:04x}:beef:{uq}"


def read_all(addr: str, topic: str, part: int = 0) -> list[records.Record]:
    """Every visible record of one partition, from offset 0 to the end (404)."""
    out: list[records.Record] = []
    off = 0
    with WireClient(addr) as c:
        while True:
            r = c.call(b"get %s g %d %d 1048576 1\r\n" % (topic.encode(), part, off))
            if r.code != 200:
                assert r.code == 404, r
                return out
            recs, used = records.decode_all(r.body, off)
            out += recs
            off += used


# ---------------------------------------------------------------------------- probes


def stats(addr: str, item: str = "", secret: str = "") -> dict[str, str]:
    """A broker's ``stats`` (or ``stats <item>``) as ``{name: value}`` (after ``auth`` with
    ``secret`` when given)."""
    with WireClient(addr) as c:
        if secret:
            assert c.call(b"auth %s 1\r\n" % secret.encode()).code == 200
        r = c.call(f"stats {item} 7\r\n".encode() if item else b"stats 7\r\n")
        assert r.code == 200, r
        return dict(parse_stats(r.body))


def queue_stats(addr: str) -> dict[str, dict[str, str]]:
    """``stats queues`` as ``{"<topic>/<group>": {field: value}}``."""
    return {name: parse_fields(v) for name, v in stats(addr, "queues").items() if "/" in name}


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
