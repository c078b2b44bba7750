"""Bounded memory under abusive clients: slow consumers, connection floods, oversized frames.

Each scenario runs against a fresh broker and reads its peak RSS (VmHWM from
/proc/<pid>/status); the bounds asserted are generous multiples of what the design allows
(write high-water mark per connection, one frame per connection), far below what an
unbounded buffer would take. The figures go to the faults summary.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.testing import BrokerProcess
from tests.faults import summary
from tests.helpers import WireClient, timing

pytestmark = pytest.mark.slow

SECTION = "resources"
MIB = 1024 * 1024


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def hwm(b: BrokerProcess) -> int:
    return _status(b.pid, "VmHWM")


def rss(b: BrokerProcess) -> int:
    return _status(b.pid, "VmRSS")


@pytest.fixture
def broker(tmp_path: Path, many_fds: int) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path, topics={"r": 1}, system={"maxConnections": 1000}, log_level="warning"
    )
    b.start()
    yield b
    b.kill()


def _fill(addr: str, mib: int) -> None:
    rec = records.encode(0, 0, b"r" * 1000)
    with WireClient(addr) as c:
        for i in range(mib):
            r = c.call(encode_mput("r", 0, rec * 1000, 1000, i))
            assert r.code == 200, r


def _responsive(addr: str) -> float:
    t = time.perf_counter()
    with WireClient(addr, timeout=20) as c:
        assert c.call(b"version 1\r\n").code == 200
    return time.perf_counter() - t


def _slow_socket(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    return s


def _send_some(s: socket.socket, data: bytes, seconds: float = 2.0) -> int:
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += s.send(data[sent:])
        except BlockingIOError:
            time.sleep(0.01)
    return sent


def test_slow_consumers_pipelining_gets_keep_memory_bounded(broker: BrokerProcess) -> None:
    """Consumers that pipeline thousands of 1 MiB gets and never read must not make the
    broker copy the requested bytes into memory (back-pressure stops at the socket)."""
    _fill(broker.addr, 3)
    base = rss(broker)
    n_conn, n_gets = (40, 3000) if summary.LONG else (10, 2000)
    socks = [_slow_socket(broker.addr) for _ in range(n_conn)]
    try:
        frames = b"".join(b"get r g 0 0 1048576 %d\r\n" % i for i in range(n_gets))
        sent = sum(_send_some(s, frames) for s in socks)
        requested = sent * n_gets // len(frames) * MIB  # bytes the pipelined gets ask for
        time.sleep(1.5)
        latency = _responsive(broker.addr)
        peak = hwm(broker) - base
    finally:
        for s in socks:
            s.close()
    summary.record(
        SECTION,
        slow_consumers=n_conn,
        slow_consumer_gets_each=n_gets,
        slow_consumer_peak_rss_growth_mib=round(peak / MIB, 1),
        slow_consumer_peak_rss_mib=round(hwm(broker) / MIB, 1),
        slow_consumer_healthy_latency_ms=round(latency * 1000, 1),
    )
    assert requested > 1000 * MIB  # the clients asked for gigabytes
    assert peak < 64 * MIB + n_conn * 6 * MIB, f"peak RSS grew by {peak / MIB:.0f} MiB"
    timing(latency < 2.0, f"a version round trip took {latency:.2f} s beside the slow consumers")


def test_slow_long_poll_consumers_keep_memory_bounded(broker: BrokerProcess) -> None:
    n_gets = 250
    base = rss(broker)
    s = _slow_socket(broker.addr)
    try:
        frames = b"".join(b"get r g 0 0 1048576 30000 %d\r\n" % i for i in range(n_gets))
        assert _send_some(s, frames) == len(frames)
        time.sleep(0.5)
        t = time.perf_counter()
        _fill(broker.addr, 1)  # the data the parked gets wait for
        fill_s = time.perf_counter() - t
        time.sleep(1.0)
        peak = hwm(broker) - base
    finally:
        s.close()
    summary.record(
        SECTION,
        long_poll_parked_gets=n_gets,
        long_poll_peak_rss_growth_mib=round(peak / MIB, 1),
        long_poll_peak_rss_mib=round(hwm(broker) / MIB, 1),
        long_poll_put_latency_s=round(fill_s, 2),
    )
    assert peak < 64 * MIB, f"{n_gets} parked gets: peak RSS grew by {peak / MIB:.0f} MiB"


def test_connection_flood_is_refused_beyond_max_connections(broker: BrokerProcess) -> None:
    total = 5000 if summary.LONG else 2000
    limit = 1000
    base = rss(broker)
    host, port = broker.addr.rsplit(":", 1)
    socks: list[socket.socket] = []
    opened: list[socket.socket] = []  # every socket, closed at the end whatever happens
    ok = refused = reset_silently = 0
    t0 = time.monotonic()
    with WireClient(broker.addr) as healthy:
        try:
            for start in range(0, total, 100):
                batch = []
                for _ in range(min(100, total - start)):
                    s = socket.create_connection((host, int(port)), timeout=10)
                    opened.append(s)
                    batch.append(s)
                    s.sendall(b"version 7\r\n")
                for s in batch:
                    data = b""
                    closed = False
                    try:
                        while b"\r\n" not in data:
                            chunk = s.recv(4096)
                            if not chunk:
                                closed = True
                                break
                            data += chunk
                        if data.startswith(b"result 503 "):
                            closed = s.recv(1) == b""
                    except ConnectionResetError:
                        closed = True  # closed with our request unread: RST
                    if data.startswith(b"result 200 "):
                        ok += 1
                        socks.append(s)
                        continue
                    s.close()
                    assert closed, f"a refused connection was left open: {data!r}"
                    if data:
                        assert data.startswith(b"result 503 "), data
                        assert b"too many connections" in data, data
                        refused += 1
                    else:
                        reset_silently += 1
            assert healthy.call(b"version 8\r\n").code == 200  # the healthy one still works
            peak = hwm(broker) - base
        finally:
            for s in opened:
                s.close()
        deadline = time.monotonic() + 10
        current = -1
        while time.monotonic() < deadline:
            body = healthy.call(b"stats 9\r\n").body.decode()
            st = dict(line.partition(" ")[::2] for line in body.split("\r\n")[1:-2])
            current = int(st["curr_connections"])
            if current == 1:
                break
            time.sleep(0.1)
    summary.record(
        SECTION,
        flood_connections=total,
        flood_max_connections=limit,
        flood_accepted=ok,
        flood_refused_503=refused,
        flood_refused_reset_before_reply=reset_silently,
        flood_peak_rss_growth_mib=round(peak / MIB, 1),
        flood_peak_rss_mib=round(hwm(broker) / MIB, 1),
        flood_seconds=round(time.monotonic() - t0, 1),
    )
    assert ok == limit - 1  # the healthy client holds one slot
    assert refused + reset_silently == total - ok
    assert refused > 0
    assert current == 1, f"{current} connections still counted after closing"
    assert peak < 256 * MIB, f"{limit} connections: peak RSS grew by {peak / MIB:.0f} MiB"


def test_oversized_frames_are_skipped_without_buffering(broker: BrokerProcess) -> None:
    base = rss(broker)
    host, port = broker.addr.rsplit(":", 1)
    n_conn = 20
    # puts declaring 100 MB (over the 16 MiB frame limit): 400 at once, then skipped unbuffered
    socks = []
    try:
        for i in range(n_conn):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"put r 0 100000000 0 %d\r\n" % i)
            socks.append(s)
        for i, s in enumerate(socks):
            head = s.recv(4096)
            assert head.startswith(b"result 400 ") and b"exceeds the maximum" in head, head
            assert head.split()[3].startswith(b"%d" % i)
        chunk = b"z" * MIB
        for _ in range(8):  # 8 MiB more on each connection: all discarded
            for s in socks:
                s.sendall(chunk)
        time.sleep(0.5)
        skipped_peak = hwm(broker) - base
    finally:
        for s in socks:
            s.close()
    # a header line over 4 KiB: 400, then the connection is closed
    with WireClient(broker.addr) as c:
        c.send(b"get " + b"x" * 5000)
        (r,) = c.replies(1)
        assert r.code == 400 and b"header line longer" in r.body, r
        assert c.is_closed()
    # an mput over 16 MiB: 400, skipped, the connection stays usable
    with WireClient(broker.addr) as c:
        c.send(b"mput r 0 20000000 1 5\r\n" + b"q" * 20000000 + b"version 6\r\n")
        r1, r2 = c.replies(2)
        assert r1.code == 400 and r1.opaque == 5, r1
        assert r2.code == 200 and r2.opaque == 6, r2
    # frames within the limits but never finished (slowloris): buffered, one per connection
    partial = []
    try:
        for i in range(n_conn):
            s = socket.create_connection((host, int(port)), timeout=10)
            n = 4 * MIB - 100
            s.sendall(b"put r 0 %d 0 %d\r\n" % (n, i) + b"w" * (n - 10))
            partial.append(s)
        time.sleep(1.0)
        partial_peak = hwm(broker) - base
        assert _responsive(broker.addr) < 2.0
    finally:
        for s in partial:
            s.close()
    summary.record(
        SECTION,
        oversized_connections=n_conn,
        oversized_peak_rss_growth_mib=round(skipped_peak / MIB, 1),
        partial_4mib_frames=n_conn,
        partial_frames_peak_rss_growth_mib=round(partial_peak / MIB, 1),
        oversized_and_partial_peak_rss_mib=round(hwm(broker) / MIB, 1),
        note_partial_frames="a connection may hold one unfinished frame: up to "
        "16 MiB for put and mput (a put over maxMessageSize is refused once read); "
        "there is no global cap, so the worst case is maxConnections x 16 MiB",
    )
    assert skipped_peak < 64 * MIB, f"skipped bodies grew RSS by {skipped_peak / MIB:.0f} MiB"
    assert partial_peak < n_conn * 4 * MIB * 2 + 64 * MIB, f"{partial_peak / MIB:.0f} MiB"
