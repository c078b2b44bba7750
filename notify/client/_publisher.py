"""The outbox relay's publisher over a synchronous session (:class:`SessionPublisher`).

Implements :class:`notify.outbox.Publisher` structurally: a batch of outbox records goes
to one partition as one ``mput`` whose records carry the relay shard's producer id and
explicit sequence numbers (the idempotent producer's attribute-block form,
:func:`notify.protocol.properties.with_producer`), so the broker stores a re-sent batch
once and answers it with what it stored. The records are stamped and framed, and the
requests sent and answered, in the calling thread.

``claim`` answers None: this broker's idempotent producers have no named claim yet, so
the relay's own records (the sequences it keeps in the database) are the only source.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Mapping, Sequence

from notify.errors import BrokerError, ClientError, ProtocolError
from notify.outbox.publisher import Batch, PublishAck, PublishError
from notify.protocol import records as rec
from notify.protocol.frames import Response, encode_line, encode_mput
from notify.protocol.properties import producer_member, with_producer
from notify.protocol.replies import MultiPutAck
from notify.transport import FrameBuilder

from ._direct import DirectPool
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
    """:class:`notify.outbox.Publisher` over a session (``session.publisher()``).

    The batches go over blocking connections of the calling thread (one per thread and
    broker, :class:`~notify.client._direct.DirectPool`, with the session's secret, TLS and
    failover epochs): the batches of one call for one broker leave in one write and their
    replies are read on the same thread, with no hop through the session's event loop.
    Partitions come from the session's router. ``timeout_s``: how long a call waits for
    its replies."""

    def __init__(
        self,
        router: TopicRouter,
        lt: LoopThread,
        direct: DirectPool,
        timeout_s: float,
    ):
        self._router = router
        self._lt = lt
        self._direct = direct
        self.timeout_s = timeout_s

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

    def claim(self, identity: str) -> Mapping[tuple[str, str], int] | None:
        """None: the broker has no named identities to claim (see the module doc)."""
        producer_member(identity)  # the identity must fit the attribute block
        return None

    def publish(self, identity: str, batches: Sequence[Batch]) -> list[PublishAck | PublishError]:
        """One ``mput`` per batch, pipelined per broker (see the class doc)."""
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
            body = stamped_body(b.records, identity, b.first_seq)
            by_addr.setdefault(part.address, []).append((i, part, body, len(b.records)))
        for address, items in by_addr.items():
            for i, res in zip(
                (it[0] for it in items), self._exchange(address, items, batches), strict=True
            ):
                out[i] = res
        return [r if r is not None else PublishError("not sent", retriable=True) for r in out]

    def _exchange(
        self,
        address: str,
        items: list[tuple[int, Partition, bytes, int]],
        batches: Sequence[Batch],
    ) -> list[PublishAck | PublishError]:
        pool = self._direct
        conn = pool.get(address)
        if conn is None:
            return [PublishError(f"{address}: not reachable just now", retriable=True)] * len(
                items
            )
        builds: list[FrameBuilder] = []
        epoch = pool.epoch_of(address) if pool.epoch_of is not None else None
        declare = epoch is not None and pool.declared.get(conn, 0) < epoch[1]
        if declare and epoch is not None:
            group, number = epoch
            builds.append(lambda o: encode_line("epoch", group, number, o))
        for i, part, body, count in items:
            builds.append(functools.partial(_mput, batches[i].topic, part.partition, body, count))
        try:
            replies = conn.exchange(builds, self.timeout_s)
        except ClientError as e:  # lost, timed out, refused, TLS, authentication
            pool.failed(conn)
            return [PublishError(f"{address}: {e}", retriable=True)] * len(items)
        if declare and epoch is not None:
            first, replies = replies[0], replies[1:]
            if first.code != 200:
                pool.failed(conn)
                text = first.body.decode("utf-8", "replace")
                return [PublishError(f"{address}: epoch refused: {text}", retriable=True)] * len(
                    items
                )
            pool.declared[conn] = epoch[1]
        return [
            self._answer(address, batches[i], r, count)
            for (i, _p, _b, count), r in zip(items, replies, strict=True)
        ]

    def _answer(self, address: str, b: Batch, r: Response, count: int) -> PublishAck | PublishError:
        if r.code != 200:
            text = r.body.decode("utf-8", "replace")
            if r.code == 404:
                self._router.invalidate(b.topic)
            return PublishError(
                f"broker {address} refused {count} record(s) for {b.topic} {b.partition}: "
                f"{r.code} {text}",
                code=r.code,
                retriable=r.code in RETRIABLE_CODES,
            )
        try:
            ack = MultiPutAck.parse(r.body)
        except ProtocolError as e:  # an unreadable reply: not known to be stored
            return PublishError(f"unreadable mput reply: {e}", retriable=True)
        if ack.count != count:
            return PublishError(
                f"mput reply acknowledges {ack.count} of {count} records", retriable=True
            )
        return PublishAck(ack.first_msg_id, ack.first_offset, ack.count)

    def close(self) -> None:
        """Close this publisher's connections (not the session)."""
        self._direct.close()


def _mput(topic: str, partition: int, body: bytes, count: int, opaque: int) -> bytes:
    return encode_mput(topic, partition, body, count, opaque)


def _find(parts: Sequence[Partition], name: str) -> Partition | None:
    for p in parts:
        if str(p) == name:
            return p
    return None
