"""Hypothesis strategies: valid MetaQ frames as tokens + body, and structured mutations.

A :class:`Frame` keeps its header tokens and body apart so a mutation can aim at one field
(a number, the body length, the command, the token count) instead of flipping random bits.
``mutate`` says whether the mutation keeps the stream's framing intact (the parser must then
resynchronise right after the frame) or may break it (any later bytes may be misread, but
nothing may crash and memory must stay bounded).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from notify.protocol import records
from tests.helpers import crc

BODY_COMMANDS = (b"put", b"mput", b"sync", b"msync")
LENGTH_INDEX = 3  # the body length is the 4th token of every body command


@dataclass
class Frame:
    tokens: list[bytes]
    body: bytes | None = None
    kind: str = "valid"
    framing_intact: bool = True
    raw: bytes | None = None  # bytes that no longer split into tokens and body

    def encode(self) -> bytes:
        if self.raw is not None:
            return self.raw
        head = b" ".join(self.tokens) + b"\r\n"
        return head + (self.body or b"")

    @property
    def has_body(self) -> bool:
        return self.body is not None


topics = st.sampled_from([b"fz", b"fz", b"nosuch", b"../etc", b"a" * 250, b"fz.x-y_z"])
partitions = st.sampled_from([b"0", b"1", b"2", b"-1", b"99"])
opaques = st.integers(min_value=0, max_value=2**31 - 1).map(lambda n: b"%d" % n)
offsets = st.sampled_from([b"0", b"20", b"-5", b"1000000000", b"9223372036854775807"])
sizes = st.sampled_from([b"0", b"1", b"64", b"4096", b"1048576", b"-1", b"2147483647"])
bodies = st.binary(min_size=0, max_size=300)
tx_keys = st.sampled_from(
    [b"TX:fz:1", b"TX:fz:2", b"XID:1:0a:0b:fz", b"null", b"TX:bad", b"XID:x:zz:0:q"]
)
tx_types = st.sampled_from(
    [
        b"BEGIN",
        b"END",
        b"PREPARE",
        b"COMMIT_ONE_PHASE",
        b"COMMIT_TWO_PHASE",
        b"ROLLBACK",
        b"RECOVER",
        b"FORGET",
    ]
)


@st.composite
def valid_frames(draw: st.DrawFn, allow_quit: bool = True) -> Frame:
    kinds = [
        "put6",
        "put7c",
        "put7t",
        "put8",
        "mput",
        "get7",
        "get8",
        "offset",
        "stats",
        "version",
        "tx",
        "sync",
        "msync",
        "auth",
        "register",
        "reload",
        "promote",
    ]
    if allow_quit:
        kinds.append("quit")
    kind = draw(st.sampled_from(kinds))
    op = draw(opaques)
    if kind.startswith("put"):
        body = draw(bodies)
        t, p = draw(topics), draw(partitions)
        toks = [b"put", t, p, b"%d" % len(body), draw(st.sampled_from([b"0", b"1", b"4"]))]
        if kind == "put7c":
            toks.append(b"%d" % draw(st.sampled_from([crc(body), -1, 12345])))
        elif kind == "put7t":
            toks.append(draw(tx_keys))
        elif kind == "put8":
            toks += [b"%d" % crc(body), draw(tx_keys)]
        return Frame([*toks, op], body)
    if kind in ("mput", "msync"):
        n = draw(st.integers(min_value=1, max_value=4))
        recs = b"".join(records.encode(0, 0, draw(bodies)) for _ in range(n))
        count = draw(st.sampled_from([n, n, 0, n + 1]))
        toks = [kind.encode(), draw(topics), draw(partitions), b"%d" % len(recs), b"%d" % count]
        if kind == "msync":
            toks.append(draw(offsets))
        elif draw(st.booleans()):
            toks.append(draw(tx_keys))
        return Frame([*toks, op], recs)
    if kind == "sync":
        body = draw(bodies)
        toks = [
            b"sync",
            draw(topics),
            draw(partitions),
            b"%d" % len(body),
            b"0",
            b"77",
            b"%d" % crc(body),
            op,
        ]
        return Frame(toks, body)
    if kind in ("get7", "get8"):
        toks = [b"get", draw(topics), b"grp", draw(partitions), draw(offsets), draw(sizes)]
        if kind == "get8":
            toks.append(draw(st.sampled_from([b"0", b"1", b"20"])))
        return Frame([*toks, op])
    if kind == "offset":
        return Frame([b"offset", draw(topics), b"grp", draw(partitions), draw(offsets), op])
    if kind == "stats":
        item = draw(
            st.sampled_from(
                [b"", b"topics", b"offsets", b"realtime", b"config", b"help", b"fz", b"nosuch"]
            )
        )
        return Frame([b"stats", item, op] if item else [b"stats", op])
    if kind == "version":
        return Frame([b"version", op])
    if kind == "tx":
        ttype = draw(tx_types)
        toks = [b"transaction", draw(tx_keys), b"fzs", ttype]
        if draw(st.booleans()):
            toks.append(b"5" if ttype == b"BEGIN" else b"fz")
        return Frame([*toks, op])
    if kind == "auth":
        return Frame([b"auth", b"secret", op])
    if kind == "register":
        return Frame([b"register", b"fzgroup", op])
    if kind == "reload":
        return Frame([b"reload", op])
    if kind == "promote":
        return Frame([b"promote", op])
    return Frame([b"quit"])


BAD_TOKENS = [
    b"",
    b"-1",
    b"99999999999999999999999",
    b"abc",
    b"\xff\xfe",
    b"0x10",
    b"1.5",
    b"-0",
    b"+7",
    b"\x00",
    b"null",
    b"9" * 60,
]

MUTATIONS = [
    "replace_token",
    "drop_token",
    "dup_token",
    "bad_command",
    "length_delta",
    "huge_length",
    "truncate",
    "flip_byte",
    "insert_crlf",
    "lf_only",
    "body_garbage",
    "long_line",
]


@st.composite
def mutated_frames(draw: st.DrawFn, allow_quit: bool = True) -> Frame:
    f = draw(valid_frames(allow_quit))
    kind = draw(st.sampled_from(MUTATIONS))
    toks = list(f.tokens)
    n = len(toks)
    f.kind = kind
    body_cmd = f.has_body
    if kind == "replace_token":
        i = draw(st.integers(min_value=1 if n > 1 else 0, max_value=n - 1))
        toks[i] = draw(st.sampled_from(BAD_TOKENS))
        # a body command's framing depends on its length token (and the token count)
        f.framing_intact = not (body_cmd and i == LENGTH_INDEX)
    elif kind == "drop_token":
        i = draw(st.integers(min_value=1 if n > 1 else 0, max_value=n - 1))
        del toks[i]
        f.framing_intact = not (body_cmd and i <= LENGTH_INDEX) and bool(toks)
    elif kind == "dup_token":
        i = draw(st.integers(min_value=1 if n > 1 else 0, max_value=n - 1))
        toks.insert(i, toks[i])
        f.framing_intact = not (body_cmd and i <= LENGTH_INDEX)
    elif kind == "bad_command":
        toks[0] = draw(st.sampled_from([b"PUT", b"gett", b"", b"\xff", b"transactio", b"q"]))
        f.framing_intact = not body_cmd  # the body is now read as lines
    elif kind == "length_delta" and body_cmd:
        d = draw(st.integers(min_value=-5, max_value=5).filter(bool))
        toks[LENGTH_INDEX] = b"%d" % (len(f.body or b"") + d)
        f.framing_intact = False
    elif kind == "huge_length" and body_cmd:
        toks[LENGTH_INDEX] = draw(
            st.sampled_from([b"70000", b"16777217", b"2147483647", b"2147483648", b"-3"])
        )
        f.framing_intact = False
    elif kind == "truncate":
        raw = Frame(toks, f.body).encode()
        cut = draw(st.integers(min_value=0, max_value=max(0, len(raw) - 1)))
        return Frame([], None, kind, False, raw[:cut])
    elif kind == "flip_byte":
        flipped = bytearray(Frame(toks, f.body).encode())
        i = draw(st.integers(min_value=0, max_value=len(flipped) - 1))
        flipped[i] ^= draw(st.integers(min_value=1, max_value=255))
        return Frame([], None, kind, False, bytes(flipped))
    elif kind == "insert_crlf":
        i = draw(st.integers(min_value=0, max_value=n - 1))
        toks[i] = toks[i] + b"\r\n"
        f.framing_intact = False
    elif kind == "lf_only":
        return Frame([], None, kind, False, b" ".join(toks) + b"\n" + (f.body or b""))
    elif kind == "body_garbage" and body_cmd:
        f.body = draw(st.binary(min_size=len(f.body or b""), max_size=len(f.body or b"")))
        f.framing_intact = True
    elif kind == "long_line":
        toks.insert(1, b"L" * draw(st.sampled_from([100, 5000])))
        f.framing_intact = False
    else:
        f.kind = "valid"
    f.tokens = toks
    return f
