"""Subscriptions over HTTP and the HTTP side of roles.

``acceptSubscribe=false`` and the internal ``__delay`` partition (messages not yet due) must
not be readable over HTTP, neither by the REST fetch nor by MetaQ's ``/get``. With
``adminSecret`` set, the admin routes need it while publish and fetch take either secret.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from notify.protocol.frames import encode_dput
from notify.testing import BrokerProcess
from tests.helpers import WireClient
from tests.http.conftest import Http


def test_closed_and_internal_topics_are_not_readable_over_http(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    nosub = {"numPartitions": 1, "acceptSubscribe": "false"}
    b = http_broker_factory({"open": 1, "nosub": nosub})
    h = Http(b.http_url)
    assert h.post("/api/topics/nosub/messages", json_body={"text": "secret"}).status == 200
    due = int(time.time() * 1000) + 3_600_000  # an hour from now: sits in __delay-0
    with WireClient(b.addr) as c:
        r = c.call(encode_dput("open", 0, b"not yet due", 0, -1, due, 7))
        assert r.code == 200, r.body
    # REST fetch
    r = h.get("/api/topics/nosub/partitions/0/messages")
    assert r.status == 403 and "does not accept subscribe" in r.json()["error"], r.text
    r = h.get("/api/topics/__delay/partitions/0/messages")
    assert r.status == 403 and "internal" in r.json()["error"], r.text
    # MetaQ HTTP get and offset
    for topic in ("nosub", "__delay"):
        r = h.get(f"/get/0?topic={topic}&group=g&partition=0&offset=0&maxsize=65536")
        assert r.status == 403, (topic, r.status, r.body[:100])
        assert b"not yet due" not in r.body and b"secret" not in r.body
    assert h.get("/offset/0?topic=__delay&partition=0&offset=0").status == 403
    # nor written to
    assert h.post("/api/topics/__delay/messages", json_body={"text": "x"}).status == 403
    assert h.post("/put/0?topic=__delay&partition=0", b"x").status == 403
    # the open topic still works, and the delayed message is still pending
    assert h.get("/api/topics/open/partitions/0/messages").json()["messages"] == []
    assert h.get("/api/topics/__delay").json()["partitions"][0]["max_offset"] > 0


def test_admin_secret_guards_admin_routes_only(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1}, authSecret="user-pw", adminSecret="admin-pw")
    user, admin, anon = Http(b.http_url, "user-pw"), Http(b.http_url, "admin-pw"), Http(b.http_url)
    wrong = Http(b.http_url, "guess")
    # publish and fetch: either secret
    for client in (user, admin):
        assert client.post("/api/topics/t/messages", json_body={"text": "m"}).status == 200
        assert client.get("/api/topics/t/partitions/0/messages").status == 200
        assert client.post("/put/0?topic=t&partition=0", b"raw").status == 200
    for client, status in ((anon, 401), (wrong, 401)):
        assert client.post("/api/topics/t/messages", json_body={"text": "m"}).status == status
    # admin routes: the user secret is not enough (403), no or a wrong token is 401
    admin_calls = [
        ("/api/topics", {"name": "made"}),
        ("/api/config/reload", None),
        ("/api/topics/t/retention", None),
        ("/api/transactions/XID:1:0a:0b:q/commit", None),
        ("/api/transactions/XID:1:0a:0b:q/rollback", None),
    ]
    for path, body in admin_calls:
        r = user.post(path, json_body=body)
        assert r.status == 403 and "adminSecret" in r.json()["error"], (path, r.text)
        assert anon.post(path, json_body=body).status == 401, path
        assert wrong.post(path, json_body=body).status == 401, path
    assert user.get("/api/topics/made").status == 404
    r = admin.post("/api/topics", json_body={"name": "made"})
    assert r.status == 201, r.text
    assert admin.post("/api/config/reload").status == 200
    assert admin.post("/api/topics/t/retention").status == 200
    assert admin.post("/api/transactions/XID:1:0a:0b:q/commit").status == 404  # unknown tx
    # stats reset changes state: POST and admin only
    assert user.get("/stats/reset").status == 405
    assert user.post("/stats/reset", json_body={}).status == 403
    assert admin.post("/stats/reset", json_body={}).status == 200
    # the config view masks both secrets
    system = admin.get("/api/config").json()["system"]
    assert system["auth_secret"] == "***" and system["admin_secret"] == "***"


def test_queue_and_dead_letter_routes_need_the_admin_role(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """The queue views and dead-letter routes (which read and replay other applications'
    messages) need adminSecret; with no token or the app token every admin route and every
    read is refused, and ``stats reset`` too."""
    b = http_broker_factory({"t": 1}, authSecret="user-pw", adminSecret="admin-pw")
    user, admin, anon = Http(b.http_url, "user-pw"), Http(b.http_url, "admin-pw"), Http(b.http_url)
    admin_only = [
        ("GET", "/api/queues/t/g/dead-letters", None),
        ("POST", "/api/queues/t/g/dead-letters/replay", {"all": True}),
        ("POST", "/api/config/reload", {}),
        ("POST", "/api/topics", {"name": "t9", "numPartitions": 1}),
        ("POST", "/api/topics/t/retention", {}),
        ("POST", "/stats/reset", {}),
    ]
    for method, path, body in admin_only:
        for client, status in ((user, 403), (anon, 401)):
            r = client.get(path) if method == "GET" else client.post(path, json_body=body)
            assert r.status == status, (method, path, client.token, r.status, r.text[:100])
    for path in ("/api/queues", "/api/topics", "/metrics", "/api/overview", "/stats"):
        assert anon.get(path).status == 401, path
    assert admin.get("/api/queues/t/g/dead-letters").status in (200, 404)
    assert admin.get("/api/topics/t9").status == 404  # the app's attempt created nothing
