"""Limits that used to be hard-coded, now settings ("every limit is a documented
setting with a safe default"): each test sets one low and attacks past it as a hostile
client would, asserting a clear refusal, bounded memory and nothing lost.

``maxHeaderSize``, ``writeBufferSize``, ``maxLongPollWait`` (wire and MetaQ HTTP),
``httpMaxBodySize``, ``httpMaxFetchSize`` / ``httpMaxFetchMessages`` /
``httpMaxProduceMessages`` (REST) and ``tlsMaxHelloSize``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from notify.broker.tlsaccept import TlsAccept
from notify.config import SystemConfig
from notify.protocol import records
from notify.protocol.frames import ResponseParser, encode_mput
from notify.testing import BrokerProcess, free_port
from tests.conftest import BrokerFactory
from tests.helpers import MIB, WireClient, raw, rss, timing
from tests.http.conftest import Http
from tests.security.test_wire_tls import pki  # noqa: F401  (fixture)
from tests.security.wire import closed_within, send_for


def test_max_header_size(broker_factory: BrokerFactory) -> None:
    """``maxHeaderSize=600``: a header line past it is a fatal framing error (400 naming the
    cap, connection closed) as soon as 600 bytes pass without a line end; 40 MiB without
    CRLF are never buffered; a put acknowledged before the attack is kept."""
    b = broker_factory({"r": 1}, maxHeaderSize=600)
    base = rss(b)
    s = raw(b.addr)
    try:
        s.sendall(b"put r 0 4 0 1\r\nkept")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"result 200 ")
        # a legal header just under the cap is read (the group is 500 bytes long)
        s.sendall(b"offset r " + b"g" * 500 + b" 0 0 2\r\n")
        assert s.recv(4096).startswith(b"result 200 ")
        s.sendall(b"x" * 700)
        closed, got = closed_within(s, 5)
        assert got.startswith(b"result 400 ") and b"longer than 600" in got, got[:120]
        assert closed, "connection left open past maxHeaderSize"
    finally:
        s.close()
    flood = raw(b.addr)
    try:  # 40 MiB without a line end: cut off, never buffered
        sent = send_for(flood, b"x" * (40 * MIB), 5)
    except (ConnectionResetError, BrokenPipeError):
        sent = 0
    finally:
        flood.close()
    assert sent < 40 * MIB
    assert rss(b) - base < 16 * MIB
    with WireClient(b.addr) as c:
        g = c.call(b"get r g 0 0 4096 3\r\n")
        assert g.kind == "value" and records.decode_all(g.body, 0)[0][0].payload == b"kept"


def test_write_buffer_size(broker_factory: BrokerFactory) -> None:
    """``writeBufferSize=64 KiB``: 40 connections pipeline 40 gets of 64 KiB each (100 MiB
    of replies) and never read. Each connection's buffered replies stop near 64 KiB + one
    reply (4 MiB each at the default: 160 MiB here), then reading pauses; a client that
    finally reads gets every reply, whole."""
    b = broker_factory({"r": 1}, writeBufferSize=64 * 1024, maxTransferSize=64 * 1024)
    rec = records.encode(0, 0, b"w" * 1000)
    per = (1 * MIB) // len(rec)
    with WireClient(b.addr) as c:
        assert c.call(encode_mput("r", 0, rec * per, per, 1)).code == 200
    base = rss(b)
    socks: list[socket.socket] = []
    try:
        for _ in range(40):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((b.host, b.port))
            s.sendall(b"".join(b"get r g 0 0 65536 %d\r\n" % i for i in range(40)))
            socks.append(s)
        time.sleep(1.0)
        grown = rss(b) - base
        assert grown < 40 * MIB, f"RSS grew {grown / MIB:.0f} MiB"
        # nothing lost: one of them reads all 40 replies
        s = socks[0]
        s.settimeout(10)
        parser = ResponseParser()
        got = []
        while len(got) < 40:
            data = s.recv(1 << 20)
            assert data, f"closed after {len(got)} replies"
            got += parser.feed(data)
        assert all(r.kind == "value" and len(r.body) == 64 * 1024 for r in got)
        assert sorted(r.opaque for r in got) == list(range(40))
    finally:
        for s in socks:
            s.close()


def test_max_long_poll_wait(broker_factory: BrokerFactory) -> None:
    """``maxLongPollWait=300``: a long poll asking for 60 s is held at most 0.3 s on the wire
    (the parked slot is freed), and MetaQ HTTP ``/get`` refuses ``maxWait`` past the cap with
    400 naming it; a message put afterwards is still there."""
    http_port = free_port()
    b = broker_factory({"r": 1}, maxLongPollWait=300, dashboardHttpPort=http_port)
    with WireClient(b.addr) as c:
        t0 = time.monotonic()
        r = c.call(b"get r g 0 0 4096 60000 1\r\n")
        took = time.monotonic() - t0
        assert r.code == 404 or r.kind == "value", r
        # (asked for 60 s; the client's 10 s socket timeout would end it first)
        timing(took < 2.0, f"a 60 s long poll capped at 0.3 s answered after {took:.2f} s")
    h = Http(f"http://{b.host}:{http_port}")
    bad = h.get("/get/0?topic=r&group=g&partition=0&offset=0&maxsize=4096&maxWait=60000")
    assert bad.status == 400 and b"0..300" in bad.body, (bad.status, bad.body)
    with WireClient(b.addr) as c:
        assert c.put("r", 0, b"after", opaque=2).code == 200
        g = c.call(b"get r g 0 0 4096 60000 3\r\n")
        assert records.decode_all(g.body, 0)[0][0].payload == b"after"


def _post_raw(b: BrokerProcess, path: str, head: bytes, body_iter: list[bytes]) -> bytes:
    s = socket.create_connection((b.host, b.http_port), timeout=10)
    try:
        s.sendall(
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n" + head + b"\r\n"
        )
        for chunk in body_iter:
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        out = b""
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            out += data
        return out
    finally:
        s.close()


def test_http_max_body_size(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    """``httpMaxBodySize=4096``: a JSON body over it is refused with 413 naming the setting,
    from its Content-Length or (chunked) as soon as the cap is crossed, without buffering
    the 16 MiB that follow, and the connection is closed; a body under it is served."""
    b = http_broker_factory({"t": 1}, httpMaxBodySize=4096)
    base = rss(b)
    h = Http(b.http_url)
    big = [{"text": "x" * 100}] * 60  # ~6 KB
    r = h.post("/api/topics/t/messages", json_body=big)
    assert r.status == 413 and b"httpMaxBodySize" in r.body, (r.status, r.body)
    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
    reply = _post_raw(b, "/api/topics/t/messages", b"Transfer-Encoding: chunked\r\n", [chunk] * 256)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    assert rss(b) - base < 12 * MIB
    ok = h.post("/api/topics/t/messages", json_body=[{"text": "small"}])
    assert ok.status == 200, ok.text
    got = h.get("/api/topics/t/partitions/0/messages?offset=0").json()
    assert [m["text"] for m in got["messages"]] == ["small"]


def test_http_fetch_and_produce_caps(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    """``httpMaxProduceMessages=10``, ``httpMaxFetchMessages=4``, ``httpMaxFetchSize=2048``:
    a produce of 11 is refused whole (nothing written), a fetch asking past either cap is a
    400 naming the bound; default fetches stay within both and page through everything."""
    b = http_broker_factory(
        {"t": 1}, httpMaxProduceMessages=10, httpMaxFetchMessages=4, httpMaxFetchSize=2048
    )
    h = Http(b.http_url)
    eleven = [{"text": f"m{i}"} for i in range(11)]
    r = h.post("/api/topics/t/messages", json_body=eleven)
    assert r.status == 400 and b"httpMaxProduceMessages" in r.body, r.text
    assert h.post("/api/topics/t/messages", json_body=eleven[:10]).status == 200
    path = "/api/topics/t/partitions/0/messages?offset=0"
    assert h.get(path + "&limit=5").status == 400
    too_big = h.get(path + "&maxSize=4096")
    assert too_big.status == 400 and b"1..2048" in too_big.body, too_big.text
    seen: list[str] = []
    offset = 0
    for _ in range(10):
        page = h.get(f"/api/topics/t/partitions/0/messages?offset={offset}").json()
        assert len(page["messages"]) <= 4
        if not page["messages"]:
            break
        seen += [m["text"] for m in page["messages"]]
        offset = page["next_offset"]
    assert seen == [f"m{i}" for i in range(10)]


def _big_client_hello(n_alpn: int) -> bytes:
    """A real ClientHello made large by many ALPN names (the server ignores them)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([f"{i:03d}" + "p" * 200 for i in range(n_alpn)])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def _answered(host: str, port: int, hello: bytes) -> bytes:
    s = socket.create_connection((host, port), timeout=5)
    try:
        try:
            s.sendall(hello)  # the broker may drop the connection before it is all sent
            return s.recv(5)
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            return b""
    finally:
        s.close()


def test_tls_max_hello_size(tmp_path: Path, pki: dict[str, Path]) -> None:  # noqa: F811
    """``tlsMaxHelloSize=4096`` on a real broker: clients that dump 1 MiB at connect are
    dropped with bounded memory (what arrives before the socket is in TLS is buffered up to
    the cap; after it OpenSSL's own ClientHello bound applies), and an ordinary TLS client,
    whose ClientHello is well under the cap, is served."""
    b = BrokerProcess(
        tmp_path / "b",
        topics={"r": 1},
        system={
            "tlsCertFile": pki["srv.pem"],
            "tlsKeyFile": pki["srv.key"],
            "tlsMaxHelloSize": 4096,
        },
    )
    b.start()
    try:
        base = rss(b)
        for _ in range(5):
            assert not _answered(b.host, b.port, b"\x16\x03\x01" + b"z" * MIB).startswith(b"\x16")
        assert rss(b) - base < 16 * MIB
        ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        with ctx.wrap_socket(
            socket.create_connection((b.host, b.port), 5), server_hostname="127.0.0.1"
        ) as s:
            s.sendall(b"version 1\r\n")
            assert s.recv(4096).startswith(b"result 200 ")
    finally:
        b.stop()


class _Admit:
    def tls_handshake_started(self) -> bool:
        return True

    def tls_handshake_ended(self) -> None:
        pass


def _server_answer(certs: dict[str, Path], hello: bytes, max_hello: int) -> bytes:
    """Run :class:`TlsAccept` on a real loop and socket whose ClientHello is already waiting
    when the broker accepts it (read before ``start_tls`` takes the socket: the window the
    cap bounds); what the server answered (b"" = dropped)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs["srv.pem"], certs["srv.key"])
    server_sock, client = socket.socketpair()
    client.sendall(hello)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(
            lambda: TlsAccept(_Admit(), ctx, asyncio.Protocol, 5.0, max_hello), server_sock
        )
        await asyncio.sleep(0.5)

    asyncio.run(run())
    client.settimeout(2)
    try:
        return client.recv(5)
    except (ConnectionResetError, TimeoutError):
        return b""
    finally:
        client.close()


def test_tls_hello_past_max_hello_size_is_dropped(pki: dict[str, Path]) -> None:  # noqa: F811
    """A real 6 KB ClientHello read before TLS took the socket: dropped with the connection at
    ``tlsMaxHelloSize=4096``, answered with a ServerHello at the default (64 KiB)."""
    hello = _big_client_hello(28)
    assert 5000 < len(hello) < 16000, len(hello)
    assert _server_answer(pki, hello, 4096) == b""
    assert _server_answer(pki, hello, SystemConfig().tls.max_hello_size).startswith(b"\x16\x03")
