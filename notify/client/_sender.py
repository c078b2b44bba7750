"""Sending what the producer queued: per partition, batches of queued items go out as one
``mput`` (or pipelined ``put`` to brokers without it), are retried, and end as results.

* :class:`Delivery` turns outcomes into what callers wait for: futures resolved (or failed
  with the error: ``ProducerConfig.raise_on_error``), posts counted and their failures kept,
  the number of outstanding messages and the waiters of ``flush``/``drain``;
* :class:`Sender` is the producer's sending side (aiokafka's ``Sender``): its connections,
  the brokers known not to speak ``mput``, its tasks, and :meth:`Sender.transmit` (one batch
  to one partition once, replies read by :mod:`.core.wire`);
* :class:`PartitionSender` is the queue and pump of one global partition: as soon as fewer
  than ``max_in_flight_per_partition`` batches are in flight, what is queued goes out (under
  load batches grow while the previous one is in flight: no linger at low rate). Retriable
  failures (connection lost, timeout, 503/504) are retried ``retries`` times with growing
  backoff (a lost ack can thus duplicate a message, unless the producer is idempotent); an
  ordered producer's partition that stays unavailable spools (:mod:`._spool`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from notify.errors import BrokerError, ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol.frames import Response
from notify.protocol.replies import MultiPutAck

from ._batch import Item, Queued, mput_body
from ._config import ClientConfig, ProducerConfig
from ._connection import ConnectionPool
from ._facade import Delegated
from ._identity import ProducerIdentity
from ._message import PostFailure
from ._routing import TopicRouter
from ._spool import PartitionSpool
from .core import wire
from .core.types import Partition, SendResult
from .transport import AsyncConnection

log = logging.getLogger("notify.client")

#: what one transmission gives back: the mput ack covering every message, or one ack or
#: exception per message (in order)
Transmitted = MultiPutAck | list[wire.Ack | Exception]


def retriable(e: BaseException) -> bool:
    """A failure worth sending again: a lost connection, a timeout, a 503/504."""
    return isinstance(e, ConnectionLostError | RequestTimeoutError) or (
        isinstance(e, BrokerError) and e.retriable
    )


class Delivery:
    """Where the outcomes of queued messages go (see the module docstring)."""

    def __init__(self, raise_on_error: bool, max_post_failures: int):
        self.raise_on_error = raise_on_error
        #: messages queued or in flight
        self.outstanding = 0
        #: :meth:`AsyncProducer.post` results: messages stored, messages failed
        self.posts_acked = 0
        self.posts_failed = 0
        self.post_failures: deque[PostFailure] = deque(maxlen=max(1, max_post_failures))
        self._idle: asyncio.Event | None = None
        self._idle_at = 0  # _idle is set once at most this many messages are outstanding

    def resolve(self, item: Queued, result: Any) -> None:
        """``item``'s result: its future's (its error with ``raise_on_error``) or, for a
        post, counted."""
        fut = item.future
        if fut is None:
            self._post_result(item, result)
        elif not fut.done():
            if self.raise_on_error and not result.success and result.error is not None:
                fut.set_exception(result.error)
            else:
                fut.set_result(result)
        self.outstanding -= item.count
        if self._idle is not None and self.outstanding <= self._idle_at:
            self._idle.set()

    def acked_all(self, part: Partition, items: Sequence[Queued], mid: int, off: int) -> None:
        """Resolve ``items`` stored back to back from message id ``mid`` at ``off`` (one
        mput ack): :meth:`resolve` of each, without its per-message calls."""
        count = 0
        new = tuple.__new__  # SendResult(True, part, off, mid) without NamedTuple.__new__
        posted = 0
        for it in items:
            if isinstance(it, Item):
                fut = it.future
                if fut is None:
                    posted += 1
                elif not fut.done():
                    fut.set_result(new(SendResult, (True, part, off, mid, None, False)))
                mid += 1
                count += 1
            else:
                bfut = it.future
                if bfut is None:  # a run of posts
                    posted += it.count
                elif not bfut.done():
                    bfut.set_result(it.acked(part, mid, off))
                mid += it.count
                count += it.count
            if off >= 0:
                off += it.nbytes
        self.posts_acked += posted
        self.outstanding -= count
        if self._idle is not None and self.outstanding <= self._idle_at:
            self._idle.set()

    def fail_hard(self, item: Queued, error: Exception) -> None:
        """Fail ``item`` with ``error`` itself (programming errors always raise)."""
        if item.future is None:  # a post: a failure like the others
            self._post_result(item, SendResult(False, None, error=error))
        elif not item.future.done():
            item.future.set_exception(error)
        self.outstanding -= item.count
        self.settle()

    def _post_result(self, item: Queued, result: Any) -> None:
        """Count the result of a futureless item (a post); keep its failures."""
        if result.success:
            self.posts_acked += item.count
            return
        self.posts_failed += item.count
        err = result.error if result.error is not None else ClientError("not stored")
        topic: str = getattr(item, "topic", "")
        for flag, payload in item.records():
            self.post_failures.append(PostFailure(topic, result.partition, payload, flag, err))

    def post_failed(self, topic: str, payload: bytes, err: Exception) -> None:
        """Count and keep a post that never reached a queue."""
        self.posts_failed += 1
        self.post_failures.append(PostFailure(topic, None, payload, 0, err))

    def take_post_failures(self) -> list[PostFailure]:
        """The kept post failures, oldest first (any thread)."""
        out: list[PostFailure] = []
        q = self.post_failures
        while True:
            try:
                out.append(q.popleft())
            except IndexError:
                return out

    def settle(self) -> None:
        """Wake the waiters of :meth:`drain` that have their count."""
        if self._idle is not None and self.outstanding <= self._idle_at:
            self._idle.set()

    async def drain(self, limit: int = 0) -> None:
        """Wait until at most ``limit`` messages are outstanding."""
        while self.outstanding > limit:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
                self._idle_at = limit
            else:
                self._idle_at = max(self._idle_at, limit)
            await self._idle.wait()


class Sender:
    """The producer's sending side: connections, tasks and one transmission of a batch."""

    def __init__(
        self, pool: ConnectionPool, router: TopicRouter, client_config: ClientConfig,
        config: ProducerConfig, loop: Callable[[], asyncio.AbstractEventLoop],
        identity: ProducerIdentity | None = None,
    ):
        self.pool = pool
        #: idempotent mode: the identity claimed on each connection before its first put
        self.identity = identity
        self.router = router
        self.client_config = client_config
        self.config = config
        self.delivery = Delivery(config.raise_on_error, config.max_post_failures)
        #: brokers that answered ``mput`` with "unknown command" (transactions use it too)
        self.no_mput: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        #: set when the producer stops for good: spool replays give up
        self.closing = False
        self.spool_replayed = 0
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task the producer cancels when it closes."""
        task = self._loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def cancel_tasks(self) -> None:
        self.closing = True
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def transmit(self, topic: str, part: Partition, items: Sequence[Queued]) -> Transmitted:
        """Send ``items`` to ``part`` once: the mput ack covering all their messages, or
        one ack or exception per message (in order)."""
        timeout = self.client_config.request_timeout_s
        conn = await self.pool.get(part.address)
        count = sum(it.count for it in items)
        try:
            ident = self.identity
            if ident is not None and ident.claimed(conn) is None:
                await ident.ensure(conn, timeout)  # a new connection: claim the identity
            if count > 1 and self.config.use_mput and part.address not in self.no_mput:
                body = mput_body(items)
                r = await conn.request(wire.mput(topic, part.partition, body, count), timeout)
                if not wire.unknown_command(r):
                    ack = wire.mput_ack(r, count)
                    return ack if isinstance(ack, MultiPutAck) else [ack] * count
                log.info("broker %s does not know mput: pipelining put", part.address)
                self.no_mput.add(part.address)
            return await self._pipelined_puts(conn, topic, part.partition, items, timeout)
        except ConnectionLostError:
            self.pool.discard(conn)
            raise

    async def producer_sequences(
        self, topic: str, parts: Sequence[Partition]
    ) -> dict[Partition, int]:
        """Claim the identity on the brokers of ``parts`` (of ``topic``); the last sequence
        each stored for it per partition (absent: never written to)."""
        ident = self.identity
        if ident is None:
            raise ClientError("producer_sequences needs ProducerConfig(idempotent=True)")
        timeout = self.client_config.request_timeout_s
        out: dict[Partition, int] = {}
        for addr in dict.fromkeys(p.address for p in parts):
            conn = await self.pool.get(addr)
            try:
                reply = await ident.ensure(conn, timeout)
            except ConnectionLostError:
                self.pool.discard(conn)
                raise
            last = ident.sequences(reply, topic)
            for p in parts:
                if p.address == addr and p.partition in last:
                    out[p] = last[p.partition]
        return out

    async def _pipelined_puts(
        self, conn: AsyncConnection, topic: str, partition: int, items: Sequence[Queued],
        timeout: float,
    ) -> list[wire.Ack | Exception]:
        checksum = self.config.send_checksum
        sent: list[tuple[int, asyncio.Future[Response]]] = []
        for flag, payload in [r for it in items for r in it.records()]:
            opaque = conn.next_opaque()
            frame = wire.put(topic, partition, payload, flag, checksum)(opaque)
            sent.append((opaque, conn.send(frame, opaque)))
        await conn.drain()
        out: list[wire.Ack | Exception] = []
        for opaque, fut in sent:
            try:
                r = await conn.wait(fut, opaque, timeout)
            except (ConnectionLostError, RequestTimeoutError) as e:
                out.append(e)
                continue
            out.append(wire.put_ack(r))
        return out


class PartitionSender:
    """The queue and pump of one global partition (see the module docstring)."""

    def __init__(self, sender: Sender, topic: str, partition: Partition):
        self.s = sender
        self.topic = topic
        self.partition = partition
        self.queue: deque[Queued] = deque()
        self.in_flight = 0
        self.scheduled = False
        self.spool: PartitionSpool | None = None

    def add(self, item: Queued) -> None:
        self.queue.append(item)
        if not self.scheduled and self.in_flight < self.s.config.max_in_flight_per_partition:
            self.scheduled = True
            self.s.loop.call_soon(self.pump)

    def pump(self) -> None:
        """Send what is queued, a batch at a time, while fewer than the allowed number of
        batches are in flight (a spool being replayed takes the queue first)."""
        self.scheduled = False
        cfg = self.s.config
        if self.spool is not None and not self.spool.empty:
            self.spool.take_queue()
            return
        queue = self.queue
        max_count = cfg.batch_max_count
        max_bytes = cfg.batch_max_bytes
        while queue and self.in_flight < cfg.max_in_flight_per_partition:
            batch: list[Queued] = []
            size = 0
            count = 0
            while queue and count < max_count:
                it = queue[0]
                if batch and (size + it.nbytes > max_bytes or count + it.count > max_count):
                    break
                batch.append(queue.popleft())
                size += it.nbytes
                count += it.count
            self.in_flight += 1
            self.s.spawn(self._send_batch(batch))

    async def _send_batch(self, batch: list[Queued]) -> None:
        try:
            await self._send_with_retries(batch)
        finally:
            self.in_flight -= 1
            if self.queue:
                self.pump()
            self.s.delivery.settle()

    async def _send_with_retries(self, batch: list[Queued]) -> None:
        cfg = self.s.config
        delivery = self.s.delivery
        todo = batch
        last: BaseException | None = None
        part = self.partition
        for attempt in range(cfg.retries + 1):
            if attempt:
                await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2 ** (attempt - 1))))
            results: Transmitted | Exception
            try:
                results = await self.s.transmit(self.topic, part, todo)
            except BaseException as e:  # translated per batch below
                if isinstance(e, asyncio.CancelledError):
                    self.fail(todo, ConnectionLostError("producer closed"))
                    raise
                results = e if isinstance(e, Exception) else ClientError(str(e))
            if isinstance(results, MultiPutAck):  # one ack for all: ids and offsets follow
                delivery.acked_all(part, todo, results.first_msg_id, results.first_offset)
                return
            retry: list[Queued] = []
            i = 0
            for it in todo:
                if isinstance(results, Exception):
                    res = results
                else:
                    mine = results[i : i + it.count]
                    i += it.count
                    bad = [r for r in mine if not isinstance(r, tuple)]
                    if not bad:
                        acks = [r for r in mine if isinstance(r, tuple)]
                        delivery.resolve(it, it.acked_each(part, acks))
                        continue
                    res = bad[0]
                if retriable(res):
                    last = res
                    retry.append(it)
                else:
                    if isinstance(res, BrokerError) and res.code == 404:
                        self.s.router.invalidate(self.topic)
                    err = res if isinstance(res, ClientError) else ClientError(str(res))
                    delivery.resolve(it, it.failed(part, err))
            if not retry:
                return
            todo = retry
        assert last is not None
        if cfg.ordered and cfg.spool_dir is not None:
            log.warning(
                "partition %s of %s unavailable (%s): spooling %d messages",
                self.partition,
                self.topic,
                last,
                len(todo),
            )
            self.spool_for().spool(todo)
            return
        err = last if isinstance(last, ClientError) else ClientError(str(last))
        self.fail(todo, err)

    def fail(self, items: Sequence[Queued], err: Exception) -> None:
        for it in items:
            self.s.delivery.resolve(it, it.failed(self.partition, err))

    def spool_for(self) -> PartitionSpool:
        """This partition's spool (ordered mode), opened on first use."""
        if self.spool is None:
            self.spool = PartitionSpool.of(self)
        return self.spool

    # -- what the partition's spool uses (:class:`~._spool.SpoolOwner`)

    config = Delegated[ProducerConfig]("s.config")
    closing = Delegated[bool]("s.closing")

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self.s.spawn(coro)

    def resolve(self, item: Queued, result: Any) -> None:
        self.s.delivery.resolve(item, result)

    def replayed(self, count: int) -> None:
        """Count messages a spool replay stored."""
        self.s.spool_replayed += count

    async def partitions(self) -> list[Partition]:
        return await self.s.router.partitions(self.topic)

    async def transmit(self, items: Sequence[Queued]) -> Transmitted:
        """Send ``items`` to this partition once (what a spool replay uses)."""
        return await self.s.transmit(self.topic, self.partition, items)

