"""The outbox relay's publisher over a synchronous session (:class:`SessionPublisher`).

Implements :class:`notify.outbox.Publisher` structurally: a batch of outbox records goes
to one partition as one ``mput`` whose records carry the relay shard's producer id and
explicit sequence numbers (the idempotent producer's attribute-block form,
:func:`notify.protocol.properties.with_producer`), so the broker stores a re-sent batch
once and answers it with what it stored. The records are stamped and framed in the
calling thread; the request runs on the session's event loop (its connection pool and
router), one reply per batch.

``claim`` answers None: this broker's idempotent producers have no named claim yet, so
the relay's own records (the sequences it keeps in the database) are the only source.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence

from notify.errors import (
    BrokerError,
    ClientError,
    ConnectionLostError,
    ProtocolError,
    RequestTimeoutError,
)
from notify.outbox.publisher import PublishAck, PublishError
from notify.protocol import records as rec
from notify.protocol.frames import encode_mput
from notify.protocol.properties import producer_member, with_producer
from notify.protocol.replies import MultiPutAck

from ._connection import ConnectionPool
from ._loopthread import LoopThread
from ._routing import Partition, TopicRouter

#: Broker reply codes a re-sent batch may get past (busy, unavailable, storage trouble).
RETRIABLE_CODES = frozenset({500, 502, 503, 504})


def stamped_body(records: Sequence[tuple[int, bytes]], identity: str, first_seq: int) -> bytes:
    """The ``mput`` body of ``records`` with the producer ``identity`` and sequences from
    ``first_seq`` in their attribute blocks (runs of one flag encoded in one go)."""
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


class SessionPublisher:
    """:class:`notify.outbox.Publisher` over a session's router and connections
    (``session.publisher()``). ``timeout_s``: how long a batch waits for its reply."""

    def __init__(self, router: TopicRouter, pool: ConnectionPool, lt: LoopThread, timeout_s: float):
        self._router = router
        self._pool = pool
        self._lt = lt
        self.timeout_s = timeout_s

    def partitions(self, topic: str) -> list[str]:
        """The topic's partitions (``"<brokerId>-<partition>"``, sorted)."""
        parts = self._router.cached(topic)
        if parts is None:
            try:
                parts = self._lt.run(self._router.partitions(topic), self.timeout_s)
            except concurrent.futures.TimeoutError:
                raise PublishError(f"partitions of {topic}: no answer", retriable=True) from None
            except BrokerError as e:
                raise PublishError(str(e), code=e.code, retriable=e.retriable) from e
            except ClientError as e:
                raise PublishError(str(e), retriable=True) from e
        return [str(p) for p in parts]

    def claim(self, identity: str) -> Mapping[tuple[str, str], int] | None:
        """None: the broker has no named identities to claim (see the module doc)."""
        producer_member(identity)  # the identity must fit the attribute block
        return None

    def publish(
        self,
        identity: str,
        topic: str,
        partition: str,
        records: Sequence[tuple[int, bytes]],
        first_seq: int,
    ) -> concurrent.futures.Future[PublishAck]:
        """One ``mput`` of ``records`` under ``identity`` from ``first_seq``."""
        body = stamped_body(records, identity, first_seq)
        return self._lt.submit(self._publish(topic, partition, body, len(records)))

    async def _publish(self, topic: str, partition: str, body: bytes, count: int) -> PublishAck:
        try:
            parts = await self._router.partitions(topic)
        except BrokerError as e:
            raise PublishError(str(e), code=e.code, retriable=e.retriable) from e
        except ClientError as e:
            raise PublishError(str(e), retriable=True) from e
        part = _find(parts, partition)
        if part is None:
            self._router.invalidate(topic)
            raise PublishError(f"{topic} has no partition {partition}", code=404)
        try:
            conn = await self._pool.get(part.address)
        except ClientError as e:
            raise PublishError(f"{part.address}: {e}", retriable=True) from e
        try:
            r = await conn.request(
                lambda o: encode_mput(topic, part.partition, body, count, o), self.timeout_s
            )
        except (TimeoutError, ConnectionLostError, RequestTimeoutError) as e:
            if isinstance(e, ConnectionLostError):
                self._pool.discard(conn)
            raise PublishError(f"{part.address}: {e}", retriable=True) from e
        if r.code != 200:
            text = r.body.decode("utf-8", "replace")
            if r.code == 404:
                self._router.invalidate(topic)
            raise PublishError(
                f"broker {part.address} refused {count} record(s) for {topic} {partition}: "
                f"{r.code} {text}",
                code=r.code,
                retriable=r.code in RETRIABLE_CODES,
            )
        try:
            ack = MultiPutAck.parse(r.body)
        except ProtocolError as e:  # an unreadable reply: not known to be stored
            raise PublishError(f"unreadable mput reply: {e}", retriable=True) from e
        if ack.count != count:
            raise PublishError(
                f"mput reply acknowledges {ack.count} of {count} records", retriable=True
            )
        return PublishAck(ack.first_msg_id, ack.first_offset, ack.count)

    def close(self) -> None:
        """Nothing of its own to release (the session owns the connections)."""


def _find(parts: Sequence[Partition], name: str) -> Partition | None:
    for p in parts:
        if str(p) == name:
            return p
    return None
