"""A hostile client on the HTTP port.

Idle and half-sent connections are closed, connections beyond ``httpMaxConnections`` get a
503 and are closed at once (file descriptors stay free for real work), bodies over their cap
are refused as soon as the cap is crossed (chunked too) and the connection is closed, and
malformed input (a non-UTF-8 bearer token, deeply nested JSON) gets a 4xx, never a 500.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

from notify.testing import BrokerProcess
from tests.http.conftest import MAX_MESSAGE, Http


def _connect(b: BrokerProcess) -> socket.socket:
    return socket.create_connection((b.host, b.http_port), timeout=10)


def _read_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything until the server closes (fails the test if it does not)."""
    s.settimeout(timeout)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connection_cap_refuses_and_frees_at_once(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1}, httpMaxConnections=20)
    idle = [_connect(b) for _ in range(20)]
    time.sleep(0.3)
    try:
        # 1,100 more: each is answered 503 and closed, none is kept open
        for _ in range(1100):
            s = _connect(b)
            reply = _read_all(s)
            s.close()
            assert reply.startswith(b"HTTP/1.1 503"), reply[:80]
            assert b"httpMaxConnections" in reply
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    h = Http(b.http_url)
    assert h.get("/api/overview").status == 200  # capacity is back
    metrics = h.get("/metrics").text
    name = "notify_http_connections_refused"
    refused = [ln for ln in metrics.splitlines() if ln.startswith(name)]
    assert refused and float(refused[0].split()[-1]) >= 1100, refused


def test_idle_and_slow_header_connections_are_closed(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1}, httpKeepaliveTimeout=500, httpBodyTimeout=500)
    silent = _connect(b)
    slowloris = _connect(b)
    slowloris.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
    slow_body = _connect(b)
    slow_body.sendall(
        b"POST /put/0?topic=t&partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 100\r\n\r\n0123456789"
    )
    try:
        assert _closed_within(silent, 5.0), "a silent connection stayed open"
        assert _closed_within(slowloris, 5.0), "a connection sending headers slowly stayed open"
        slow_body.settimeout(5.0)
        reply = _read_all(slow_body)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:80]
    finally:
        for s in (silent, slowloris, slow_body):
            s.close()
    assert Http(b.http_url).get("/api/topics/t/partitions/0/messages").json()["messages"] == []


def test_oversized_bodies_are_cut_off_and_the_connection_closed(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1})
    # declared too large: 413 before any body byte, then the connection is closed
    s = _connect(b)
    s.sendall(
        b"POST /put/0?topic=t&partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: %d\r\n\r\n" % (10 * MAX_MESSAGE)
    )
    reply = _read_all(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:80]
    assert b"Connection: close" in reply
    # chunked, never ending: refused once the cap is crossed, not after buffering it all
    s = _connect(b)
    s.sendall(
        b"POST /put/0?topic=t&partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (8192, b"x" * 8192)
    sent = 0
    s.settimeout(10)
    reply = b""
    reset = False
    try:
        while sent < 50 * MAX_MESSAGE:
            s.sendall(chunk)
            sent += 8192
            if sent > 2 * MAX_MESSAGE and not reply:
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    reply = s.recv(65536)
                s.setblocking(True)
                s.settimeout(10)
                if reply:
                    break
    except (BrokenPipeError, ConnectionResetError):
        reset = True
    try:
        if not reply:
            reply = _read_all(s)
    except ConnectionResetError:
        # the server closed with chunks of ours still unread: its kernel answers with a
        # reset, which may overtake the 413 it wrote before closing
        reset = True
    finally:
        s.close()
    assert reply.startswith(b"HTTP/1.1 413") or (reset and not reply), reply[:80]
    assert sent < 50 * MAX_MESSAGE, "the whole chunked body was accepted before the 413"
    # JSON REST: the same behaviour with its own cap, and nothing was stored
    h = Http(b.http_url)
    assert h.get("/api/topics/t/partitions/0/messages").json()["messages"] == []


def test_malformed_input_gets_4xx_not_500(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1}, authSecret="pw")
    # a bearer token that is not UTF-8 (raw bytes in the header)
    for path in (b"/api/topics", b"/metrics", b"/get/0?topic=t"):
        s = _connect(b)
        s.sendall(
            b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer \xff\xfe\xc3(\r\nConnection: close\r\n\r\n"
        )
        reply = _read_all(s)
        s.close()
        assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    # JSON nested far deeper than any parser should follow
    h = Http(b.http_url, token="pw")
    for depth in (10_000, 200_000):
        deep = b"[" * depth + b"]" * depth
        r = h.post("/api/topics/t/messages", deep)
        assert r.status == 400 and "nested too deeply" in r.json()["error"], r.text[:200]
        r = h.post("/api/topics", b'{"name": ' + b"{" * depth)
        assert r.status == 400, r.text[:200]
    assert h.get("/api/topics/t").status == 200
