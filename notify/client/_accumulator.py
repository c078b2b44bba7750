"""Where the producer's messages wait to be sent: one queue per global partition.

Messages are queued per partition in call order and picked up by that partition's pump
(:class:`~._sender.PartitionSender`). A message goes to the partition its selector picks;
without a key under the default selector, round robin by batch (sticky, as Kafka's KIP-480:
while the partition picked last has a send scheduled and less than a batch queued, the
message joins it, so a burst goes out as one frame instead of one per partition). Posts
(:meth:`Accumulator.post`) fill one run per partition while it waits at the tail of the
queue: a list append per message. A topic not routed yet parks its messages until the
router answers. Idempotent mode stamps each message with the producer id and the
partition's next sequence number (retries resend those very bytes). An ordered producer
resumes the spools an earlier run left (:mod:`._spool`) before it routes anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from notify.errors import ClientError
from notify.protocol import records as rec
from notify.protocol.properties import decode_attribute

from ._batch import BatchItem, Item, PostRun, Queued
from ._identity import ProducerIdentity
from ._message import Draft, Headers, Key, build_payload
from ._sender import PartitionSender, Sender, retriable
from ._spool import PartitionSpool, Spool, existing_spools
from .core.selectors import KeyHashSelector, PartitionSelector
from .core.types import Partition, SendResult

log = logging.getLogger("notify.client")


class Accumulator:
    """The per-partition queues of one producer (see the module docstring)."""

    def __init__(
        self, sender: Sender, selector: PartitionSelector, identity: ProducerIdentity | None
    ):
        self.s = sender
        self.delivery = sender.delivery
        self.router = sender.router
        self.config = sender.config
        self.selector = selector
        #: idempotent mode: the identity, its id and the next sequence number per partition
        self.identity = identity
        self.producer_id = identity.producer_id if identity is not None else None
        self._sequences: dict[tuple[str, Partition], int] = {}
        #: named identity: topics whose sequences were read from their brokers' claims
        self._seeded: set[str] = set()
        self.closed = False
        self._senders: dict[tuple[str, Partition], PartitionSender] = {}
        self._sender_by_id: dict[tuple[str, int], tuple[Partition, PartitionSender]] = {}
        self._unrouted: dict[str, deque[tuple[Queued, bytes | str | None, bytes]]] = {}
        self._open_runs: dict[str, PostRun] = {}  # per topic: the run posts fill
        #: per topic: the partition list and sender ``send_into`` filled last (sticky)
        self._sticky: dict[str, tuple[list[Partition], PartitionSender]] = {}
        self._spools_restored = False

    def payload(
        self,
        data: bytes,
        attribute: str | None,
        key: Key | None,
        headers: Headers | None,
    ) -> tuple[bytes, int]:
        """A message's record payload and flag (the key and headers go in the attribute
        block); raises :class:`ClientError` when the producer is closed or ``data`` is not
        bytes-like."""
        if self.closed:
            raise ClientError("producer is closed")
        if type(data) is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise ClientError(f"message data must be bytes, not {type(data).__name__}")
            data = bytes(data)
        if attribute is None and key is None and not headers:
            return data, 0
        return build_payload(data, attribute, key, headers)

    def send_into(
        self,
        fut: asyncio.Future[SendResult] | concurrent.futures.Future[SendResult],
        msg: Draft,
    ) -> None:
        """Queue one message whose result resolves ``fut`` (on the loop)."""
        topic, data, attribute, key, headers = msg
        payload, flag = self.payload(data, attribute, key, headers)
        item = Item(payload, flag, fut)
        self.delivery.outstanding += 1
        if not self._spools_restored:
            self.restore_spools()
        waiting = self._unrouted.get(topic)
        parts = None if waiting is not None else self.router.cached(topic)
        if parts is None:
            self._park(topic, item, key, payload)
            return
        sel = self.selector
        if key is None and parts and type(sel) is KeyHashSelector and self.producer_id is None:
            # the common case without the general dispatch's calls: sticky round robin
            st = self._sticky.get(topic)
            if (
                st is not None
                and st[0] is parts
                and st[1].scheduled
                and len(st[1].queue) < self.config.batch_max_count
            ):
                st[1].queue.append(item)
                return
            part = parts[sel.next_index(len(parts))]
            hit = self._sender_by_id.get((topic, id(part)))
            s = hit[1] if hit is not None and hit[0] is part else self.sender_for(topic, part)
            self._sticky[topic] = (parts, s)
            s.queue.append(item)  # PartitionSender.add inline
            if not s.scheduled and s.in_flight < self.config.max_in_flight_per_partition:
                s.scheduled = True
                self.s.loop.call_soon(s.pump)
            return
        self.dispatch(topic, parts, item, key, payload)

    def post(self, msg: Draft) -> None:
        """Queue one message without a future (see :meth:`AsyncProducer.post`)."""
        topic, data, attribute, key, headers = msg
        if type(data) is bytes and attribute is None and key is None and not headers:
            if self.closed:
                raise ClientError("producer is closed")
            payload, flag = data, 0
        else:
            payload, flag = self.payload(data, attribute, key, headers)
        self.delivery.outstanding += 1
        n = len(payload) + rec.HEADER_SIZE
        cfg = self.config
        run = self._open_runs.get(topic) if key is None else None
        if (
            run is not None
            and run.flag == flag
            and run.count < cfg.batch_max_count
            and run.nbytes + n <= cfg.batch_max_bytes
        ):
            q = run.queue
            if q and q[-1] is run:  # still waiting at the tail of its partition's queue
                run.payloads.append(payload)
                run.count += 1
                run.nbytes += n
                return
        if not self._spools_restored:
            self.restore_spools()
        parts = None if topic in self._unrouted else self.router.cached(topic)
        sel = self.selector
        if parts and key is None and type(sel) is KeyHashSelector and self.producer_id is None:
            # sticky round robin: a run fills for one partition, the next run goes to the
            # next partition (one partition per message when the pump keeps up)
            part = parts[sel.next_index(len(parts))]
            hit = self._sender_by_id.get((topic, id(part)))
            s = hit[1] if hit is not None and hit[0] is part else self.sender_for(topic, part)
            queue = s.queue
            run = PostRun(topic, payload, flag, queue)
            queue.append(run)
            self._open_runs[topic] = run
            if not s.scheduled and s.in_flight < cfg.max_in_flight_per_partition:
                s.scheduled = True
                self.s.loop.call_soon(s.pump)
            return
        item = Item(payload, flag, None)  # not routed yet, a key, a custom selector...
        item.topic = topic
        if parts is None:
            self._park(topic, item, key, payload)
            return
        self.dispatch(topic, parts, item, key, payload)

    def add_batch(
        self, topic: str, items: list[BatchItem], key: Key | None, first: bytes
    ) -> None:
        """Queue the chunks of one ``send_batch`` for one partition (picked once, by ``key``
        or round robin, with ``first`` as the data a selector sees)."""
        for it in items:
            self.delivery.outstanding += it.count
        if not self._spools_restored:
            self.restore_spools()
        waiting = self._unrouted.get(topic)
        parts = None if waiting is not None else self.router.cached(topic)
        if parts is None:
            for it in items:
                self._park(topic, it, key, first)
            return
        if self.identity is not None and (seed := self._seed_queue(topic)) is not None:
            for it in items:
                seed.append((it, key, first))
            return
        try:
            part = self.selector(topic, parts, key, first)
        except ClientError as e:
            for it in items:
                self.delivery.resolve(it, it.failed(None, e))
            return
        except Exception as e:  # a bug in the selector: raised, not a result
            for it in items:
                self.delivery.fail_hard(it, e)
            return
        sender = self.sender_for(topic, part)
        for it in items:
            if self.producer_id is not None:
                self._stamp(topic, part, it)
            sender.add(it)

    def _park(self, topic: str, item: Queued, key: Key | None, data: bytes) -> None:
        """``topic`` is not routed yet: ``item`` waits for the router's answer."""
        waiting = self._unrouted.get(topic)
        if waiting is None:
            waiting = self._unrouted[topic] = deque()
            self.s.spawn(self._route_later(topic))
        waiting.append((item, key, data))

    def dispatch(
        self, topic: str, parts: Sequence[Partition], item: Queued, key: Key | None, data: bytes,
    ) -> None:
        """Queue ``item`` for the partition the selector picks among ``parts``."""
        if self.identity is not None and (seed := self._seed_queue(topic)) is not None:
            seed.append((item, key, data))
            return
        try:
            part = self.selector(topic, parts, key, data)
        except ClientError as e:
            self.delivery.resolve(item, item.failed(None, e))
            return
        except Exception as e:  # a bug in the selector: raised by send(), not a result
            self.delivery.fail_hard(item, e)
            return
        if self.producer_id is not None:
            self._stamp(topic, part, item)
        self.sender_for(topic, part).add(item)

    def _stamp(self, topic: str, part: Partition, item: Queued) -> None:
        """Idempotent mode: give ``item``'s messages the producer id and the partition's
        next sequences (in their attribute blocks; retries resend these very bytes)."""
        seq = self._sequences.get((topic, part), 0)
        self._sequences[(topic, part)] = seq + item.count
        stamped: list[bytes] = []
        flag = item.flag
        for i, (f, payload) in enumerate(item.records()):
            text, body = rec.split_payload(payload, f)
            props = decode_attribute(text, f)
            new, flag = build_payload(
                body, props.attribute, props.key, props.headers, self.producer_id, seq + i
            )
            stamped.append(new)
        if isinstance(item, BatchItem):
            item.payloads = stamped
        else:
            item.payload = stamped[0]
        item.flag = flag
        item.nbytes = sum(map(len, stamped)) + rec.HEADER_SIZE * len(stamped)

    def sender_for(self, topic: str, part: Partition) -> PartitionSender:
        """The queue of ``part`` of ``topic`` (created on first use)."""
        # Partition's dataclass __hash__ runs in Python: look the routed partition object
        # up by identity first (the router hands out the same objects while cached).
        hit = self._sender_by_id.get((topic, id(part)))
        if hit is not None and hit[0] is part:
            return hit[1]
        s = self._senders.get((topic, part))
        if s is None:
            s = self._senders[(topic, part)] = PartitionSender(self.s, topic, part)
        elif part.address and s.partition.address != part.address:
            # a restored spool's partition, now routed, or the partition's broker moved
            # (failover: another broker registered as its master)
            s.partition = part
        if len(self._sender_by_id) > 4 * len(self._senders) + 64:
            self._sender_by_id.clear()  # old partition lists: bounded
        self._sender_by_id[(topic, id(part))] = (part, s)
        return s

    async def _route_later(self, topic: str) -> None:
        cfg = self.config
        try:
            for attempt in range(cfg.retries + 1):
                try:
                    parts = await self.router.partitions(topic)
                    break
                except ClientError as e:
                    if not retriable(e) or attempt == cfg.retries:
                        raise
                    await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2**attempt)))
        except Exception as e:
            err = e if isinstance(e, ClientError) else ClientError(str(e))
            waiting = self._unrouted.pop(topic, deque())
            for item, _key, _data in waiting:
                self.delivery.resolve(item, item.failed(None, err))
            return
        if self.identity is not None and self.identity.named and topic not in self._seeded:
            try:
                await self._seed(topic, parts)
            except Exception as e:
                err = e if isinstance(e, ClientError) else ClientError(str(e))
                for item, _key, _data in self._unrouted.pop(topic, deque()):
                    self.delivery.resolve(item, item.failed(None, err))
                return
        waiting = self._unrouted.pop(topic, deque())
        for item, key, data in waiting:
            self.dispatch(topic, parts, item, key, data)

    def _seed_queue(
        self, topic: str
    ) -> deque[tuple[Queued, bytes | str | None, bytes]] | None:
        """Named identity: the queue messages for ``topic`` wait in until its sequences
        are read from its brokers (None: ready). Other producers: None."""
        ident = self.identity
        if ident is None or not ident.named or topic in self._seeded:
            return None
        waiting = self._unrouted.get(topic)
        if waiting is None:
            waiting = self._unrouted[topic] = deque()
            self.s.spawn(self._route_later(topic))
        return waiting

    async def _seed(self, topic: str, parts: Sequence[Partition]) -> None:
        """Claim the named identity on ``topic``'s brokers and go on from the last sequence
        each stored for it (retried like a send; a fenced identity is not)."""
        cfg = self.config
        for attempt in range(cfg.retries + 1):
            try:
                for part, last in (await self.s.producer_sequences(topic, parts)).items():
                    k = (topic, part)
                    self._sequences[k] = max(self._sequences.get(k, 0), last + 1)
                break
            except ClientError as e:
                if not retriable(e) or attempt == cfg.retries:
                    raise
                await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2**attempt)))
        self._seeded.add(topic)

    def restore_spools(self) -> None:
        """Resume replaying spools left by an earlier run (ordered mode).

        Runs before the first message is routed: each spooled partition's sender starts in
        spooling state, so new messages for it queue behind the old ones.
        """
        self._spools_restored = True
        cfg = self.config
        if not (cfg.ordered and cfg.spool_dir is not None):
            return
        for topic, pid, path in existing_spools(Path(cfg.spool_dir)):
            try:
                part = Partition.parse(pid, "")  # address learnt when replaying
            except ValueError:
                log.error("ignoring spool file with an unexpected name: %s", path)
                continue
            s = self.sender_for(topic, part)
            s.spool = PartitionSpool(s, Spool(path))
            if not s.spool.empty:
                s.spool.start_replay()
