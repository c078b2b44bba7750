"""The batched queue push frame and the range records of the queue log: round trips and
malformed input (a precise error, never a wrong decode)."""

from __future__ import annotations

import pytest

from notify.client._queue import _ack_body, _refused_spans
from notify.errors import ProtocolError
from notify.protocol import queuelog
from notify.protocol.frames import (
    QBATCH_RUN,
    RequestParser,
    ResponseParser,
    decode_qbatch,
    encode_qbatch,
)
from notify.protocol.records import encode


def test_qbatch_round_trips_through_the_response_parser() -> None:
    rec = encode(0, 0, b"x" * 10)
    frame = b"".join(encode_qbatch(7, [(0, 1, 3, 100, rec * 3), (2, 4, 1, 0, rec)]))
    (r,) = ResponseParser().feed(frame)
    assert (r.kind, r.opaque) == ("qbatch", 7)
    runs = decode_qbatch(r.body)
    assert [x[:4] for x in runs] == [(0, 1, 3, 100), (2, 4, 1, 0)]
    _p, _c, _n, _first, pos = runs[0]
    assert r.body[pos : pos + 3 * len(rec)] == rec * 3
    with pytest.raises(ProtocolError, match="beyond the frame"):
        decode_qbatch(r.body[: QBATCH_RUN.size + 5])


def test_qbsub_parses_like_qsub_with_the_batch_flag() -> None:
    (req,) = RequestParser(1 << 20).feed(b"qbsub t g 50 earliest 9\r\n")
    assert req.batch and req.credit == 50 and req.opaque == 9  # type: ignore[union-attr]
    (req,) = RequestParser(1 << 20).feed(b"qsub t g 50 earliest 9\r\n")
    assert not req.batch  # type: ignore[union-attr]


def test_acked_and_deliver_runs_records_round_trip() -> None:
    body = queuelog.encode_acked("t", "g", [(0, 10, 90), (3, 0, 40)], 1234)
    assert queuelog.decode_acked(body) == ("t", "g", [(0, 10, 90, 1234), (3, 0, 40, 1234)])
    body = queuelog.encode_deliver_runs("t", "g", [(1, 2, [0, 30, 60]), (0, 70000, [5])])
    assert queuelog.decode_deliver_runs(body) == (
        "t", "g", [(1, 0, 2), (1, 30, 2), (1, 60, 2), (0, 5, 65535)]
    )
    with pytest.raises(ProtocolError, match="DELIVRUN"):
        queuelog.decode_deliver_runs(body[:-3])
    with pytest.raises(ProtocolError, match="empty range"):
        queuelog.decode_acked(queuelog.encode_acked("t", "g", [(0, 9, 9)], 0))


def test_client_coalesces_accepts_into_ranges_and_reads_span_refusals() -> None:
    items = [(b"A", 0, 30, 60, 0), (b"A", 0, 0, 30, 0), (b"A", 0, 90, 120, 0),
             (b"a", 1, 0, 300, 0), (b"A", 1, 300, 330, 0), (b"R", 0, 60, 90, 500),
             (b"r", 2, 0, 90, 0), (b"X", 3, 7, 9, 0)]
    body = _ack_body(items, ranges=True)
    assert sorted(body.split(b"\n")[:-1]) == sorted([
        b"a 0 0 60", b"A 0 90", b"a 1 0 330", b"R 0 60 500", b"r 2 0 90 0", b"X 3 7",
    ])
    # an older broker: one line per message, no range forms
    assert _ack_body(items[:2], ranges=False) == b"A 0 30\nA 0 0\n"
    spans = _refused_spans(["0:120 is not held", "2:0..90 is not held", "malformed item 'x'"])
    assert spans == [(0, 120, 121), (2, 0, 90)]
