"""BlockingConnection (send() one at a time, XA participant, CLI): a plain socket is
blocking with its timeout in the kernel, the receive buffer is reused; a silent peer still
times out on time, a reply split over many receives is put together, a timeout drops the
socket and the next request reconnects."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from notify.client.transport import BlockingConnection
from notify.errors import RequestTimeoutError
from tests.helpers import timing


def _server(handler: object) -> tuple[socket.socket, str]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(c,), daemon=True).start()  # type: ignore[arg-type]

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"127.0.0.1:{srv.getsockname()[1]}"


def test_silent_peer_times_out_on_time_and_the_next_request_reconnects() -> None:
    replies = {"on": False}

    def handler(c: socket.socket) -> None:
        with c, contextlib.suppress(OSError):  # the client drops the socket on a timeout
            buf = b""
            while True:
                d = c.recv(4096)
                if not d:
                    return
                buf += d
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    if replies["on"]:
                        opaque = line.split()[-1]
                        body = b"1.0"
                        # the reply in single bytes: many receives, one response
                        for b in b"result 200 %d %s\r\n%s" % (len(body), opaque, body):
                            c.sendall(bytes([b]))
                            time.sleep(0.0005)

    srv, addr = _server(handler)
    with srv:
        conn = BlockingConnection(addr, request_timeout_s=5.0)
        t = time.monotonic()
        with pytest.raises(RequestTimeoutError, match=r"0\.2 s"):
            conn.request(lambda o: b"version %d\r\n" % o, 0.2)
        took = time.monotonic() - t
        assert took > 0.15
        timing(took < 2.0, f"a 0.2 s request timed out after {took:.2f} s (< 2)")
        assert not conn.is_open  # dropped
        replies["on"] = True
        r = conn.request(lambda o: b"version %d\r\n" % o, 5.0)
        assert r.code == 200 and r.body == b"1.0"
        r = conn.request(lambda o: b"version %d\r\n" % o)  # the request timeout again
        assert r.code == 200 and r.body == b"1.0"
        conn.close()


def test_partial_reply_then_silence_times_out_by_the_deadline() -> None:
    """Two requests in one exchange: the first answered at once, the second never. The
    socket is not re-armed after the partial reply unless that would overshoot the
    deadline by more than REARM_SLACK of the timeout."""

    def handler(c: socket.socket) -> None:
        with c, contextlib.suppress(OSError):
            buf = b""
            while b"\r\n" not in buf:
                d = c.recv(4096)
                if not d:
                    return
                buf += d
            opaque = buf.split(b"\r\n", 1)[0].split()[-1]
            time.sleep(0.2)  # the first reply comes half way
            c.sendall(b"result 200 3 %s\r\n1.0" % opaque)
            while c.recv(4096):
                pass

    srv, addr = _server(handler)
    with srv:
        conn = BlockingConnection(addr, request_timeout_s=5.0)
        limit = 0.4
        t = time.monotonic()
        with pytest.raises(RequestTimeoutError):
            conn.exchange(
                [lambda o: b"version %d\r\n" % o, lambda o: b"version %d\r\n" % o], limit
            )
        took = time.monotonic() - t
        # not re-armed, the second receive would wait a whole 0.4 s more (0.6 s in all)
        assert limit - 0.01 < took, took
        timing(took < limit * 1.05 + 0.1, f"a {limit} s exchange timed out after {took:.2f} s")
        conn.close()
