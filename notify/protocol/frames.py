"""MetaQ text wire protocol: sans-IO request parser, reply encoder and reply parser.

No sockets here: :class:`RequestParser` turns bytes into request objects (broker side),
:class:`ResponseParser` turns bytes into replies (client side), and the ``encode_*``
functions build frames. One header line, tokens separated by one space, ``\\r\\n``
terminated, UTF-8; some commands carry a binary body whose length is a header field.
``opaque`` is a client-chosen int32 echoed in the reply, so requests may be pipelined.

Requests (MetaQ 1.4)::

    put <topic> <partition> <len> <flag> <opaque>\\r\\n<body>                      (6 tokens)
    put <topic> <partition> <len> <flag> <checksum|txKey> <opaque>\\r\\n<body>     (7)
    put <topic> <partition> <len> <flag> <checksum> <txKey> <opaque>\\r\\n<body>   (8)
    get <topic> <group> <partition> <offset> <maxSize> <opaque>\\r\\n
    offset <topic> <group> <partition> <offset> <opaque>\\r\\n
    stats [<item>] [<opaque>]\\r\\n
    version [<opaque>]\\r\\n
    quit\\r\\n
    transaction <txKey> <sessionId> <TYPE> [<timeout>] [<uniqueQualifier>] <opaque>\\r\\n
    sync <topic> <partition> <len> <flag> <msgId> [<checksum>] <opaque>\\r\\n<body>

    In a 7-token put, slot 5 is a checksum if it starts with a digit or '-', else a txKey.
    checksum -1 means "not supplied" (so does a 7-token ``sync``: masters before MetaQ 1.4.4).
    A put to partition -1 lets the broker choose the partition (MetaQ's
    ``Partition.RandomPartiton``; the Java producer sends it when configured with a server URL
    instead of ZooKeeper). In a 6-token ``transaction`` the optional slot is a timeout only
    for BEGIN and only when it is all digits, and not when it repeats the uniqueQualifier of
    the XA key (MetaQ reads any all-digit slot as a timeout, so it loses a numeric
    qualifier); for every other TYPE it is the uniqueQualifier. ``version`` and ``stats``
    without an opaque are answered with opaque 2147483647, as MetaQ does.

notify extensions (old clients never send them; old brokers answer them with an error)::

    mput <topic> <partition> <len> <count> [<txKey>] <opaque>\\r\\n<records>
        <records> is <count> records in the on-disk layout (see records.py) with msgId 0;
        each record's checksum is verified. Reply body: <firstMsgId> <partition>
        <firstOffset> <count>; record i has id firstMsgId+i and the offset that follows
        from the sizes of the records before it.
    get <topic> <group> <partition> <offset> <maxSize> <maxWaitMs> <opaque>\\r\\n   (8)
        long poll: hold the fetch up to maxWaitMs when no message is there yet.
    auth <secret> <opaque>\\r\\n       shared-secret authentication (when enabled)
    msync <topic> <partition> <len> <count> <baseOffset> <opaque>\\r\\n<records>
        master -> synchronous slave: records (ids assigned) that the master wrote at
        <baseOffset>; the slave appends them at the same offset (200), answers 200 again if it
        already has exactly those bytes there, and 301 with its end when it is behind
    promote [<opaque>]\\r\\n          turn a slave into a master (failover)
    dput <topic> <partition> <len> <flag> <checksum> <deliverAtMs> [<txKey>] <opaque>\\r\\n<body>
        a delayed message: visible in <topic> no earlier than <deliverAtMs> (Unix ms);
        reply <msgId> <partition> -1 (its offset exists only once it is delivered)
    register <producerGroup> [<groupSecret>] <opaque>\\r\\n
        this connection belongs to a producer of <producerGroup>: transactions it prepares
        are half messages the broker may check back on, through any connection of the group;
        a group with a ``[producerGroup=NAME] secret`` needs that secret (else 403)
    check <txKey> <topic> <partition> <len> <opaque>\\r\\n<records>     (broker -> client)
        check-back of a prepared half message; the producer answers with a plain
        ``transaction <txKey> <sessionId> COMMIT_TWO_PHASE|ROLLBACK <opaque>``, or not at
        all when it does not know yet (the broker asks again later)
    reload [<opaque>]\\r\\n            re-read server.ini (new topics, per-topic settings)
    producer <producerId> <secret> <epoch> <instance> <opaque>\\r\\n
        claim an idempotent producer's identity on this connection (its puts may then name
        it); reply and rules: :mod:`notify.protocol.identity`

Queue subscriptions (Notify-style push with per-message acknowledgement; README "Queues")::

    qsub <topic> <group> <credit> <start> [<consumerId>] <opaque>\\r\\n
        join queue group <group> of <topic> on this connection; <start> (earliest|latest)
        places a new group's partitions; <consumerId> (cluster mode): the consumer's
        ZooKeeper node (README "Queues"), 409 when it is not registered. Reply body: the
        credit granted. Messages then
        arrive as ``qmsg`` frames carrying this opaque, at most <credit> unacknowledged
    qmsg <subOpaque> <partition> <offset> <deliveryCount> <len>\\r\\n<record>  (to the client)
    qbsub <topic> <group> <credit> <start> [<consumerId>] <opaque>\\r\\n
        ``qsub`` with batched pushes: messages arrive as ``qbatch`` frames instead
    qbatch <subOpaque> <len>\\r\\n<runs>     (to the client; see :func:`encode_qbatch`)
    qack <topic> <group> <len> <opaque>\\r\\n<items>
        <items>: lines ``A <partition> <offset>`` (accept), ``R <partition> <offset>
        [<delayMs>]`` (release), ``X <partition> <offset>`` (reject), ``N <partition>
        <offset>`` (renew the lock); in lower case with ``<from> <to>`` instead of
        ``<offset>`` (``a <partition> <from> <to>``, ``r ... [<delayMs>]``, ``x``, ``n``) the
        same for every message of the consumer whose record starts in ``[from, to)``.
        Reply body ``<applied> <refused>`` then one line per refused item (at most 16):
        ``<partition>:<offset> <why>`` or ``<partition>:<from>..<to> <why>`` for a span;
        answered once accepted/rejected items are durable
    qunsub <topic> <group> <opaque>\\r\\n   leave the group: held messages return at once
    qdel <topic> <group> [force] <opaque>\\r\\n     (admin role when adminSecret is set)
        delete the group and its state (positions, dead letters); 409 while it has
        consumers unless ``force`` (their connections are closed, after a ``410`` frame)
    qdlq <topic> <group> <len> <action> <opaque>\\r\\n<body>    (admin role when adminSecret is set)
        the group's dead-letter queue. ``list``: body empty or ``<from> <limit>``; reply body
        ``<total> <dropped>`` then one line per dead letter, oldest first (see
        :func:`encode_dead_letters`). ``replay``: body ``all`` or lines ``<partition>
        <offset>``; those dead letters become available again (logged); reply body
        ``<replayed> <unknown>``

Replies::

    result <code> <bodyLen> <opaque>\\r\\n<body>
    value <len> <opaque>\\r\\n<raw records>
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from notify.errors import FrameTooLargeError, ProtocolError
from notify.protocol.identity import Claim, decode_claim
from notify.protocol.replies import encode_stats

#: Old name of :func:`notify.protocol.replies.encode_stats`, kept for notify.broker until it
#: imports that one (then delete).
encode_stats_body = encode_stats

#: ``build(opaque) -> frame``: how a request is handed to a connection, which picks the
#: opaque (so requests may be pipelined and matched to their replies).
FrameBuilder = Callable[[int], bytes]

CRLF: Final = b"\r\n"
DEFAULT_MAX_HEADER_BYTES: Final = 4096
#: Beyond this a declared length is treated as a broken stream rather than skipped.
ABSURD_LENGTH: Final = 1 << 31

_TOKEN_COUNTS: Final = {
    b"put": (6, 8),
    b"mput": (6, 7),
    b"sync": (7, 8),
    b"msync": (7, 7),
    b"dput": (8, 9),
    b"qack": (5, 5),
    b"qdlq": (6, 6),
}
_BATCH_COMMANDS: Final = frozenset({b"mput", b"msync"})
TX_TYPES: Final = frozenset(
    {
        "BEGIN",
        "END",
        "PREPARE",
        "COMMIT_ONE_PHASE",
        "COMMIT_TWO_PHASE",
        "ROLLBACK",
        "RECOVER",
        "FORGET",
    }
)
#: a known type's token -> its name (the parser's fast path)
_TX_TYPE_OF: Final = {name.encode(): name for name in TX_TYPES}


# --------------------------------------------------------------------------- requests


class Put:
    """``put``: one message. ``checksum`` is -1 when not supplied."""

    __slots__ = ("body", "checksum", "flag", "opaque", "partition", "topic", "tx_key")

    def __init__(
        self,
        topic: str,
        partition: int,
        flag: int,
        checksum: int,
        tx_key: str | None,
        opaque: int,
        body: bytes,
    ):
        self.topic = topic
        self.partition = partition
        self.flag = flag
        self.checksum = checksum
        self.tx_key = tx_key
        self.opaque = opaque
        self.body = body

    def __repr__(self) -> str:
        return (
            f"Put({self.topic!r}, {self.partition}, flag={self.flag}, "
            f"checksum={self.checksum}, tx_key={self.tx_key!r}, opaque={self.opaque}, "
            f"len={len(self.body)})"
        )


class MultiPut:
    """``mput`` (notify extension): ``count`` records already in the on-disk layout."""

    __slots__ = ("count", "opaque", "partition", "records", "topic", "tx_key")

    def __init__(
        self,
        topic: str,
        partition: int,
        count: int,
        tx_key: str | None,
        opaque: int,
        records: bytes,
    ):
        self.topic = topic
        self.partition = partition
        self.count = count
        self.tx_key = tx_key
        self.opaque = opaque
        self.records = records


@dataclass(slots=True)
class Get:
    topic: str
    group: str
    partition: int
    offset: int
    max_size: int
    opaque: int
    max_wait_ms: int = 0


@dataclass(slots=True)
class Offset:
    topic: str
    group: str
    partition: int
    offset: int
    opaque: int


@dataclass(slots=True)
class Stats:
    item: str | None
    opaque: int


@dataclass(slots=True)
class Version:
    opaque: int


@dataclass(slots=True)
class Quit:
    opaque: int = 0


@dataclass(slots=True)
class Transaction:
    tx_key: str | None
    session_id: str
    type: str
    timeout: int | None
    unique_qualifier: str | None
    opaque: int
    #: ``msgs=<n>`` (notify extension, COMMIT_ONE_PHASE and PREPARE): the number of
    #: messages the client wrote in the transaction; the broker rolls back on a mismatch,
    #: so a COMMIT pipelined behind the puts never commits without a refused one.
    expect_messages: int | None = None


@dataclass(slots=True)
class Sync:
    topic: str
    partition: int
    flag: int
    msg_id: int
    checksum: int
    opaque: int
    body: bytes


@dataclass(slots=True)
class Auth:
    secret: str
    opaque: int
    #: ``auth <secret> <brokerId> <opaque>``: a broker of a replication set names the broker
    #: id it replicates (its master's, which a MetaQ slave shares); None in the 3-token form
    broker_id: int | None = None
    #: ``auth <secret> <brokerId> <epoch> <opaque>``: the failover epoch the linking broker
    #: is in (automatic failover, README "Replication and failover"); None = not given
    epoch: int | None = None


@dataclass(slots=True)
class Reload:
    opaque: int


@dataclass(slots=True)
class MultiSync:
    topic: str
    partition: int
    count: int
    base_offset: int
    opaque: int
    records: bytes


@dataclass(slots=True)
class DelayedPut:
    topic: str
    partition: int
    flag: int
    checksum: int
    deliver_at_ms: int
    tx_key: str | None
    opaque: int
    body: bytes


@dataclass(slots=True)
class Promote:
    opaque: int


@dataclass(slots=True)
class Epoch:
    """``epoch <brokerId> <epoch> <opaque>`` (extension, automatic failover): a producer
    declares the newest failover epoch it has seen for broker group ``broker_id``; a broker
    of that group in an older epoch is a replaced master and refuses the connection's writes.
    Answered ``<brokerId> <epoch>`` (the broker's own)."""

    broker_id: int
    epoch: int
    opaque: int


@dataclass(slots=True)
class Register:
    group: str
    opaque: int
    secret: str = ""


@dataclass(slots=True)
class QueueSubscribe:
    topic: str
    group: str
    credit: int
    start: str
    opaque: int
    #: cluster mode: the consumer's id under ``consumers/<group>/queue-ids/<topic>/``
    consumer_id: str = ""
    #: ``qbsub``: pushes come as ``qbatch`` frames (many messages each)
    batch: bool = False


@dataclass(slots=True)
class QueueAck:
    topic: str
    group: str
    opaque: int
    items: bytes


@dataclass(slots=True)
class QueueUnsubscribe:
    topic: str
    group: str
    opaque: int


@dataclass(slots=True)
class QueueDelete:
    """``qdel``: delete a queue group and its state (admin)."""

    topic: str
    group: str
    force: bool
    opaque: int


#: ``qdlq`` actions
QDLQ_ACTIONS: Final = ("list", "replay")


@dataclass(slots=True)
class QueueDeadLetters:
    """``qdlq``: list (``action`` "list") or replay (``"replay"``) a group's dead letters."""

    topic: str
    group: str
    action: str
    opaque: int
    body: bytes


Request = (
    Put
    | MultiPut
    | Get
    | Offset
    | Stats
    | Version
    | Quit
    | Transaction
    | Sync
    | Auth
    | Reload
    | Register
    | MultiSync
    | Promote
    | Epoch
    | DelayedPut
    | QueueSubscribe
    | QueueAck
    | QueueUnsubscribe
    | QueueDeadLetters
    | QueueDelete
    | Claim
)


# --------------------------------------------------------------------------- parser


_INT64_FIELDS: Final = frozenset({"offset", "msgId", "deliverAtMs", "baseOffset"})
_INT32: Final = (-(2**31), 2**31 - 1)
_INT64: Final = (-(2**63), 2**63 - 1)


def _int(tok: bytes, name: str, opaque: int) -> int:
    """A decimal field; ints that do not fit their wire type (int32, or int64 for offsets
    and ids) are rejected here, before they can reach a struct.pack."""
    try:
        v = int(tok)
    except ValueError:
        raise ProtocolError(
            f"invalid {name} {tok[:40].decode('latin-1')!r}: not an integer", 400, opaque
        ) from None
    if -2147483648 <= v <= 2147483647:  # fits every wire type
        return v
    lo, hi = _INT64 if name in _INT64_FIELDS else _INT32
    if not lo <= v <= hi:
        bits = 64 if name in _INT64_FIELDS else 32
        raise ProtocolError(f"{name} {v} does not fit a signed {bits}-bit integer", 400, opaque)
    return v


#: Opaque of the reply to a request that carried none (MetaQ's Integer.MAX_VALUE).
NO_OPAQUE: Final = 2**31 - 1

#: Token counts of the known line commands (their opaque is the last token).
_LINE_COUNTS: Final = {
    b"get": (7, 8),
    b"offset": (6, 6),
    b"stats": (1, 3),
    b"version": (1, 2),
    b"transaction": (5, 7),
    b"auth": (3, 5),
    b"register": (3, 4),
    b"qsub": (6, 7),
    b"qbsub": (6, 7),
    b"qunsub": (4, 4),
    b"qdel": (4, 5),
    b"epoch": (4, 4),
    b"producer": (6, 6),
}


def _opaque_of(tokens: list[bytes]) -> int:
    """Best-effort opaque of a broken request: its last token when it is an int32 and sits
    where the command keeps its opaque. A known command with a wrong number of tokens has no
    known opaque slot: 0. An unknown command: its last token (most commands end with one)."""
    counts = _TOKEN_COUNTS.get(tokens[0]) or _LINE_COUNTS.get(tokens[0]) if tokens else None
    if counts is not None and not counts[0] <= len(tokens) <= counts[1]:
        return 0
    try:
        v = int(tokens[-1])
    except (ValueError, IndexError):
        return 0
    return v if -(2**31) <= v < 2**31 else 0


def _text(tok: bytes, name: str, opaque: int) -> str:
    try:
        return tok.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{name} is not valid UTF-8", 400, opaque) from None


class RequestParser:
    """Incremental request decoder (broker side).

    ``feed(data)`` returns the list of complete requests in ``data`` plus what was buffered,
    interleaved with :class:`ProtocolError` instances for requests that were rejected. A
    rejected request whose length is known is skipped whole, so the stream stays in sync;
    when framing is lost (no line end within ``max_header_bytes``, an unreadable body
    length) the error is ``fatal`` and the parser refuses further input.

    Body limits are checked from the header, before any body byte is kept: ``put``,
    ``dput`` and ``sync`` bodies may hold ``max_body_bytes``, ``mput`` and ``msync`` batches
    ``max_batch_bytes``; with ``bodies_allowed`` False (a connection that has not
    authenticated yet) every body is refused (403) and skipped. A partial frame is kept in
    one ``bytearray`` that grows by appending, and a chunk that cannot complete it returns
    at once: a frame trickled byte by byte costs linear, not quadratic, work.
    """

    __slots__ = (
        "_buf",
        "_max_batch",
        "_max_body",
        "_max_header",
        "_need",
        "_skip",
        "bodies_allowed",
        "closed",
    )

    def __init__(
        self,
        max_body_bytes: int,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_batch_bytes: int | None = None,
    ):
        self._max_body = max_body_bytes
        self._max_batch = max_body_bytes if max_batch_bytes is None else max_batch_bytes
        self._max_header = max_header_bytes
        self._buf = bytearray()  # the start of an incomplete frame
        self._need = 0  # bytes _buf must reach before parsing again can make progress
        self._skip = 0  # body bytes of a rejected request still to discard
        #: True once framing was lost (a fatal error): no further input is decoded
        self.closed = False
        self.bodies_allowed = True

    def set_limits(self, max_body_bytes: int, max_batch_bytes: int) -> None:
        """Change the body limits (a config reload); applies to the next header."""
        self._max_body = max_body_bytes
        self._max_batch = max_batch_bytes

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)

    @property
    def in_frame(self) -> bool:
        """True while a frame is incomplete (bytes buffered, or a body still being skipped)."""
        return bool(self._buf) or self._skip > 0

    def feed(self, data: bytes) -> list[Request | ProtocolError]:
        out: list[Request | ProtocolError] = []
        if self.closed:
            return out
        if self._skip:
            if len(data) < self._skip:
                self._skip -= len(data)
                return out
            data = data[self._skip :]
            self._skip = 0
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return out  # the frame cannot be complete yet: nothing to parse
            buf = bytes(self._buf)  # one copy per completed frame, not per chunk
            self._buf.clear()
        else:
            buf = data
        self._need = 0
        n = len(buf)
        pos = 0
        max_header = self._max_header
        while pos < n:
            eol = buf.find(CRLF, pos, pos + max_header + 2)
            if eol < 0:
                if n - pos > max_header + 1:  # a lone CR may wait for its LF
                    out.append(
                        FrameTooLargeError(
                            f"header line longer than {max_header} bytes", 400, 0, fatal=True
                        )
                    )
                    self.closed = True
                    return out
                self._need = n - pos + 1
                break
            line = buf[pos:eol]
            tokens = line.split(b" ")
            cmd = tokens[0]
            body_start = eol + 2
            try:
                if cmd in _TOKEN_COUNTS:
                    length = self._body_length(tokens, cmd)
                    if n - body_start < length:
                        self._need = body_start + length - pos
                        break  # wait for the body
                    body = buf[body_start : body_start + length]
                    pos = body_start + length
                    out.append(self._decode_body_command(cmd, tokens, body))
                    continue
                pos = body_start
                out.append(self._decode_line(cmd, tokens))
            except ProtocolError as e:
                out.append(e.report if isinstance(e, _SkipBody) else e)
                if e.fatal:
                    self.closed = True
                    return out
                if isinstance(e, _SkipBody):
                    # framing known: drop the body we are told follows
                    avail = n - body_start
                    if avail >= e.length:
                        pos = body_start + e.length
                    else:
                        self._skip = e.length - avail
                        pos = n
                else:
                    pos = max(pos, body_start)
        if pos < n:
            self._buf += memoryview(buf)[pos:]
        return out

    # -- helpers

    def _body_length(self, tokens: list[bytes], cmd: bytes) -> int:
        lengths = _TOKEN_COUNTS[cmd]
        ntok = len(tokens)
        if lengths[0] <= ntok <= lengths[1]:  # the usual case, checked in fewer steps
            try:
                length = int(tokens[3])
            except ValueError:
                length = -1
            if (
                0 <= length < ABSURD_LENGTH
                and (self.bodies_allowed or not length)
                and length <= (self._max_batch if cmd in _BATCH_COMMANDS else self._max_body)
            ):
                return length
        return self._bad_body_length(tokens, cmd, lengths, ntok)

    def _bad_body_length(
        self, tokens: list[bytes], cmd: bytes, lengths: tuple[int, int], ntok: int
    ) -> int:
        """:meth:`_body_length` past its usual case: the length, or the error it makes."""
        if ntok < 4:
            raise ProtocolError(
                f"{cmd.decode()}: expected {lengths[0]}-{lengths[1]} tokens, got {ntok}",
                400,
                _opaque_of(tokens),
                fatal=True,
            )
        try:
            length = int(tokens[3])
        except ValueError:
            raise ProtocolError(
                f"{cmd.decode()}: body length {tokens[3][:40].decode('latin-1')!r} is not an "
                "integer",
                400,
                _opaque_of(tokens),
                fatal=True,
            ) from None
        if length < 0 or length >= ABSURD_LENGTH:
            raise ProtocolError(
                f"{cmd.decode()}: invalid body length {length}", 400, _opaque_of(tokens), fatal=True
            )
        if not lengths[0] <= ntok <= lengths[1]:
            raise _SkipBody(
                f"{cmd.decode()}: expected {lengths[0]}-{lengths[1]} tokens, got {ntok}",
                400,
                _opaque_of(tokens),
                length,
            )
        if length and not self.bodies_allowed:
            raise _SkipBody(
                f"{cmd.decode()}: authentication required: send auth first (body skipped)",
                403,
                _opaque_of(tokens),
                length,
            )
        if length > (self._max_batch if cmd in _BATCH_COMMANDS else self._max_body):
            limit = self._max_batch if cmd in _BATCH_COMMANDS else self._max_body
            setting = "maxBatchSize" if cmd in _BATCH_COMMANDS else "maxMessageSize"
            raise _SkipBody(
                f"{cmd.decode()}: message of {length} bytes exceeds the maximum of {limit} "
                f"({setting})",
                400,
                _opaque_of(tokens),
                length,
                too_large=True,
            )
        return length

    def _decode_body_command(self, cmd: bytes, t: list[bytes], body: bytes) -> Request:
        n = len(t)
        if cmd == b"put" and (n == 7 or n == 8):  # MetaQ's put: checksum and/or txKey
            slot = t[5]
            try:
                opaque = int(t[-1])
                partition = int(t[2])
                flag = int(t[4])
                topic = t[1].decode("utf-8")
                tx_key: str | None
                if n == 8:  # checksum and txKey
                    checksum = int(slot)
                    tx_key = t[6].decode("utf-8")
                elif slot[:1].isdigit() or slot[:1] == b"-":
                    checksum = int(slot)
                    tx_key = None
                else:
                    checksum = -1
                    tx_key = slot.decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                pass  # the general path below says what is wrong
            else:
                # each in -2**31..2**31-1, in one test: biased by 2**31, every one lies in
                # 0..2**32-1 exactly when their OR has no bit from 32 up (nor a sign)
                if not (
                    (opaque + 2147483648)
                    | (partition + 2147483648)
                    | (flag + 2147483648)
                    | (checksum + 2147483648)
                ) >> 32:
                    if tx_key == "null":
                        tx_key = None
                    return Put(topic, partition, flag, checksum, tx_key, opaque, body)
        return self._decode_body_general(cmd, t, body)

    def _decode_body_general(self, cmd: bytes, t: list[bytes], body: bytes) -> Request:
        opaque = _int(t[-1], "opaque", 0)
        topic = _text(t[1], "topic", opaque)
        if cmd == b"qack":
            return QueueAck(topic, _text(t[2], "group", opaque), opaque, body)
        if cmd == b"qdlq":
            action = _text(t[4], "action", opaque)
            if action not in QDLQ_ACTIONS:
                raise ProtocolError(
                    f"qdlq: action must be list or replay, got {action[:20]!r}", 400, opaque
                )
            return QueueDeadLetters(topic, _text(t[2], "group", opaque), action, opaque, body)
        partition = _int(t[2], "partition", opaque)
        if cmd == b"put":
            flag = _int(t[4], "flag", opaque)
            checksum = -1
            tx_key: str | None = None
            if len(t) == 7:
                slot = t[5]
                if slot[:1].isdigit() or slot[:1] == b"-":
                    checksum = _int(slot, "checksum", opaque)
                else:
                    tx_key = _text(slot, "txKey", opaque)
            elif len(t) == 8:
                checksum = _int(t[5], "checksum", opaque)
                tx_key = _text(t[6], "txKey", opaque)
            if tx_key == "null":
                tx_key = None
            return Put(topic, partition, flag, checksum, tx_key, opaque, body)
        if cmd == b"dput":
            dtx = _text(t[7], "txKey", opaque) if len(t) == 9 else None
            return DelayedPut(
                topic,
                partition,
                _int(t[4], "flag", opaque),
                _int(t[5], "checksum", opaque),
                _int(t[6], "deliverAtMs", opaque),
                None if dtx == "null" else dtx,
                opaque,
                body,
            )
        if cmd == b"msync":
            return MultiSync(
                topic,
                partition,
                _int(t[4], "count", opaque),
                _int(t[5], "baseOffset", opaque),
                opaque,
                body,
            )
        if cmd == b"mput":
            count = _int(t[4], "count", opaque)
            mtx = _text(t[5], "txKey", opaque) if len(t) == 7 else None
            if mtx == "null":
                mtx = None
            return MultiPut(topic, partition, count, mtx, opaque, body)
        # sync (7 tokens: a master before MetaQ 1.4.4, no checksum)
        return Sync(
            topic,
            partition,
            _int(t[4], "flag", opaque),
            _int(t[5], "msgId", opaque),
            _int(t[6], "checksum", opaque) if len(t) == 8 else -1,
            opaque,
            body,
        )

    def _decode_line(self, cmd: bytes, t: list[bytes]) -> Request:
        n = len(t)
        if cmd == b"transaction":  # the most frequent line command with get
            return self._decode_transaction(t)
        if cmd == b"get":
            if n != 7 and n != 8:
                raise ProtocolError(f"get: expected 7 tokens, got {n}", 400, _opaque_of(t))
            opaque = _int(t[-1], "opaque", 0)
            return Get(
                _text(t[1], "topic", opaque),
                _text(t[2], "group", opaque),
                _int(t[3], "partition", opaque),
                _int(t[4], "offset", opaque),
                _int(t[5], "maxSize", opaque),
                opaque,
                _int(t[6], "maxWaitMs", opaque) if n == 8 else 0,
            )
        if cmd == b"offset":
            if n != 6:
                raise ProtocolError(f"offset: expected 6 tokens, got {n}", 400, _opaque_of(t))
            opaque = _int(t[5], "opaque", 0)
            return Offset(
                _text(t[1], "topic", opaque),
                _text(t[2], "group", opaque),
                _int(t[3], "partition", opaque),
                _int(t[4], "offset", opaque),
                opaque,
            )
        if cmd == b"stats":
            if n == 1:
                return Stats(None, NO_OPAQUE)
            if n == 2:
                tok = t[1]
                if tok.lstrip(b"-").isdigit():
                    return Stats(None, _int(tok, "opaque", 0))
                return Stats(_text(tok, "item", NO_OPAQUE) or None, NO_OPAQUE)
            if n == 3:
                opaque = _int(t[2], "opaque", 0)
                return Stats(_text(t[1], "item", opaque) or None, opaque)
            raise ProtocolError(f"stats: expected 1-3 tokens, got {n}", 400, _opaque_of(t))
        if cmd == b"version":
            if n == 1:
                return Version(NO_OPAQUE)
            if n == 2:
                return Version(_int(t[1], "opaque", 0))
            raise ProtocolError(f"version: expected 1-2 tokens, got {n}", 400, _opaque_of(t))
        if cmd == b"quit":
            return Quit(_opaque_of(t) if n > 1 else 0)
        if cmd == b"auth":
            if n not in (3, 4, 5):
                raise ProtocolError(f"auth: expected 3-5 tokens, got {n}", 400, _opaque_of(t))
            opaque = _int(t[-1], "opaque", 0)
            bid = _int(t[2], "brokerId", opaque) if n >= 4 else None
            epoch = _int(t[3], "epoch", opaque) if n == 5 else None
            return Auth(_text(t[1], "secret", opaque), opaque, bid, epoch)
        if cmd == b"reload":
            return Reload(_int(t[1], "opaque", 0) if n > 1 else 0)
        if cmd == b"promote":
            return Promote(_int(t[1], "opaque", 0) if n > 1 else 0)
        if cmd == b"epoch":
            opaque = _opaque_of(t)
            if n != 4:
                raise ProtocolError(f"epoch: expected 4 tokens, got {n}", 400, opaque)
            opaque = _int(t[3], "opaque", 0)
            bid, epoch = _int(t[1], "brokerId", opaque), _int(t[2], "epoch", opaque)
            if bid < 0 or epoch < 0:
                raise ProtocolError("epoch: brokerId and epoch must be >= 0", 400, opaque)
            return Epoch(bid, epoch, opaque)
        if cmd == b"register":
            if n not in (3, 4):
                raise ProtocolError(
                    f"register: expected 3 or 4 tokens, got {n}", 400, _opaque_of(t)
                )
            opaque = _int(t[-1], "opaque", 0)
            secret = _text(t[2], "groupSecret", opaque) if n == 4 else ""
            return Register(_text(t[1], "producerGroup", opaque), opaque, secret)
        if cmd == b"qsub" or cmd == b"qunsub" or cmd == b"qbsub" or cmd == b"qdel":
            return _decode_queue_line(cmd, t)
        if cmd == b"producer":
            opaque = _opaque_of(t)
            return decode_claim(t, _int(t[-1], "opaque", 0) if n == 6 else opaque)
        if not cmd:
            raise ProtocolError("empty command line", 400, 0)
        shown = cmd[:40].decode("latin-1")
        raise ProtocolError(f"unknown command {shown!r}", 400, _opaque_of(t))

    def _decode_transaction(self, t: list[bytes]) -> Transaction:
        n = len(t)
        ttype = _TX_TYPE_OF.get(t[3]) if n == 5 or n == 6 else None
        if ttype is not None:  # the usual forms, checked in fewer steps
            try:
                opaque = int(t[-1])
                key = t[1].decode("utf-8")
                session = t[2].decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                pass  # the general path below says what is wrong
            else:
                if not (opaque + 2147483648) >> 32:  # an int32
                    tx_key = None if key == "null" else key
                    if n == 5:
                        return Transaction(tx_key, session, ttype, None, None, opaque)
                    slot = t[4]
                    if ttype == "BEGIN" and slot.isdigit() and not key.startswith("XID:"):
                        timeout = int(slot)
                        if timeout <= 2147483647:
                            return Transaction(tx_key, session, ttype, timeout, None, opaque)
        return self._decode_transaction_general(t)

    def _decode_transaction_general(self, t: list[bytes]) -> Transaction:
        n = len(t)
        if not 5 <= n <= 7:
            raise ProtocolError(f"transaction: expected 5-7 tokens, got {n}", 400, _opaque_of(t))
        opaque = _int(t[-1], "opaque", 0)
        key = _text(t[1], "txKey", opaque)
        session = _text(t[2], "sessionId", opaque)
        ttype = _text(t[3], "type", opaque)
        if ttype not in TX_TYPES:
            raise ProtocolError(f"transaction: unknown type {ttype[:40]!r}", 400, opaque)
        timeout: int | None = None
        uq: str | None = None
        expect: int | None = None
        if n == 6:
            slot = t[4]
            if ttype == "BEGIN" and slot.isdigit() and not _is_key_qualifier(key, slot):
                timeout = _int(slot, "timeout", opaque)
            elif ttype in ("COMMIT_ONE_PHASE", "PREPARE") and slot.startswith(b"msgs="):
                expect = _int(slot[5:], "msgs", opaque)
                if expect < 0:
                    raise ProtocolError(f"transaction: msgs={expect} is negative", 400, opaque)
            else:
                uq = _text(slot, "uniqueQualifier", opaque)
        elif n == 7:
            timeout = _int(t[4], "timeout", opaque)
            uq = _text(t[5], "uniqueQualifier", opaque)
        return Transaction(
            None if key == "null" else key, session, ttype, timeout, uq, opaque, expect
        )


def _decode_queue_line(cmd: bytes, t: list[bytes]) -> Request:
    n = len(t)
    least, most = _LINE_COUNTS[cmd]
    name = cmd.decode()
    if not least <= n <= most:
        want = str(least) if least == most else f"{least} or {most}"
        raise ProtocolError(f"{name}: expected {want} tokens, got {n}", 400, _opaque_of(t))
    opaque = _int(t[-1], "opaque", 0)
    topic = _text(t[1], "topic", opaque)
    group = _text(t[2], "group", opaque)
    if cmd == b"qunsub":
        return QueueUnsubscribe(topic, group, opaque)
    if cmd == b"qdel":
        if n == 5 and t[3] != b"force":
            raise ProtocolError("qdel: the optional token is 'force'", 400, opaque)
        return QueueDelete(topic, group, n == 5, opaque)
    start = _text(t[4], "start", opaque)
    if start not in ("earliest", "latest"):
        raise ProtocolError(f"{name}: start must be earliest or latest, got {start[:20]!r}",
                            400, opaque)
    consumer_id = _text(t[5], "consumerId", opaque) if n == 7 else ""
    return QueueSubscribe(topic, group, _int(t[3], "credit", opaque), start, opaque, consumer_id,
                          cmd == b"qbsub")


def _is_key_qualifier(key: str, slot: bytes) -> bool:
    """True when ``slot`` is the uniqueQualifier that ends the XA key ``key``."""
    return key.startswith("XID:") and key.rsplit(":", 1)[-1].encode() == slot


class _SkipBody(ProtocolError):
    """Internal: a rejected body command whose body length is known (skip it)."""

    def __init__(self, message: str, code: int, opaque: int, length: int, too_large: bool = False):
        super().__init__(message, code, opaque)
        self.length = length
        cls = FrameTooLargeError if too_large else ProtocolError
        self.report: ProtocolError = cls(message, code, opaque)


# --------------------------------------------------------------------------- replies


def encode_result(code: int, opaque: int, body: bytes = b"") -> bytes:
    """``result <code> <bodyLen> <opaque>\\r\\n<body>``."""
    return b"result %d %d %d\r\n%b" % (code, len(body), opaque, body)


def encode_results(replies: list[tuple[int, int, bytes]]) -> bytes:
    """:func:`encode_result` of each ``(opaque, code, body)``, as one bytes."""
    return b"".join(
        [b"result %d %d %d\r\n%b" % (code, len(body), op, body) for op, code, body in replies]
    )


def encode_error(err: ProtocolError) -> bytes:
    return encode_result(err.code, err.opaque, str(err).encode("utf-8", "replace"))


def encode_value_header(length: int, opaque: int) -> bytes:
    """``value <len> <opaque>\\r\\n`` (the raw records follow)."""
    return b"value %d %d\r\n" % (length, opaque)


# --------------------------------------------------------------------------- client side


def encode_put(
    topic: str,
    partition: int,
    body: bytes,
    flag: int,
    opaque: int,
    checksum: int | None = None,
    tx_key: str | None = None,
) -> bytes:
    """Build a ``put`` frame (8-token form when both checksum and txKey are given)."""
    head = f"put {topic} {partition} {len(body)} {flag}"
    if checksum is not None:
        head += f" {checksum}"
    if tx_key is not None:
        head += f" {tx_key}"
    return f"{head} {opaque}\r\n".encode() + body


def encode_mput(
    topic: str, partition: int, records: bytes, count: int, opaque: int, tx_key: str | None = None
) -> bytes:
    tx = f" {tx_key}" if tx_key is not None else ""
    return f"mput {topic} {partition} {len(records)} {count}{tx} {opaque}\r\n".encode() + records


def encode_get(
    topic: str,
    group: str,
    partition: int,
    offset: int,
    max_size: int,
    opaque: int,
    max_wait_ms: int = 0,
) -> bytes:
    wait = f" {max_wait_ms}" if max_wait_ms > 0 else ""
    return f"get {topic} {group} {partition} {offset} {max_size}{wait} {opaque}\r\n".encode()


def encode_offset(topic: str, group: str, partition: int, offset: int, opaque: int) -> bytes:
    return f"offset {topic} {group} {partition} {offset} {opaque}\r\n".encode()


def encode_dput(
    topic: str,
    partition: int,
    body: bytes,
    flag: int,
    checksum: int,
    deliver_at_ms: int,
    opaque: int,
    tx_key: str | None = None,
) -> bytes:
    tx = f" {tx_key}" if tx_key else ""
    head = f"dput {topic} {partition} {len(body)} {flag} {checksum} {deliver_at_ms}{tx} {opaque}"
    return (head + "\r\n").encode() + body


def encode_msync(
    topic: str, partition: int, records: bytes, count: int, base_offset: int, opaque: int
) -> bytes:
    head = f"msync {topic} {partition} {len(records)} {count} {base_offset} {opaque}\r\n"
    return head.encode() + records


def encode_replica_auth(secret: str, broker_id: int, opaque: int, epoch: int = 0) -> bytes:
    """``auth <replicationSecret> <brokerId> [<epoch>] <opaque>``: the handshake of a
    replication link (the failover epoch with automatic failover, else omitted); the broker
    answers ``ok role=replica broker=<its brokerId>[ epoch=<its epoch>]`` (see
    :func:`notify.protocol.replies.parse_replica_ack`)."""
    if epoch:
        return f"auth {secret} {broker_id} {epoch} {opaque}\r\n".encode()
    return f"auth {secret} {broker_id} {opaque}\r\n".encode()


def encode_line(*tokens: object) -> bytes:
    """Any single-line command: ``encode_line('stats', 'topics', 7)``."""
    return (" ".join(str(t) for t in tokens) + "\r\n").encode()


def encode_qmsg(
    sub_opaque: int, partition: int, offset: int, count: int, record_len: int
) -> bytes:
    """Broker -> client: the header of a pushed queue message (the record follows)."""
    return b"qmsg %d %d %d %d %d\r\n" % (sub_opaque, partition, offset, count, record_len)


#: one run of a ``qbatch`` body: partition, delivery count, records, first offset, bytes
QBATCH_RUN: Final = struct.Struct(">IHIqI")


def encode_qbatch(sub_opaque: int, runs: list[tuple[int, int, int, int, bytes | memoryview]]
                  ) -> list[bytes | memoryview]:
    """Broker -> client: many pushed messages in one frame, ``qbatch <subOpaque> <len>`` then
    runs of ``partition:u32 count:u16 n:u32 firstOffset:i64 bytes:u32`` (big-endian) each
    followed by ``bytes`` of ``n`` whole records in the on-disk layout, at consecutive
    offsets from ``firstOffset``, all with delivery count ``count``. ``runs``: ``(partition,
    count, n, first_offset, records)``; returns the frame's pieces (to join or write)."""
    out: list[bytes | memoryview] = [b""]
    size = 0
    pack = QBATCH_RUN.pack
    for p, c, n, first, data in runs:
        out.append(pack(p, min(c, 65535), n, first, len(data)))
        out.append(data)
        size += QBATCH_RUN.size + len(data)
    out[0] = b"qbatch %d %d\r\n" % (sub_opaque, size)
    return out


def decode_qbatch(body: bytes) -> list[tuple[int, int, int, int, int]]:
    """The runs of a ``qbatch`` body: ``(partition, count, n, first_offset, start)``, the
    run's records at ``body[start:]`` (:class:`ProtocolError` when malformed)."""
    out = []
    pos, end = 0, len(body)
    unpack = QBATCH_RUN.unpack_from
    try:
        while pos < end:
            p, c, n, first, size = unpack(body, pos)
            pos += QBATCH_RUN.size
            if pos + size > end:
                raise ValueError(f"run of {size} bytes beyond the frame")
            out.append((p, c, n, first, pos))
            pos += size
    except (struct.error, ValueError) as e:
        raise ProtocolError(f"malformed qbatch frame: {e}") from None
    return out


def encode_qack(topic: str, group: str, items: bytes, opaque: int) -> bytes:
    """``qack``: ``items`` are ``K <partition> <offset> [<delayMs>]`` lines."""
    return f"qack {topic} {group} {len(items)} {opaque}\r\n".encode() + items


def encode_qdel(topic: str, group: str, force: bool, opaque: int) -> bytes:
    """``qdel``: delete a queue group (``force``: even with consumers)."""
    return f"qdel {topic} {group}{' force' if force else ''} {opaque}\r\n".encode()


def encode_qdlq(topic: str, group: str, action: str, body: bytes, opaque: int) -> bytes:
    """``qdlq``: ``action`` list (body ``[<from> <limit>]``) or replay (body ``all`` or
    ``<partition> <offset>`` lines)."""
    return f"qdlq {topic} {group} {len(body)} {action} {opaque}\r\n".encode() + body


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """One entry of a ``qdlq list`` reply. ``reason``: ``rejected`` (a consumer rejected it)
    or ``max_deliveries`` (returned with queueMaxDeliveries deliveries)."""

    partition: int
    offset: int
    length: int
    deliveries: int
    reason: str
    #: when it became a dead letter: wall-clock milliseconds since the Unix epoch
    at_ms: int

    @property
    def at_known(self) -> bool:
        """Whether ``at_ms`` is a wall-clock time (entries recorded before dead letters
        carried one hold the broker's monotonic clock: milliseconds since its boot)."""
        return self.at_ms >= WALL_CLOCK_SINCE_MS

    @property
    def at_iso(self) -> str | None:
        """``at_ms`` in ISO 8601, UTC, to the millisecond (None when not known)."""
        if not self.at_known:
            return None
        at = datetime.fromtimestamp(self.at_ms / 1000, tz=UTC)
        return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


DEAD_LETTER_REASONS: Final = ("rejected", "max_deliveries")
#: 2001-01-01T00:00:00Z in ms: an earlier dead-letter time is not a wall-clock time
WALL_CLOCK_SINCE_MS: Final = 978_307_200_000


def encode_dead_letters(total: int, dropped: int, letters: list[DeadLetterInfo]) -> bytes:
    """``qdlq list`` reply body: ``<total> <dropped>`` (entries in the queue, entries dropped
    at queueMaxDeadLetters) then ``<partition> <offset> <length> <deliveries> <reason>
    <atMs>`` lines."""
    lines = [f"{total} {dropped}"]
    lines += [
        f"{d.partition} {d.offset} {d.length} {d.deliveries} {d.reason} {d.at_ms}"
        for d in letters
    ]
    return "\n".join(lines).encode()


def parse_dead_letters(body: bytes) -> tuple[int, int, list[DeadLetterInfo]]:
    """Inverse of :func:`encode_dead_letters` (:class:`ProtocolError` when malformed)."""
    try:
        lines = body.decode("ascii").split("\n")
        total, dropped = (int(x) for x in lines[0].split())
        out = []
        for line in lines[1:]:
            p, o, ln, c, reason, at = line.split()
            if reason not in DEAD_LETTER_REASONS:
                raise ValueError(reason)
            out.append(DeadLetterInfo(int(p), int(o), int(ln), int(c), reason, int(at)))
        return total, dropped, out
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed qdlq list reply: {e}") from None


def encode_check(tx_key: str, topic: str, partition: int, records: bytes, opaque: int) -> bytes:
    """Broker -> producer: ``check <txKey> <topic> <partition> <len> <opaque>\\r\\n<records>``."""
    return f"check {tx_key} {topic} {partition} {len(records)} {opaque}\r\n".encode() + records


@dataclass(slots=True)
class Response:
    """A decoded reply. ``kind`` is ``"result"``, ``"value"`` (code 200), ``"check"`` (a
    broker-initiated check-back: ``tx_key``, ``topic`` and ``partition`` are set, ``body``
    holds the half message's records, ``code`` is 0) or ``"qmsg"`` (a pushed queue
    message: ``opaque`` is the subscription's, ``partition`` and ``offset`` say which
    message, ``code`` is its delivery count, ``body`` its record) or ``"qbatch"`` (pushed
    queue messages, ``body`` as :func:`decode_qbatch` reads it)."""

    kind: str
    code: int
    opaque: int
    body: bytes
    tx_key: str | None = None
    topic: str | None = None
    partition: int = -1
    offset: int = -1


class ResponseParser:
    """Incremental reply decoder (client side)."""

    __slots__ = ("_max_body", "_rest")

    def __init__(self, max_body_bytes: int = 1 << 30):
        self._rest = b""
        self._max_body = max_body_bytes

    def feed(self, data: bytes) -> list[Response]:
        """Decode what is complete; raises ProtocolError when the stream is garbage."""
        buf = self._rest + data if self._rest else data
        n = len(buf)
        pos = 0
        out: list[Response] = []
        while pos < n:
            eol = buf.find(CRLF, pos, pos + DEFAULT_MAX_HEADER_BYTES)
            if eol < 0:
                if n - pos > DEFAULT_MAX_HEADER_BYTES:
                    raise ProtocolError("reply header line too long", fatal=True)
                break
            t = buf[pos:eol].split(b" ")
            extra: tuple[str | None, str | None, int, int] = (None, None, -1, -1)
            try:
                if t[0] == b"qmsg" and len(t) == 6:
                    kind, code, length, opaque = "qmsg", int(t[4]), int(t[5]), int(t[1])
                    extra = (None, None, int(t[2]), int(t[3]))
                elif t[0] == b"qbatch" and len(t) == 3:
                    kind, code, length, opaque = "qbatch", 0, int(t[2]), int(t[1])
                elif t[0] == b"check" and len(t) == 6:
                    kind, code, length, opaque = "check", 0, int(t[4]), int(t[5])
                    extra = (t[1].decode(), t[2].decode(), int(t[3]), -1)
                elif t[0] == b"result" and len(t) == 4:
                    kind, code, length, opaque = "result", int(t[1]), int(t[2]), int(t[3])
                elif t[0] == b"value" and len(t) == 3:
                    kind, code, length, opaque = "value", 200, int(t[1]), int(t[2])
                else:
                    raise ValueError
            except (ValueError, UnicodeDecodeError):
                shown = buf[pos:eol][:80].decode("latin-1")
                raise ProtocolError(f"malformed reply line {shown!r}", fatal=True) from None
            if length < 0 or length > self._max_body:
                raise ProtocolError(f"reply body length {length} out of range", fatal=True)
            start = eol + 2
            if n - start < length:
                break
            out.append(Response(kind, code, opaque, buf[start : start + length], *extra))
            pos = start + length
        self._rest = buf[pos:] if pos < n else b""
        return out
