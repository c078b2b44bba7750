"""The MetaQ wire protocol against a real broker process."""

from __future__ import annotations

import time
import zlib

from notify.config import load_config, served_config
from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, crc, timing


def body_of(reply_body: bytes) -> list[int]:
    return [int(x) for x in reply_body.split()]


def test_put_get_roundtrip_all_forms(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        r6 = c.call(b"put test 0 2 0 1\r\nab")
        r7 = c.call(b"put test 0 2 0 %d 2\r\ncd" % crc(b"cd"))
        payload, flag = records.make_payload(b"ef", "k=v")
        r8 = c.call(
            b"put test 0 %d %d %d null 3\r\n%b" % (len(payload), flag, crc(payload), payload)
        )
        assert [(r.code, r.opaque) for r in (r6, r7, r8)] == [(200, 1), (200, 2), (200, 3)]
        ids, offsets = [], []
        for r in (r6, r7, r8):
            mid, part, off = body_of(r.body)
            assert part == 0
            ids.append(mid)
            offsets.append(off)
        assert offsets == [0, 22, 44]
        assert ids == sorted(ids) and len(set(ids)) == 3
        g = c.call(b"get test grp 0 0 1048576 9\r\n")
        assert (g.kind, g.opaque) == ("value", 9)
        recs, used = records.decode_all(g.body)
        assert used == len(g.body)
        assert [(x.offset, x.msg_id, x.body, x.attribute) for x in recs] == [
            (0, ids[0], b"ab", None),
            (22, ids[1], b"cd", None),
            (44, ids[2], b"ef", "k=v"),
        ]
        # a window that ends mid-record: the client keeps the whole ones
        g2 = c.call(b"get test grp 0 0 30 10\r\n")
        assert len(g2.body) == 30
        assert len(records.decode_all(g2.body)[0]) == 1
        # next offset after the last record: nothing yet
        miss = c.call(b"get test grp 0 %d 100 11\r\n" % (44 + 20 + len(payload)))
        assert (miss.code, miss.opaque) == (404, 11)


def test_offsets_and_out_of_range(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        for i in range(3):
            assert c.put("test", 1, b"m%d" % i).code == 200
        end = 3 * 22
        assert c.call(b"offset test g 1 0 1\r\n").body == b"0"
        assert c.call(b"offset test g 1 9223372036854775807 2\r\n").body == b"%d" % end
        # beyond the end: MetaQ's 404 (301 only for Long.MAX_VALUE or updateConsumerOffsets)
        past = c.call(b"get test g 1 9999 100 3\r\n")
        assert (past.code, past.body) == (404, b"Could not find message at position 9999")
        top = c.call(b"get test g 1 9223372036854775807 100 3\r\n")
        assert (top.code, top.body) == (301, b"%d" % end)
        # the long-poll form (a notify extension) keeps the 301 to the end
        held = c.call(b"get test g 1 9999 100 50 3\r\n")
        assert (held.code, held.body) == (301, b"%d" % end)
        neg = c.call(b"get test g 1 -5 100 4\r\n")
        assert (neg.code, neg.body) == (301, b"0")
        bad = c.call(b"get test g 1 0 0 5\r\n")
        assert bad.code == 400 and b"invalid max size" in bad.body


def test_bad_input_gets_precise_errors_and_connection_survives(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        cases = [
            (b"put nosuch 0 1 0 1\r\nx", 404, b"does not exist"),
            (b"put test 9 1 0 2\r\nx", 404, b"partition 9"),
            (b"put ../../etc 0 1 0 3\r\nx", 400, b"invalid topic name"),
            (b"put test 0 1 0 12345 4\r\nx", 400, b"checksum mismatch"),
            (b"put test 0 1 0 1 2 3 4 5\r\nx", 400, b"expected 6-8 tokens"),
            (b"get test g zero 0 100 6\r\n", 400, b"partition"),
            (b"frobnicate 7\r\n", 400, b"unknown command"),
            (b"get test g 0 0 100 1 2 3 8\r\n", 400, b"expected 7 tokens"),
            (b"stats nosuchitem 9\r\n", 200, b"\r\nresultCode 1\r\n"),
            (b"offset test g 0 x 10\r\n", 400, b"offset"),
            (b"put test 0 8000000 0 11\r\n" + b"y" * 8000000, 400, b"exceeds"),
            (b"put test 0 1 99999999999 12\r\nx", 400, b"32-bit"),
        ]
        for frame, code, text in cases:
            r = c.call(frame)
            assert r.code == code, (frame[:40], r)
            assert text in r.body, (frame[:40], r.body)
        # still serving on the same connection, nothing was written by the bad puts
        assert c.put("test", 0, b"ok", opaque=99).body.split()[2] == b"0"
        assert c.call(b"version 5\r\n").code == 200


def test_length_that_lies_and_garbage(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        c.put("test", 0, b"first")
        # declared 3, sent 10: the extra bytes are read as a (bad) command line
        c.send(b"put test 0 3 0 1\r\nabcdefghij\r\n")
        r1, r2 = c.replies(2)
        assert r1.code == 200
        assert r2.code == 400 and b"unknown command" in r2.body
        # unreadable length: framing is lost, the broker answers and closes this connection
        c.send(b"put test 0 many 0 3\r\nxyz")
        (r3,) = c.replies(1)
        assert r3.code == 400 and b"not an integer" in r3.body
        assert c.is_closed()
    # a header line with no end: closed too, others unaffected
    with WireClient(broker.addr) as c2, WireClient(broker.addr) as c3:
        c2.send(b"x" * 10000)
        (r,) = c2.replies(1)
        assert r.code == 400 and b"header line longer" in r.body
        assert c2.is_closed()
        assert c3.call(b"version 1\r\n").code == 200
    with WireClient(broker.addr) as c4:
        got = c4.call(b"get test g 0 0 1000 1\r\n")
        recs, _ = records.decode_all(got.body)
        assert [x.body for x in recs] == [b"first", b"abc"]


def test_pipelining_and_opaque(broker: BrokerProcess) -> None:
    n = 5000
    with WireClient(broker.addr) as c:
        frames = b"".join(
            b"put test %d 4 0 %d %d\r\nm%03d" % (i % 4, crc(b"m%03d" % (i % 1000)), i, i % 1000)
            for i in range(n)
        )
        c.send(frames)
        replies = c.replies(n)
        assert sorted(r.opaque for r in replies) == list(range(n))
        assert all(r.code == 200 for r in replies)
        per_part: dict[int, list[int]] = {}
        for r in sorted(replies, key=lambda r: r.opaque):
            _mid, part, off = body_of(r.body)
            per_part.setdefault(part, []).append(off)
        for offs in per_part.values():
            assert offs == [i * 24 for i in range(len(offs))]  # in send order, no gaps


def test_mput_extension(broker: BrokerProcess) -> None:
    bodies = [b"a" * i for i in range(1, 101)]
    recs = b"".join(records.encode(0, 0, b) for b in bodies)
    with WireClient(broker.addr) as c:
        c.put("orders", 1, b"before")
        r = c.call(encode_mput("orders", 1, recs, len(bodies), 7))
        assert r.code == 200, r.body
        first_id, part, first_off, count = body_of(r.body)
        assert (part, first_off, count) == (1, 26, 100)
        g = c.call(b"get orders g 1 26 1048576 8\r\n")
        got, _ = records.decode_all(g.body, 26)
        assert [x.body for x in got] == bodies
        assert [x.msg_id for x in got] == list(range(first_id, first_id + 100))
        # a corrupt record rejects the whole batch, nothing written
        bad = bytearray(recs)
        bad[-1] ^= 1
        r2 = c.call(encode_mput("orders", 1, bytes(bad), len(bodies), 9))
        assert r2.code == 400 and b"record 99: checksum mismatch" in r2.body
        r3 = c.call(encode_mput("orders", 1, recs, 99, 10))
        assert r3.code == 400 and b"holds 100 records" in r3.body
        assert c.call(b"offset orders g 1 999999999 11\r\n").body == b"%d" % (got[-1].offset + 120)


def test_record_larger_than_max_transfer_size_is_fetchable(
    broker_factory: BrokerFactory,
) -> None:
    b = broker_factory(maxTransferSize=1024)
    big = bytes(range(256)) * 40  # 10 KiB
    with WireClient(b.addr) as c:
        c.put("test", 0, b"small")
        c.put("test", 0, big)
        # window clamps to maxTransferSize, but the first record is served whole
        g = c.call(b"get test g 0 25 1048576 1\r\n")
        (rec,), used = records.decode_all(g.body, 25)
        assert rec.body == big and used == len(g.body)
        # client's maxSize smaller than the record: partial, client must grow maxSize
        g2 = c.call(b"get test g 0 25 4096 2\r\n")
        assert len(g2.body) == 4096 and records.decode_all(g2.body)[0] == []
        # normal clamp
        for _ in range(100):
            c.put("test", 1, b"z" * 80)
        g3 = c.call(b"get test g 1 0 1048576 3\r\n")
        assert len(g3.body) == 1024


def test_stats_items_and_version(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        c.put("test", 2, b"hello")
        v = c.call(b"version 3\r\n")
        assert (v.code, v.opaque) == (200, 3) and v.body

        def items(frame: bytes) -> dict[str, str]:
            r = c.call(frame)
            assert r.code == 200 and r.body.startswith(b"STATS\r\n") and r.body.endswith(b"END\r\n")
            lines = r.body.decode().split("\r\n")[1:-2]
            return dict(line.partition(" ")[::2] for line in lines)

        system = items(b"stats 1\r\n")
        assert int(system["put_messages"]) == 1 and "uptime" in system
        assert items(b"stats topics 2\r\n")["test"].startswith("partitions=4 ")
        assert items(b"stats offsets 2\r\n")["test-2"].startswith("min_offset=0 max_offset=25 ")
        assert "put_tps" in items(b"stats realtime 2\r\n")
        # the server.ini text, as MetaQ serves it (notify's own keys commented out)
        cfg = c.call(b"stats config 2\r\n")
        assert cfg.code == 200 and cfg.body == served_config(load_config(broker.config_path))
        assert b"\n; notify: configWatchInterval=0\n" in cfg.body
        assert b"\n[topic=orders]\nnumPartitions=2\n" in cfg.body
        assert items(b"stats test 2\r\n")["put_messages"] == "1"
        assert "topics" in items(b"stats help 2\r\n")
        assert items(b"stats reset 2\r\n") == {"reset": "ok"}
        assert int(items(b"stats 1\r\n")["put_messages"]) == 0
        c.send(b"quit\r\n")
        assert c.is_closed()


def test_auth_shared_secret(broker_factory: BrokerFactory) -> None:
    b = broker_factory(authSecret="s3cret")
    with WireClient(b.addr) as c:
        r = c.put("test", 0, b"x")
        assert r.code == 403 and b"authentication required" in r.body
        assert c.call(b"auth s3cret 2\r\n").code == 200
        assert c.put("test", 0, b"x").code == 200
        cfg = c.call(b"stats config 3\r\n").body
        assert b"s3cret" not in cfg
    with WireClient(b.addr) as c2:
        assert c2.call(b"auth wrong 1\r\n").code == 403
        assert c2.is_closed()


def test_reload_adds_topic_without_restart(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        assert c.put("fresh", 0, b"x").code == 404
        broker.topics = {**broker.topics, "fresh": 3}
        broker.write_config()
        r = c.call(b"reload 5\r\n")
        assert r.code == 200 and b"added topics: fresh" in r.body, r.body
        assert c.put("fresh", 2, b"x").code == 200
        # a bad edit is refused with the key named; the running config stays
        broker.config_path.write_text(broker.config_path.read_text() + "bogusKey=1\n")
        bad = c.call(b"reload 6\r\n")
        assert bad.code == 400 and b"bogusKey" in bad.body
        assert f"{broker.config_path.resolve()}:".encode() in bad.body  # file and line
        assert c.put("fresh", 1, b"y").code == 200


def test_file_watch_picks_up_new_topic(broker_factory: BrokerFactory) -> None:
    b = broker_factory(configWatchInterval=200)
    b.topics = {**b.topics, "watched": 1}
    b.write_config()
    deadline = time.monotonic() + 10
    with WireClient(b.addr) as c:
        while time.monotonic() < deadline:
            if c.put("watched", 0, b"x").code == 200:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("file watch did not add the topic")


def test_topic_level_accept_publish_enforced(broker_factory: BrokerFactory) -> None:
    b = broker_factory(
        topics={
            "ro": {"numPartitions": 1, "acceptPublish": "false"},
            "wo": {"numPartitions": 1, "acceptSubscribe": "false"},
        }
    )
    with WireClient(b.addr) as c:
        assert c.put("ro", 0, b"x").code == 403
        assert c.put("wo", 0, b"x").code == 200
        assert c.call(b"get wo g 0 0 100 1\r\n").code == 403


def test_too_many_connections_refused(broker_factory: BrokerFactory) -> None:
    b = broker_factory(maxConnections=2)
    with WireClient(b.addr) as c1, WireClient(b.addr) as c2:
        assert c1.call(b"version 1\r\n").code == 200
        assert c2.call(b"version 1\r\n").code == 200
        with WireClient(b.addr) as c3:
            (r,) = c3.replies(1)
            assert r.code == 503
        assert c1.call(b"version 2\r\n").code == 200


def test_checksum_value_matches_metaq_definition() -> None:
    assert crc(b"hello") == zlib.crc32(b"hello") & 0x7FFFFFFF == records.checksum(b"hello")


def test_long_poll_get_wakes_on_put_and_times_out(broker_factory: BrokerFactory) -> None:
    import threading

    b = broker_factory(topics={"lp": 1, "gc": {"numPartitions": 1, "unflushThreshold": 0}})
    for topic in ("lp", "gc"):
        with WireClient(b.addr) as c:
            t0 = time.monotonic()
            miss = c.call(b"get %s g 0 0 4096 300 1\r\n" % topic.encode())
            waited = time.monotonic() - t0
            assert miss.code == 404 and waited >= 0.25
            timing(waited < 2.0, f"a 300 ms long poll answered 404 after {waited:.2f} s (< 2)")
            c.send(b"get %s g 0 0 4096 5000 2\r\n" % topic.encode())
            t1 = time.monotonic()

            def later(topic: str = topic) -> None:
                time.sleep(0.2)
                with WireClient(b.addr) as p:
                    p.put(topic, 0, b"wake")

            th = threading.Thread(target=later)
            th.start()
            (r,) = c.replies(1)
            th.join()
            assert r.kind == "value" and r.opaque == 2
            woke = time.monotonic() - t1
            assert woke >= 0.15
            timing(woke < 2.0, f"a parked get woke {woke:.2f} s after, by a put 0.2 s after (< 2)")
            (rec,), _ = records.decode_all(r.body)
            assert rec.body == b"wake"
            # old clients (7 tokens) still get an immediate 404
            assert c.call(b"get %s g 0 %d 4096 3\r\n" % (topic.encode(), rec.size)).code == 404


def test_parked_get_does_not_hold_back_later_replies(broker: BrokerProcess) -> None:
    with WireClient(broker.addr) as c:
        c.send(b"get single g 0 0 4096 3000 1\r\n")  # parks: nothing there yet
        t0 = time.monotonic()
        r = c.call(b"put single 0 2 0 2\r\nhi")  # answered at once, before the parked get
        assert r.opaque == 2 and r.code == 200
        (g,) = c.replies(1)
        assert g.opaque == 1 and g.kind == "value"
        took = time.monotonic() - t0
        timing(took < 1.0, f"a put and the get it woke answered in {took:.2f} s (< 1)")
