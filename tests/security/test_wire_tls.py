"""TLS on the wire and HTTP ports (``tlsCertFile``/``tlsKeyFile``, mutual TLS with
``tlsCaFile`` + ``tlsClientAuth``), tested with raw ``ssl`` sockets against a real broker."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from notify.protocol import records
from notify.protocol.frames import ResponseParser
from notify.testing import BrokerProcess, free_port


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
