"""Who may do what on the wire: reloaded secrets, roles, internal topics, deadlines.

Raw sockets against real broker processes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from notify.protocol import records
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, crc, raw, timing
from tests.http.conftest import Http
from tests.security.wire import closed_within

APP = "app-secret"
ADMIN = "admin-secret"
REPL = "repl-secret"


def _auth(c: WireClient, secret: str) -> bytes:
    r = c.call(b"auth %s 1\r\n" % secret.encode())
    assert r.code == 200, r
    return r.body


def test_auth_secret_enabled_by_reload_applies_to_new_connections(
    broker_factory: BrokerFactory,
) -> None:
    """Item 2: a broker started without authSecret gets one by config reload; the next
    connection must authenticate on the wire (it used to be computed once at start)."""
    b: BrokerProcess = broker_factory({"r": 1})
    with WireClient(b.addr) as c:
        assert c.put("r", 0, b"before").code == 200
    b.system["authSecret"] = APP
    b.write_config()
    with WireClient(b.addr) as c:
        assert c.call(b"reload 3\r\n").code == 200
    with WireClient(b.addr) as c:
        r = c.put("r", 0, b"after", opaque=4)
        assert (r.code, r.opaque) == (403, 4) and b"authentication required" in r.body
        _auth(c, APP)
        assert c.put("r", 0, b"after", opaque=5).code == 200
    with WireClient(b.addr) as c:
        assert c.call(b"auth wrong 9\r\n").code == 403
        assert c.is_closed()


def test_roles_admin_verbs_need_admin_secret(broker_factory: BrokerFactory) -> None:
    """Roles: with adminSecret set, ``auth <authSecret>`` may produce and consume but not
    reload, promote or reset stats; ``auth <adminSecret>`` may."""
    b = broker_factory({"r": 1}, authSecret=APP, adminSecret=ADMIN)
    with WireClient(b.addr) as c:
        assert _auth(c, APP) == b"ok"
        assert c.put("r", 0, b"m").code == 200
        assert c.call(b"get r g 0 0 4096 2\r\n").kind == "value"
        for line in (b"reload 3\r\n", b"promote 4\r\n", b"stats reset 5\r\n"):
            r = c.call(line)
            assert r.code == 403 and b"needs the admin role" in r.body, (line, r)
        assert c.call(b"stats 6\r\n").code == 200  # reading stats is fine
    with WireClient(b.addr) as c:
        assert _auth(c, ADMIN) == b"ok role=admin"
        assert c.call(b"reload 3\r\n").code == 200
        assert c.call(b"stats reset 5\r\n").code == 200
        assert c.call(b"promote 4\r\n").code == 400  # allowed; this broker is a master


def test_roles_transactions_of_others_need_admin(broker_factory: BrokerFactory) -> None:
    """An application connection cannot resolve another connection's prepared local
    transaction (heuristic/admin path) nor FORGET; its own and XA ones keep working."""
    b = broker_factory({"r": 1}, authSecret=APP, adminSecret=ADMIN)
    owner, other, admin = WireClient(b.addr), WireClient(b.addr), WireClient(b.addr)
    try:
        _auth(owner, APP)
        _auth(other, APP)
        _auth(admin, ADMIN)
        key = b"TX:s1:1"
        assert owner.call(b"transaction %s s1 BEGIN 1\r\n" % key).code == 200
        assert owner.call(b"put r 0 1 0 %s 2\r\nx" % key).code == 200
        assert owner.call(b"transaction %s s1 END 3\r\n" % key).code == 200
        assert owner.call(b"transaction %s s1 PREPARE 4\r\n" % key).code == 200
        r = other.call(b"transaction %s s2 COMMIT_TWO_PHASE 5\r\n" % key)
        assert r.code == 403 and b"admin role" in r.body, r
        assert admin.call(b"transaction %s s3 COMMIT_TWO_PHASE 6\r\n" % key).code == 200
        # XA: any application connection may commit an xid
        xid = b"XID:1:00aa:beef:q"
        assert owner.call(b"transaction %s s1 BEGIN 7\r\n" % xid).code == 200
        assert owner.call(b"put r 0 1 0 %s 11\r\ny" % xid).code == 200
        assert owner.call(b"transaction %s s1 END 8\r\n" % xid).code == 200
        assert owner.call(b"transaction %s s1 PREPARE 9\r\n" % xid).code == 200
        assert other.call(b"transaction %s s2 COMMIT_TWO_PHASE 10\r\n" % xid).code == 200
    finally:
        for c in (owner, other, admin):
            c.close()


def test_internal_topics_only_for_replicas(broker_factory: BrokerFactory) -> None:
    """Item 9: ``__delay-0`` (messages not yet due) is not readable by clients: get and
    offset answer 403; a connection authenticated with replicationSecret and this broker's
    id (the replica handshake) may read it; the secret alone is not enough."""
    b = broker_factory({"r": 1}, replicationSecret=REPL)
    due = int(time.time() * 1000) + 3_600_000
    with WireClient(b.addr) as c:
        assert c.call(b"dput r 0 6 0 -1 %d 1\r\nsecret" % due).code == 200
        for line in (b"get __delay g 0 0 65536 2\r\n", b"offset __delay g 0 0 3\r\n"):
            r = c.call(line)
            assert r.code == 403 and b"replica role" in r.body, r
    with WireClient(b.addr) as c:
        assert c.call(b"auth %s 1\r\n" % REPL.encode()).code == 403  # no broker id
    with WireClient(b.addr) as c:
        assert c.call(b"auth %s 0 1\r\n" % REPL.encode()).body == b"ok role=replica broker=0"
        g = c.call(b"get __delay g 0 0 65536 2\r\n")
        assert g.kind == "value" and b"secret" in g.body


def test_unauthenticated_and_trickling_sockets_are_closed(broker_factory: BrokerFactory) -> None:
    """Item 8: sockets that never authenticate, or trickle a frame, are closed after
    authTimeout / frameTimeout, freeing maxConnections for real clients."""
    b = broker_factory(
        {"r": 1}, authSecret=APP, maxConnections=40, authTimeout=1500, frameTimeout=1500
    )
    squatters = [raw(b.addr) for _ in range(40)]
    try:
        for s in squatters:
            s.sendall(b"ver")  # a frame that never completes
        with WireClient(b.addr) as c:
            full = c.replies(1)[0]
            assert full.code == 503
        t0 = time.monotonic()
        for s in squatters:
            closed, got = closed_within(s, 5)
            assert closed, "unauthenticated squatter still connected"
            assert got.startswith(b"result 408 ") and b"authTimeout" in got, got
        took = time.monotonic() - t0
        timing(took < 5, f"every squatter closed within {took:.2f} s")
        with WireClient(b.addr) as c:
            _auth(c, APP)
            assert c.put("r", 0, b"in").code == 200
            c.send(b"put r 0 10 0 1\r\nabc")  # authenticated, body trickled and abandoned
            closed, got = closed_within(c.sock, 5)
            assert closed and b"frameTimeout" in got, got
    finally:
        for s in squatters:
            s.close()


def test_idle_timeout(broker_factory: BrokerFactory) -> None:
    """Item 8: with idleTimeout a silent connection is closed; one that keeps talking is not."""
    b = broker_factory({"r": 1}, idleTimeout=1000)
    with WireClient(b.addr) as quiet, WireClient(b.addr) as busy:
        for _ in range(6):
            assert busy.call(b"version 1\r\n").code == 200
            time.sleep(0.3)
        assert quiet.is_closed(0.1)
        assert not busy.is_closed(0.1)


def test_delay_bounds(broker_factory: BrokerFactory) -> None:
    """Item 15 (part): deliverAt beyond maxDelay is refused; deliverAt 0 is due now and
    does not skew the lateness figures (it used to report ~1.8e12 ms)."""
    b = broker_factory({"r": 1}, maxDelay=60_000)
    far = int(time.time() * 1000) + 3_600_000
    with WireClient(b.addr) as c:
        r = c.call(b"dput r 0 3 0 -1 %d 1\r\nfar" % far)
        assert r.code == 400 and b"maxDelay" in r.body, r
        assert c.call(b"dput r 0 3 0 -1 0 2\r\nnow").code == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            g = c.call(b"get r g 0 0 4096 3\r\n")
            if g.kind == "value":
                break
            time.sleep(0.05)
        assert g.kind == "value" and b"now" in g.body
        st = c.call(b"stats 4\r\n").body.decode()
    line = next(x for x in st.split("\r\n") if x.startswith("delay_lateness_p50_ms"))
    p50 = float(line.split()[1])
    assert 0 <= p50 < 5_000, p50


def test_protected_producer_group_needs_its_secret(tmp_path: Path) -> None:
    """An app that may publish cannot register as another app's producer group (it would
    receive that group's check-backs and could commit or roll back its half messages)."""
    b = BrokerProcess(
        tmp_path / "b",
        topics={"r": 1},
        system={"authSecret": APP, "adminSecret": ADMIN},
        extra_ini="[producerGroup=shop]\nsecret=shop-secret\n",
    ).start()
    owner, thief = WireClient(b.addr), WireClient(b.addr)
    try:
        _auth(owner, APP)
        _auth(thief, APP)
        for line in (b"register shop 2\r\n", b"register shop wrong 3\r\n"):
            r = thief.call(line)
            assert r.code == 403 and b"secret" in r.body, r
        assert owner.call(b"register shop shop-secret 4\r\n").code == 200
        assert thief.call(b"register other 5\r\n").code == 200  # unprotected groups stay open
        key = b"TX:h1:1"
        assert owner.call(b"transaction %s s1 BEGIN 6\r\n" % key).code == 200
        assert owner.call(b"put r 0 1 0 %s 7\r\nx" % key).code == 200
        assert owner.call(b"transaction %s s1 END 8\r\n" % key).code == 200
        assert owner.call(b"transaction %s s1 PREPARE 9\r\n" % key).code == 200
        r = thief.call(b"transaction %s s2 COMMIT_TWO_PHASE 10\r\n" % key)
        assert r.code == 403, r  # not a member of the group: no check-back answer either
        # the secret never shows in the served config
        r = thief.call(b"stats config 11\r\n")
        assert r.code == 200 and b"shop-secret" not in r.body and APP.encode() not in r.body
        assert b"secret=***" in r.body
    finally:
        owner.close()
        thief.close()
        b.stop()


def test_every_verb_needs_the_role_it_names(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """With authSecret and adminSecret: before ``auth`` every verb (queue verbs, ``register``,
    ``transaction``, ``stats`` included) is refused 401/403 and nothing is written; the app
    secret cannot use the admin verbs (``reload``, ``promote``, ``stats reset``, ``stats
    producers``, ``qdlq``, ``qdel``) nor the replica verbs (``msync``, ``sync``). 300 wrong
    wire secrets are all counted in ``/metrics`` and logged as at most two lines."""
    b = http_broker_factory({"r": 1}, authSecret=APP, adminSecret=ADMIN)
    body = b"x"
    anyone = (
        b"put r 0 1 0 %d 1\r\nx" % crc(body),
        b"mput r 0 %d 1 1\r\n" % len(records.encode(0, 0, body)) + records.encode(0, 0, body),
        b"dput r 0 1 0 -1 0 1\r\nx",
        b"get r g 0 0 1024 1\r\n",
        b"offset r g 0 0 1\r\n",
        b"qsub r g 10 earliest 1\r\n",
        b"qcredit r g 10 1\r\n",
        b"qack r g 8 1\r\nK 0 0 1\n",
        b"qdlq r g 0 list 1\r\n",
        b"qdel r g 1\r\n",
        b"producer ~AAAAAAAAAAAAAAAAAAAAAA secret-secret-secret 0 - 1\r\n",
        b"transaction TX:a:1 s BEGIN 10 1\r\n",
        b"register shop 1\r\n",
        b"reload 1\r\n",
        b"promote 1\r\n",
        b"stats 1\r\n",
        b"msync r 0 0 0 0 1\r\n",
    )
    for frame in anyone:
        with WireClient(b.addr) as c:
            r = c.call(frame)
            assert r.code in (401, 403), (frame, r)
    admin_or_replica = (
        b"reload 1\r\n",
        b"promote 1\r\n",
        b"stats reset 1\r\n",
        b"stats producers 1\r\n",
        b"qdlq r g 0 list 1\r\n",
        b"qdel r g 1\r\n",
        b"msync r 0 0 0 0 1\r\n",
        b"sync r 0 1 0 7 %d 1\r\nx" % crc(body),
    )
    for frame in admin_or_replica:
        with WireClient(b.addr) as c:
            _auth(c, APP)
            r = c.call(frame)
            assert r.code == 403, (frame, r)
    with WireClient(b.addr) as c:
        _auth(c, APP)
        assert c.call(b"offset r g 0 9223372036854775807 1\r\n").body == b"0"  # nothing in
    size0 = b.log_path.stat().st_size
    for _ in range(300):
        with WireClient(b.addr) as c:
            assert c.call(b"auth guess 1\r\n").code == 403
            assert c.is_closed()
    lines = [
        ln for ln in b.log_path.read_text()[size0:].splitlines() if "authentication failed" in ln
    ]
    assert 1 <= len(lines) <= 2, lines[:5]
    metrics = Http(b.http_url, ADMIN).get("/metrics").text
    total = re.search(r"^notify_auth_failures_total (\S+)$", metrics, re.M)
    assert total and float(total.group(1)) >= 300, total
