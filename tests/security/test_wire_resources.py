"""Memory attacks on the wire port: huge reads, parked gets, pipelining without reading.

Each test runs a hostile client on raw sockets against a real broker process and bounds the
broker's RSS growth (from /proc) far below what the unbounded behaviour took.
"""

from __future__ import annotations

import socket
import struct
import time

from notify.protocol import records
from notify.protocol.frames import ResponseParser, encode_mput
from tests.conftest import BrokerFactory
from tests.helpers import MIB, WireClient, cpu_seconds, crc, raw, rss, stats
from tests.security.test_http_topic_creation import fd_limit
from tests.security.wire import send_for


def _fill(addr: str, topic: str, mib: int, payload: bytes) -> None:
    rec = records.encode(0, 0, payload)
    per = max(1, (1 * MIB) // len(rec))
    with WireClient(addr) as c:
        for i in range(mib):
            r = c.call(encode_mput(topic, 0, rec * per, per, i))
            assert r.code == 200, r


def test_mid_record_get_reads_at_most_one_record(broker_factory: BrokerFactory) -> None:
    """Item 6: a get at an offset inside a record whose bytes look like a 2 GiB length, with
    maxSize 2^31-1, is served at most one record's worth (maxMessageSize + slack), not the
    rest of the segment. Five
    connections pipeline such gets without reading: the broker's RSS stays bounded (it read
    the rest of the 48 MiB segment per get before)."""
    b = broker_factory({"r": 1}, maxTransferSize=64 * 1024)
    # payloads whose first 4 bytes read as a huge record length at offset 20 (mid-record)
    evil = struct.pack(">i", 0x7FFF0000) + b"e" * 996
    _fill(b.addr, "r", 48, evil)
    with WireClient(b.addr) as c:
        g = c.call(b"get r g 0 20 2147483647 1\r\n")
        one_record = records.HEADER_SIZE + 4 * MIB + 4096  # maxMessageSize + envelope slack
        assert g.kind == "value" and len(g.body) <= one_record, (g.code, len(g.body))
        whole = c.call(b"get r g 0 0 2147483647 2\r\n")  # a real record boundary: window
        assert len(whole.body) == 64 * 1024
    base = rss(b)
    socks = [raw(b.addr) for _ in range(5)]
    try:
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"".join(b"get r g 0 20 2147483647 %d\r\n" % i for i in range(50)))
        time.sleep(2.0)
        grown = rss(b) - base
    finally:
        for s in socks:
            s.close()
    assert grown < 48 * MIB, f"RSS grew {grown / MIB:.0f} MiB"


def test_parked_gets_are_capped_and_die_with_their_connection(
    broker_factory: BrokerFactory,
) -> None:
    """Item 7: 300,000 long-poll gets on one connection: past maxParkedGets they are refused
    with 503 at once, memory stays bounded, and closing the connection releases the parked
    ones immediately (not after their 60 s wait)."""
    b = broker_factory({"r": 1}, maxParkedGets=100)
    base = rss(b)
    s = raw(b.addr, timeout=30)
    burst = b"".join(b"get r g 0 0 4096 60000 %d\r\n" % i for i in range(300_000))
    sent = send_for(s, burst, 20, stall=2.0)
    time.sleep(0.5)
    grown = rss(b) - base
    st = stats(b.addr)
    assert int(st["parked_gets_current"]) == 100
    assert int(st["refused_parked_gets"]) > 1000
    # what it was answered: 503s naming the setting (read a little)
    s.settimeout(5)
    head = s.recv(4096)
    assert b"result 503 " in head and b"maxParkedGets=100" in head, head[:200]
    s.close()
    deadline = time.monotonic() + 3
    while int(stats(b.addr)["parked_gets_current"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(stats(b.addr)["parked_gets_current"]) == 0, "parked gets outlived the connection"
    assert grown < 64 * MIB, f"RSS grew {grown / MIB:.0f} MiB ({sent} bytes of gets sent)"
    # a normal long poll on another connection still works
    with WireClient(b.addr) as c:
        c.send(b"get r g 0 0 4096 5000 1\r\n")
        assert c.put("r", 0, b"wake", opaque=2).code == 200
        got = {r.opaque: r for r in c.replies(1)}
        assert got[1].kind == "value"


def test_pipelined_puts_without_reading_pause_the_reader(broker_factory: BrokerFactory) -> None:
    """Item 11: a client pipelines small puts and never reads a reply. The broker stops
    reading once maxQueuedReplies replies wait, so its memory stays bounded; when the client
    finally reads, every put it got through is acknowledged (nothing lost)."""
    b = broker_factory({"r": 1}, maxQueuedReplies=20_000, unflushThreshold=0)
    base = rss(b)
    body = b"p"
    one = b"put r 0 1 0 %d 7\r\n%b" % (crc(body), body)
    s = raw(b.addr, timeout=30)
    burst = one * 3_000_000  # 72 MB of puts
    sent = send_for(s, burst, 15, stall=2.0)
    grown = rss(b) - base
    assert sent < len(burst), "the broker read everything: no back-pressure"
    assert grown < 80 * MIB, f"RSS grew {grown / MIB:.0f} MiB"
    # now read: every put that went out is acknowledged, in order, nothing lost
    expected = sent // len(one)  # a trailing partial put stays unanswered
    parser = ResponseParser()
    got = 0
    s.settimeout(20)
    while got < expected:
        data = s.recv(1 << 20)
        assert data, f"closed after {got} of {expected} replies"
        for r in parser.feed(data):
            assert r.code == 200, r
            got += 1
    s.close()
    with WireClient(b.addr) as c2:
        end = int(c2.call(b"offset r g 0 9223372036854775807 1\r\n").body)
    assert end == expected * (records.HEADER_SIZE + 1)


def test_begin_flood_at_capacity_stays_cheap(broker_factory: BrokerFactory) -> None:
    """Pipelined BEGINs past ``maxTxTimeoutTimerCapacity``: each refusal rebuilt the timer heap
    (O(capacity)), so 100,000 of them held the event loop for minutes (SIGTERM ignored). Now
    the open transactions are counted exactly: refusals are O(1), every BEGIN is answered
    (200 up to the cap, 503 beyond) and the broker's CPU stays small."""
    cap, n = 2000, 30_000
    b = broker_factory(maxTxTimeoutTimerCapacity=cap)
    s = raw(b.addr, timeout=20)
    frames = b"".join(b"transaction TX:f:%d s BEGIN 600 %d\r\n" % (i, i) for i in range(n))
    c0 = cpu_seconds(b)
    s.sendall(frames)  # ~1 MiB: fits the socket buffers plus the broker's reading
    parser = ResponseParser()
    codes: dict[int, int] = {}
    got = 0
    while got < n:
        data = s.recv(1 << 20)
        assert data, f"closed after {got} replies"
        for r in parser.feed(data):
            codes[r.code] = codes.get(r.code, 0) + 1
            got += 1
    s.close()
    assert codes == {200: cap, 503: n - cap}, codes
    assert cpu_seconds(b) - c0 < 5.0  # (was ~2,000 x 28,000 tuple checks: minutes)


def _answers(s: socket.socket, n: int) -> dict[int, int]:
    parser = ResponseParser()
    codes: dict[int, int] = {}
    got = 0
    while got < n:
        data = s.recv(1 << 20)
        assert data, f"closed after {got} replies"
        for r in parser.feed(data):
            codes[r.code] = codes.get(r.code, 0) + 1
            got += 1
    return codes


def test_end_and_begin_pairs_at_capacity_stay_cheap(broker_factory: BrokerFactory) -> None:
    """A client holds ``maxTxTimeoutTimerCapacity`` transactions open, then pipelines pairs of
    (roll one back, begin another). Each pair made the broker compact the whole timer heap,
    O(capacity): 2,000 pairs at 10,000 open took ~20 M entry checks of CPU on the event loop.
    Dead entries are now dropped only once they outnumber the live ones: every pair is
    answered 200/200 and the broker's CPU for them stays small; the cap still holds."""
    cap, pairs = 10_000, 2_000
    b = broker_factory(maxTxTimeoutTimerCapacity=cap)
    s = raw(b.addr, timeout=20)
    s.sendall(b"".join(b"transaction TX:f:%d s BEGIN 600 %d\r\n" % (i, i) for i in range(cap)))
    assert _answers(s, cap) == {200: cap}
    frames = b"".join(
        b"transaction TX:f:%d s ROLLBACK %d\r\ntransaction TX:g:%d s BEGIN 600 %d\r\n"
        % (i, 2 * i, i, 2 * i + 1)
        for i in range(pairs)
    )
    c0 = cpu_seconds(b)
    s.sendall(frames)
    assert _answers(s, 2 * pairs) == {200: 2 * pairs}
    used = cpu_seconds(b) - c0
    s.sendall(b"transaction TX:h:1 s BEGIN 600 1\r\n")
    assert _answers(s, 1) == {503: 1}  # still exactly at the cap
    s.close()
    assert used < 2.0, f"{pairs} end+begin pairs at capacity {cap} took {used:.2f} s of CPU"


def _closed_now(s: socket.socket) -> bool:
    """Whether the broker already closed ``s`` (a 503 line may come first)."""
    s.setblocking(False)
    try:
        while True:
            if not s.recv(4096):
                return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_idle_sockets_cannot_take_the_brokers_file_descriptors(
    broker_factory: BrokerFactory,
) -> None:
    """Item 8 (file descriptors): ``maxConnections`` (10,000 by default) is above a usual
    ``RLIMIT_NOFILE`` (1,024), so idle sockets could take every descriptor and the broker
    could no longer open a segment or a checkpoint. Wire connections are also held to what
    the descriptors allow (``RLIMIT_NOFILE`` - open - ``fdReserve`` - ``httpMaxConnections``):
    with a 400 limit, 500 squatters are partly refused with 503 and a client already in keeps
    writing across segment rolls; once they go, new clients are served again."""
    with fd_limit(400):
        b = broker_factory({"r": 1}, maxSegmentSize=4096, fdReserve=64, unflushThreshold=0)
    with WireClient(b.addr) as c:
        squatters: list[socket.socket] = []
        try:
            for _ in range(500):
                squatters.append(raw(b.addr))
            time.sleep(0.3)
            refused = sum(_closed_now(s) for s in squatters)
            assert refused >= 100, refused
            for i in range(60):  # ~15 segment rolls, each opening a file
                r = c.put("r", 0, b"w" * 1000, opaque=i)
                assert r.code == 200, r
        finally:
            for s in squatters:
                s.close()
    time.sleep(0.3)
    with WireClient(b.addr) as c:
        assert c.put("r", 0, b"after").code == 200
