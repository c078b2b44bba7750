"""Wire fuzzing: structured mutations of valid frames, against the codec and a live broker.

Codec: a stream of valid frames around one mutated frame, fed in random chunks. The parser
never raises, gives the same result whatever the chunking, keeps its buffer bounded, and
when the mutation leaves the framing intact it is back in step right after the frame.
Replies (client side): mutated replies raise nothing but ProtocolError.

Live: each example sends valid and mutated frames on one connection, then a sentinel
``version`` and a half-close. The broker must answer with well-formed replies and end the
connection (never hang, never crash); a healthy client on another connection checks a
put/get round trip after every example.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notify.errors import ProtocolError
from notify.protocol.frames import (
    MultiPut,
    Put,
    RequestParser,
    ResponseParser,
    encode_check,
    encode_result,
    encode_value_header,
)
from notify.testing import BrokerProcess
from tests.faults import summary
from tests.faults.frames import Frame, mutated_frames, valid_frames
from tests.helpers import WireClient

SECTION = "wire_fuzz"
CODEC_EXAMPLES = 3000 if summary.LONG else 400
LIVE_EXAMPLES = 1500 if summary.LONG else 150
MAX_HEADER = 300
MAX_BODY = 512


def norm(x: object) -> object:
    """A comparable form of a parser output (Put's repr leaves the body out)."""
    if isinstance(x, ProtocolError):
        return ("error", type(x).__name__, str(x), x.code, x.opaque, x.fatal)
    if isinstance(x, Put | MultiPut):
        return (type(x).__name__, *(getattr(x, s) for s in type(x).__slots__))
    if dataclasses.is_dataclass(x):
        return (type(x).__name__, dataclasses.astuple(x))  # type: ignore[arg-type]
    return repr(x)


def parse(data: bytes, chunks: list[int] | None = None) -> list[object]:
    p = RequestParser(MAX_BODY, max_header_bytes=MAX_HEADER)
    out: list[object] = []
    if not chunks:
        out += p.feed(data)
    else:
        pos = 0
        i = 0
        while pos < len(data):
            step = chunks[i % len(chunks)]
            out += p.feed(data[pos : pos + step])
            assert p.buffered <= MAX_HEADER + 2 + MAX_BODY + 64, p.buffered
            pos += step
            i += 1
    for item in out:
        if isinstance(item, ProtocolError):
            assert item.code in (400, 404, 500), item
    return [norm(x) for x in out]


codec_settings = settings(
    max_examples=CODEC_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@codec_settings
@given(
    st.lists(valid_frames(), max_size=4),
    mutated_frames(),
    st.lists(valid_frames(), max_size=4),
    st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=6),
)
def test_codec_structured_mutations(
    prefix: list[Frame], bad: Frame, suffix: list[Frame], chunks: list[int]
) -> None:
    pre = b"".join(f.encode() for f in prefix)
    mid = bad.encode()
    post = b"".join(f.encode() for f in suffix)
    whole = parse(pre + mid + post)
    # the same result whatever the TCP segmentation
    assert parse(pre + mid + post, chunks) == whole
    summary.add(SECTION, "codec_examples")
    if not bad.framing_intact or len(b" ".join(bad.tokens)) > MAX_HEADER:
        return
    # framing intact: exactly one item for the mutated frame, then back in step
    head = parse(pre)
    tail = parse(post)
    if any(isinstance(x, tuple) and x[0] == "error" and x[-1] for x in head):
        return  # a valid prefix can still be fatal (e.g. an over-long topic line)
    assert whole[: len(head)] == head
    one = whole[len(head) : len(head) + 1]
    assert len(one) == 1, (bad.kind, mid[:120])
    item = one[0]
    if isinstance(item, tuple) and item[0] == "error":
        assert not item[-1], f"intact framing but a fatal error: {item} for {mid[:120]!r}"
    assert whole[len(head) + 1 :] == tail, (bad.kind, mid[:120])
    summary.add(SECTION, "codec_resync_checked")


def test_codec_header_of_exactly_max_bytes_split_before_lf() -> None:
    """A header line of exactly max_header_bytes is accepted when CRLF arrives whole; it
    must be accepted too when the TCP segment ends between CR and LF."""
    line = b"stats " + b"x" * (MAX_HEADER - 9) + b" 12"
    assert len(line) == MAX_HEADER
    whole = parse(line + b"\r\n")
    assert whole and whole[0][0] == "Stats"  # type: ignore[index]
    split = parse(line + b"\r\n", [MAX_HEADER + 1, 1])
    assert split == whole


@st.composite
def replies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["result", "value", "check"]))
    body = draw(st.binary(max_size=200))
    op = draw(st.integers(min_value=0, max_value=2**31 - 1))
    if kind == "result":
        return encode_result(draw(st.sampled_from([200, 301, 400, 404, 500, 503])), op, body)
    if kind == "value":
        return encode_value_header(len(body), op) + body
    return encode_check("TX:p:1", "fz", 0, body, op)


@codec_settings
@given(
    st.lists(replies(), min_size=1, max_size=5),
    st.sampled_from(["flip", "truncate", "crlf", "token"]),
    st.data(),
    st.lists(st.integers(min_value=1, max_value=61), min_size=1, max_size=4),
)
def test_reply_parser_raises_only_protocol_errors(
    frames: list[bytes], how: str, data: st.DataObject, chunks: list[int]
) -> None:
    raw = bytearray(b"".join(frames))
    i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    if how == "flip":
        raw[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    elif how == "truncate":
        del raw[i:]
    elif how == "crlf":
        raw[i:i] = b"\r\n"
    else:
        raw[i:i] = data.draw(st.sampled_from([b" ", b"-1", b"x", b"99999999999999999999"]))
    whole: list[object] | None
    try:
        whole = [repr(r) for r in ResponseParser().feed(bytes(raw))]
    except ProtocolError:
        whole = None
    p = ResponseParser()
    got: list[object] = []
    try:
        pos = k = 0
        while pos < len(raw):
            got += [repr(r) for r in p.feed(bytes(raw[pos : pos + chunks[k % len(chunks)]]))]
            pos += chunks[k % len(chunks)]
            k += 1
    except ProtocolError:
        assert whole is None or len(got) <= len(whole)
        return
    if whole is not None:
        assert got == whole


# ---------------------------------------------------------------------------- live broker


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        Path(tmp_path_factory.mktemp("fuzzbroker")),
        topics={"fz": 2},
        system={"maxMessageSize": 65536, "maxTxTimeoutInSeconds": 5},
        log_level="warning",
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def healthy(fuzz_broker: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(fuzz_broker.addr) as c:
        yield c


def _converse(addr: str, data: bytes, chunks: list[int]) -> tuple[list[object], bool, str]:
    """Send ``data`` in chunks plus a sentinel, half-close, read to the end.
    Returns (replies, sentinel answered, how it ended)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    parser = ResponseParser()
    got: list[object] = []
    ended = "eof"
    try:
        try:
            pos = k = 0
            while pos < len(data):
                step = chunks[k % len(chunks)]
                s.sendall(data[pos : pos + step])
                pos += step
                k += 1
            s.sendall(b"version 424242\r\n")
            s.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: the broker closed first
            ended = "closed while sending"
        deadline = time.monotonic() + 10
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"broker neither answered nor closed; got {got[-3:]}")
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                ended = "reset"
                break
            except TimeoutError:
                raise AssertionError(f"broker hung: no close; got {got[-3:]}") from None
            if not chunk:
                break
            got += parser.feed(chunk)  # raises if a reply is malformed
    finally:
        s.close()
    answered = any(getattr(r, "opaque", None) == 424242 for r in got)
    return got, answered, ended


@settings(
    max_examples=LIVE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.one_of(valid_frames(allow_quit=False), mutated_frames(allow_quit=False)),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=4),
)
def test_live_broker_survives_mutated_frames(
    fuzz_broker: BrokerProcess, healthy: WireClient, frames: list[Frame], chunks: list[int]
) -> None:
    data = b"".join(f.encode() for f in frames)
    got, answered, ended = _converse(fuzz_broker.addr, data, chunks)
    errors = [r for r in got if getattr(r, "code", 200) >= 400]
    mutated = [f for f in frames if f.kind != "valid"]
    if not answered:
        # a clean end: an error reply before the close, or a frame left incomplete by EOF
        assert errors or mutated, f"valid frames only, yet no answer ({ended}): {data[:200]!r}"
    assert fuzz_broker.proc is not None and fuzz_broker.proc.poll() is None, "broker died"
    # another connection is unaffected
    body = b"healthy-%d" % time.monotonic_ns()
    r = healthy.put("fz", 0, body, opaque=5)
    assert r.code == 200, r
    off = int(r.body.split()[2])
    g = healthy.call(b"get fz h 0 %d 65536 6\r\n" % off)
    assert g.kind == "value" and body in g.body, g
    summary.add(SECTION, "live_examples")
    summary.add(SECTION, "live_frames_sent", len(frames))
    summary.add(SECTION, "live_mutated_frames", len(mutated))
    summary.add(SECTION, "live_error_replies", len(errors))
    summary.add(SECTION, "live_connections_closed_early", 0 if answered else 1)


def test_live_fuzz_left_the_broker_sound(fuzz_broker: BrokerProcess) -> None:
    """After the fuzzing: the broker is up, counted the protocol errors, and a restart
    recovers its data without cutting anything."""
    with WireClient(fuzz_broker.addr) as c:
        body = c.call(b"stats 1\r\n").body.decode()
    stats = dict(line.partition(" ")[::2] for line in body.split("\r\n")[1:-2])
    summary.record(
        SECTION, broker_protocol_errors=int(stats.get("protocol_errors", 0)), broker_crashes=0
    )
    fuzz_broker.restart(kill=True)
    assert "truncating torn tail" not in fuzz_broker.log_tail(200)
    with WireClient(fuzz_broker.addr) as c:
        assert c.call(b"version 1\r\n").code == 200
