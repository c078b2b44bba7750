"""The request parser's fast paths (``put`` with 7 or 8 tokens, ``transaction`` with 5 or 6)
decode exactly what the general paths decode, and leave to them every case they would
refuse: the same request, or the same error, for every token below."""

from __future__ import annotations

import itertools

from notify.errors import ProtocolError
from notify.protocol.frames import RequestParser

INTS = [b"0", b"7", b"-1", b"2147483647", b"2147483648", b"-2147483648", b"-2147483649",
        b"+5", b"1_0", b"x", b"99999999999999999999"]  # fmt: skip
KEYS = [b"TX:s:1", b"null", b"\xff", b"XID:1:ab:cd:q", b"5", b"-"]


def _outcome(fn: object, *args: object) -> object:
    try:
        return repr(fn(*args))  # type: ignore[operator]
    except ProtocolError as e:
        return ("error", str(e), e.code, e.opaque, e.fatal)


def test_put_fast_path_matches_the_general_path() -> None:
    p = RequestParser(1000)
    body = b"abc"
    seen = 0
    for opaque, part, flag, slot in itertools.product(INTS[:8], INTS[:4], INTS[:4], INTS + KEYS):
        t7 = [b"put", b"t", part, b"3", flag, slot, opaque]
        assert _outcome(p._decode_body_command, b"put", t7, body) == _outcome(
            p._decode_body_general, b"put", t7, body
        ), t7
        for key in KEYS:
            t8 = [b"put", b"t", part, b"3", flag, slot, key, opaque]
            assert _outcome(p._decode_body_command, b"put", t8, body) == _outcome(
                p._decode_body_general, b"put", t8, body
            ), t8
            seen += 1
    assert seen > 1000


def test_transaction_fast_path_matches_the_general_path() -> None:
    p = RequestParser(1000)
    types = [b"BEGIN", b"COMMIT_ONE_PHASE", b"ROLLBACK", b"RECOVER", b"begin", b"NOPE"]
    slots = [b"30", b"0", b"2147483648", b"msgs=2", b"q", b"ab"]
    for key, ttype, opaque in itertools.product(KEYS, types, INTS):
        t5 = [b"transaction", key, b"s", ttype, opaque]
        assert _outcome(p._decode_transaction, t5) == _outcome(
            p._decode_transaction_general, t5
        ), t5
        for slot in slots:
            t6 = [b"transaction", key, b"s", ttype, slot, opaque]
            assert _outcome(p._decode_transaction, t6) == _outcome(
                p._decode_transaction_general, t6
            ), t6
