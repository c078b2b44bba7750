"""A web page in the operator's browser must not be able to
drive the broker's HTTP port, by a cross-site request or by DNS rebinding, and REST can
neither create internal (``__``) topics nor place a topic's data outside ``dataPath``.

Each test sends exactly what a browser would (``text/plain`` or form POSTs, a foreign
``Origin``, a rebinding ``Host``) and asserts both the refusal and that nothing changed.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable
from pathlib import Path

from notify.testing import BrokerProcess
from tests.http.conftest import Http

EVIL = "http://evil.example"


def _raw(
    b: BrokerProcess, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    """A request with exactly these headers (no Content-Type unless given)."""
    conn = http.client.HTTPConnection(b.host, b.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_simple_cross_site_posts_change_nothing(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1})
    h = Http(b.http_url)
    ini_before = Path(b.config_path).read_text()
    create = b'{"name": "pwned", "numPartitions": 1}'
    # what <form enctype=text/plain> / fetch(no-cors) can send from any page, no preflight
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = h.post("/api/topics", create, headers={"Content-Type": ctype})
        assert r.status == 415, r.text
        assert "application/json" in r.json()["error"]
        r = h.post("/api/config/reload", b"", headers={"Content-Type": ctype})
        assert r.status == 415, r.text
        r = h.post("/api/topics/t/messages", b'{"text":"x"}', headers={"Content-Type": ctype})
        assert r.status == 415, r.text
    status, _ = _raw(b, "POST", "/api/topics", create, {})  # no Content-Type at all
    assert status == 415
    # a foreign Origin is refused even with a JSON type (and even for reads)
    for path, body in (("/api/topics", create), ("/api/topics/t/messages", b'{"text":"x"}')):
        status, text = _raw(
            b, "POST", path, body, {"Content-Type": "application/json", "Origin": EVIL}
        )
        assert status == 403 and b"cross-origin" in text, text
    assert h.get("/api/topics", headers={"Origin": "null"}).status == 403
    # MetaQ's raw-body /put keeps working for non-browser clients, not for a foreign page
    r = h.post("/put/0?topic=t&partition=0", b"raw", headers={"Content-Type": "text/plain"})
    assert r.status == 200, r.text
    r = h.post("/put/0?topic=t&partition=0", b"raw", headers={"Origin": EVIL})
    assert r.status == 403, r.text
    # nothing happened: no topic, one message (the legitimate /put), ini untouched
    assert h.get("/api/topics/pwned").status == 404
    assert h.get("/api/topics/t/partitions/0/messages").json()["messages"][0]["text"] == "raw"
    assert len(h.get("/api/topics/t/partitions/0/messages").json()["messages"]) == 1
    assert Path(b.config_path).read_text() == ini_before
    # the same-origin dashboard and JSON clients still work
    own = f"http://127.0.0.1:{b.http_port}"
    r = h.post("/api/topics/t/messages", json_body={"text": "ok"}, headers={"Origin": own})
    assert r.status == 200, r.text


def test_dns_rebinding_host_is_refused(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory({"t": 1}, httpAllowedHosts="broker.example")
    h = Http(b.http_url)
    port = b.http_port
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        r = h.get("/api/topics", headers={"Host": host})
        assert r.status == 421, (host, r.text)
        r = h.post("/api/topics", json_body={"name": "rebound"}, headers={"Host": host})
        assert r.status == 421, (host, r.text)
        assert h.get("/metrics", headers={"Host": host}).status == 421
    assert h.get("/api/topics/rebound").status == 404
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "broker.example", f"[::1]:{port}"):
        assert h.get("/api/topics", headers={"Host": host}).status == 200, host


def test_rest_cannot_create_internal_topics_or_set_data_path(
    http_broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    b = http_broker_factory({"t": 1})
    h = Http(b.http_url)
    ini_before = Path(b.config_path).read_text()
    for name in ("__evil", "__delay", "__"):
        r = h.post("/api/topics", json_body={"name": name})
        assert r.status == 400 and "reserved" in r.json()["error"], r.text
    outside = tmp_path / "outside"
    r = h.post("/api/topics", json_body={"name": "escape", "config": {"dataPath": str(outside)}})
    assert r.status == 400 and "dataPath" in r.json()["error"], r.text
    assert not outside.exists()
    assert h.get("/api/topics/__evil").status == 404
    assert Path(b.config_path).read_text() == ini_before
    # the broker still restarts on its (unchanged) server.ini
    b.restart()
    assert Http(b.http_url).get("/api/topics/t").status == 200
