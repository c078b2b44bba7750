"""Delivery counts survive ``kill -9``: a message delivered before a crash comes back with a
count that includes those deliveries, and the delivery limit holds across restarts (a
poison message cannot be retried forever by crashing the broker)."""

from __future__ import annotations

import time
from pathlib import Path

from notify.protocol.frames import encode_qdlq, parse_dead_letters
from notify.testing import BrokerProcess
from tests.helpers import WireClient
from tests.queues.test_queues import _publish, _pushes

FSYNC_WAIT_S = 0.3  # the DELIVER record is fsynced in the background, group-committed


def _ack(c: WireClient, kind: bytes, topic: str, p: int, o: int, opaque: int) -> bytes:
    items = b"%s %d %d\n" % (kind, p, o)
    r = c.call(b"qack %s g %d %d\r\n" % (topic.encode(), len(items), opaque) + items)
    assert r.code == 200, r
    return r.body


def test_counts_survive_sigkill_and_the_limit_holds_across_crashes(tmp_path: Path) -> None:
    sysc = {"queueLockTimeout": 60000, "queueMaxDeliveries": 3, "queueCheckpointInterval": 200}
    with BrokerProcess(tmp_path, topics={"poison": 1, "rel": 1}, system=sysc) as b:
        _publish(b.addr, "poison", 3, 1)
        _publish(b.addr, "rel", 1, 1)
        poison: tuple[int, int] | None = None
        seen_counts = []
        for crash in range(3):
            c = WireClient(b.addr)
            assert c.call(b"qsub poison g 10 earliest 1\r\n").code == 200
            got = _pushes(c, 3 if crash == 0 else 1)
            if crash == 0:
                poison = (got[0].partition, got[0].offset)
                for m in got[1:]:  # the others are fine, accepted (durable once answered)
                    assert _ack(c, b"A", "poison", m.partition, m.offset, 5)[:3] == b"1 0"
            (m,) = [m for m in got if (m.partition, m.offset) == poison]
            seen_counts.append(m.code)
            # the consumer "crashes the broker" while holding it; in the 2nd round a
            # checkpoint passes first, so the count also travels through the compact form
            time.sleep(FSYNC_WAIT_S if crash != 1 else 0.8)
            b.kill()
            c.close()
            b.start()
        assert seen_counts == [1, 2, 3]
        # the 4th start: the poison message used up its deliveries; it is dead, not pushed
        c = WireClient(b.addr)
        assert c.call(b"qsub poison g 10 earliest 1\r\n").code == 200
        c.sock.settimeout(1.5)
        try:
            extra = c.replies(1)
        except TimeoutError:
            extra = []
        assert extra == [], extra
        with WireClient(b.addr) as a:
            total, _, letters = parse_dead_letters(
                a.call(encode_qdlq("poison", "g", "list", b"", 2)).body
            )
        assert total == 1 and (letters[0].partition, letters[0].offset) == poison
        assert letters[0].reason == "max_deliveries" and letters[0].deliveries == 3
        c.close()

        # released (and redelivered) before the crash: the count includes both deliveries
        c = WireClient(b.addr)
        assert c.call(b"qsub rel g 1 earliest 1\r\n").code == 200
        (m,) = _pushes(c, 1)
        assert m.code == 1
        c.send(b"qack rel g %d 6\r\n" % len(b"R %d %d\n" % (m.partition, m.offset))
               + b"R %d %d\n" % (m.partition, m.offset))
        out = c.replies(2)
        (again,) = [r for r in out if r.kind == "qmsg"]
        assert again.code == 2
        time.sleep(FSYNC_WAIT_S)
        b.kill()
        c.close()
        b.start()
        c = WireClient(b.addr)
        assert c.call(b"qsub rel g 1 earliest 1\r\n").code == 200
        (m3,) = _pushes(c, 1)
        assert (m3.offset, m3.code) == (m.offset, 3)
        # at the limit now: a release kills it (the limit counts pre-crash deliveries)
        assert _ack(c, b"R", "rel", m3.partition, m3.offset, 7)[:3] == b"1 0"
        with WireClient(b.addr) as a:
            total, _, letters = parse_dead_letters(
                a.call(encode_qdlq("rel", "g", "list", b"", 2)).body
            )
        assert total == 1 and letters[0].deliveries == 3
        c.close()
