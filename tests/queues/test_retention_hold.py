"""Retention and queue groups (README "Queues"): expired segments a queue group has not
finished are kept up to ``queueRetentionHoldBytes`` per partition; past the bound they go,
and the group skips what it had not read and dead-letters what it tracked (counted)."""

from __future__ import annotations

import time

from tests.conftest import BrokerFactory
from tests.helpers import WireClient


def _min_offset(c: WireClient, topic: str) -> int:
    return int(c.call(b"offset %s g 0 0 1\r\n" % topic.encode()).body)


def test_retention_holds_for_a_queue_group_up_to_the_bound(broker_factory: BrokerFactory) -> None:
    every = {"deletePolicy": "delete,1s", "deleteWhen": "* * * * * ?"}
    b = broker_factory(
        topics={"q": every, "plain": every},
        maxSegmentSize=4096,
        queueRetentionHoldBytes=8200,
        queueMaxInFlight=2,  # the group tracks 2 messages: the rest below the cut is unread
    )
    with WireClient(b.addr) as c, WireClient(b.addr) as sub:
        for t in ("q", "plain"):  # 16 x 920 B: 3 closed segments and the active one
            for i in range(16):  # one write each: segments roll between writes
                assert c.put(t, 0, b"x" * 900, opaque=i).code == 200
        sub.send(b"qsub q w 1 earliest 1\r\n")
        first = sub.replies(2)  # the credit, then message 0, held without an ack
        assert first[0].code == 200 and first[1].kind == "qmsg" and first[1].offset == 0
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and (
            _min_offset(c, "plain") == 0 or _min_offset(c, "q") == 0
        ):
            time.sleep(0.2)
        time.sleep(1.2)  # one more retention round: nothing more may go
        cut_plain, cut_q = _min_offset(c, "plain"), _min_offset(c, "q")
        # everything expired went for the plain topic; for q only what exceeds the bound
        assert 0 < cut_q < cut_plain, (cut_q, cut_plain)
        assert cut_plain - cut_q <= 8200
        # the held message can still be acknowledged; the next push is one whose record
        # is still there: the tracked ones below the cut were dead-lettered, the rest skipped
        sub.send(b"qack q w 6 2\r\nA 0 0\n")
        got = sub.replies(2)
        ack = next(r for r in got if r.kind != "qmsg")
        push = next(r for r in got if r.kind == "qmsg")
        assert ack.code == 200 and ack.body.startswith(b"1 0"), ack
        assert push.offset == cut_q, (push.offset, cut_q)
        stats = c.call(b"stats queues 3\r\n").body.decode()
        line = next(x for x in stats.splitlines() if x.startswith("q/w "))
        fig = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        assert int(fig["retention_dropped"]) > 0 and int(fig["retention_skipped_bytes"]) > 0
        assert int(fig["dead_letters"]) == int(fig["retention_dropped"]), line
