"""Queue groups under attack (second security round, item 3): one connection used to
create every group queueMaxGroups allows (256 x ``qsub``/``qunsub``, 0.1 s) and every later
group got ``503 too many queue groups``, after a restart too; no way to delete a group,
empty ones never expired. Real broker processes, raw sockets, the REST face and the CLI."""

from __future__ import annotations

import time
from collections.abc import Callable

from click.testing import CliRunner

from notify.cli import main
from notify.protocol.frames import Response
from notify.testing import BrokerProcess
from tests.helpers import WireClient, stats
from tests.http.conftest import Http

ADMIN = "admin-secret-9"
APP = "app-secret-9"


def _squat(addr: str, topic: str, names: list[str], secret: str = "") -> list[Response]:
    """One connection: ``qsub`` then ``qunsub`` of each group, pipelined; the qsubs'
    answers (pushed messages skipped)."""
    with WireClient(addr) as c:
        frames = [b"auth %s 1\r\n" % secret.encode()] if secret else []
        for i, g in enumerate(names):
            t, n = topic.encode(), g.encode()
            frames.append(b"qsub %s %s 1 earliest %d\r\n" % (t, n, 2 * i + 10))
            frames.append(b"qunsub %s %s %d\r\n" % (t, n, 2 * i + 11))
        c.send(b"".join(frames))
        want = len(frames)
        got: list[Response] = []
        while len(got) < want:
            got += [r for r in c.replies(1) if r.kind == "result"]
    subs = {2 * i + 10 for i in range(len(names))}
    return [r for r in got if r.opaque in subs]


def _groups(addr: str, secret: str) -> set[str]:
    return {k.split("/", 1)[1] for k in stats(addr, "queues", secret)}


def test_one_client_cannot_squat_the_queue_groups_and_an_admin_deletes_them(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """The reported squat is capped per connection (queueMaxGroupsPerConnection, 16) and a
    legitimate group is still created; groups holding nothing make room at queueMaxGroups
    (256); once every slot holds pending messages the admin deletes one (REST) and the next
    group is created; a group with a consumer is deleted only when forced (its connection
    closed with a 410), and deletions survive a restart."""
    b = http_broker_factory({"demo": 1, "busy": 1}, authSecret=APP, adminSecret=ADMIN)
    got = _squat(b.addr, "demo", [f"squat{i:03d}" for i in range(256)], APP)
    assert [r.code for r in got] == [200] * 16 + [503] * 240
    assert b"queueMaxGroupsPerConnection=16" in got[16].body
    legit = WireClient(b.addr)
    assert legit.call(b"auth %s 1\r\n" % APP.encode()).code == 200
    assert legit.call(b"qsub demo legit 10 latest 2\r\n").code == 200  # a consumer stays
    for k in range(15):  # fifteen more connections fill queueMaxGroups with empty groups
        got = _squat(b.addr, "demo", [f"more{k:02d}-{i:02d}" for i in range(16)], APP)
        assert all(r.code == 200 for r in got), [r.body for r in got if r.code != 200]
    assert len(_groups(b.addr, APP)) == 256
    with WireClient(b.addr) as c:  # busy holds a message: groups on it hold it pending
        assert c.call(b"auth %s 1\r\n" % APP.encode()).code == 200
        assert c.put("busy", 0, b"pending", opaque=3).code == 200
    for k in range(16):  # every empty group makes room for one that holds something
        got = _squat(b.addr, "busy", [f"held{k:02d}-{i:02d}" for i in range(16)], APP)
        assert all(r.code == 200 for r in got[: 16 if k < 15 else 15])
    groups = _groups(b.addr, APP)
    assert len(groups) == 256 and "legit" in groups
    assert not [g for g in groups if g.startswith(("squat", "more"))]
    with WireClient(b.addr) as c:
        assert c.call(b"auth %s 1\r\n" % APP.encode()).code == 200
        r = c.call(b"qsub demo late 10 latest 4\r\n")
        assert r.code == 503 and b"an admin may delete" in r.body, r
        r = c.call(b"qdel busy held00-00 5\r\n")
        assert r.code == 403 and b"admin role" in r.body, r  # the app secret is not enough
    admin = Http(b.http_url, token=ADMIN)
    assert Http(b.http_url, token=APP).request("DELETE", "/api/queues/busy/held00-00").status == 403
    r2 = admin.request("DELETE", "/api/queues/busy/held00-00")
    assert r2.status == 200 and r2.json()["deleted"] is True, r2.text
    with WireClient(b.addr) as c:
        assert c.call(b"auth %s 1\r\n" % APP.encode()).code == 200
        assert c.call(b"qsub demo late 10 latest 6\r\n").code == 200
    r2 = admin.request("DELETE", "/api/queues/demo/legit")
    assert r2.status == 409 and "consumer" in r2.json()["error"]
    out = CliRunner().invoke(main, ["queue", "delete", "demo", "legit", "-s", b.addr,
                                    "--secret", ADMIN, "--force"])
    assert out.exit_code == 0 and "demo/legit: deleted" in out.output, out.output
    closed = [r for r in legit.replies(1) if r.kind == "result"]
    assert closed and closed[0].code == 410 and closed[0].opaque == 2 and legit.is_closed()
    legit.close()
    b.stop()
    b.start()
    groups = _groups(b.addr, APP)
    assert "legit" not in groups and "held00-00" not in groups and "held01-00" in groups


def test_unused_groups_that_hold_nothing_expire(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """queueGroupExpiry: a group whose consumer left after finishing every message is
    deleted (logged: still gone after a restart); one with a message pending for it, or a
    dead letter, or a consumer, stays however long."""
    b = http_broker_factory(
        {"jobs": 1, "other": 1}, queueGroupExpiry=1000, queueCheckpointInterval=200
    )
    with WireClient(b.addr) as c:
        assert c.put("jobs", 0, b"j0", opaque=1).code == 200
        c.send(b"qsub jobs done 10 earliest 2\r\n")
        sub, push = sorted(c.replies(2), key=lambda r: r.kind == "qmsg")
        assert sub.code == 200 and push.kind == "qmsg"
        items = b"A 0 %d\n" % push.offset
        assert c.call(b"qack jobs done %d 3\r\n%s" % (len(items), items)).code == 200
        assert c.call(b"qunsub jobs done 4\r\n").code == 200
    with WireClient(b.addr) as c:  # created at the end, then a message arrives: pending
        assert c.call(b"qsub other behind 10 latest 5\r\n").code == 200
        assert c.call(b"qunsub other behind 6\r\n").code == 200
        assert c.put("other", 0, b"o1", opaque=7).code == 200
    watcher = WireClient(b.addr)
    assert watcher.call(b"qsub jobs watched 10 latest 8\r\n").code == 200
    deadline = time.monotonic() + 15
    while "done" in _groups(b.addr, ""):
        assert time.monotonic() < deadline, "the finished group did not expire"
        time.sleep(0.1)
    time.sleep(1.0)  # the others outlive the expiry too
    assert _groups(b.addr, "") == {"behind", "watched"}
    watcher.close()
    b.stop()
    b.start()
    groups = _groups(b.addr, "")
    assert "done" not in groups and "behind" in groups
