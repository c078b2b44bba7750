"""The client's side of the wire, sans-IO: the frames a producer writes and what their replies
mean. The one place of the client where put, mput and dput acknowledgements and the replies
to transaction commands are read (their bodies are parsed by :mod:`notify.protocol.replies`).

No sockets here. A request is a :data:`~notify.protocol.frames.FrameBuilder`
(``build(opaque) -> bytes``: the connection picks the opaque) and a reply is the
:class:`~notify.protocol.frames.Response` its caller read. Frames (layouts in
:mod:`notify.protocol.frames`)::

    put <topic> <partition> <len> <flag> [<checksum>] [<txKey>] <opaque>\\r\\n<payload>
    mput <topic> <partition> <len> <count> [<txKey>] <opaque>\\r\\n<records, msgId 0>
    dput <topic> <partition> <len> <flag> <checksum> <deliverAtMs> <opaque>\\r\\n<payload>
    transaction <txKey> <sessionId> <VERB> [<timeout>|msgs=<n>] <opaque>

Replies (bodies in :mod:`notify.protocol.replies`)::

    200 to put, dput    <msgId> <partition> <offset>       -> (msg_id, offset)
    200 to mput         <firstMsgId> <partition> <firstOffset> <count>
    200 to PREPARE      <vote>                              0 XA_OK, 3 XA_RDONLY
    non-200             XAException:code=<n>,msg=<text>     -> XAError (code 106:
                                                               TransactionTimeoutError)
                        any other text                      -> BrokerError(code, text)
    400 to mput         "unknown command ..."               a broker without the extension
                                                               (MetaQ): send puts instead
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Final, TypeVar

from notify.client._errors import TransactionTimeoutError, XAError
from notify.errors import BrokerError, ClientError, ProducerFencedError, ProtocolError
from notify.protocol import records as rec
from notify.protocol.frames import (
    FrameBuilder,
    Response,
    encode_dput,
    encode_mput,
    encode_put,
)
from notify.protocol.replies import MultiPutAck, PutAck, XAFailure, parse_prepare_vote
from notify.protocol.xa import XA_RBTIMEOUT

T = TypeVar("T")

#: ``(msg_id, offset)`` of one stored message (offset -1: not in the partition yet).
Ack = tuple[int, int]

#: The verbs of ``transaction`` requests a producer sends.
BEGIN: Final = "BEGIN"
END: Final = "END"
PREPARE: Final = "PREPARE"
COMMIT_ONE_PHASE: Final = "COMMIT_ONE_PHASE"
COMMIT_TWO_PHASE: Final = "COMMIT_TWO_PHASE"
ROLLBACK: Final = "ROLLBACK"
FORGET: Final = "FORGET"
RECOVER: Final = "RECOVER"


# --------------------------------------------------------------------------- frames


def put(
    topic: str,
    partition: int,
    payload: bytes,
    flag: int,
    checksum: bool = True,
    tx_key: str | None = None,
) -> FrameBuilder:
    """One message: a ``put`` (with the payload's checksum unless ``checksum`` is False)."""
    cs = rec.checksum(payload) if checksum else None
    return lambda o: encode_put(topic, partition, payload, flag, o, cs, tx_key)


def mput(
    topic: str, partition: int, records: bytes, count: int, tx_key: str | None = None
) -> FrameBuilder:
    """``count`` records (on-disk layout, msgId 0) for one partition in one ``mput``."""
    return functools.partial(encode_mput, topic, partition, records, count, tx_key=tx_key)


def dput(topic: str, partition: int, payload: bytes, flag: int, due_ms: int) -> FrameBuilder:
    """A delayed message, visible no earlier than ``due_ms`` (Unix ms)."""
    cs = rec.checksum(payload)
    return lambda o: encode_dput(topic, partition, payload, flag, cs, due_ms, o)


def command(tx_key: str, session_id: str, verb: str, *extra: object) -> FrameBuilder:
    """``transaction <txKey> <sessionId> <verb> [extra...] <opaque>`` (the line is
    formatted once; only the opaque is added per request)."""
    head = " ".join(["transaction", tx_key, session_id, verb, *map(str, extra)]).encode()
    return lambda o: b"%b %d\r\n" % (head, o)


def begin(tx_key: str, session_id: str, timeout: int | None) -> FrameBuilder:
    """BEGIN, with the transaction timeout (seconds) when one is given."""
    if timeout is None:
        return command(tx_key, session_id, BEGIN)
    return command(tx_key, session_id, BEGIN, timeout)


def timeout_token(timeout_s: float | None) -> int | None:
    """A transaction timeout as BEGIN carries it: whole seconds, rounded up; None: the
    broker's cap (``maxTxTimeoutInSeconds``). Raises :class:`ClientError` for <= 0."""
    if timeout_s is None:
        return None
    if not timeout_s > 0:
        raise ClientError(f"transaction timeout must be > 0 seconds, not {timeout_s}")
    return max(1, math.ceil(timeout_s))


# --------------------------------------------------------------------------- replies


def reply_error(r: Response, tx_key: str | None = None) -> ClientError:
    """The error of a non-200 reply: :class:`XAError` (:class:`TransactionTimeoutError` for
    XA_RBTIMEOUT) for ``XAException:code=N,msg=...`` bodies, :class:`BrokerError` otherwise."""
    try:
        failure = XAFailure.parse(r.body)
    except ProtocolError:
        failure = None
    if failure is None:
        text = r.body.decode("utf-8", "replace")
        if r.code == 409:  # a newer instance holds the idempotent producer's identity
            return ProducerFencedError(r.code, text)
        return BrokerError(r.code, text)
    cls = TransactionTimeoutError if failure.code == XA_RBTIMEOUT else XAError
    return cls(failure.code, failure.message, tx_key, r.code)


def unknown_command(r: Response) -> bool:
    """True when the broker does not know the command (an extension MetaQ lacks)."""
    return r.code == 400 and b"unknown command" in r.body.lower()


def _body(r: Response, parse: Callable[[bytes], T], tx_key: str | None) -> T | ClientError:
    """``parse`` of a 200 reply's body, or the error the reply carries (a non-200 reply, a
    body that does not parse)."""
    if r.code != 200:
        return reply_error(r, tx_key)
    try:
        return parse(r.body)
    except ProtocolError as e:
        return ClientError(str(e))


def put_ack(r: Response, tx_key: str | None = None) -> Ack | ClientError:
    """``(msg_id, offset)`` of a reply to ``put`` or ``dput``, or the error it carries (a
    non-200 reply, a body that is no put ack)."""
    if r.code != 200:
        return reply_error(r, tx_key)
    try:  # (inline rather than through _body: this runs once per message sent)
        ack = PutAck.parse(r.body)
    except ProtocolError as e:
        return ClientError(str(e))
    return ack.msg_id, ack.offset


def mput_ack(r: Response, count: int, tx_key: str | None = None) -> MultiPutAck | ClientError:
    """The ack of a reply to an ``mput`` of ``count`` records, or the error it carries (a
    non-200 reply, a body that is no mput ack or acknowledges another count)."""
    ack = _body(r, MultiPutAck.parse, tx_key)
    if isinstance(ack, MultiPutAck) and ack.count != count:
        return ClientError(f"mput reply acknowledges {ack.count} of {count} messages")
    return ack


def prepare_vote(r: Response, tx_key: str | None = None) -> int | ClientError:
    """The vote of a 200 reply to PREPARE (0 XA_OK, 3 XA_RDONLY), or the reply's error."""
    return _body(r, parse_prepare_vote, tx_key)


def records_body(runs: list[tuple[int, list[bytes]]]) -> bytes:
    """The records of an ``mput`` (on-disk layout, msgId 0): ``runs`` of payloads sharing
    one flag, encoded a run at a time."""
    encode_batch = rec.encode_batch
    if len(runs) == 1:
        flag, payloads = runs[0]
        return encode_batch(payloads, flag)
    return b"".join([encode_batch(payloads, flag) for flag, payloads in runs])
