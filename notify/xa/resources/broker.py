"""The notify broker as an XA participant, over a blocking
:class:`~notify.transport.BlockingConnection` (shared secret and TLS as configured).

Speaks MetaQ's ``transaction`` and ``put`` commands directly (no client library)::

    transaction <key> <sid> BEGIN <timeout> <opaque>          (sent with the first put)
    put <topic> <partition> <len> <flag> <checksum> <key> <opaque>\\r\\n<body>
    transaction <key> <sid> END <opaque>                      (pipelined with PREPARE)
    transaction <key> <sid> PREPARE <opaque>                  -> "0" XA_OK | "3" XA_RDONLY
    transaction <key> <sid> COMMIT_ONE_PHASE|COMMIT_TWO_PHASE|ROLLBACK|FORGET <opaque>
    transaction null <sid> RECOVER <uniqueQualifier> <opaque> -> keys joined by \\r\\n

``key`` is ``XID:<formatId>:<hex gtrid>:<hex bqual>:<uniqueQualifier>``. Errors come back as
``500 XAException:code=<n>,msg=<text>`` and are mapped by
:func:`~notify.xa.errors.from_xa_code`. A branch that never sent a message never reaches the
broker at all: it votes READ_ONLY without a round trip.
"""

from __future__ import annotations

import itertools
import secrets
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from notify.errors import ClientError, ProtocolError, TransactionError
from notify.protocol import records
from notify.protocol.frames import Response, encode_line, encode_put
from notify.protocol.keys import Xid, parse_xid
from notify.protocol.replies import (
    PutAck,
    XAFailure,
    parse_partition_count,
    parse_prepare_vote,
    parse_recover,
)
from notify.protocol.xa import XA_RDONLY
from notify.transport import (
    AuthenticationError,
    BlockingConnection,
    FrameBuilder,
    TLSError,
    TransportOptions,
)
from notify.xa.errors import (
    XAER_PROTO,
    BranchHeuristicError,
    HeuristicKind,
    ParticipantError,
    ParticipantUnavailableError,
    from_xa_code,
)
from notify.xa.ids import Scope, qualifier_of
from notify.xa.participant import Vote

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a message sent inside a branch will appear once committed."""

    topic: str
    partition: int
    msg_id: int


class BrokerProducer:
    """The application's view of a broker branch: :meth:`send` messages inside it."""

    def __init__(self, owner: BrokerParticipant):
        self._owner = owner

    def send(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        partition: int | None = None,
    ) -> SendResult:
        """Send one message in the current branch; visible only if the transaction commits.

        ``partition`` defaults to round robin over the topic's partitions. Raises
        :class:`~notify.xa.errors.ParticipantError` (the broker refused it) or
        :class:`~notify.xa.errors.ParticipantUnavailableError`.
        """
        return self._owner.send(topic, data, attribute, partition)


class BrokerParticipant:
    """An XA participant for one notify (or MetaQ) broker.

    ``unique_qualifier`` defaults to the coordinator id found in each gtrid (so ``RECOVER``
    returns only that coordinator's keys). ``secret`` authenticates first when the broker
    requires it (on every reconnect); ``tls`` is the TLS context to connect with
    (:func:`notify.transport.tls_context`).
    """

    def __init__(
        self,
        addr: str,
        *,
        secret: str | None = None,
        tls: ssl.SSLContext | None = None,
        unique_qualifier: str | None = None,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 30.0,
    ):
        self.addr = addr
        self.secret = secret
        self.unique_qualifier = unique_qualifier
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.session_id = "xa" + secrets.token_hex(6)
        try:
            options = TransportOptions(secret or None, tls, connect_timeout_s)
            self._conn = BlockingConnection(addr, options, request_timeout_s)
        except ClientError as e:
            raise ParticipantError(f"broker {addr}: {e}") from e
        self._producer = BrokerProducer(self)
        self._partitions: dict[str, int] = {}
        self._rr = itertools.count()
        # the current branch
        self._xid: Xid | None = None
        self._key = ""
        self._timeout_s = 0
        self._begun = False  # BEGIN reached the broker
        self._ended = False
        self._sent = 0
        self._last_key: tuple[Xid, str] | None = None

    # ------------------------------------------------------------------ plumbing

    @property
    def handle(self) -> BrokerProducer:
        """The producer bound to the current branch."""
        return self._producer

    def _key_of(self, xid: Xid) -> str:
        last = self._last_key
        if last is not None and last[0] == xid:  # the branch's own calls: computed once
            return last[1]
        uq = self.unique_qualifier or qualifier_of(xid.gtrid) or "null"
        key = xid.key(uq)
        self._last_key = (xid, key)
        return key

    def _exchange(self, builds: list[FrameBuilder]) -> list[Response]:
        """Send the frames in one write and return their replies in order."""
        try:
            return self._conn.exchange(builds)
        except (AuthenticationError, TLSError) as e:
            raise ParticipantError(f"broker {self.addr}: {e}") from e
        except ClientError as e:  # connection lost, timeout (the connection was dropped)
            raise ParticipantUnavailableError(f"broker {self.addr}: {e}") from e

    def _tx_frame(self, key: str, verb: str, *extra: object) -> FrameBuilder:
        sid = self.session_id
        return lambda o: encode_line("transaction", key, sid, verb, *extra, o)

    def _parse(self, parse: Callable[[bytes], T], body: bytes, what: str) -> T:
        try:
            return parse(body)
        except ProtocolError as e:
            raise ParticipantError(f"broker {self.addr}: {what}: {e}") from e

    @staticmethod
    def _check(r: Response, what: str) -> bytes:
        if r.code == 200:
            return r.body
        try:
            failure = XAFailure.parse(r.body)
        except ProtocolError:
            failure = None
        if failure is not None:
            code, text = failure.code, failure.message
            if code == XAER_PROTO and "HEURISTIC_" in text:  # decided by the broker's admin
                kind = (
                    HeuristicKind.COMMIT
                    if "HEURISTIC_COMMITTED" in text
                    else (HeuristicKind.ROLLBACK)
                )
                raise BranchHeuristicError(f"{what}: {text}", kind)
            raise from_xa_code(code, f"{what}: {text}")
        text = r.body.decode(errors="replace")
        if r.code in (503, 504):
            raise ParticipantUnavailableError(f"{what}: broker busy ({r.code}): {text}")
        raise ParticipantError(f"{what}: broker error {r.code}: {text}")

    # ------------------------------------------------------------------ the branch

    def start(self, xid: Xid, timeout_s: int) -> None:
        """Remember the branch; BEGIN goes out with the first message."""
        if self._xid is not None:
            raise ParticipantError(f"broker {self.addr}: a branch is already active")
        if self._conn.peer_closed():
            self._conn.drop()  # a pooled connection the broker closed (restart): reconnect lazily
        self._xid, self._key, self._timeout_s = xid, self._key_of(xid), max(1, timeout_s)
        self._begun = self._ended = False
        self._sent = 0

    def _partition_for(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            r = self._exchange([lambda o: encode_line("stats", topic, o)])[0]
            n = parse_partition_count(self._check(r, f"stats {topic}"))
            if not n:
                raise ParticipantError(f"broker {self.addr}: topic {topic!r} has no partitions")
            self._partitions[topic] = n
        return next(self._rr) % n

    def send(
        self, topic: str, data: bytes, attribute: str | None, partition: int | None
    ) -> SendResult:
        """See :meth:`BrokerProducer.send`."""
        if self._xid is None or self._ended:
            raise ParticipantError("send() outside an active transaction branch")
        if partition is None:
            partition = self._partition_for(topic)
        payload, flag = records.make_payload(bytes(data), attribute)
        frames: list[FrameBuilder] = []
        if not self._begun:
            frames.append(self._tx_frame(self._key, "BEGIN", self._timeout_s))
        key, crc, part = self._key, records.checksum(payload), partition
        frames.append(
            lambda o: encode_put(topic, part, payload, flag, o, checksum=crc, tx_key=key)
        )
        replies = self._exchange(frames)
        if not self._begun:
            self._check(replies[0], f"BEGIN {self._key}")
            self._begun = True
        body = self._check(replies[-1], f"put {topic}-{partition}")
        self._sent += 1
        ack = self._parse(PutAck.parse, body, f"put {topic}-{partition}")
        return SendResult(topic, ack.partition, ack.msg_id)

    def end(self, xid: Xid, success: bool) -> None:
        """Mark the branch ended; END is pipelined with the next command."""
        self._ended = True

    def _finish_branch(self) -> None:
        self._xid = None
        self._begun = self._ended = False

    def prepare(self, xid: Xid) -> Vote:
        """END + PREPARE in one round trip; READ_ONLY at once when nothing was sent."""
        if self._xid == xid and not self._begun:
            self._finish_branch()
            return Vote.READ_ONLY
        key = self._key_of(xid)
        replies = self._exchange([self._tx_frame(key, "END"), self._tx_frame(key, "PREPARE")])
        body = self._check(replies[1], f"PREPARE {key}")  # its error says more than END's
        self._check(replies[0], f"END {key}")
        if self._xid == xid:
            self._finish_branch()
        vote = self._parse(parse_prepare_vote, body, f"PREPARE {key}")
        return Vote.READ_ONLY if vote == XA_RDONLY else Vote.OK

    def commit(self, xid: Xid, one_phase: bool) -> None:
        """COMMIT_ONE_PHASE (after END) or COMMIT_TWO_PHASE."""
        key = self._key_of(xid)
        if one_phase:
            if self._xid == xid and not self._begun:
                self._finish_branch()
                return
            frames = [self._tx_frame(key, "END"), self._tx_frame(key, "COMMIT_ONE_PHASE")]
            replies = self._exchange(frames)
            if self._xid == xid:
                self._finish_branch()
            self._check(replies[1], f"COMMIT_ONE_PHASE {key}")
            self._check(replies[0], f"END {key}")
            return
        self._check(self._exchange([self._tx_frame(key, "COMMIT_TWO_PHASE")])[0], f"COMMIT {key}")

    def rollback(self, xid: Xid) -> None:
        """ROLLBACK (nothing to do for a branch that never reached the broker)."""
        if self._xid == xid:
            begun = self._begun
            self._finish_branch()
            if not begun:
                return
        key = self._key_of(xid)
        self._check(self._exchange([self._tx_frame(key, "ROLLBACK")])[0], f"ROLLBACK {key}")

    def recover(self, scope: Scope) -> list[Xid]:
        """``RECOVER <uniqueQualifier>``, filtered by ``scope``."""
        uq = self.unique_qualifier or scope.unique_qualifier
        sid = self.session_id
        frame: FrameBuilder = lambda o: encode_line("transaction", "null", sid, "RECOVER", uq, o)  # noqa: E731
        body = self._check(self._exchange([frame])[0], "RECOVER")
        out = []
        for line in parse_recover(body):
            try:
                xid, _ = parse_xid(line)
            except TransactionError:  # not an XA key: not ours
                continue
            if scope.owns(xid):
                out.append(xid)
        return out

    def forget(self, xid: Xid) -> None:
        """FORGET a heuristically completed branch."""
        key = self._key_of(xid)
        self._check(self._exchange([self._tx_frame(key, "FORGET")])[0], f"FORGET {key}")

    def close(self) -> None:
        """Say ``quit`` and close the connection; never raises."""
        self._conn.close()

    def __repr__(self) -> str:
        return f"<BrokerParticipant {self.addr}>"
