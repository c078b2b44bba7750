"""An idempotent producer's identity, claimed on each connection before its first put.

The broker refuses a put whose records name a producer id that its connection has not
claimed (README "Protocol notes", :mod:`notify.protocol.identity`). A producer therefore
holds one :class:`ProducerIdentity` and calls :meth:`ProducerIdentity.ensure` with the
connection it is about to put through: the first call on a connection sends the
``producer`` verb and waits for its answer, later ones cost a dictionary lookup. A new
connection (a reconnect, a restarted broker, a promoted slave) is claimed again with the
same secret, epoch and instance: the same instance re-associates, it never fences itself.

* ``ProducerIdentity()``: anonymous, a random secret drawn per instance (the id is
  ``~<tag>``); nobody else can claim it.
* ``ProducerIdentity("shard-3", secret)``: named, shared by the instances that take over
  from each other; the newest epoch (default: this instance's start time in microseconds)
  holds it and older instances' claims and puts are answered ``409 fenced`` on every broker
  it was claimed on. The claim's answer holds the last sequence the broker stored per
  partition for the identity, to go on from (:meth:`ProducerIdentity.sequences`).

:func:`put_sequenced` sends one batch under an identity with explicit sequence numbers
(what an outbox relay needs: re-sending a batch the old instance stored is answered with
the stored ids and offsets, never stored twice).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

from notify.errors import BrokerError, ClientError, ProducerFencedError, ProtocolError
from notify.protocol import records as rec
from notify.protocol.identity import NO_INSTANCE, ClaimReply, encode_claim, producer_id
from notify.protocol.properties import decode_attribute
from notify.protocol.replies import MultiPutAck

from ._message import build_payload
from .core import wire
from .transport import AsyncConnection

T = TypeVar("T")


def broker_error(code: int, body: bytes) -> BrokerError:
    """The error of a non-200 reply to a claim or a put: 409 (a put's or claim's only one)
    is :class:`~notify.errors.ProducerFencedError`."""
    text = body.decode("utf-8", "replace")
    return ProducerFencedError(code, text) if code == 409 else BrokerError(code, text)


class ProducerIdentity:
    """Who an idempotent producer is on the wire (module doc).

    ``name`` None: anonymous (``secret`` and ``epoch`` must be None). Else ``secret`` is
    required (16-256 printable ASCII characters, e.g. ``secrets.token_urlsafe(24)``: its
    hash is public in every message's producer id, so it must not be guessable) and
    ``epoch`` orders the instances (default: now in microseconds; a relay may pass the
    epoch of its leader election)."""

    def __init__(
        self, name: str | None = None, secret: str | None = None, epoch: int | None = None
    ):
        if name is None:
            if secret is not None or epoch is not None:
                raise ClientError("an anonymous producer identity takes no secret or epoch")
            name, secret, epoch, instance = "", secrets.token_hex(16), 0, NO_INSTANCE
        else:
            if not name:
                raise ClientError("a producer name is at least one character")
            if secret is None:
                raise ClientError(f"producer name {name!r} needs a producer secret")
            epoch = time.time_ns() // 1000 if epoch is None else epoch
            if not 0 <= epoch < 2**63:
                raise ClientError(f"producer epoch {epoch} is not in 0..2^63-1")
            instance = secrets.token_hex(8)
        try:
            self.producer_id = producer_id(name, secret)
        except ValueError as e:
            raise ClientError(str(e)) from None
        self.name = name
        self.named = bool(name)
        self.epoch = epoch
        self.instance = instance
        self._secret = secret
        self._claims: weakref.WeakKeyDictionary[AsyncConnection, ClaimReply] = (
            weakref.WeakKeyDictionary()
        )
        self._claiming: weakref.WeakKeyDictionary[
            AsyncConnection, asyncio.Future[ClaimReply]
        ] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:  # never the secret
        return f"ProducerIdentity({self.producer_id!r}, epoch={self.epoch})"

    def claimed(self, conn: AsyncConnection) -> ClaimReply | None:
        """The broker's answer to this identity's claim on ``conn`` (None: not claimed)."""
        return self._claims.get(conn)

    async def ensure(self, conn: AsyncConnection, timeout_s: float) -> ClaimReply:
        """Claim the identity on ``conn`` unless done already (concurrent callers share
        one claim). Raises :class:`~notify.errors.ProducerFencedError` when a newer
        instance holds it, :class:`~notify.errors.BrokerError` for another refusal, and
        the connection's errors."""
        got = self._claims.get(conn)
        if got is not None:
            return got
        pending = self._claiming.get(conn)
        if pending is None:
            pending = asyncio.ensure_future(self._claim(conn, timeout_s))
            self._claiming[conn] = pending
        try:
            return await asyncio.shield(pending)
        finally:
            if pending.done() and self._claiming.get(conn) is pending:
                del self._claiming[conn]

    async def _claim(self, conn: AsyncConnection, timeout_s: float) -> ClaimReply:
        r = await conn.request(
            lambda o: encode_claim(
                self.producer_id, self._secret, self.epoch, self.instance, o
            ),
            timeout_s,
        )
        if r.code == 400 and b"unknown command" in r.body.lower():
            # a broker from before identities: it takes puts unclaimed (and its own
            # duplicate check, if any, trusts them); nothing to go on from
            reply = ClaimReply(self.producer_id, self.epoch)
            self._claims[conn] = reply
            return reply
        if r.code != 200:
            raise broker_error(r.code, r.body)
        reply = _parsed(ClaimReply.parse, r.body)
        if reply.producer_id != self.producer_id:
            raise ClientError(f"broker claimed {reply.producer_id}, not {self.producer_id}")
        self._claims[conn] = reply
        return reply

    @staticmethod
    def sequences(reply: ClaimReply, topic: str) -> dict[int, int]:
        """The last sequence stored per partition of ``topic`` on the broker that gave
        ``reply`` (partitions the identity never wrote to are absent: start at 0)."""
        return {p: s for (t, p), s in reply.sequences.items() if t == topic}

    def stamp(self, payloads: Sequence[tuple[bytes, int]], first_seq: int) -> bytes:
        """The records of ``payloads`` (``(payload, flag)`` as :func:`build_payload` makes
        them) carrying this identity and sequences ``first_seq, first_seq + 1, ...``: the
        body of one mput."""
        out = []
        for i, (payload, flag) in enumerate(payloads):
            text, body = rec.split_payload(payload, flag)
            props = decode_attribute(text, flag)
            new, nflag = build_payload(
                body, props.attribute, props.key, props.headers, self.producer_id, first_seq + i
            )
            out.append(rec.encode(0, nflag, new))
        return b"".join(out)


async def put_sequenced(
    conn: AsyncConnection,
    identity: ProducerIdentity,
    topic: str,
    partition: int,
    payloads: Sequence[tuple[bytes, int]],
    first_seq: int,
    timeout_s: float,
) -> MultiPutAck:
    """Put ``payloads`` to broker-local ``partition`` of ``topic`` through ``conn`` as one
    mput under ``identity`` with sequences from ``first_seq`` (the identity claimed first if
    needed). A batch the broker already stored (the same sequences: a retry, or an older
    instance's batch re-sent by a newer one) is answered with the stored ids and offsets.
    Raises :class:`~notify.errors.ProducerFencedError`, :class:`~notify.errors.BrokerError`
    or the connection's errors."""
    if not payloads:
        raise ClientError("put_sequenced needs at least one message")
    await identity.ensure(conn, timeout_s)
    body = identity.stamp(payloads, first_seq)
    n = len(payloads)
    r = await conn.request(wire.mput(topic, partition, body, n), timeout_s)
    ack = wire.mput_ack(r, n)  # (409: ProducerFencedError)
    if isinstance(ack, ClientError):
        raise ack
    return ack


def _parsed(parse: Callable[[bytes], T], body: bytes) -> T:
    """``parse(body)``, a malformed reply raising :class:`~notify.errors.ClientError`."""
    try:
        return parse(body)
    except ProtocolError as e:
        raise ClientError(str(e)) from None
