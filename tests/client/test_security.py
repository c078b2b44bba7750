"""Shared-secret authentication and TLS from the client side, against real brokers.

The broker sets ``authSecret``; the client library, the CLI, the XA broker participant and
the blocking transport must authenticate on every connection, fail clearly without the
secret (or with a wrong one), and take the secret from ``NOTIFY_SECRET`` by default. TLS is
tested through a real TLS terminator (an asyncio TLS server relaying to the broker) with a
CA and server certificate made by ``openssl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from notify.cli import main
from notify.client import AsyncMessageSessionFactory, ClientConfig, ConsumerConfig, connect
from notify.client.transport import (
    AuthenticationError,
    BlockingConnection,
    TLSError,
    TransportOptions,
    open_connection,
)
from notify.errors import BrokerError
from notify.protocol.frames import encode_line
from notify.protocol.keys import Xid
from notify.protocol.replies import parse_stats_topics
from notify.testing import BrokerProcess
from notify.xa import BrokerParticipant, ParticipantError, Scope, Vote
from notify.xa.ids import XidFactory
from tests.conftest import BrokerFactory

SECRET = "s3cret-pw"


@pytest.fixture
def secured(broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch) -> BrokerProcess:
    monkeypatch.delenv("NOTIFY_SECRET", raising=False)
    return broker_factory({"test": 2}, authSecret=SECRET)


def test_send_without_secret_fails_clearly(secured: BrokerProcess) -> None:
    with (
        connect([secured.addr], partitions={"test": 2}) as session,
        pytest.raises(BrokerError) as ei,
    ):
        session.create_producer().send("test", b"x")
    assert ei.value.code == 403 and "authentication required" in str(ei.value)


def test_wrong_secret_is_refused(secured: BrokerProcess) -> None:
    with (
        connect([secured.addr], partitions={"test": 2}, secret="wrong") as session,
        pytest.raises(AuthenticationError) as ei,
    ):
        session.create_producer().send("test", b"x")
    assert "refused the shared secret" in str(ei.value) and not ei.value.retriable


def test_secret_argument_and_env_var(
    secured: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connect([secured.addr], secret=SECRET) as session:  # discovery authenticates too
        producer = session.create_producer()
        results = [producer.send("test", b"m%d" % i) for i in range(20)]
        assert all(r.success for r in results), [r.error for r in results if not r.success]
    monkeypatch.setenv("NOTIFY_SECRET", SECRET)
    assert ClientConfig().secret == SECRET
    with connect([secured.addr]) as session:
        assert session.create_producer().send("test", b"env").success
        consumer = session.create_consumer(
            ConsumerConfig(group="g", data_dir=tmp_path, long_poll_ms=100)
        )
        got = []
        for msg in consumer.messages("test"):
            got.append(msg.data)
            if len(got) == 21:
                break
    assert sorted(got) == sorted([b"m%d" % i for i in range(20)] + [b"env"])


async def _async_send(addr: str, secret: str | None) -> bool:
    async with AsyncMessageSessionFactory([addr], secret=secret) as session:
        try:
            await session.create_producer().send("test", b"async")
        except BrokerError as e:
            assert e.code == 403
            return False
        return True


def test_async_factory_takes_the_secret(secured: BrokerProcess) -> None:
    assert asyncio.run(_async_send(secured.addr, SECRET))
    assert not asyncio.run(_async_send(secured.addr, None))


def test_blocking_transport_reauthenticates_after_reconnect(secured: BrokerProcess) -> None:
    conn = BlockingConnection(secured.addr, TransportOptions(SECRET))
    with conn:
        assert conn.request(lambda o: encode_line("stats", "topics", o)).code == 200
        conn.drop()  # the next request reconnects: auth is sent again first
        r = conn.request(lambda o: encode_line("stats", "topics", o))
        assert r.code == 200 and parse_stats_topics(r.body)["test"] == 2
    with BlockingConnection(secured.addr) as anon:
        assert anon.request(lambda o: encode_line("stats", o)).code == 403


def test_cli_secret_option_and_env_var(secured: BrokerProcess) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["stats", "topics", "-s", secured.addr, "--json"], env={})
    assert r.exit_code == 1 and "403" in r.output and "authentication" in r.output
    r = runner.invoke(
        main, ["stats", "topics", "-s", secured.addr, "--json"], env={"NOTIFY_SECRET": SECRET}
    )
    assert r.exit_code == 0, r.output
    assert '"test"' in r.output
    r = runner.invoke(main, ["stats", "-s", secured.addr, "--secret", "nope"], env={})
    assert r.exit_code == 1 and "refused the shared secret" in r.output
    r = runner.invoke(
        main, ["config", "reload", "-s", secured.addr], env={"NOTIFY_SECRET": SECRET}
    )
    assert r.exit_code == 0, r.output
    for cmd in (["stats"], ["config", "reload"], ["tx", "commit"], ["topics", "list"]):
        help_text = runner.invoke(main, [*cmd, "--help"]).output
        assert "NOTIFY_SECRET" in help_text and "--tls-ca-file" in help_text, cmd


def test_xa_participant_with_secret(secured: BrokerProcess) -> None:
    xids = XidFactory(Scope("sec"))
    xid: Xid = xids.branch(xids.new_gtrid(2e9), "b1")
    p = BrokerParticipant(secured.addr, secret=SECRET)
    try:
        p.start(xid, 30)
        sent = p.handle.send("test", b"xa", partition=1)
        assert sent.partition == 1
        p.end(xid, True)
        assert p.prepare(xid) is Vote.OK
        p.commit(xid, one_phase=False)
    finally:
        p.close()
    anon = BrokerParticipant(secured.addr)
    try:
        anon.start(xid, 30)
        with pytest.raises(ParticipantError, match="403"):
            anon.handle.send("test", b"xa", partition=1)
    finally:
        anon.close()
    bad = BrokerParticipant(secured.addr, secret="wrong")
    try:
        bad.start(xid, 30)
        with pytest.raises(ParticipantError, match="refused the shared secret"):
            bad.handle.send("test", b"xa", partition=1)
    finally:
        bad.close()


# ---------------------------------------------------------------------------------- TLS


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:  # pragma: no cover - Debian has it
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("certs")
    ca_key, ca, key, csr, crt, ext = (
        d / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem", "ext.cnf")
    )
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
             "-out", str(ca), "-days", "2", "-subj", "/CN=notify test CA")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", "/CN=127.0.0.1")  # fmt: skip
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return {"ca": ca, "cert": crt, "key": key}


class TLSTerminator:
    """A TLS server on loopback relaying each connection to a plain broker (like stunnel)."""

    def __init__(self, cert: Path, key: Path, upstream: tuple[str, int]):
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(str(cert), str(key))
        self.upstream = upstream
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _relay(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await r.read(1 << 16):
                w.write(data)
                await w.drain()
        w.close()

    async def _client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self._writers.append(w)
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            w.close()
            return
        self._writers.append(uw)
        await asyncio.gather(self._relay(r, uw), self._relay(ur, w))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0, ssl=self.ctx)
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        server.close()
        for w in self._writers:
            w.close()
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(server.wait_closed())
        self.loop.run_until_complete(asyncio.sleep(0.05))  # let the transports finish closing
        self.loop.close()

    def __enter__(self) -> TLSTerminator:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def tls_broker(secured: BrokerProcess, certs: dict[str, Path]) -> Iterator[str]:
    host, _, port = secured.addr.rpartition(":")
    with TLSTerminator(certs["cert"], certs["key"], (host, int(port))) as t:
        yield f"127.0.0.1:{t.port}"


def test_tls_with_ca_file(tls_broker: str, certs: dict[str, Path]) -> None:
    ca = str(certs["ca"])
    with connect([tls_broker], secret=SECRET, tls_ca_file=ca) as session:
        results = [session.create_producer().send("test", b"tls%d" % i) for i in range(5)]
        assert all(r.success for r in results), [r.error for r in results]
    opts = TransportOptions.build(SECRET, tls_ca_file=ca)
    with BlockingConnection(tls_broker, opts) as conn:
        r = conn.request(lambda o: encode_line("stats", "topics", o))
        assert r.code == 200 and parse_stats_topics(r.body)["test"] == 2
        assert not conn.peer_closed()  # a TLS 1.3 session ticket is no stray data
    r2 = CliRunner().invoke(
        main,
        ["stats", "topics", "-s", tls_broker, "--tls-ca-file", ca, "--json"],
        env={"NOTIFY_SECRET": SECRET},
    )
    assert r2.exit_code == 0, r2.output


def test_tls_refuses_an_untrusted_certificate(tls_broker: str, certs: dict[str, Path]) -> None:
    with pytest.raises(TLSError, match="not accepted"):
        BlockingConnection(tls_broker, TransportOptions.build(SECRET, tls=True)).connect()

    async def go() -> None:
        await open_connection(tls_broker, TransportOptions.build(SECRET, tls=True))

    with pytest.raises(TLSError):
        asyncio.run(go())
    # verification off (testing only): the same connection works
    opts = TransportOptions.build(SECRET, tls=True, tls_verify=False)
    with BlockingConnection(tls_broker, opts) as conn:
        assert conn.request(lambda o: encode_line("stats", o)).code == 200
    with pytest.raises(TLSError, match="cannot set up TLS"):
        TransportOptions.build(SECRET, tls_ca_file=certs["ca"].parent / "missing.pem")
