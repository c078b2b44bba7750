"""TLS on the wire and HTTP ports (``tlsCertFile``/``tlsKeyFile``, mutual TLS with
``tlsCaFile`` + ``tlsClientAuth``), tested with raw ``ssl`` sockets against a real broker."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from notify.protocol import records
from notify.protocol.frames import ResponseParser
from notify.testing import BrokerProcess, free_port
from tests.helpers import wait_until


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both CA-signed."""
    d = tmp_path / "pki"
    d.mkdir()
    p = {n: d / n for n in ("ca.key", "ca.pem", "srv.key", "srv.pem", "cli.key", "cli.pem")}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=notify-test-ca", "-keyout", str(p["ca.key"]), "-out", str(p["ca.pem"]),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    for who in ("srv", "cli"):
        csr = d / f"{who}.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}",
                 "-keyout", str(p[f"{who}.key"]), "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(p["ca.pem"]),
                 "-CAkey", str(p["ca.key"]), "-CAcreateserial", "-days", "2",
                 "-extfile", str(ext), "-out", str(p[f"{who}.pem"]))  # fmt: skip
    return p


def _call(s: ssl.SSLSocket, frame: bytes) -> list[object]:
    s.sendall(frame)
    parser = ResponseParser()
    while True:
        data = s.recv(1 << 20)
        if not data:
            raise ConnectionError("closed by the broker")
        got = parser.feed(data)
        if got:
            return list(got)


def test_tls_wire_and_http(tmp_path: Path, pki: dict[str, Path]) -> None:
    http_port = free_port()
    b = BrokerProcess(
        tmp_path / "b",
        topics={"r": 1},
        system={
            "tlsCertFile": pki["srv.pem"],
            "tlsKeyFile": pki["srv.key"],
            "dashboardHttpPort": http_port,
        },
    )
    b.start()
    try:
        ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        with ctx.wrap_socket(socket.create_connection((b.host, b.port), 10),
                             server_hostname="127.0.0.1") as s:  # fmt: skip
            assert s.version() in ("TLSv1.2", "TLSv1.3")
            (put,) = _call(s, b"put r 0 5 0 1\r\nhello")
            assert put.code == 200  # type: ignore[attr-defined]
            # a get larger than the socket buffer: served through TLS, never sendfile'd raw
            big = b"x" * 200_000
            (p2,) = _call(s, b"put r 0 %d 0 2\r\n%b" % (len(big), big))
            assert p2.code == 200  # type: ignore[attr-defined]
            s.sendall(b"get r g 0 0 1048576 3\r\n")
            parser, got = ResponseParser(), []
            while not got:
                got = parser.feed(s.recv(1 << 20))
            recs, _ = records.decode_all(got[0].body)
            assert [r.body for r in recs] == [b"hello", big]
        # plain text on the TLS port gets no service
        with socket.create_connection((b.host, b.port), 10) as plain:
            plain.sendall(b"version 1\r\n")
            plain.settimeout(10)
            assert not plain.recv(100).startswith(b"result 200")
        conn = http.client.HTTPSConnection("127.0.0.1", http_port, context=ctx, timeout=10)
        conn.request("GET", "/api/overview")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        b.stop()


def test_mutual_tls_requires_a_client_certificate(tmp_path: Path, pki: dict[str, Path]) -> None:
    b = BrokerProcess(
        tmp_path / "b",
        topics={"r": 1},
        system={
            "tlsCertFile": pki["srv.pem"],
            "tlsKeyFile": pki["srv.key"],
            "tlsCaFile": pki["ca.pem"],
            "tlsClientAuth": "true",
        },
    )
    b.start()
    try:
        anon = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        raw = socket.create_connection((b.host, b.port), 10)
        with (  # no certificate: no service
            pytest.raises((ssl.SSLError, ConnectionError)),
            anon.wrap_socket(raw, server_hostname="127.0.0.1") as s,
        ):
            _call(s, b"version 1\r\n")
        raw.close()
        ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        ctx.load_cert_chain(str(pki["cli.pem"]), str(pki["cli.key"]))
        with ctx.wrap_socket(socket.create_connection((b.host, b.port), 10),
                             server_hostname="127.0.0.1") as s:  # fmt: skip
            (v,) = _call(s, b"version 1\r\n")
            assert v.code == 200  # type: ignore[attr-defined]
    finally:
        b.stop()


def test_tls_config_errors_are_clear(tmp_path: Path, pki: dict[str, Path]) -> None:
    b = BrokerProcess(tmp_path / "b", topics={"r": 1}, system={"tlsCertFile": pki["srv.pem"]})
    with pytest.raises(RuntimeError, match="tlsCertFile and tlsKeyFile go together"):
        b.start()
    b2 = BrokerProcess(
        tmp_path / "b2",
        topics={"r": 1},
        system={"tlsCertFile": pki["srv.pem"], "tlsKeyFile": tmp_path / "missing.key"},
    )
    with pytest.raises(RuntimeError, match="cannot load"):
        b2.start()


def _squat(host: str, port: int, n: int) -> tuple[list[socket.socket], int]:
    """``n`` sockets that never start the handshake, and how many the broker closed at once."""
    socks = [socket.create_connection((host, port), 5) for _ in range(n)]
    closed = 0
    for s in socks:
        s.settimeout(0.05)
        try:
            closed += s.recv(1) == b""
        except TimeoutError:
            pass
        except ConnectionError:
            closed += 1
    return socks, closed


def _until(ok: Callable[[], None], what: str) -> None:
    """Until ``ok`` succeeds (the slots free as the broker sees the squatters go)."""
    wait_until(
        lambda: ok() is None,
        timeout=3,
        step=0.1,
        what=what,
        retry=(ssl.SSLError, ConnectionError, TimeoutError),
    )


def test_tls_handshake_slowloris_is_bounded(tmp_path: Path, pki: dict[str, Path]) -> None:
    """Sockets that never send a ClientHello count toward ``maxConnections`` (wire) and
    ``httpMaxConnections`` (HTTP) from the moment they are accepted (they were invisible until
    their handshake ended, so they could take every file descriptor for up to the 10 s
    handshake timeout each): beyond the cap they are closed at once, the broker's descriptors
    stay bounded, and once they go a TLS client is served again."""
    http_port = free_port()
    b = BrokerProcess(
        tmp_path / "b",
        topics={"r": 1},
        system={
            "tlsCertFile": pki["srv.pem"],
            "tlsKeyFile": pki["srv.key"],
            "maxConnections": 20,
            "dashboardHttpPort": http_port,
            "httpMaxConnections": 20,
        },
    )
    b.start()
    ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    squatters: list[socket.socket] = []
    try:
        fds0 = len(list(Path(f"/proc/{b.pid}/fd").iterdir()))
        for port in (b.port, http_port):
            socks, closed = _squat(b.host, port, 60)
            squatters += socks
            assert closed >= 35, (port, closed)  # 60 - 20 admitted (some still in the backlog)
        assert len(list(Path(f"/proc/{b.pid}/fd").iterdir())) <= fds0 + 50
        for s in squatters:
            s.close()

        def wire() -> None:
            with ctx.wrap_socket(socket.create_connection((b.host, b.port), 2),
                                 server_hostname="127.0.0.1") as s:  # fmt: skip
                (v,) = _call(s, b"version 1\r\n")
                assert v.code == 200  # type: ignore[attr-defined]

        def https() -> None:
            c = http.client.HTTPSConnection(b.host, http_port, timeout=2, context=ctx)
            try:
                c.request("GET", "/stats")
                assert c.getresponse().status == 200
            finally:
                c.close()

        _until(wire, "no TLS service on the wire port after the squatters left")
        _until(https, "no HTTPS service after the squatters left")
    finally:
        for s in squatters:
            s.close()
        b.stop()


def _eof(s: socket.socket) -> bool:
    """Whether the broker closed ``s`` (non-blocking look)."""
    s.settimeout(0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_tls_handshake_squatters_within_the_cap_are_closed_after_the_timeout(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    """Sockets that take every ``maxConnections`` / ``httpMaxConnections`` slot and never finish
    their TLS handshake (half of them silent, half trickling a ClientHello a byte at a time)
    lock real clients out only for ``tlsHandshakeTimeout`` (here 500 ms; it was a fixed 10 s):
    then the broker closes them and TLS clients are served on both ports."""
    http_port = free_port()
    b = BrokerProcess(
        tmp_path / "b",
        topics={"r": 1},
        system={
            "tlsCertFile": pki["srv.pem"],
            "tlsKeyFile": pki["srv.key"],
            "maxConnections": 8,
            "dashboardHttpPort": http_port,
            "httpMaxConnections": 8,
            "tlsHandshakeTimeout": 500,
        },
    )
    b.start()
    ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    squatters: list[socket.socket] = []
    try:
        for port in (b.port, http_port):
            for i in range(8):
                s = socket.create_connection((b.host, port), 5)
                if i % 2:
                    s.sendall(b"\x16\x03\x01\x02\x00")  # a 512-byte ClientHello begins
                squatters.append(s)
        t0 = time.monotonic()
        with (  # every slot is taken: a real client gets no service meanwhile
            pytest.raises((ssl.SSLError, ConnectionError)),
            ctx.wrap_socket(socket.create_connection((b.host, b.port), 2),
                            server_hostname="127.0.0.1") as s,  # fmt: skip
        ):
            _call(s, b"version 1\r\n")
        open_ = set(squatters)
        while open_ and time.monotonic() - t0 < 3.0:
            for s in list(open_):
                if _eof(s):
                    open_.discard(s)
                elif squatters.index(s) % 2:
                    try:
                        s.sendall(b"\x01")  # still "talking": the deadline is not extended
                    except OSError:
                        open_.discard(s)
            time.sleep(0.1)
        assert not open_, f"{len(open_)} handshake squatters still open after 3 s"
        with ctx.wrap_socket(socket.create_connection((b.host, b.port), 2),
                             server_hostname="127.0.0.1") as s:  # fmt: skip
            (v,) = _call(s, b"version 1\r\n")
            assert v.code == 200  # type: ignore[attr-defined]
        c = http.client.HTTPSConnection(b.host, http_port, timeout=2, context=ctx)
        c.request("GET", "/stats")
        assert c.getresponse().status == 200
        c.close()
    finally:
        for s in squatters:
            s.close()
        b.stop()
