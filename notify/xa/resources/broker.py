"""The notify broker as an XA participant, over a blocking
:class:`~notify.client.transport.BlockingConnection` (shared secret and TLS as configured).

The branch is one client transaction: the frames, what their replies mean and the branch's
state are the client's transaction core's (:class:`~notify.client.core.transaction.TxCore`,
the one the producers drive); this module moves the bytes and translates the client's errors
into :mod:`notify.xa.errors` at the boundary. On the wire (MetaQ's commands)::

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
from dataclasses import dataclass

from notify.client import TransactionConnectionError, XAError
from notify.client.core import wire
from notify.client.core.states import TxEvent
from notify.client.core.transaction import Outcome, Resolved, TxCore
from notify.client.core.types import Partition
from notify.client.transport import (
    AuthenticationError,
    BlockingConnection,
    TLSError,
    TransportOptions,
)
from notify.errors import (
    BrokerError,
    ClientError,
    ConnectionLostError,
    NotifyError,
    ProtocolError,
    RequestTimeoutError,
    TransactionError,
)
from notify.protocol import records
from notify.protocol.frames import FrameBuilder, Response, encode_line
from notify.protocol.keys import Xid, parse_xid
from notify.protocol.replies import parse_partition_count, parse_recover
from notify.protocol.xa import XA_RDONLY
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
    (:func:`notify.client.transport.tls_context`).
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
        # the current branch: its xid and its transaction core
        self._xid: Xid | None = None
        self._tx: TxCore[None] | None = None
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

    def _current(self, xid: Xid) -> TxCore[None] | None:
        """The current branch's core when it is ``xid``'s."""
        return self._tx if self._xid == xid else None

    def _exchange(self, builds: list[FrameBuilder]) -> list[Response]:
        """Send the frames in one write and return their replies in order."""
        try:
            return self._conn.exchange(builds)
        except (AuthenticationError, TLSError) as e:
            raise ParticipantError(f"broker {self.addr}: {e}") from e
        except ClientError as e:  # connection lost, timeout (the connection was dropped)
            raise ParticipantUnavailableError(f"broker {self.addr}: {e}") from e

    def _command(self, key: str, verb: str) -> FrameBuilder:
        return wire.command(key, self.session_id, verb)

    @staticmethod
    def _check(outcome: Outcome, what: str, key: str | None = None) -> None:
        """Raise the :mod:`notify.xa.errors` class of a reply that is not a 200."""
        if isinstance(outcome, Response):
            if outcome.code == 200:
                return
            err: BaseException = wire.reply_error(outcome, key)
        else:
            err = outcome
        raise _xa_error(err, what) from None

    # ------------------------------------------------------------------ the branch

    def start(self, xid: Xid, timeout_s: int) -> None:
        """Remember the branch; BEGIN goes out with the first message."""
        if self._xid is not None:
            raise ParticipantError(f"broker {self.addr}: a branch is already active")
        if self._conn.peer_closed():
            self._conn.drop()  # a pooled connection the broker closed (restart): reconnect lazily
        key = self._key_of(xid)
        self._tx = TxCore(key, self.session_id, max(1, timeout_s))
        self._tx.bind(-1, self.addr)
        self._xid = xid

    def _partition_for(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            r = self._exchange([lambda o: encode_line("stats", topic, o)])[0]
            self._check(r, f"stats {topic}")
            n = parse_partition_count(r.body)
            if not n:
                raise ParticipantError(f"broker {self.addr}: topic {topic!r} has no partitions")
            self._partitions[topic] = n
        return next(self._rr) % n

    def send(
        self, topic: str, data: bytes, attribute: str | None, partition: int | None
    ) -> SendResult:
        """See :meth:`BrokerProducer.send`."""
        tx = self._tx
        if tx is None or not tx.open:
            raise ParticipantError("send() outside an active transaction branch")
        if partition is None:
            partition = self._partition_for(topic)
        try:
            payload, flag = records.make_payload(bytes(data), attribute)
        except ValueError as e:
            raise ParticipantError(f"broker {self.addr}: {e}") from e
        tx.add(topic, Partition(-1, partition, self.addr), payload, flag, None)
        flight = tx.flight(mput=False, checksum=True)
        try:
            replies: list[Outcome] = list(self._exchange(flight.frames))
        except ParticipantUnavailableError as e:  # the broker rolls the branch back
            for step in flight.steps:
                tx.on_reply(step, ConnectionLostError(str(e)))
            raise
        resolved: Resolved[None] = []
        for step, r in zip(flight.steps, replies, strict=True):
            resolved += tx.on_reply(step, r)
        result = resolved[-1][1]  # the put's (BEGIN resolves nothing)
        if not result.success:
            raise _xa_error(result.error, f"put {topic}-{partition}")
        return SendResult(topic, partition, result.msg_id)

    def end(self, xid: Xid, success: bool) -> None:
        """Mark the branch ended; END is pipelined with the next command."""
        tx = self._current(xid)
        if tx is not None and tx.open:
            tx.fire(TxEvent.END)

    def _finish_branch(self) -> None:
        self._xid = self._tx = None

    def _begun(self, xid: Xid) -> bool | None:
        """Whether the current branch ``xid`` reached the broker (None: not current)."""
        tx = self._current(xid)
        return None if tx is None else tx.begin_ok

    def prepare(self, xid: Xid) -> Vote:
        """END + PREPARE in one round trip; READ_ONLY at once when nothing was sent."""
        if self._begun(xid) is False:
            self._finish_branch()
            return Vote.READ_ONLY
        key = self._key_of(xid)
        replies = self._exchange([self._command(key, wire.END), self._command(key, wire.PREPARE)])
        if self._xid == xid:
            self._finish_branch()
        self._check(replies[1], f"PREPARE {key}", key)  # its error says more than END's
        self._check(replies[0], f"END {key}", key)
        vote = wire.prepare_vote(replies[1], key)
        if isinstance(vote, ClientError):
            raise ParticipantError(f"broker {self.addr}: PREPARE {key}: {vote}")
        return Vote.READ_ONLY if vote == XA_RDONLY else Vote.OK

    def commit(self, xid: Xid, one_phase: bool) -> None:
        """COMMIT_ONE_PHASE (after END) or COMMIT_TWO_PHASE."""
        key = self._key_of(xid)
        if not one_phase:
            r = self._exchange([self._command(key, wire.COMMIT_TWO_PHASE)])[0]
            self._check(r, f"COMMIT {key}", key)
            return
        if self._begun(xid) is False:
            self._finish_branch()
            return
        frames = [self._command(key, wire.END), self._command(key, wire.COMMIT_ONE_PHASE)]
        replies = self._exchange(frames)
        if self._xid == xid:
            self._finish_branch()
        self._check(replies[1], f"COMMIT_ONE_PHASE {key}", key)
        self._check(replies[0], f"END {key}", key)

    def rollback(self, xid: Xid) -> None:
        """ROLLBACK (nothing to do for a branch that never reached the broker)."""
        begun = self._begun(xid)
        if begun is not None:
            self._finish_branch()
            if not begun:
                return
        key = self._key_of(xid)
        r = self._exchange([self._command(key, wire.ROLLBACK)])[0]
        self._check(r, f"ROLLBACK {key}", key)

    def recover(self, scope: Scope) -> list[Xid]:
        """``RECOVER <uniqueQualifier>``, filtered by ``scope``."""
        uq = self.unique_qualifier or scope.unique_qualifier
        frame = wire.command("null", self.session_id, wire.RECOVER, uq)
        r = self._exchange([frame])[0]
        self._check(r, "RECOVER")
        out = []
        for line in parse_recover(r.body):
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
        r = self._exchange([self._command(key, wire.FORGET)])[0]
        self._check(r, f"FORGET {key}", key)

    def close(self) -> None:
        """Say ``quit`` and close the connection; never raises."""
        self._conn.close()

    def __repr__(self) -> str:
        return f"<BrokerParticipant {self.addr}>"


def _xa_error(err: BaseException | None, what: str) -> NotifyError:
    """The :mod:`notify.xa.errors` class of a client error (the boundary's translation)."""
    if isinstance(err, XAError):
        code, text = err.code, err.text
        if code == XAER_PROTO and "HEURISTIC_" in text:  # decided by the broker's admin
            kind = HeuristicKind.COMMIT if "HEURISTIC_COMMITTED" in text else HeuristicKind.ROLLBACK
            return BranchHeuristicError(f"{what}: {text}", kind)
        return from_xa_code(code, f"{what}: {text}")
    if isinstance(err, BrokerError):
        text = err.text
        if err.code in (503, 504):
            return ParticipantUnavailableError(f"{what}: broker busy ({err.code}): {text}")
        return ParticipantError(f"{what}: broker error {err.code}: {text}")
    if isinstance(err, ConnectionLostError | RequestTimeoutError | TransactionConnectionError):
        return ParticipantUnavailableError(f"{what}: {err}")
    if isinstance(err, ProtocolError):
        return ParticipantError(f"{what}: {err}")
    return ParticipantError(f"{what}: {err}")
