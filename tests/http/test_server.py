"""The HTTP server's lifecycle, auth and concurrency, on real broker processes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient
from tests.http.conftest import HTTP_TOPICS, Http

SECRET = "s3cret-token"


def test_auth_everywhere(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory(authSecret=SECRET)
    anon = Http(b.http_url)
    for path in (
        "/",
        "/dashboard.js",
        "/api/topics",
        "/api/overview",
        "/metrics",
        "/stats",
        "/get/0?topic=test&group=g&partition=0&offset=0&maxsize=10",
        "/api/openapi.json",
    ):
        r = anon.get(path)
        assert r.status == 401, path
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), path
    r = anon.post("/api/topics/test/messages", json_body={"text": "x"})
    assert r.status == 401 and "authentication required" in r.json()["error"]
    r = anon.post("/put/0?topic=test&partition=0&flag=0", b"x")
    assert r.status == 401
    assert Http(b.http_url, token="wrong").get("/api/topics").status == 401
    assert anon.get("/api/topics?token=wrong").status == 401
    # the right secret, as a bearer token or ?token=
    good = Http(b.http_url, token=SECRET)
    assert good.get("/api/topics").status == 200
    assert good.get("/metrics").status == 200
    assert good.post("/put/0?topic=test&partition=0&flag=0", b"x").status == 200
    assert anon.get(f"/api/topics?token={SECRET}").status == 200
    assert anon.get(f"/?token={SECRET}").status == 200
    # the secret never leaks through config views
    assert good.get("/api/config").json()["system"]["auth_secret"] == "***"
    assert SECRET not in good.get("/stats/config").text
    assert SECRET not in good.get("/api/overview").text


def test_concurrent_http_puts_share_fsyncs(http_broker: BrokerProcess, http: Http) -> None:
    before = http.get("/api/overview").json()["system"]["fsyncs"]

    async def run() -> list[tuple[int, str]]:
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> tuple[int, str]:
                async with session.post(
                    f"{http_broker.http_url}/put/0?topic=gc&partition=0&flag=0",
                    data=b"c%d" % i,
                ) as resp:
                    return resp.status, await resp.text()

            return await asyncio.gather(*(one(i) for i in range(100)))

    results = asyncio.run(run())
    assert all(status == 200 for status, _ in results), results[:3]
    offsets = [int(text.split()[2]) for _, text in results]
    assert len(set(offsets)) == 100
    fsyncs = http.get("/api/overview").json()["system"]["fsyncs"] - before
    assert 1 <= fsyncs < 100  # group commit: concurrent puts share fsyncs


def test_port_in_use_fails_the_start_cleanly(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        b = BrokerProcess(tmp_path, topics=HTTP_TOPICS, system={"dashboardHttpPort": port})
        with pytest.raises(RuntimeError, match="exited with 1"):
            b.start()
        assert "address already in use" in b.log_tail().lower()


def test_http_off_by_default_and_graceful_stop(
    tmp_path: Path, http_broker_factory: Callable[..., BrokerProcess]
) -> None:
    plain = BrokerProcess(tmp_path / "plain", topics={"t": 1}).start()
    try:
        assert plain.http_port == 0
        assert "notify.http" not in plain.log_tail()
    finally:
        assert plain.stop() == 0
    b = http_broker_factory()
    h = Http(b.http_url)
    assert h.get("/").status == 200
    assert b.stop() == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", b.http_port), timeout=1).close()


def test_dashboard_assets(http: Http) -> None:
    r = http.get("/")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    assert b"dashboard.js" in r.body and b'<script src="http' not in r.body
    for path, ctype in (
        ("/dashboard.js", "application/javascript"),
        ("/dashboard.css", "text/css"),
        ("/favicon.svg", "image/svg+xml"),
    ):
        r = http.get(path)
        assert r.status == 200 and r.headers["Content-Type"].startswith(ctype), path
    # nothing from a CDN: the machine may have no internet
    for path in ("/", "/dashboard.js", "/dashboard.css"):
        assert b"https://" not in http.get(path).body, path
    ov = http.get("/api/overview").json()
    assert {"system", "rates", "topics", "groups", "transactions", "config"} <= set(ov)


def test_wire_unaffected_by_http(http_broker: BrokerProcess) -> None:
    with WireClient(http_broker.addr) as c:
        assert c.call(b"version 1\r\n").code == 200
    assert free_port() != http_broker.http_port
