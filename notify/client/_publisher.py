"""The outbox relay's publisher over a synchronous session (:class:`SessionPublisher`).

Implements :class:`notify.outbox.Publisher` structurally. A relay shard's identity is a
named idempotent-producer identity (:mod:`notify.protocol.identity`): its id
``<name>~<tag>`` comes from the name and secret the outbox keeps, its epoch is the
shard's leadership epoch, so a new leader's claim fences the old one on every broker.
Each connection claims the identity (the ``producer`` verb) before its first batch, in
the same write. A batch goes to one partition as one ``mput`` whose records carry the
producer id and explicit sequence numbers (appended to their properties,
:func:`notify.protocol.properties.with_producer`), so the broker stores a re-sent batch
once and answers it with what it stored. The records are stamped and framed, and the
requests sent and answered, in the calling thread.
"""

from __future__ import annotations

import concurrent.futures
import functools
import secrets
import threading
import weakref
from collections.abc import Mapping, Sequence

from notify.errors import BrokerError, ClientError, ProtocolError
from notify.outbox.publisher import Batch, Identity, PublishAck, PublishError
from notify.protocol import records as rec
from notify.protocol.frames import FrameBuilder, Response
from notify.protocol.identity import ClaimReply, encode_claim, producer_id
from notify.protocol.properties import producer_member, with_producer

from ._connection import ConnectionPool, epoch_frame
from ._loopthread import LoopThread
from ._routing import Partition, TopicRouter
from .core import wire
from .transport import BlockingConnection

#: Broker reply codes a re-sent batch may get past (busy, unavailable, storage trouble).
RETRIABLE_CODES = frozenset({500, 502, 503, 504})


def stamped_body(records: Sequence[tuple[int, bytes]], identity: str, first_seq: int) -> bytes:
    """The ``mput`` body of ``records`` with the producer id ``identity`` and sequences
    from ``first_seq`` in their attribute blocks (runs of one flag encoded in one go)."""
    member = producer_member(identity)
    out: list[bytes] = []
    run: list[bytes] = []
    run_flag = -1
    seq = first_seq
    for flag, payload in records:
        f, p = with_producer(flag, payload, member, seq)
        seq += 1
        if f != run_flag and run:
            out.append(rec.encode_batch(run, run_flag))
            run = []
        run_flag = f
        run.append(p)
    if run:
        out.append(rec.encode_batch(run, run_flag))
    return b"".join(out)


def _refusal(address: str, what: str, r: Response) -> PublishError:
    text = r.body.decode("utf-8", "replace")
    return PublishError(
        f"broker {address} refused {what}: {r.code} {text}",
        code=r.code,
        retriable=r.code in RETRIABLE_CODES or (r.code == 403 and "not claimed" in text),
        fenced=r.code == 409,
    )


class SessionPublisher:
    """:class:`notify.outbox.Publisher` over a session (``session.publisher()``).

    The batches go over blocking connections of the calling thread (one per thread and
    broker, in this publisher's own lane of the session's
    :class:`~notify.client._connection.ConnectionPool`, with the session's secret, TLS and
    failover epochs): the batches of one call for one broker leave in one write and their
    replies are read on the same thread, with no hop through the session's event loop.
    Partitions come from the session's router. ``timeout_s``: how long a call waits for
    its replies."""

    def __init__(
        self,
        router: TopicRouter,
        lt: LoopThread,
        pool: ConnectionPool,
        timeout_s: float,
    ):
        self._router = router
        self._lt = lt
        self._pool = pool
        #: the pool lane of this publisher's connections (closed with it)
        self._lane = f"publisher-{secrets.token_hex(4)}"
        self.timeout_s = timeout_s
        #: per identity and epoch: the producer id and this publisher's instance token
        self._ids: dict[Identity, tuple[str, str]] = {}
        #: the identity (id, epoch) each connection claimed on its current socket
        self._claimed: weakref.WeakKeyDictionary[BlockingConnection, tuple[str, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def _id(self, identity: Identity) -> tuple[str, str]:
        with self._lock:
            got = self._ids.get(identity)
            if got is None:
                try:
                    pid = producer_id(identity.name, identity.secret)
                except ValueError as e:
                    raise PublishError(f"identity {identity}: {e}") from None
                got = self._ids[identity] = (pid, secrets.token_hex(8))
            return got

    def _claim_frame(self, identity: Identity) -> FrameBuilder:
        pid, instance = self._id(identity)
        return functools.partial(
            encode_claim, pid, identity.secret, identity.epoch, instance
        )

    def partitions(self, topic: str) -> list[str]:
        """The topic's partitions (``"<brokerId>-<partition>"``, sorted)."""
        return [str(p) for p in self._partitions(topic)]

    def _partitions(self, topic: str) -> list[Partition]:
        parts = self._router.cached(topic)
        if parts is not None:
            return parts
        try:
            return self._lt.run(self._router.partitions(topic), self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise PublishError(f"partitions of {topic}: no answer", retriable=True) from None
        except BrokerError as e:
            raise PublishError(str(e), code=e.code, retriable=e.retriable) from e
        except ClientError as e:
            raise PublishError(str(e), retriable=True) from e

    def claim(
        self, identity: Identity, topics: Sequence[str]
    ) -> Mapping[tuple[str, str], int] | None:
        """Claim ``identity`` on the brokers of ``topics`` now (connections opened later
        claim it before their first batch); the last sequence they stored for it per
        (topic, ``"<brokerId>-<partition>"``). Raises :class:`PublishError` (``fenced``
        when a newer epoch holds it; retriable when a broker cannot be reached)."""
        pid, _instance = self._id(identity)
        by_addr: dict[str, set[int]] = {}
        for topic in topics:
            try:
                parts = self._partitions(topic)
            except PublishError as e:
                if e.code == 404:
                    continue  # a topic gone: nothing of it to check
                raise
            for p in parts:
                by_addr.setdefault(p.address, set()).add(p.broker_id)
        out: dict[tuple[str, str], int] = {}
        for address, broker_ids in by_addr.items():
            reply = self._claim_on(address, identity, pid)
            bid = min(broker_ids)
            for (topic, part), seq in reply.sequences.items():
                out[(topic, f"{bid}-{part}")] = seq
        return out

    def _claim_on(self, address: str, identity: Identity, pid: str) -> ClaimReply:
        conn = self._pool.blocking(address, self._lane)
        if conn is None:
            raise PublishError(f"{address}: not reachable just now", retriable=True)
        try:
            (r,) = conn.exchange([self._claim_frame(identity)], self.timeout_s)
        except ClientError as e:
            self._pool.blocking_failed(conn)
            raise PublishError(f"{address}: {e}", retriable=True) from e
        if r.code != 200:
            raise _refusal(address, f"the claim of {pid}", r)
        try:
            reply = ClaimReply.parse(r.body)
        except ProtocolError as e:
            raise PublishError(f"{address}: {e}", retriable=True) from e
        self._claimed[conn] = (pid, identity.epoch)
        return reply

    def publish(
        self, identity: Identity, batches: Sequence[Batch]
    ) -> list[PublishAck | PublishError]:
        """One ``mput`` per batch, pipelined per broker (see the class doc)."""
        pid, _instance = self._id(identity)
        out: list[PublishAck | PublishError | None] = [None] * len(batches)
        by_addr: dict[str, list[tuple[int, Partition, bytes, int]]] = {}
        for i, b in enumerate(batches):
            try:
                part = _find(self._partitions(b.topic), b.partition)
            except PublishError as e:
                out[i] = e
                continue
            if part is None:
                self._router.invalidate(b.topic)
                out[i] = PublishError(f"{b.topic} has no partition {b.partition}", code=404)
                continue
            body = stamped_body(b.records, pid, b.first_seq)
            by_addr.setdefault(part.address, []).append((i, part, body, len(b.records)))
        for address, items in by_addr.items():
            for i, res in zip(
                (it[0] for it in items),
                self._exchange(address, items, batches, identity),
                strict=True,
            ):
                out[i] = res
        return [r if r is not None else PublishError("not sent", retriable=True) for r in out]

    def _exchange(
        self,
        address: str,
        items: list[tuple[int, Partition, bytes, int]],
        batches: Sequence[Batch],
        identity: Identity,
    ) -> list[PublishAck | PublishError]:
        pool = self._pool
        conn = pool.blocking(address, self._lane)
        n = len(items)
        if conn is None:
            return [PublishError(f"{address}: not reachable just now", retriable=True)] * n
        pid, _instance = self._id(identity)
        builds: list[FrameBuilder] = []
        epoch = pool.owed_epoch(conn)
        if epoch is not None:
            builds.append(epoch_frame(*epoch))
        claim = not conn.is_open or self._claimed.get(conn) != (pid, identity.epoch)
        if claim:  # a new socket, or another identity: claimed in the same write
            builds.append(self._claim_frame(identity))
        for i, part, body, count in items:
            builds.append(wire.mput(batches[i].topic, part.partition, body, count))
        try:
            replies = conn.exchange(builds, self.timeout_s)
        except ClientError as e:  # lost, timed out, refused, TLS, authentication
            pool.blocking_failed(conn)
            self._claimed.pop(conn, None)
            return [PublishError(f"{address}: {e}", retriable=True)] * n
        if epoch is not None:
            first, replies = replies[0], replies[1:]
            if first.code != 200:
                pool.blocking_failed(conn)
                return [_refusal(address, "the epoch", first)] * n
            pool.blocking_declared[conn] = epoch[1]
        if claim:
            first, replies = replies[0], replies[1:]
            if first.code != 200:
                return [_refusal(address, f"the claim of {pid}", first)] * n
            self._claimed[conn] = (pid, identity.epoch)
        out = [
            self._answer(address, batches[i], r, count)
            for (i, _p, _b, count), r in zip(items, replies, strict=True)
        ]
        if any(isinstance(r, PublishError) and r.code == 403 for r in out):
            self._claimed.pop(conn, None)  # reconnected meanwhile: claim again next time
        return out

    def _answer(self, address: str, b: Batch, r: Response, count: int) -> PublishAck | PublishError:
        if r.code != 200:
            if r.code == 404:
                self._router.invalidate(b.topic)
            return _refusal(address, f"{count} record(s) for {b.topic} {b.partition}", r)
        ack = wire.mput_ack(r, count)
        if isinstance(ack, ClientError):  # an unreadable reply: not known to be stored
            return PublishError(f"unreadable mput reply: {ack}", retriable=True)
        return PublishAck(ack.first_msg_id, ack.first_offset, ack.count)

    def close(self) -> None:
        """Close this publisher's connections (not the session)."""
        self._pool.close_blocking_lane(self._lane)


def _find(parts: Sequence[Partition], name: str) -> Partition | None:
    for p in parts:
        if str(p) == name:
            return p
    return None
