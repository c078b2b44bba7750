"""The queue groups' dead-letter queue for admins: wire ``qdlq``, ``notify queue dlq`` and the
REST routes, against real broker processes, with roles on (adminSecret) and hostile input."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from notify.cli import main
from notify.protocol import records
from notify.protocol.frames import Response, encode_qdlq, parse_dead_letters
from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient
from tests.http.conftest import Http
from tests.queues.test_queues import _publish, _pushes

USER, ADMIN = "user-pw", "admin-pw"


def _auth(c: WireClient, secret: str) -> None:
    assert c.call(b"auth %s 1\r\n" % secret.encode()).code == 200


def _text(m: Response) -> str:
    recs, _ = records.decode_all(m.body, m.offset)
    return recs[0].payload.decode()


def _dead_letter_some(addr: str) -> list[tuple[int, int]]:
    """Consumer rejects the messages m0, m3, m6, m9 of 10: four dead letters."""
    c = WireClient(addr)
    _auth(c, USER)
    assert c.call(b"qsub work g 10 earliest 2\r\n").code == 200
    got = _pushes(c, 10)
    rejected = [(m.partition, m.offset) for m in got if int(_text(m)[1:]) % 3 == 0]
    items = b"".join(
        b"%s %d %d\n" % (b"X" if (m.partition, m.offset) in rejected else b"A", m.partition,
                         m.offset)
        for m in got
    )
    rep = c.call(b"qack work g %d 3\r\n" % len(items) + items)
    assert rep.body.split(b"\n")[0] == b"10 0", rep
    c.close()
    return sorted(rejected)


def test_dead_letters_wire_cli_and_rest_with_roles(tmp_path: Path) -> None:
    sysc = {"authSecret": USER, "adminSecret": ADMIN, "dashboardHttpPort": free_port()}
    with BrokerProcess(tmp_path, topics={"work": 2}, system=sysc) as b:
        _publish_auth(b.addr, 10)
        rejected = _dead_letter_some(b.addr)
        assert len(rejected) == 4

        # --- wire: the user role may neither list nor replay; the admin may
        user = WireClient(b.addr)
        _auth(user, USER)
        for action, body in (("list", b""), ("replay", b"all")):
            r = user.call(encode_qdlq("work", "g", action, body, 5))
            assert r.code == 403 and b"admin" in r.body, r
        admin = WireClient(b.addr)
        _auth(admin, ADMIN)
        r = admin.call(encode_qdlq("work", "g", "list", b"", 6))
        assert r.code == 200, r
        total, dropped, letters = parse_dead_letters(r.body)
        assert (total, dropped) == (4, 0)
        assert sorted((d.partition, d.offset) for d in letters) == rejected
        assert {d.reason for d in letters} == {"rejected"} and all(d.deliveries == 1
                                                                    for d in letters)
        page = parse_dead_letters(admin.call(encode_qdlq("work", "g", "list", b"1 2", 7)).body)
        assert [(d.partition, d.offset) for d in page[2]] == [
            (d.partition, d.offset) for d in letters[1:3]
        ]
        # bogus arguments: clear 400s, nothing replayed, the connection stays
        bad = [
            (encode_qdlq("work", "g", "list", b"x 2", 8), b"from"),
            (encode_qdlq("work", "g", "list", b"0 0", 9), b"limit >= 1"),
            (encode_qdlq("work", "g", "list", b"-1 5", 9), b"from must be"),
            (encode_qdlq("work", "g", "replay", b"", 10), b"nothing to replay"),
            (encode_qdlq("work", "g", "replay", b"0 1\nzero 5\n", 11), b"'zero 5'"),
            (encode_qdlq("work", "g", "replay", b"0 -3\n", 12), b"'0 -3'"),
            (encode_qdlq("work", "g", "explode", b"", 13), b"list or replay"),
            (b"qdlq work g 0 list\r\n", b"expected 6"),
        ]
        for frame, why in bad:
            r = admin.call(frame)
            assert r.code == 400 and why in r.body, (frame, r)
        assert admin.call(encode_qdlq("work", "nope", "list", b"", 14)).code == 404
        assert admin.call(encode_qdlq("nope", "g", "list", b"", 15)).code == 404
        listed_again = admin.call(encode_qdlq("work", "g", "list", b"", 15)).body
        assert parse_dead_letters(listed_again)[0] == 4

        # --- replay one over the wire: a consumer gets it again, delivery count from 0
        one = rejected[0]
        r = admin.call(encode_qdlq("work", "g", "replay", b"%d %d\n9 9\n" % one, 16))
        assert r.code == 200 and r.body == b"1 1", r  # 9:9 is no dead letter
        cons = WireClient(b.addr)
        _auth(cons, USER)
        assert cons.call(b"qsub work g 10 earliest 2\r\n").code == 200
        (m,) = _pushes(cons, 1)
        assert (m.partition, m.offset, m.code) == (*one, 1)
        items = b"A %d %d\n" % one
        assert cons.call(b"qack work g %d 3\r\n" % len(items) + items).body[:3] == b"1 0"

        # --- CLI: list, then replay one by position; the user secret is refused
        runner = CliRunner()
        base = ["-s", b.addr]
        out = runner.invoke(main, ["queue", "dlq", "list", "work", "g", *base, "--secret", USER])
        assert out.exit_code == 1 and "admin" in out.output, out.output
        out = runner.invoke(
            main, ["queue", "dlq", "list", "work", "g", *base, "--secret", ADMIN, "--json"]
        )
        assert out.exit_code == 0, out.output
        listed = json.loads(out.output)
        assert listed["total"] == 3
        assert sorted((d["partition"], d["offset"]) for d in listed["dead_letters"]) == \
            rejected[1:]
        out = runner.invoke(main, ["dlq", "list", "work", "g", *base, "--secret", ADMIN])
        assert out.exit_code == 0 and "3 dead letter(s)" in out.output, out.output
        two = rejected[1]
        out = runner.invoke(main, ["dlq", "replay", "work", "g", *base, "--secret",
                                   ADMIN, "-m", f"{two[0]}:{two[1]}"])
        assert out.exit_code == 0 and "replayed 1" in out.output, out.output
        (m,) = _pushes(cons, 1)
        assert (m.partition, m.offset) == two
        for args in (["-m", "zero:1"], [], ["--all", "-m", "0:1"]):
            out = runner.invoke(main, ["queue", "dlq", "replay", "work", "g", *base,
                                       "--secret", ADMIN, *args])
            assert out.exit_code == 2, (args, out.output)

        # --- REST: admin routes; bogus bodies get 400s naming the problem
        h_admin, h_user, anon = Http(b.http_url, ADMIN), Http(b.http_url, USER), Http(b.http_url)
        path = "/api/queues/work/g/dead-letters"
        assert anon.get(path).status == 401
        assert h_user.get(path).status == 403
        assert h_user.post(path + "/replay", json_body={"all": True}).status == 403
        r = h_admin.get(path)
        assert r.status == 200, r.text
        body = r.json()
        assert body["total"] == 2 and body["dropped"] == 0
        texts = {d["message"]["text"] for d in body["dead_letters"]}
        assert texts <= {f"m{i}" for i in range(0, 10, 3)} and len(texts) == 2
        assert h_admin.get(path + "?limit=0").status == 400
        assert h_admin.get(path + "?from=-1").status == 400
        assert h_admin.get("/api/queues/work/nope/dead-letters").status == 404
        assert h_admin.get("/api/queues/nope/g/dead-letters").status == 404
        for bogus in (
            {},
            {"all": True, "messages": []},
            {"all": 1},
            {"messages": []},
            {"messages": [{"partition": "zero", "offset": 1}]},
            {"messages": [{"partition": 0, "offset": -1}]},
            {"messages": [{"partition": 0}]},
            {"messages": "0:1"},
            [1, 2],
        ):
            r = h_admin.post(path + "/replay", json_body=bogus)
            assert r.status == 400, (bogus, r.status, r.text)
        assert h_admin.get(path).json()["total"] == 2  # nothing replayed by the bogus calls
        queues = h_user.get("/api/queues").json()["queues"]
        assert queues[0]["group"] == "g" and queues[0]["dead_letters"] == 2
        r = h_admin.post(path + "/replay", json_body={"all": True})
        assert r.status == 200 and r.json()["replayed"] == 2, r.text
        again = _pushes(cons, 2)
        assert sorted((m.partition, m.offset) for m in again) == rejected[2:]
        assert h_admin.get(path).json()["total"] == 0
        for c in (user, admin, cons):
            c.close()


def _publish_auth(addr: str, n: int) -> None:
    with WireClient(addr) as c:
        _auth(c, USER)
        frames = b"".join(
            b"put work %d %d 0 %d\r\nm%d" % (i % 2, len(b"m%d" % i), i + 10, i) for i in range(n)
        )
        c.send(frames)
        assert all(r.code == 200 for r in c.replies(n))


def test_replay_survives_sigkill(tmp_path: Path) -> None:
    """A replayed dead letter is logged before the answer: after kill -9 it is still
    available (delivered again), not back in the dead-letter queue."""
    with BrokerProcess(tmp_path, topics={"work": 1}) as b:
        _publish(b.addr, "work", 3, 1)
        c = WireClient(b.addr)
        assert c.call(b"qsub work g 3 earliest 1\r\n").code == 200
        got = _pushes(c, 3)
        items = b"X %d %d\nA %d %d\nA %d %d\n" % tuple(
            v for m in got for v in (m.partition, m.offset)
        )
        assert c.call(b"qack work g %d 2\r\n" % len(items) + items).body[:3] == b"3 0"
        c.close()
        with WireClient(b.addr) as a:
            assert a.call(encode_qdlq("work", "g", "replay", b"all", 3)).body == b"1 0"
        b.kill()
        b.start()
        c = WireClient(b.addr)
        assert c.call(b"qsub work g 3 earliest 1\r\n").code == 200
        (m,) = _pushes(c, 1)
        assert (m.partition, m.offset) == (got[0].partition, got[0].offset)
        with WireClient(b.addr) as a:
            assert parse_dead_letters(a.call(encode_qdlq("work", "g", "list", b"", 4)).body)[0] == 0
        c.close()
