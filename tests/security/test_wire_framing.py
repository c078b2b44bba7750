"""Framing attacks on the wire port: trickled frames, bodies before auth, broken framing.

Hostile clients on raw sockets against a real broker process; the broker's CPU and memory
are read from /proc.
"""

from __future__ import annotations

import threading
import time

import pytest

from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import MIB, WireClient, cpu_seconds, crc, raw, rss
from tests.security.wire import closed_within, send_for

SECRET = "wire-s3cret"


def _trickle(addr: str, frame: bytes, chunk: int, out: list[bytes]) -> None:
    s = raw(addr, timeout=60)
    try:
        for i in range(0, len(frame), chunk):
            s.sendall(frame[i : i + chunk])
            time.sleep(0.0005)  # paced: the broker sees each piece as its own read
        s.settimeout(60)
        got = b""
        while b"\r\n" not in got:
            data = s.recv(4096)
            if not data:
                break
            got += data
        out.append(got)
    finally:
        s.close()


def test_trickled_frames_cost_linear_cpu(broker_factory: BrokerFactory) -> None:
    """Item 12: two clients trickle a 12 MiB mput in paced 2 KiB pieces. Re-copying the
    partial frame on each piece costs ~6 MiB x 6,000 pieces of memcpy per client (seconds of
    CPU); a growing buffer costs one copy. The broker's CPU for the exchange stays small."""
    b = broker_factory({"r": 1}, maxBatchSize=16 * MIB, frameTimeout=0)
    rec = records.encode(0, 0, b"t" * 3052)
    count = 4096
    frame = encode_mput("r", 0, rec * count, count, 5)
    before = cpu_seconds(b)
    replies: list[bytes] = []
    threads = [
        threading.Thread(target=_trickle, args=(b.addr, frame, 2048, replies)) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    used = cpu_seconds(b) - before
    print(f"broker CPU for two trickled 12 MiB frames: {used:.2f}s")
    assert len(replies) == 2 and all(r.startswith(b"result 200 ") for r in replies), replies
    assert used < 1.5, f"broker used {used:.2f}s of CPU for two trickled 12 MiB frames"
    with WireClient(b.addr) as c:
        assert c.call(b"offset r g 0 9223372036854775807 1\r\n").body == b"%d" % (
            2 * count * len(rec)
        )


def test_bodies_before_auth_are_skipped_not_buffered(broker_factory: BrokerFactory) -> None:
    """Item 4: with authSecret set, 30 unauthenticated connections each announce a 15 MiB
    mput and stream 12 MiB of it. Nothing is buffered (the body is refused from its header and
    skipped), each gets a 403, and the broker's RSS does not grow by the 360 MiB sent."""
    b = broker_factory({"r": 1}, authSecret=SECRET)
    base = rss(b)
    socks = [raw(b.addr) for _ in range(30)]
    junk = b"x" * (12 * MIB)
    peak = base
    try:
        for s in socks:
            s.sendall(b"mput r 0 %d 1 9\r\n" % (15 * MIB))
            assert send_for(s, junk, 10) == len(junk)
            peak = max(peak, rss(b))
        for s in socks:
            s.settimeout(10)
            got = s.recv(4096)
            assert got.startswith(b"result 403 ") and b"authentication required" in got, got
        peak = max(peak, rss(b))
    finally:
        for s in socks:
            s.close()
    assert peak - base < 48 * MIB, f"RSS grew {(peak - base) / MIB:.0f} MiB"


def test_body_over_max_message_size_refused_from_header(broker_factory: BrokerFactory) -> None:
    """Item 4 (authenticated): a put over maxMessageSize is answered 400 at its header and its
    body skipped; the connection stays in sync and the next put works."""
    b = broker_factory({"r": 1}, maxMessageSize=1024)
    base = rss(b)
    with WireClient(b.addr) as c:
        c.send(b"put r 0 %d 0 1\r\n" % (40 * MIB))
        first = c.replies(1)[0]
        assert first.code == 400 and b"maxMessageSize" in first.body
        send_for(c.sock, b"y" * (40 * MIB), 20)
        assert rss(b) - base < 24 * MIB
        ok = c.put("r", 0, b"fine", opaque=2)
        assert (ok.code, ok.opaque) == (200, 2)


@pytest.mark.parametrize(
    "garbage",
    [b"put r 0 notanumber 0 1\r\n", b"x" * 5000],
    ids=["unreadable-length", "header-too-long"],
)
def test_fatal_framing_error_closes_connection(
    broker_factory: BrokerFactory, garbage: bytes
) -> None:
    """Item 17: once framing is lost the connection is answered 400 and closed, also before
    authentication (it used to stay open with a dead parser that ignored a later auth)."""
    b = broker_factory({"r": 1}, authSecret=SECRET)
    s = raw(b.addr)
    try:
        s.sendall(garbage)
        closed, got = closed_within(s, 5)
        assert got.startswith(b"result 400 "), got
        assert closed, "connection left open after a fatal framing error"
    finally:
        s.close()
    # an authenticated connection: same
    with WireClient(b.addr) as c:
        assert c.call(b"auth %s 1\r\n" % SECRET.encode()).code == 200
        c.send(garbage)
        assert c.replies(1)[0].code == 400
        assert c.is_closed(5)


def test_frames_split_anywhere_still_parse(broker: BrokerProcess) -> None:
    """The buffer rewrite keeps every split point working: a pipelined burst of puts and gets
    sent one byte at a time gets every reply, in order."""
    frames = b"".join(
        b"put test 0 3 0 %d %d\r\nm%02d" % (crc(b"m%02d" % i), i, i) for i in range(20)
    )
    frames += b"get test g 0 0 4096 99\r\n"
    with WireClient(broker.addr) as c:
        for i in range(len(frames)):
            c.send(frames[i : i + 1])
        replies = c.replies(21)
    assert [r.opaque for r in replies] == [*range(20), 99]
    assert all(r.code == 200 for r in replies)
    recs, _ = records.decode_all(replies[-1].body)
    assert [r.body for r in recs] == [b"m%02d" % i for i in range(20)]
