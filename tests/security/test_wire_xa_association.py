"""XA branch association (second security round, item 4): ``GET /api/transactions`` lists an
application's open XA key to any holder of the authSecret, and a ``put`` naming that key
from another connection used to be answered 200 and committed with the victim's branch.
As JTA has it: until END only the connection that began the branch adds to (ends,
prepares, commits) it; after END or PREPARE any authenticated connection may commit or
roll it back (recovery needs that); local transactions stay their connection's."""

from __future__ import annotations

from collections.abc import Callable

from notify.protocol import records
from notify.testing import BrokerProcess
from tests.helpers import WireClient
from tests.http.conftest import Http

APP = "app-secret-4"


def _auth(c: WireClient) -> None:
    assert c.call(b"auth %s 1\r\n" % APP.encode()).code == 200


def test_another_connection_cannot_join_an_open_xa_branch(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"r": 1}, authSecret=APP)
    victim, attacker = WireClient(b.addr), WireClient(b.addr)
    try:
        _auth(victim)
        _auth(attacker)
        xid = b"XID:1:00aa:beef:q"
        assert victim.call(b"transaction %s v BEGIN 30 2\r\n" % xid).code == 200
        assert victim.call(b"put r 0 2 0 %s 3\r\nv1" % xid).code == 200
        listed = Http(b.http_url, token=APP).get("/api/transactions").json()
        assert xid.decode() in str(listed)  # where the attacker finds the key
        r = attacker.call(b"put r 0 6 0 %s 4\r\nFORGED" % xid)
        assert r.code != 200 and b"belongs to another connection" in r.body, r
        r = attacker.call(b"mput r 0 26 1 %s 5\r\n%b" % (xid, records.encode(0, 0, b"FORGED")))
        assert r.code != 200, r
        for verb in (b"END", b"PREPARE", b"COMMIT_ONE_PHASE", b"ROLLBACK"):
            r = attacker.call(b"transaction %s a %s 6\r\n" % (xid, verb))
            assert r.code != 200 and b"associated with the connection" in r.body, (verb, r)
        assert victim.call(b"put r 0 2 0 %s 7\r\nv2" % xid).code == 200  # still the victim's
        assert victim.call(b"transaction %s v END 8\r\n" % xid).code == 200
        r = attacker.call(b"put r 0 6 0 %s 9\r\nFORGED" % xid)  # ended: nobody adds now
        assert r.code != 200, r
        assert victim.call(b"transaction %s v PREPARE 10\r\n" % xid).code == 200
        # a recovering coordinator on another connection decides the prepared branch
        assert attacker.call(b"transaction %s a COMMIT_TWO_PHASE 11\r\n" % xid).code == 200
        # a local transaction stays its connection's
        key = b"TX:v:1"
        assert victim.call(b"transaction %s v BEGIN 12\r\n" % key).code == 200
        r = attacker.call(b"put r 0 6 0 %s 13\r\nFORGED" % key)
        assert r.code != 200 and b"belongs to another connection" in r.body, r
        assert victim.call(b"transaction %s v ROLLBACK 14\r\n" % key).code == 200
        got = victim.call(b"get r g 0 0 65536 15\r\n")
        assert [rec.body for rec in records.decode_all(got.body, 0)[0]] == [b"v1", b"v2"]
    finally:
        victim.close()
        attacker.close()


def test_an_ended_branch_whose_connection_is_gone_is_recoverable(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """The owner's connection drops after END: another connection prepares and commits
    (what a coordinator recovering on a new connection does); one that drops while the
    branch is active leaves it to its timeout or a rollback from anyone, never to puts."""
    b = http_broker_factory({"r": 1})
    xid, lost = b"XID:1:00bb:cafe:q", b"XID:1:00cc:cafe:q"
    with WireClient(b.addr) as owner:
        assert owner.call(b"transaction %s o BEGIN 30 1\r\n" % xid).code == 200
        assert owner.call(b"put r 0 1 0 %s 2\r\na" % xid).code == 200
        assert owner.call(b"transaction %s o END 3\r\n" % xid).code == 200
        assert owner.call(b"transaction %s o BEGIN 30 4\r\n" % lost).code == 200
        assert owner.call(b"put r 0 1 0 %s 5\r\nb" % lost).code == 200
    with WireClient(b.addr) as tm:
        assert tm.call(b"transaction %s t PREPARE 1\r\n" % xid).code == 200
        assert tm.call(b"transaction %s t COMMIT_TWO_PHASE 2\r\n" % xid).code == 200
        assert tm.call(b"put r 0 1 0 %s 3\r\nX" % lost).code != 200
        assert tm.call(b"transaction %s t ROLLBACK 4\r\n" % lost).code == 200
        got = tm.call(b"get r g 0 0 65536 5\r\n")
        assert [rec.body for rec in records.decode_all(got.body, 0)[0]] == [b"a"]
