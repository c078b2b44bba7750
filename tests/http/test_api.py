"""The JSON REST face: produce, fetch, topics, groups, transactions, config, OpenAPI."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner

from notify.cli import main
from notify.config import load_config
from notify.http import api
from notify.testing import BrokerProcess
from tests.helpers import WireClient
from tests.http.conftest import MAX_MESSAGE, Http, prepare_xa, xid


def test_produce_one_many_and_fetch(http: Http) -> None:
    r = http.post("/api/topics/single/messages", json_body={"text": "héllo", "attribute": "tag"})
    assert r.status == 200, r.text
    first = r.json()["results"][0]
    assert first["partition"] == 0 and isinstance(first["id"], str) and int(first["id"]) > 0
    r = http.post(
        "/api/topics/single/messages",
        json_body={
            "messages": [
                {"base64": base64.b64encode(b"\x00\xffbin").decode()},
                {"text": "third"},
            ]
        },
    )
    assert r.status == 200, r.text
    res = r.json()["results"]
    assert [x["offset"] for x in res] == sorted(x["offset"] for x in res)
    r = http.post("/api/topics/single/messages", json_body=[{"text": "fourth"}])
    assert r.status == 200
    # fetch from the first message on
    r = http.get(f"/api/topics/single/partitions/0/messages?offset={first['offset']}")
    assert r.status == 200, r.text
    page = r.json()
    msgs = page["messages"]
    assert [m["text"] for m in msgs][:4] == ["héllo", None, "third", "fourth"]
    assert msgs[0]["attribute"] == "tag" and msgs[0]["flag"] == 1
    assert msgs[0]["id"] == first["id"]
    assert base64.b64decode(msgs[1]["base64"]) == b"\x00\xffbin"
    assert page["next_offset"] == page["max_offset"]
    # paging with limit and next_offset
    p1 = http.get(f"/api/topics/single/partitions/0/messages?offset={first['offset']}&limit=1")
    one = p1.json()
    assert len(one["messages"]) == 1 and one["next_offset"] == msgs[1]["offset"]
    p2 = http.get(f"/api/topics/single/partitions/0/messages?offset={one['next_offset']}&limit=1")
    assert p2.json()["messages"][0]["offset"] == msgs[1]["offset"]
    # at the end: empty page; out of range: 416 with the offset to use
    end = page["max_offset"]
    r = http.get(f"/api/topics/single/partitions/0/messages?offset={end}")
    assert r.status == 200 and r.json()["messages"] == []
    r = http.get(f"/api/topics/single/partitions/0/messages?offset={end + 1000}")
    assert r.status == 416 and r.json()["nearest_offset"] == end
    # an offset inside a record
    r = http.get(f"/api/topics/single/partitions/0/messages?offset={first['offset'] + 3}")
    assert r.status == 400 and "not the start of a record" in r.json()["error"]


def test_produce_round_robin_and_explicit_partition(http: Http) -> None:
    r = http.post("/api/topics/test/messages", json_body=[{"text": f"m{i}"} for i in range(8)])
    parts = [x["partition"] for x in r.json()["results"]]
    assert sorted(parts) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(parts[i] != parts[i + 1] for i in range(7))
    r = http.post(
        "/api/topics/test/messages",
        json_body={"partition": 2, "messages": [{"text": "a"}, {"text": "b", "partition": 1}]},
    )
    assert [x["partition"] for x in r.json()["results"]] == [2, 1]


def test_produce_on_group_commit_topic_batches_fsyncs(http: Http) -> None:
    before = http.get("/api/overview").json()["system"]["fsyncs"]
    r = http.post("/api/topics/gc/messages", json_body=[{"text": f"g{i}"} for i in range(200)])
    assert r.status == 200
    # acknowledged after the fsync covering them: visible at once, and batched
    assert http.get("/api/topics/gc").json()["partitions"][0]["flushed_offset"] > 0
    after = http.get("/api/overview").json()["system"]["fsyncs"]
    assert 1 <= after - before <= 4


def test_produce_bad_input(http: Http) -> None:
    cases: list[tuple[str, Any, int, str]] = [
        ("test", {"base64": "***"}, 400, "not valid base64"),
        ("test", {"text": "a", "base64": "YQ=="}, 400, "exactly one"),
        ("test", {}, 400, "exactly one"),
        ("test", {"text": 5}, 400, "must be a string"),
        ("test", {"text": "a", "attribute": 1}, 400, "attribute"),
        ("test", {"text": "a", "colour": "red"}, 400, "unknown field"),
        ("test", {"text": "a", "partition": "x"}, 400, "partition"),
        ("test", {"messages": []}, 400, "between 1 and"),
        ("test", {"messages": "x"}, 400, "must be a list"),
        ("test", [{"text": "a"}] * 1001, 400, "between 1 and"),
        ("test", "just a string", 400, "expected a message"),
        ("test", {"text": "a", "partition": 99}, 404, "does not exist"),
        ("nosuch", {"text": "a"}, 404, "does not exist"),
        ("closed", {"text": "a"}, 403, "does not accept publish"),
        ("test", {"text": "x" * (MAX_MESSAGE + 1)}, 413, "maxMessageSize"),
    ]
    for topic, body, status, words in cases:
        r = http.post(f"/api/topics/{topic}/messages", json_body=body)
        assert r.status == status, (body if len(str(body)) < 100 else topic, r.text)
        assert words in r.json()["error"], r.text
    # not JSON at all, empty body, a topic that is a path
    r = http.post("/api/topics/test/messages", b"{nope")
    assert r.status == 400 and "not valid JSON" in r.json()["error"]
    r = http.post("/api/topics/test/messages", b"{}", headers={"Content-Type": "text/plain"})
    assert r.status == 415 and "application/json" in r.json()["error"]
    assert http.post("/api/topics/test/messages").status == 400
    for bad in ("..%2F..%2Ftmp", "%2E%2E", "..", "x%00", "a$b", "a%20b"):
        r = http.post(f"/api/topics/{bad}/messages", json_body={"text": "a"})
        assert r.status == 400 and "invalid topic name" in r.json()["error"], (bad, r.text)
        r = http.get(f"/api/topics/{bad}/partitions/0/messages")
        assert r.status == 400, bad


def test_partial_failure_reports_each_message(http: Http) -> None:
    r = http.post(
        "/api/topics/test/messages",
        json_body=[{"text": "ok", "partition": 0}, {"text": "bad", "partition": 42}],
    )
    assert r.status == 404
    body = r.json()
    assert "partition 42" in body["error"]
    ok, bad = body["results"]
    assert ok["partition"] == 0 and "offset" in ok
    assert bad["code"] == 404 and "partition 42" in bad["error"]


def test_topics_and_groups_views(http_broker: BrokerProcess, http: Http) -> None:
    topics = http.get("/api/topics").json()["topics"]
    names = [t["name"] for t in topics if not t["internal"]]
    assert names == sorted(["test", "single", "gc", "closed"])
    assert all(t["name"].startswith("__") for t in topics if t["internal"])
    t = http.get("/api/topics/test").json()
    assert t["num_partitions"] == 4 and len(t["partitions"]) == 4
    assert {"min_offset", "max_offset", "flushed_offset", "size_bytes"} <= set(t["partitions"][0])
    assert t["config"]["unflush_threshold"] == 1000
    assert http.get("/api/topics/nosuch").status == 404
    assert http.get("/api/topics/bad%20name").status == 400
    # a consumer fetching at 0 on a non-empty partition lags by the partition's size
    end = http.get("/api/topics/test").json()["partitions"][1]["max_offset"]
    assert end > 0
    with WireClient(http_broker.addr) as c:
        assert c.call(b"get test lagging 1 0 16 5\r\n").code == 200
    groups = http.get("/api/groups").json()["groups"]
    row = next(g for g in groups if g["group"] == "lagging" and g["topic"] == "test")
    assert row["partition"] == 1 and row["offset"] == 0 and row["lag_bytes"] == end
    assert row["live"] is True
    assert "lagging" in http.get("/api/topics/test").json()["groups"]
    # the REST fetch does not register a consumer group
    http.get("/api/topics/test/partitions/1/messages")
    assert {g["group"] for g in http.get("/api/groups").json()["groups"]} >= {"lagging"}
    assert "" not in {g["group"] for g in http.get("/api/groups").json()["groups"]}


def test_transactions_list_commit_rollback(http_broker: BrokerProcess, http: Http) -> None:
    k1, k2 = xid(101), xid(102)
    prepare_xa(http_broker.addr, k1, "single", 0, [b"tx-a", b"tx-b"])
    prepare_xa(http_broker.addr, k2, "single", 0, [b"tx-gone"])
    with WireClient(http_broker.addr) as c:  # an active one: in flight, not in doubt
        assert c.call(f"transaction {xid(103)} s1 BEGIN 1\r\n".encode()).code == 200
        txs = {t["key"]: t for t in http.get("/api/transactions").json()["transactions"]}
        assert txs[k1]["state"] == "PREPARED" and txs[k1]["in_doubt"] is True
        assert txs[k1]["messages"] == 2 and txs[k1]["xa"] is True
        assert txs[xid(103)]["state"] == "ACTIVE" and not txs[xid(103)]["in_doubt"]
        doubt = http.get("/api/transactions?in_doubt=1").json()["transactions"]
        assert {t["key"] for t in doubt} == {k1, k2}
        overview = http.get("/api/overview").json()
        assert overview["in_doubt"] == 2
        # only in-doubt transactions are resolved by an admin
        r = http.post(f"/api/transactions/{xid(103)}/commit")
        assert r.status == 409 and "ACTIVE" in r.json()["error"]
    before = http.get("/api/topics/single").json()["partitions"][0]["max_offset"]
    r = http.post(f"/api/transactions/{k1}/commit")
    assert r.status == 200 and r.json()["outcome"] == "committed", r.text
    r = http.post(f"/api/transactions/{k2}/rollback")
    assert r.status == 200 and r.json()["outcome"] == "rolled_back"
    page = http.get(f"/api/topics/single/partitions/0/messages?offset={before}").json()
    assert [m["text"] for m in page["messages"]] == ["tx-a", "tx-b"]
    keys = {t["key"] for t in http.get("/api/transactions").json()["transactions"]}
    assert k1 not in keys and k2 not in keys
    assert http.post(f"/api/transactions/{k1}/commit").status == 404
    r = http.post("/api/transactions/not-a-key/rollback")
    assert r.status == 400


def test_config_and_reload(http: Http) -> None:
    cfg = http.get("/api/config").json()
    assert cfg["system"]["max_message_size"] == MAX_MESSAGE
    assert cfg["topics"]["gc"]["unflush_threshold"] == 0
    assert cfg["source"].endswith("server.ini")
    r = http.post("/api/config/reload")
    assert r.status == 200 and "added topics: -" in r.json()["summary"]


def test_rejected_reload_is_422_with_the_reason(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 1}, authSecret="")
    b.config_path.write_text(b.config_path.read_text() + "unflushTreshold=0\n")
    r = Http(b.http_url).post("/api/config/reload")
    assert r.status == 422, r.text
    error = r.json()["error"]
    assert "config unchanged" in error and "did you mean 'unflushThreshold'?" in error
    assert f"{b.config_path.resolve()}:" in error
    cli = CliRunner().invoke(main, ["config", "reload", "-s", b.addr])
    assert cli.exit_code == 1 and "400" in cli.output and "unflushTreshold" in cli.output


def test_create_topic_and_reload(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory({"test": 1}, authSecret="")
    h = Http(b.http_url)
    ini_before = b.config_path.read_text()
    r = h.post(
        "/api/topics",
        json_body={"name": "fresh", "numPartitions": 3, "config": {"unflushThreshold": 0}},
    )
    assert r.status == 201, r.text
    assert r.json()["topic"]["num_partitions"] == 3
    assert "[topic=fresh]" in b.config_path.read_text()
    assert (
        h.post("/api/topics/fresh/messages", json_body={"text": "hi", "partition": 2}).status == 200
    )
    assert h.get("/api/topics/fresh").json()["config"]["unflush_threshold"] == 0
    with WireClient(b.addr) as c:  # the wire sees it too
        assert c.put("fresh", 1, b"wire").code == 200
    # conflicts and bad input leave server.ini alone
    text = b.config_path.read_text()
    for body, status in (
        ({"name": "fresh"}, 409),
        ({"name": "test"}, 409),
        ({"name": "../evil"}, 400),
        ({"name": "ok", "numPartitions": 0}, 400),
        ({"name": "ok", "config": {"bogus": 1}}, 400),
        ({"name": "ok", "config": {"deletePolicy": "nonsense"}}, 400),
        ({"name": "ok", "config": {"deleteWhen": "0 0 6\n[system]"}}, 400),
        ({"name": "ok", "extra": 1}, 400),
        ({}, 400),
        ([1], 400),
    ):
        r = h.post("/api/topics", json_body=body)
        assert r.status == status, (body, r.text)
        assert "error" in r.json()
    assert b.config_path.read_text() == text
    assert ini_before in text
    # it survives a restart: server.ini holds it (BrokerProcess.restart rewrites the file)
    cfg = load_config(b.config_path)
    assert cfg.topics["fresh"].num_partitions == 3 and cfg.topics["fresh"].unflush_threshold == 0


def test_retention_now(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory(
        {"old": {"numPartitions": 1, "deletePolicy": "delete,1s"}}, maxSegmentSize=4096
    )
    h = Http(b.http_url)
    for _ in range(3):
        h.post("/api/topics/old/messages", json_body=[{"text": "x" * 1000}] * 4)
    segs = h.get("/api/topics/old").json()["partitions"][0]["segments"]
    assert segs >= 3
    time.sleep(1.2)
    r = h.post("/api/topics/old/retention")
    assert r.status == 200, r.text
    (res,) = r.json()["results"]
    assert res["action"] == "delete" and len(res["removed"]) == segs - 1
    part = h.get("/api/topics/old").json()["partitions"][0]
    assert part["segments"] == 1 and part["min_offset"] > 0
    assert h.post("/api/topics/nosuch/retention").status == 404


def test_openapi_describes_every_route(http: Http) -> None:
    doc = http.get("/api/openapi.json").json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"]
    routed = {(p, m.lower()) for m, p, _h in api.routes()}
    methods = ("get", "post", "delete")
    described = {(p, m) for p, item in doc["paths"].items() for m in item if m in methods}
    assert routed == described
    # every $ref resolves
    text = http.get("/api/openapi.json").text
    for ref in set(re.findall(r'"#/components/schemas/([A-Za-z]+)"', text)):
        assert ref in doc["components"]["schemas"], ref
    for path, item in doc["paths"].items():
        for method in ("get", "post"):
            if method in item:
                assert item[method]["responses"], (path, method)
                assert item[method]["operationId"]


def test_api_answers_an_index(http: Http) -> None:
    r = http.get("/api")
    assert r.status == 200, r.text
    index = r.json()
    assert index["openapi"] == "/api/openapi.json"
    listed = {(e["method"], e["path"]) for e in index["endpoints"]}
    assert listed == {(m, p) for m, p, _h in api.routes()}
    assert all(e["summary"] for e in index["endpoints"])
    assert {e["path"] for e in index["endpoints"] if e["admin"]} >= {"/api/config/reload"}


def test_unknown_paths_and_methods(http: Http) -> None:
    r = http.get("/api/nothing")
    assert r.status == 404 and "error" in r.json()
    r = http.request("DELETE", "/api/topics/test")
    assert r.status == 405 and "error" in r.json()
    assert http.get("/nothing").status == 404
