"""The notify broker as an XA participant, over its own blocking socket.

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

import contextlib
import itertools
import re
import secrets
import socket
from dataclasses import dataclass
from typing import Final

from notify.errors import ProtocolError, TransactionError
from notify.protocol import records
from notify.protocol.frames import Response, ResponseParser, encode_line, encode_put
from notify.protocol.keys import Xid, parse_xid
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
from notify.xa.resources._alive import peer_closed

DEFAULT_PORT: Final = 8123
_XA_ERR: Final = re.compile(rb"XAException:code=(-?\d+),msg=(.*)", re.S)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a message sent inside a branch will appear once committed."""

    topic: str
    partition: int
    msg_id: int


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``meta://host:port`` or ``notify://host:port`` -> ``(host, port)``."""
    if "://" in addr:
        addr = addr.split("://", 1)[1]
    addr = addr.rstrip("/")
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, DEFAULT_PORT
    return host, int(port)


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
    requires it.
    """

    def __init__(
        self,
        addr: str,
        *,
        secret: str | None = None,
        unique_qualifier: str | None = None,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 30.0,
    ):
        self.addr = addr
        self.host, self.port = parse_addr(addr)
        self.secret = secret
        self.unique_qualifier = unique_qualifier
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.session_id = "xa" + secrets.token_hex(6)
        self._sock: socket.socket | None = None
        self._parser = ResponseParser()
        self._opaque = itertools.count(1)
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

    # ------------------------------------------------------------------ plumbing

    @property
    def handle(self) -> BrokerProducer:
        """The producer bound to the current branch."""
        return self._producer

    def _key_of(self, xid: Xid) -> str:
        uq = self.unique_qualifier or qualifier_of(xid.gtrid) or "null"
        return xid.key(uq)

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        try:
            s = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except OSError as e:
            raise ParticipantUnavailableError(f"broker {self.addr}: cannot connect: {e}") from e
        s.settimeout(self.request_timeout_s)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = s
        self._parser = ResponseParser()
        if self.secret:
            r = self._exchange([encode_line("auth", self.secret, self._next())])[0]
            if r.code != 200:
                self._drop()
                raise ParticipantError(f"broker {self.addr}: authentication refused")
        return s

    def _next(self) -> int:
        return next(self._opaque) & 0x7FFFFFFF

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _exchange(self, frames: list[bytes]) -> list[Response]:
        """Send ``frames`` in one write and return their replies in order."""
        sock = self._connect()
        try:
            sock.sendall(b"".join(frames))
            replies: list[Response] = []
            while len(replies) < len(frames):
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionResetError("the broker closed the connection")
                replies.extend(r for r in self._parser.feed(data) if r.kind != "check")
        except (OSError, ProtocolError) as e:
            self._drop()
            raise ParticipantUnavailableError(f"broker {self.addr}: {e}") from e
        return replies

    def _tx_frame(self, key: str, verb: str, *extra: object) -> bytes:
        return encode_line("transaction", key, self.session_id, verb, *extra, self._next())

    @staticmethod
    def _check(r: Response, what: str) -> bytes:
        if r.code == 200:
            return r.body
        m = _XA_ERR.match(r.body)
        if m:
            code, text = int(m.group(1)), m.group(2).decode(errors="replace")
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
        if self._sock is not None and peer_closed(self._sock.fileno()):
            self._drop()  # a pooled connection the broker closed (restart): reconnect lazily
        self._xid, self._key, self._timeout_s = xid, self._key_of(xid), max(1, timeout_s)
        self._begun = self._ended = False
        self._sent = 0

    def _partition_for(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            r = self._exchange([encode_line("stats", topic, self._next())])[0]
            body = self._check(r, f"stats {topic}")
            for line in body.decode(errors="replace").split("\r\n"):
                k, _, v = line.partition(" ")
                if k == "partitions":
                    n = int(v)
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
        frames = []
        if not self._begun:
            frames.append(self._tx_frame(self._key, "BEGIN", self._timeout_s))
        frames.append(
            encode_put(
                topic,
                partition,
                payload,
                flag,
                self._next(),
                checksum=records.checksum(payload),
                tx_key=self._key,
            )
        )
        replies = self._exchange(frames)
        if not self._begun:
            self._check(replies[0], f"BEGIN {self._key}")
            self._begun = True
        body = self._check(replies[-1], f"put {topic}-{partition}")
        self._sent += 1
        parts = body.split()
        return SendResult(topic, int(parts[1]), int(parts[0]))

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
        return Vote.READ_ONLY if body.strip() == b"3" else Vote.OK

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
        frame = encode_line("transaction", "null", self.session_id, "RECOVER", uq, self._next())
        body = self._check(self._exchange([frame])[0], "RECOVER")
        out = []
        for line in body.decode(errors="replace").split("\r\n"):
            if not line:
                continue
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
        """Say ``quit`` and close the socket; never raises."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.sendall(b"quit\r\n")
        self._drop()

    def __repr__(self) -> str:
        return f"<BrokerParticipant {self.addr}>"
