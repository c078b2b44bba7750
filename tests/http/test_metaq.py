"""MetaQ 1.4's HTTP protocol (/put, /get, /offset) and /stats against a real broker."""

from __future__ import annotations

import threading
import time
import zlib

from notify.protocol import records
from notify.testing import BrokerProcess
from tests.helpers import WireClient, timing
from tests.http.conftest import MAX_MESSAGE, Http


def crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def test_put_get_offset_as_metaq_clients_send_them(http_broker: BrokerProcess, http: Http) -> None:
    # SimpleHttpProducer: /put/<brokerId>?topic&partition&flag&length, body = payload
    r = http.post("/put/0?topic=single&partition=0&flag=0&length=5", b"hello")
    assert r.status == 200, r.text
    mid, part, off = r.text.split(" ")
    assert (part, off) == ("0", "0") and int(mid) > 0
    assert r.headers["Content-Type"].startswith("text/plain")
    # with a checksum, as the wire's 7-token put
    r = http.post(f"/put/0?topic=single&partition=0&flag=0&checksum={crc(b'world')}", b"world")
    assert r.status == 200 and r.text.endswith(" 0 25")
    # SimpleHttpConsumer: /get/<brokerId>?topic&partition&offset&group&maxsize: raw records
    r = http.get("/get/0?topic=single&partition=0&offset=0&group=g1&maxsize=1024")
    assert r.status == 200
    assert r.headers["Content-Type"] == "application/octet-stream"
    recs, used = records.decode_all(r.body)
    assert [x.body for x in recs] == [b"hello", b"world"] and used == len(r.body) == 50
    assert recs[0].msg_id == int(mid)
    # a window ending mid-record is served as the wire serves it
    r = http.get("/get/0?topic=single&partition=0&offset=0&group=g1&maxSize=30")
    assert r.status == 200 and len(r.body) == 30
    # the end of the partition and past it: 404 (MetaQ); Long.MAX_VALUE: 301 to the end
    r = http.get("/get/0?topic=single&partition=0&offset=50&group=g1&maxsize=1024")
    assert r.status == 404 and "Could not find message at position 50" in r.text
    r = http.get("/get/0?topic=single&partition=0&offset=7777&group=g1&maxsize=1024")
    assert r.status == 404 and "Could not find message at position 7777" in r.text
    top = 2**63 - 1
    r = http.get(f"/get/0?topic=single&partition=0&offset={top}&group=g1&maxsize=1024")
    assert (r.status, r.body) == (301, b"50")
    assert "Location" not in r.headers
    # /offset: the nearest valid offset
    r = http.get("/offset/0?topic=single&partition=0&group=g1&offset=25")
    assert (r.status, r.body) == (200, b"0")
    r = http.get("/offset/0?topic=single&partition=0&offset=999999")
    assert (r.status, r.body) == (200, b"50")
    # the brokerId segment is for load balancers only: it may be left out
    assert http.get("/offset?topic=single&partition=0&offset=0").status == 200


def test_http_and_wire_see_the_same_partition(http_broker: BrokerProcess, http: Http) -> None:
    with WireClient(http_broker.addr) as c:
        w = c.put("test", 3, b"from-wire")
        assert w.code == 200
    h = http.post("/put/0?topic=test&partition=3&flag=0", b"from-http")
    assert h.status == 200
    start = int(w.body.split()[2])
    with WireClient(http_broker.addr) as c:
        g = c.call(b"get test gw 3 %d 4096 7\r\n" % start)
    recs, _ = records.decode_all(g.body, start)
    assert [x.body for x in recs][:2] == [b"from-wire", b"from-http"]
    assert int(h.text.split()[2]) == recs[1].offset


def test_put_errors_keep_wire_codes(http: Http, http_broker: BrokerProcess) -> None:
    # unknown topic and partition: 404 as on the wire
    r = http.post("/put/0?topic=nosuch&partition=0&flag=0", b"x")
    assert r.status == 404 and "does not exist" in r.text
    r = http.post("/put/0?topic=test&partition=9&flag=0", b"x")
    assert r.status == 404
    # a path in the topic: 400, never a file system path
    for bad in ("..%2F..%2Fetc", "a%20b", "%2E%2E", "x" * 250):
        r = http.post(f"/put/0?topic={bad}&partition=0&flag=0", b"x")
        assert r.status == 400 and "invalid topic name" in r.text, (bad, r.text)
    assert not any(p.name.startswith(("..", "etc")) for p in http_broker.data_dir.iterdir())
    # checksum mismatch, topic refusing publish
    r = http.post("/put/0?topic=test&partition=0&flag=0&checksum=12345", b"x")
    assert r.status == 400 and "checksum mismatch" in r.text
    r = http.post("/put/0?topic=closed&partition=0&flag=0", b"x")
    assert r.status == 403 and "does not accept publish" in r.text
    # malformed numbers: 400 naming the parameter (MetaQ would 500)
    for q, name in (
        ("partition=x&flag=0", "partition"),
        ("partition=0&flag=1.5", "flag"),
        ("partition=0&flag=99999999999", "flag"),
        ("flag=0", "partition"),
        ("partition=-1", "partition"),
    ):
        r = http.post(f"/put/0?topic=test&{q}", b"x")
        assert r.status == 400 and name in r.text, (q, r.text)
    # length must match the body
    r = http.post("/put/0?topic=test&partition=0&flag=0&length=9", b"x")
    assert r.status == 400 and "length=9" in r.text
    # oversize body: 413 before reading it
    r = http.post("/put/0?topic=test&partition=0&flag=0", b"z" * (MAX_MESSAGE + 1))
    assert r.status == 413 and "maxMessageSize" in r.text
    # a put is POST (or PUT)
    assert http.get("/put/0?topic=test&partition=0").status == 405


def test_get_and_offset_errors(http: Http) -> None:
    r = http.get("/get/0?topic=test&group=g&partition=0&offset=0&maxsize=0")
    assert r.status == 400 and "invalid max size" in r.text
    r = http.get("/get/0?topic=test&partition=0&offset=0&maxsize=10")
    assert r.status == 400 and "group" in r.text
    r = http.get("/get/0?topic=test&group=a%20b&partition=0&offset=0&maxsize=10")
    assert r.status == 400 and "group" in r.text
    r = http.get("/get/0?topic=nosuch&group=g&partition=0&offset=0&maxsize=10")
    assert r.status == 404
    r = http.get("/get/0?topic=..&group=g&partition=0&offset=0&maxsize=10")
    assert r.status == 400
    r = http.get("/offset/0?topic=test&partition=0&offset=abc")
    assert r.status == 400 and "offset" in r.text
    r = http.get("/offset/0?topic=test&partition=77&offset=0")
    assert r.status == 404


def test_get_long_poll(http: Http) -> None:
    end = int(http.get("/offset/0?topic=test&partition=2&offset=99999999").text)

    def later() -> None:
        time.sleep(0.3)
        Http(http.base).post("/put/0?topic=test&partition=2&flag=0", b"late")

    t = threading.Thread(target=later)
    t.start()
    t0 = time.monotonic()
    r = http.get(f"/get/0?topic=test&group=lp&partition=2&offset={end}&maxsize=1024&maxWait=5000")
    t.join()
    took = time.monotonic() - t0
    assert r.status == 200  # woken by the put (a 5 s wait ending answers 404)
    timing(took < 4, f"a MetaQ long poll woken by a put 0.3 s later answered in {took:.2f} s")
    assert records.decode_all(r.body)[0][0].body == b"late"
    # nothing arrives: 404 when the wait ends
    end += len(r.body)
    r = http.get(f"/get/0?topic=test&group=lp&partition=2&offset={end}&maxsize=1024&maxWait=200")
    assert r.status == 404


def test_stats_like_the_wire(http_broker: BrokerProcess, http: Http) -> None:
    r = http.get("/stats")
    assert r.status == 200 and r.body.startswith(b"STATS\r\n") and r.body.endswith(b"END\r\n")
    assert b"\r\nversion " in r.body and b"\r\nput_messages " in r.body
    with WireClient(http_broker.addr) as c:
        wire = c.call(b"stats topics 3\r\n").body
    assert http.get("/stats/topics").body == wire
    for item in ("offsets", "realtime", "help", "test"):
        r = http.get(f"/stats/{item}")
        assert r.status == 200 and r.body.startswith(b"STATS\r\n"), item
    assert http.get("/stats/config").body.startswith(b"[system]")  # the ini, as MetaQ
    nosuch = http.get("/stats/nosuch")  # MetaQ: any other item is a topic, resultCode 1
    assert nosuch.status == 200 and b"\r\nresultCode 1\r\n" in nosuch.body
    j = http.get("/stats?format=json").json()
    assert j["broker_id"] == 0 and isinstance(j["put_messages"], int)
    t = http.get("/stats/test?format=json").json()
    assert t["topic"] == "test" and t["partitions"] == 4
    assert "***" not in http.get("/stats/config").text  # no secret configured
    assert http.get("/stats/nosuch?format=json").json()["resultCode"] == 1
