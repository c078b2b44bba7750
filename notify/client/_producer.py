"""The producer core (asyncio). The synchronous :class:`Producer` runs this same code.

Messages are queued per global partition, in call order. A per-partition pump sends what is
queued as soon as fewer than ``max_in_flight_per_partition`` batches are in flight: one
message goes as a ``put`` (with checksum), several as one ``mput`` (notify extension). A
broker that answers ``mput`` with ``400 unknown command`` is remembered and gets the batch
as pipelined ``put`` requests instead. Under load batches grow while the previous one is in
flight (no linger at low rate). Retriable failures (connection lost, timeout, 503/504) are
retried ``retries`` times with growing backoff; a lost acknowledgement can thus duplicate a
message. Every failure ends as a :class:`SendResult` with ``success`` False, never silently.

In ordered mode (``ProducerConfig.ordered``) a partition that stays unavailable gets the
message appended to a local :class:`~notify.client._spool.Spool`; later messages for it
follow into the spool until a background task has replayed it, in order.

Transactions (:mod:`._transaction`) bypass the queues: a local transaction writes its puts
(with the txKey) in call order on one of the producer's own connections, and a producer
with a group sends half messages and answers the broker's check-backs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from notify.errors import (
    BrokerError,
    ClientError,
    ConnectionLostError,
    ProtocolError,
    RequestTimeoutError,
)
from notify.protocol import records as rec
from notify.protocol.frames import Response, encode_dput, encode_line, encode_mput, encode_put
from notify.protocol.keys import local_key
from notify.protocol.properties import decode_attribute
from notify.protocol.replies import MultiPutAck, PutAck, parse_prepare_vote
from notify.protocol.xa import XA_RDONLY
from notify.transport import AsyncConnection

from ._config import ClientConfig, ProducerConfig
from ._connection import ConnectionPool
from ._errors import ClientTransactionError, TransactionConnectionError
from ._identity import ProducerIdentity, broker_error
from ._message import (
    BatchSendResult,
    Headers,
    Message,
    PostFailure,
    SendResult,
    build_payload,
)
from ._routing import Partition, TopicRouter
from ._selectors import KeyHashSelector, PartitionSelector
from ._spool import Spool, existing_spools
from ._transaction import (
    AsyncTransaction,
    HalfMessage,
    LocalTransaction,
    LocalTxState,
    TransactionChecker,
    TransactionSendResult,
    TxChannel,
    as_state,
    reply_error,
    timeout_token,
)

log = logging.getLogger("notify.client")

_Ack = tuple[int, int]  # (msg_id, offset)


class _Item:
    """One queued message (``send_nowait``)."""

    __slots__ = ("flag", "future", "nbytes", "payload", "topic")
    count = 1
    topic: str  # set for posts only (their failures name it)

    def __init__(
        self,
        payload: bytes,
        flag: int,
        future: asyncio.Future[SendResult] | concurrent.futures.Future[SendResult] | None,
    ):
        self.payload = payload
        self.flag = flag
        self.future = future
        self.nbytes = len(payload) + rec.HEADER_SIZE

    def records(self) -> list[tuple[int, bytes]]:
        return [(self.flag, self.payload)]

    def acked(self, part: Partition, mid: int, off: int) -> SendResult:
        return SendResult(True, part, off, mid)

    def acked_each(self, part: Partition, acks: Sequence[_Ack]) -> SendResult:
        return SendResult(True, part, acks[0][1], acks[0][0])

    def failed(self, part: Partition | None, err: Exception) -> SendResult:
        return SendResult(False, part, error=err)

    def spooled(self, part: Partition) -> SendResult:
        return SendResult(True, part, spooled=True)


class _BatchItem:
    """Queued messages of one ``send_batch`` chunk: one object and one future for all
    (they share a partition and a flag, and go in one ``mput``)."""

    __slots__ = ("count", "flag", "future", "nbytes", "payloads")

    def __init__(
        self, payloads: list[bytes], flag: int, future: asyncio.Future[BatchSendResult]
    ):
        self.payloads = payloads
        self.flag = flag
        self.future = future
        self.count = len(payloads)
        self.nbytes = sum(map(len, payloads)) + rec.HEADER_SIZE * len(payloads)

    @property
    def payload(self) -> bytes:  # what a selector sees of the batch
        return self.payloads[0] if self.payloads else b""

    def records(self) -> list[tuple[int, bytes]]:
        flag = self.flag
        return [(flag, p) for p in self.payloads]

    def acked(self, part: Partition, mid: int, off: int) -> BatchSendResult:
        n = len(self.payloads)
        offs = rec.record_offsets(off, self.payloads) if off >= 0 else [-1] * n
        return BatchSendResult(True, part, range(mid, mid + n), offs)

    def acked_each(self, part: Partition, acks: Sequence[_Ack]) -> BatchSendResult:
        return BatchSendResult(True, part, [a[0] for a in acks], [a[1] for a in acks])

    def failed(self, part: Partition | None, err: Exception) -> BatchSendResult:
        return BatchSendResult(False, part, error=err)

    def spooled(self, part: Partition) -> BatchSendResult:
        n = len(self.payloads)
        return BatchSendResult(True, part, [-1] * n, [-1] * n, spooled=True)


class _PostRun(_BatchItem):
    """Messages of :meth:`AsyncProducer.post` queued back to back for one partition, with
    one flag: a list of payloads and no future, filled while it is the queue's last item
    (so a message posted one at a time costs a list append, not an object and a future).
    Results are counted by the producer; failures kept as :class:`PostFailure`."""

    __slots__ = ("queue", "topic")

    def __init__(self, topic: str, payload: bytes, flag: int, queue: deque[_Queued]):
        self.topic = topic
        self.queue = queue  # its partition's queue: open while it is that queue's tail
        self.payloads = [payload]
        self.flag = flag
        self.future = None  # type: ignore[assignment]
        self.count = 1
        self.nbytes = len(payload) + rec.HEADER_SIZE


_Queued = _Item | _BatchItem


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (a posted message joined to a transaction: the
    commit reports the failure)."""
    if not f.cancelled():
        f.exception()


def _retriable(e: BaseException) -> bool:
    return isinstance(e, ConnectionLostError | RequestTimeoutError) or (
        isinstance(e, BrokerError) and e.retriable
    )


def _parse_put_reply(r: Response) -> _Ack:
    try:
        ack = PutAck.parse(r.body)
    except ProtocolError as e:
        raise ClientError(str(e)) from None
    return ack.msg_id, ack.offset


def _parse_mput_reply(r: Response, count: int) -> MultiPutAck:
    try:
        ack = MultiPutAck.parse(r.body)
    except ProtocolError as e:
        raise ClientError(str(e)) from None
    if ack.count != count:
        raise ClientError(f"mput reply acknowledges {ack.count} of {count} messages")
    return ack


def _mput_body(items: Sequence[_Queued]) -> bytes:
    """The records of ``items`` back to back (runs of one flag encoded in one go)."""
    out: list[bytes] = []
    run: list[bytes] = []
    run_flag = 0
    encode_batch = rec.encode_batch
    for it in items:
        if isinstance(it, _BatchItem):
            if run:
                out.append(encode_batch(run, run_flag))
                run = []
            out.append(encode_batch(it.payloads, it.flag))
            continue
        if it.flag != run_flag and run:
            out.append(encode_batch(run, run_flag))
            run = []
        run_flag = it.flag
        run.append(it.payload)
    if run:
        out.append(encode_batch(run, run_flag))
    return out[0] if len(out) == 1 else b"".join(out)


def _unknown_command(r: Response) -> bool:
    return r.code == 400 and b"unknown command" in r.body.lower()


class _PartitionSender:
    """The queue and pump of one global partition."""

    def __init__(self, producer: AsyncProducer, topic: str, partition: Partition):
        self.p = producer
        self.topic = topic
        self.partition = partition
        self.queue: deque[_Queued] = deque()
        self.in_flight = 0
        self.scheduled = False
        self.spool: Spool | None = None
        self.replay_task: asyncio.Task[None] | None = None

    def add(self, item: _Queued) -> None:
        self.queue.append(item)
        if not self.scheduled and self.in_flight < self.p.config.max_in_flight_per_partition:
            self.scheduled = True
            self.p.loop.call_soon(self.pump)

    def pump(self) -> None:
        self.scheduled = False
        cfg = self.p.config
        if self.spool is not None and not self.spool.empty:
            self._spool_queue()
            return
        queue = self.queue
        max_count = cfg.batch_max_count
        max_bytes = cfg.batch_max_bytes
        while queue and self.in_flight < cfg.max_in_flight_per_partition:
            batch: list[_Queued] = []
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
            self.p._spawn(self._send_batch(batch))

    async def _send_batch(self, batch: list[_Queued]) -> None:
        try:
            await self._send_with_retries(batch)
        finally:
            self.in_flight -= 1
            if self.queue:
                self.pump()
            self.p._maybe_idle()

    async def _send_with_retries(self, batch: list[_Queued]) -> None:
        cfg = self.p.config
        todo = batch
        last: BaseException | None = None
        part = self.partition
        for attempt in range(cfg.retries + 1):
            if attempt:
                await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2 ** (attempt - 1))))
            results: MultiPutAck | list[_Ack | Exception] | Exception
            try:
                results = await self.p._transmit(self.topic, part, todo)
            except BaseException as e:  # translated per batch below
                if isinstance(e, asyncio.CancelledError):
                    self._fail(todo, ConnectionLostError("producer closed"))
                    raise
                results = e if isinstance(e, Exception) else ClientError(str(e))
            if isinstance(results, MultiPutAck):  # one ack for all: ids and offsets follow
                self.p._acked_all(part, todo, results.first_msg_id, results.first_offset)
                return
            retry: list[_Queued] = []
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
                        self.p._resolve(it, it.acked_each(part, acks))
                        continue
                    res = bad[0]
                if _retriable(res):
                    last = res
                    retry.append(it)
                else:
                    if isinstance(res, BrokerError) and res.code == 404:
                        self.p.router.invalidate(self.topic)
                    err = res if isinstance(res, ClientError) else ClientError(str(res))
                    self.p._resolve(it, it.failed(part, err))
            if not retry:
                return
            todo = retry
        assert last is not None
        if self.p.config.ordered and self.p.config.spool_dir is not None:
            log.warning(
                "partition %s of %s unavailable (%s): spooling %d messages",
                self.partition,
                self.topic,
                last,
                len(todo),
            )
            self._to_spool(todo)
            return
        err = last if isinstance(last, ClientError) else ClientError(str(last))
        self._fail(todo, err)

    def _fail(self, items: Sequence[_Queued], err: Exception) -> None:
        for it in items:
            self.p._resolve(it, it.failed(self.partition, err))

    # -- ordered mode spool

    def _spool_obj(self) -> Spool:
        if self.spool is None:
            assert self.p.config.spool_dir is not None
            path = Path(self.p.config.spool_dir) / self.topic / f"{self.partition}.spool"
            self.spool = Spool(path)
        return self.spool

    def _to_spool(self, items: Sequence[_Queued]) -> None:
        spool = self._spool_obj()
        try:
            spool.append([r for it in items for r in it.records()])
        except ClientError as e:
            self._fail(items, e)
            return
        for it in items:
            self.p._resolve(it, it.spooled(self.partition))
        self._start_replay()

    def _spool_queue(self) -> None:
        items = list(self.queue)
        self.queue.clear()
        if items:
            self._to_spool(items)

    def _start_replay(self) -> None:
        if self.replay_task is None or self.replay_task.done():
            self.replay_task = self.p._spawn(self._replay())

    async def _resolve_address(self) -> None:
        while not self.partition.address and not self.p._closing_hard:
            try:
                parts = await self.p.router.partitions(self.topic)
            except ClientError as e:
                log.warning("cannot route spool of %s %s yet: %s", self.topic, self.partition, e)
                await asyncio.sleep(self.p.config.spool_replay_interval_s)
                continue
            match = [p for p in parts if p == self.partition]
            if match:
                self.partition = match[0]
                return
            log.error("%s has no partition %s: its spool waits", self.topic, self.partition)
            await asyncio.sleep(max(1.0, self.p.config.spool_replay_interval_s))

    async def _replay(self) -> None:
        cfg = self.p.config
        spool = self._spool_obj()
        await self._resolve_address()
        while not spool.empty and not self.p._closing_hard:
            msgs, end = spool.peek(cfg.batch_max_count, cfg.batch_max_bytes)
            loop = self.p.loop
            items: list[_Queued] = [
                _Item(payload, flag, loop.create_future()) for flag, payload in msgs
            ]
            try:
                results = await self.p._transmit(self.topic, self.partition, items)
            except (ClientError, OSError) as e:
                results = [e] * len(items)
            ok = 0
            if isinstance(results, MultiPutAck):
                ok = len(items)
            else:
                for res in results:
                    if not isinstance(res, tuple):
                        break
                    ok += 1
            if ok == len(items):
                spool.advance(end)
                self.p.stats_spool_replayed += ok
                continue
            if ok:  # advance past the prefix that went through
                _, part_end = spool.peek(ok, cfg.batch_max_bytes)
                spool.advance(part_end)
                self.p.stats_spool_replayed += ok
            await asyncio.sleep(cfg.spool_replay_interval_s)
        if spool.empty and self.queue:
            self.pump()
        self.p._maybe_idle()


class AsyncProducer:
    """Sends messages to a topic's partitions (asyncio API).

    Create it with :meth:`AsyncMessageSessionFactory.create_producer` (or
    ``create_transactional_producer`` for half messages). All methods must be called on the
    session's event loop. Transactions::

        async with producer.transaction(timeout=10):
            await producer.send("orders", b"o-1")   # joins the transaction of this task
        result = await producer.send_in_transaction("orders", b"o-2", local_tx)
    """

    def __init__(
        self,
        pool: ConnectionPool,
        router: TopicRouter,
        client_config: ClientConfig,
        config: ProducerConfig,
        selector: PartitionSelector | None = None,
        checker: TransactionChecker | None = None,
    ):
        self.pool = pool
        self.router = router
        self.client_config = client_config
        self.config = config
        if (config.ordered or config.idempotent) and config.max_in_flight_per_partition != 1:
            config.max_in_flight_per_partition = 1
        self._raise_on_error = config.raise_on_error
        #: Idempotent mode: this producer's identity (claimed on each connection before its
        #: first put, :mod:`._identity`), its id and next sequence number per partition.
        self.identity: ProducerIdentity | None = None
        if config.idempotent:
            self.identity = ProducerIdentity(
                config.producer_name, config.producer_secret, config.producer_epoch
            )
        elif config.producer_name is not None:
            raise ClientError("producer_name needs ProducerConfig(idempotent=True)")
        self.producer_id = self.identity.producer_id if self.identity is not None else None
        self._sequences: dict[tuple[str, Partition], int] = {}
        #: named identity: topics whose sequences were read from their brokers' claims
        self._seeded: set[str] = set()
        self.selector: PartitionSelector = selector or KeyHashSelector()
        self._senders: dict[tuple[str, Partition], _PartitionSender] = {}
        self._sender_by_id: dict[tuple[str, int], tuple[Partition, _PartitionSender]] = {}
        self._unrouted: dict[str, deque[tuple[_Queued, bytes | str | None, bytes]]] = {}
        self._no_mput: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outstanding = 0
        self._idle: asyncio.Event | None = None
        self._idle_at = 0  # _idle is set once at most this many messages are outstanding
        self._closed = False
        self._closing_hard = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats_spool_replayed = 0
        self._spools_restored = False
        #: Unique per producer instance: local transaction keys are ``TX:<session_id>:<n>``.
        self.session_id = uuid.uuid4().hex[:12]
        self.checker = checker
        self._tx_seq = itertools.count(1)
        self._tx_var: contextvars.ContextVar[AsyncTransaction | None] = contextvars.ContextVar(
            f"notify_tx_{self.session_id}", default=None
        )
        self._channel: TxChannel | None = None
        #: :meth:`post` results: messages stored, messages failed (after retries)
        self.posts_acked = 0
        self.posts_failed = 0
        self._post_failures: deque[PostFailure] = deque(maxlen=max(1, config.max_post_failures))
        self._open_runs: dict[str, _PostRun] = {}  # per topic: the run posts fill
        #: per topic: the partition list and sender ``send_nowait`` filled last (sticky)
        self._sticky: dict[str, tuple[list[Partition], _PartitionSender]] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the producer runs on (the running one at first use)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # -- public API

    async def publish(self, topic: str) -> list[Partition]:
        """Look up (and cache) the partitions of ``topic``; optional warm-up."""
        self._restore_spools()
        return await self.router.partitions(topic)

    async def send(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
    ) -> SendResult:
        """Send one message and wait for its result.

        A failed send is a :class:`SendResult` with ``success`` False (or raises its error
        with ``ProducerConfig(raise_on_error=True)``); programming errors (bad arguments, an
        exception other than :class:`~notify.errors.ClientError` in a custom selector)
        always raise. ``delay`` (seconds) or ``deliver_at``: see :meth:`send_delayed`.
        ``key`` picks the partition and stays on the message with the typed ``headers``
        (``{name: str | int | float | bool | bytes}``), in MetaQ's attribute block.
        """
        if delay is not None or deliver_at is not None:
            return await self.send_delayed(
                topic, data, delay, deliver_at, attribute, key, headers=headers
            )
        return await self.send_nowait(topic, data, attribute, key, headers=headers)

    def send_nowait(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue one message; the future resolves to its :class:`SendResult`.

        Messages queued one after the other for the same partition are sent in that order.
        Raises :class:`ClientError` when the producer is closed. Inside a transaction of
        the current context (:meth:`transaction`) the message joins it.
        """
        tx = self._tx_var.get()
        if tx is not None and not tx.finished:
            return tx.send_nowait(topic, data, attribute, key, headers=headers)
        fut: asyncio.Future[SendResult] = (self._loop or self.loop).create_future()
        self.send_into(fut, topic, data, attribute, key, headers)
        return fut

    def _payload(
        self,
        data: bytes,
        attribute: str | None,
        key: bytes | str | None,
        headers: Headers | None,
    ) -> tuple[bytes, int]:
        """A message's record payload and flag (the key and headers go in the attribute
        block); raises :class:`ClientError` when the producer is closed or ``data`` is not
        bytes-like."""
        if self._closed:
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
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        headers: Headers | None = None,
    ) -> None:
        """:meth:`send_nowait` resolving ``fut`` instead of a future of its own (outside
        transactions; on the loop). The synchronous API passes its thread-safe future: no
        asyncio future chained to it, no callback per message."""
        payload, flag = self._payload(data, attribute, key, headers)
        loop = self._loop or self.loop
        item = _Item(payload, flag, fut)
        self._outstanding += 1
        if not self._spools_restored:
            self._restore_spools()
        waiting = self._unrouted.get(topic)
        parts = None if waiting is not None else self.router.cached(topic)
        if parts is None:
            if waiting is None:
                waiting = self._unrouted[topic] = deque()
                self._spawn(self._route_later(topic))
            waiting.append((item, key, payload))
            return
        sel = self.selector
        if key is None and parts and type(sel) is KeyHashSelector and self.producer_id is None:
            # the common case without the general dispatch's calls: round robin by batch
            # (sticky, as Kafka's KIP-480): while the partition picked last has a send
            # scheduled and less than a batch queued, the message joins it, so a burst
            # goes out as one frame instead of one frame per partition
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
            s = hit[1] if hit is not None and hit[0] is part else self._sender(topic, part)
            self._sticky[topic] = (parts, s)
            s.queue.append(item)  # _PartitionSender.add inline
            if not s.scheduled and s.in_flight < self.config.max_in_flight_per_partition:
                s.scheduled = True
                loop.call_soon(s.pump)
            return
        self._dispatch(topic, parts, item, key, payload)
        return

    def post(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> None:
        """Queue one message without a future: the fastest way to send messages one at a
        time (fire and forget, results reported in bulk).

        Same routing, order, batching and retries as :meth:`send_nowait`. Results are
        counted: :attr:`posts_acked` (stored) and :attr:`posts_failed` (not stored after
        the retries); each failure is kept as a :class:`PostFailure` (topic, partition,
        the record, the error) until :meth:`post_failures` takes them (at most
        ``ProducerConfig.max_post_failures``, the oldest dropped first). ``await flush()``
        waits for every result. Data that is not bytes or a closed producer raise here;
        an exception in a custom selector is a failure like the others (its error is the
        exception). Inside a transaction of the current context the message joins it (as
        with ``send_nowait``; the transaction's commit reports its failure).
        """
        tx = self._tx_var.get()
        if tx is not None and not tx.finished:
            tx.send_nowait(topic, data, attribute, key, headers=headers).add_done_callback(
                _retrieve
            )
            return
        payload, flag = self._payload(data, attribute, key, headers)
        self._outstanding += 1
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
            self._restore_spools()
        parts = None if topic in self._unrouted else self.router.cached(topic)
        sel = self.selector
        if parts and key is None and type(sel) is KeyHashSelector and self.producer_id is None:
            # sticky round robin: a run fills for one partition, the next run goes to the
            # next partition (one partition per message when the pump keeps up)
            part = parts[sel.next_index(len(parts))]
            hit = self._sender_by_id.get((topic, id(part)))
            s = hit[1] if hit is not None and hit[0] is part else self._sender(topic, part)
            queue = s.queue
            run = _PostRun(topic, payload, flag, queue)
            queue.append(run)
            self._open_runs[topic] = run
            if not s.scheduled and s.in_flight < cfg.max_in_flight_per_partition:
                s.scheduled = True
                (self._loop or self.loop).call_soon(s.pump)
            return
        item = _Item(payload, flag, None)  # not routed yet, a key, a custom selector...
        item.topic = topic
        if parts is None:
            waiting = self._unrouted.get(topic)
            if waiting is None:
                waiting = self._unrouted[topic] = deque()
                self._spawn(self._route_later(topic))
            waiting.append((item, key, payload))
            return
        self._dispatch(topic, parts, item, key, payload)

    def post_failures(self) -> list[PostFailure]:
        """Take the kept failures of :meth:`post` (oldest first); see ``posts_failed``.
        Safe from another thread (the blocking API's)."""
        out: list[PostFailure] = []
        q = self._post_failures
        while True:
            try:
                out.append(q.popleft())
            except IndexError:
                return out

    def post_failed(self, topic: str, payload: bytes, err: Exception) -> None:
        """Count and keep a post that never reached a queue (e.g. the producer closed
        before the blocking API's buffer was drained)."""
        self.posts_failed += 1
        self._post_failures.append(PostFailure(topic, None, payload, 0, err))

    def _post_result(self, item: _Queued, result: Any) -> None:
        """Count the result of a futureless item (:meth:`post`); keep its failures."""
        if result.success:
            self.posts_acked += item.count
            return
        self.posts_failed += item.count
        err = result.error if result.error is not None else ClientError("not stored")
        topic: str = getattr(item, "topic", "")
        for flag, payload in item.records():
            self._post_failures.append(PostFailure(topic, result.partition, payload, flag, err))

    async def send_batch(
        self,
        topic: str,
        datas: Sequence[bytes],
        attribute: str | None = None,
        key: bytes | str | None = None,
    ) -> BatchSendResult:
        """Send many messages to one partition and wait for one :class:`BatchSendResult`.

        See :meth:`send_batch_nowait`."""
        return await self.send_batch_nowait(topic, datas, attribute, key)

    def send_batch_nowait(
        self,
        topic: str,
        datas: Sequence[bytes],
        attribute: str | None = None,
        key: bytes | str | None = None,
    ) -> asyncio.Future[BatchSendResult]:
        """Queue many messages (same ``attribute``) for one partition (chosen once, by
        ``key`` or round robin); one future resolves to their :class:`BatchSendResult`.
        A ``key`` is kept on every message (:attr:`Message.key`), like :meth:`send`'s.

        The fast way to produce: the records are encoded in bulk into ``mput`` frames of
        at most ``batch_max_count`` messages / ``batch_max_bytes``, no object per message.
        Order is kept with other sends to the same partition. Inside a transaction of the
        current context the messages join it one by one. Raises :class:`ClientError` when
        the producer is closed or an element is not bytes.
        """
        tx = self._tx_var.get()
        if tx is not None and not tx.finished:
            futs = [tx.send_nowait(topic, d, attribute, key) for d in datas]
            return self._gather_batch(futs)
        if self._closed:
            raise ClientError("producer is closed")
        payloads = list(datas)
        if not all(type(d) is bytes for d in payloads):
            if not all(isinstance(d, bytes | bytearray | memoryview) for d in payloads):
                raise ClientError("message data must be bytes")
            payloads = [bytes(d) for d in payloads]
        flag = 0
        if key is not None:  # the key stays on every message (attribute block), as with send()
            flag = build_payload(b"", attribute, key)[1]
            payloads = [build_payload(d, attribute, key)[0] for d in payloads]
        elif attribute is not None:
            flag = rec.make_payload(b"", attribute)[1]
            payloads = [rec.make_payload(d, attribute)[0] for d in payloads]
        loop = self.loop
        if not payloads:
            done: asyncio.Future[BatchSendResult] = loop.create_future()
            done.set_result(BatchSendResult(True, None))
            return done
        chunks = self._chunks(payloads)
        futs2: list[asyncio.Future[BatchSendResult]] = []
        items = []
        for chunk in chunks:
            f: asyncio.Future[BatchSendResult] = loop.create_future()
            futs2.append(f)
            items.append(_BatchItem(chunk, flag, f))
            self._outstanding += len(chunk)
        if not self._spools_restored:
            self._restore_spools()
        waiting = self._unrouted.get(topic)
        parts = None if waiting is not None else self.router.cached(topic)
        if parts is None:
            if waiting is None:
                waiting = self._unrouted[topic] = deque()
                self._spawn(self._route_later(topic))
            for it in items:
                waiting.append((it, key, payloads[0]))
        elif self.identity is not None and (seed := self._seed_queue(topic)) is not None:
            for it in items:
                seed.append((it, key, payloads[0]))
        else:
            try:
                part = self.selector(topic, parts, key, payloads[0])
            except ClientError as e:
                for it in items:
                    self._resolve(it, it.failed(None, e))
            except Exception as e:  # a bug in the selector: raised, not a result
                for it in items:
                    self._fail_hard(it, e)
            else:
                sender = self._sender(topic, part)
                for it in items:
                    if self.producer_id is not None:
                        self._stamp(topic, part, it)
                    sender.add(it)
        return futs2[0] if len(futs2) == 1 else self._merge_batches(futs2, len(payloads))

    def _chunks(self, payloads: list[bytes]) -> list[list[bytes]]:
        """``payloads`` cut into pieces that each fit one mput frame."""
        cfg = self.config
        max_count = cfg.batch_max_count
        max_bytes = cfg.batch_max_bytes
        if len(payloads) <= max_count and (
            sum(map(len, payloads)) + rec.HEADER_SIZE * len(payloads) <= max_bytes
        ):
            return [payloads]
        out: list[list[bytes]] = []
        cur: list[bytes] = []
        size = 0
        for p in payloads:
            n = len(p) + rec.HEADER_SIZE
            if cur and (size + n > max_bytes or len(cur) >= max_count):
                out.append(cur)
                cur = []
                size = 0
            cur.append(p)
            size += n
        out.append(cur)
        return out

    def _merge_batches(
        self, futs: list[asyncio.Future[BatchSendResult]], total: int
    ) -> asyncio.Future[BatchSendResult]:
        """One result for a batch that went as several frames."""

        async def merge() -> BatchSendResult:
            results = await asyncio.gather(*futs)
            ids = [m for r in results for m in r.msg_ids]
            offs = [o for r in results for o in r.offsets]
            errs = [r.error for r in results if not r.success]
            part = next((r.partition for r in results if r.partition is not None), None)
            if not errs:
                return BatchSendResult(True, part, ids, offs, spooled=results[0].spooled)
            e = errs[0]
            err = ClientError(f"{len(ids)} of {total} messages stored; first error: {e}")
            return BatchSendResult(False, part, ids, offs, error=err)

        return asyncio.ensure_future(merge(), loop=self.loop)

    def _gather_batch(
        self, futs: list[asyncio.Future[SendResult]]
    ) -> asyncio.Future[BatchSendResult]:
        """One batch result for messages sent one by one (inside a transaction)."""

        async def merge() -> BatchSendResult:
            results = await asyncio.gather(*futs)
            ok = [r for r in results if r.success]
            part = results[0].partition if results else None
            ids = [r.msg_id for r in ok]
            offs = [r.offset for r in ok]
            bad = next((r.error for r in results if not r.success), None)
            if bad is None:
                return BatchSendResult(True, part, ids, offs)
            return BatchSendResult(False, part, ids, offs, error=bad)

        return asyncio.ensure_future(merge(), loop=self.loop)

    async def send_delayed(
        self,
        topic: str,
        data: bytes,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> SendResult:
        """Send a message consumers see no earlier than ``delay`` seconds from now or at
        ``deliver_at`` (an aware datetime or Unix seconds), in due order per partition.

        The broker keeps it durably until then (the ``dput`` extension); the result's
        offset is -1 because the message gets its offset when it is delivered.
        """
        if (delay is None) == (deliver_at is None):
            raise ClientError("give exactly one of delay= or deliver_at=")
        if delay is not None:
            due_ms = int((time.time() + delay) * 1000)
        elif isinstance(deliver_at, datetime):
            if deliver_at.tzinfo is None:
                raise ClientError("deliver_at must be timezone-aware (e.g. UTC)")
            due_ms = int(deliver_at.timestamp() * 1000)
        else:
            assert deliver_at is not None
            due_ms = int(float(deliver_at) * 1000)
        return self._checked(
            await self._send_delayed(topic, data, due_ms, attribute, key, headers)
        )

    def _checked(self, result: SendResult) -> SendResult:
        if not result.success and self.config.raise_on_error and result.error is not None:
            raise result.error
        return result

    async def _send_delayed(
        self,
        topic: str,
        data: bytes,
        due_ms: int,
        attribute: str | None,
        key: bytes | str | None,
        headers: Headers | None,
    ) -> SendResult:
        payload, flag = build_payload(data, attribute, key, headers)
        try:
            parts = await self.router.partitions(topic)
            part = self.selector(topic, parts, key, payload)
        except ClientError as e:
            return SendResult(False, None, error=e)
        timeout = self.client_config.request_timeout_s
        try:
            conn = await self.pool.get(part.address)
            r = await conn.request(
                lambda o: encode_dput(
                    topic, part.partition, payload, flag, rec.checksum(payload), due_ms, o
                ),
                timeout,
            )
        except ClientError as e:
            return SendResult(False, part, error=e)
        if r.code != 200:
            err = BrokerError(r.code, r.body.decode("utf-8", "replace"))
            return SendResult(False, part, error=err)
        mid, _off = _parse_put_reply(r)
        return SendResult(True, part, -1, mid)

    async def flush(self) -> None:
        """Wait until every queued message has its result."""
        await self.drain(0)

    async def drain(self, limit: int = 0) -> None:
        """Wait until at most ``limit`` messages are queued or in flight (back-pressure for
        :meth:`post` and :meth:`send_nowait` loops: ``await producer.drain(50_000)``)."""
        while self._outstanding > limit:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
                self._idle_at = limit
            else:
                self._idle_at = max(self._idle_at, limit)
            await self._idle.wait()

    async def close(self, timeout_s: float | None = 30.0) -> None:
        """Flush (up to ``timeout_s``), then stop; later sends raise ClientError."""
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush()
        except TimeoutError:
            log.warning("producer closed with %d messages unacknowledged", self._outstanding)
        self._closing_hard = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def outstanding(self) -> int:
        """Messages queued or in flight."""
        return self._outstanding

    # -- transactions

    def transaction(self, timeout: float | None = None) -> AsyncTransaction:
        """Begin a local transaction for ``async with`` (commit on exit, rollback on error).

        ::

            async with producer.transaction(timeout=10) as tx:
                await producer.send("orders", b"o-1")
                await producer.send("audit", b"o-1 created")

        Same as :meth:`begin_transaction`; see :class:`AsyncTransaction`.
        """
        return self.begin_transaction(timeout)

    def begin_transaction(self, timeout: float | None = None) -> AsyncTransaction:
        """Begin a local transaction and make it current in this context (task).

        ``timeout`` (seconds, rounded up) is enforced by the broker, capped at its
        ``maxTxTimeoutInSeconds``; None: the cap. BEGIN goes out with the first message.
        Raises :class:`ClientTransactionError` if this context already has an open one.
        """
        cur = self._tx_var.get()
        if cur is not None and not cur.finished:
            raise ClientTransactionError(
                f"transaction {cur.key} is still open in this context: transactions of one "
                "producer do not nest",
                cur.key,
            )
        tx = self._new_transaction(timeout)
        self._tx_var.set(tx)
        return tx

    def current_transaction(self) -> AsyncTransaction | None:
        """The open transaction of the current context, if any."""
        tx = self._tx_var.get()
        return tx if tx is not None and not tx.finished else None

    def _new_transaction(self, timeout: float | None) -> AsyncTransaction:
        """A transaction not bound to any context (thread-safe: no loop work)."""
        self._check_open()
        return AsyncTransaction(self, self._next_tx_key(), timeout)

    def _next_tx_key(self) -> str:
        return local_key(self.session_id, next(self._tx_seq))

    def _tx_ended(self, tx: AsyncTransaction) -> None:
        if self._tx_var.get() is tx:
            self._tx_var.set(None)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError("producer is closed")

    def _tx_channel(self) -> TxChannel:
        if self._channel is None:
            self._channel = TxChannel(self)
        return self._channel

    async def _tx_connection(self, address: str) -> AsyncConnection:
        return await self._tx_channel().get(address)

    def start_check_backs(self) -> None:
        """Register the producer group with the brokers now (on the loop) so check-backs
        reach this producer before it sends anything; done by
        ``create_transactional_producer``. With a non-static directory, brokers are
        registered as the producer first uses them."""
        if self.config.producer_group is None:
            raise ClientError("start_check_backs needs ProducerConfig.producer_group")
        self._tx_channel().start()

    async def send_in_transaction(
        self,
        topic: str,
        data: bytes,
        local_tx: LocalTransaction,
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout: float | None = None,
        *,
        headers: Headers | None = None,
    ) -> TransactionSendResult:
        """Send a half message, run ``local_tx(msg)``, then commit or roll the message back.

        ::

            async def local_tx(msg: Message) -> LocalTxState:
                ok = await db.insert_order(msg.data)
                return LocalTxState.COMMIT if ok else LocalTxState.ROLLBACK

            result = await producer.send_in_transaction("orders", b"o-1", local_tx)

        BEGIN, the put and PREPARE are pipelined on a registered connection; then
        ``local_tx`` (plain or ``async def``; a plain one runs on the loop) decides:
        COMMIT -> COMMIT_TWO_PHASE, ROLLBACK -> ROLLBACK, UNKNOWN -> nothing (the broker asks
        the group's checker after ``txCheckBackDelay``). If ``local_tx`` raises, the state
        is UNKNOWN and the exception propagates. Raises (without running ``local_tx``) when
        the half message could not be prepared. Needs a producer group.
        """
        half = await self._send_half(topic, data, attribute, key, timeout, headers)
        try:
            res: object = local_tx(half.message)
            if inspect.isawaitable(res):
                res = await res
        except BaseException as e:
            log.warning(
                "local transaction of %s raised %r: UNKNOWN, left to check-back", half.tx_key, e
            )
            raise
        state = as_state(res, half.tx_key)
        err = await self._end_half(half, state)
        return TransactionSendResult(half.tx_key, state, half.result, err)

    async def _send_half(
        self,
        topic: str,
        data: bytes,
        attribute: str | None,
        key: bytes | str | None,
        timeout: float | None,
        headers: Headers | None = None,
    ) -> HalfMessage:
        """BEGIN + put + PREPARE; the prepared half message (raises when not prepared)."""
        self._check_open()
        if self.config.producer_group is None:
            raise ClientTransactionError(
                "send_in_transaction needs a producer group: "
                "session.create_transactional_producer(group, checker)"
            )
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ClientError(f"message data must be bytes, not {type(data).__name__}")
        body = bytes(data)
        payload, flag = build_payload(body, attribute, key, headers)
        parts = self.router.cached(topic) or await self.router.partitions(topic)
        part = self.selector(topic, parts, key, body)
        conn = await self._tx_connection(part.address)
        tx_key = self._next_tx_key()
        sid = self.session_id
        tmo = timeout_token(timeout)
        begin = ["transaction", tx_key, sid, "BEGIN"] + ([str(tmo)] if tmo is not None else [])
        cs = rec.checksum(payload) if self.config.send_checksum else None
        frames: list[Callable[[int], bytes]] = [
            lambda o: encode_line(*begin, o),
            lambda o: encode_put(topic, part.partition, payload, flag, o, cs, tx_key),
            lambda o: encode_line("transaction", tx_key, sid, "PREPARE", o),
        ]
        waits = []
        t = self.client_config.request_timeout_s
        try:
            for build in frames:
                o = conn.next_opaque()
                waits.append(conn.wait(conn.send(build(o), o), o, t))
        except ConnectionLostError as e:
            for w in waits:
                w.close()
            raise TransactionConnectionError(f"half message {tx_key}: {e}", tx_key) from e
        replies = await asyncio.gather(*waits, return_exceptions=True)
        for r in replies:
            if isinstance(r, ConnectionLostError | RequestTimeoutError):
                raise TransactionConnectionError(
                    f"half message {tx_key}: {r}; if it was prepared, the broker will ask the "
                    "checker (whose answer should be ROLLBACK: local_tx never ran)",
                    tx_key,
                ) from r
            if isinstance(r, BaseException):
                raise r
        r_begin, r_put, r_prep = (r for r in replies if isinstance(r, Response))
        for r in (r_begin, r_put):
            if r.code != 200:
                raise reply_error(r, tx_key)  # PREPARE voted read-only: nothing left behind
        if r_prep.code != 200:
            with contextlib.suppress(ClientError):
                await conn.request(
                    lambda o: encode_line("transaction", tx_key, sid, "ROLLBACK", o), t
                )
            raise reply_error(r_prep, tx_key)
        try:
            vote = parse_prepare_vote(r_prep.body)
            msg_id = PutAck.parse(r_put.body).msg_id
        except ProtocolError as e:
            raise ClientError(str(e)) from None
        if vote == XA_RDONLY:
            raise ClientTransactionError(f"half message {tx_key} was not recorded", tx_key)
        result = SendResult(True, part, -1, msg_id)
        return HalfMessage(tx_key, conn, result, Message(topic, part, -1, msg_id, flag, payload))

    async def _end_half(self, half: HalfMessage, state: LocalTxState) -> Exception | None:
        """Second phase for ``state``; the error when it could not be delivered."""
        if state is LocalTxState.UNKNOWN:
            log.info("half message %s left UNKNOWN: the broker will check back", half.tx_key)
            return None
        verb = "COMMIT_TWO_PHASE" if state is LocalTxState.COMMIT else "ROLLBACK"
        sid, key = self.session_id, half.tx_key
        try:
            conn = half.conn
            if not conn.is_open:  # a prepared transaction may end on any connection
                conn = await self._tx_connection(conn.address)
            r = await conn.request(
                lambda o: encode_line("transaction", key, sid, verb, o),
                self.client_config.request_timeout_s,
            )
            if r.code == 200:
                return None
            err: Exception = reply_error(r, key)
        except ClientError as e:
            err = e
        log.warning("half message %s: %s failed (%s): left to check-back", key, verb, err)
        return err

    # -- internals

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _resolve(self, item: _Queued, result: Any) -> None:
        fut = item.future
        if fut is None:
            self._post_result(item, result)
        elif not fut.done():
            if self._raise_on_error and not result.success and result.error is not None:
                fut.set_exception(result.error)
            else:
                fut.set_result(result)
        self._outstanding -= item.count
        if self._idle is not None and self._outstanding <= self._idle_at:
            self._idle.set()

    def _acked_all(self, part: Partition, items: Sequence[_Queued], mid: int, off: int) -> None:
        """Resolve ``items`` stored back to back from message id ``mid`` at ``off`` (one
        mput ack): :meth:`_resolve` of each, without its per-message calls."""
        count = 0
        new = tuple.__new__  # SendResult(True, part, off, mid) without NamedTuple.__new__
        posted = 0
        for it in items:
            if isinstance(it, _Item):
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
        self._outstanding -= count
        if self._idle is not None and self._outstanding <= self._idle_at:
            self._idle.set()

    def _fail_hard(self, item: _Queued, error: Exception) -> None:
        """Fail ``item`` with ``error`` itself (programming errors always raise)."""
        if item.future is None:  # a post: a failure like the others
            self._post_result(item, SendResult(False, None, error=error))
        elif not item.future.done():
            item.future.set_exception(error)
        self._outstanding -= item.count
        if self._idle is not None and self._outstanding <= self._idle_at:
            self._idle.set()

    def _maybe_idle(self) -> None:
        if self._idle is not None and self._outstanding <= self._idle_at:
            self._idle.set()

    def _dispatch(
        self,
        topic: str,
        parts: Sequence[Partition],
        item: _Queued,
        key: bytes | str | None,
        data: bytes,
    ) -> None:
        if self.identity is not None and (seed := self._seed_queue(topic)) is not None:
            seed.append((item, key, data))
            return
        try:
            part = self.selector(topic, parts, key, data)
        except ClientError as e:
            self._resolve(item, item.failed(None, e))
            return
        except Exception as e:  # a bug in the selector: raised by send(), not a result
            self._fail_hard(item, e)
            return
        if self.producer_id is not None:
            self._stamp(topic, part, item)
        self._sender(topic, part).add(item)

    def _stamp(self, topic: str, part: Partition, item: _Queued) -> None:
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
        if isinstance(item, _BatchItem):
            item.payloads = stamped
        else:
            item.payload = stamped[0]
        item.flag = flag
        item.nbytes = sum(map(len, stamped)) + rec.HEADER_SIZE * len(stamped)

    def _sender(self, topic: str, part: Partition) -> _PartitionSender:
        # Partition's dataclass __hash__ runs in Python: look the routed partition object
        # up by identity first (the router hands out the same objects while cached).
        hit = self._sender_by_id.get((topic, id(part)))
        if hit is not None and hit[0] is part:
            return hit[1]
        s = self._senders.get((topic, part))
        if s is None:
            s = self._senders[(topic, part)] = _PartitionSender(self, topic, part)
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
                    if not _retriable(e) or attempt == cfg.retries:
                        raise
                    await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2**attempt)))
        except Exception as e:
            err = e if isinstance(e, ClientError) else ClientError(str(e))
            waiting = self._unrouted.pop(topic, deque())
            for item, _key, _data in waiting:
                self._resolve(item, item.failed(None, err))
            return
        if self.identity is not None and self.identity.named and topic not in self._seeded:
            try:
                await self._seed(topic, parts)
            except Exception as e:
                err = e if isinstance(e, ClientError) else ClientError(str(e))
                for item, _key, _data in self._unrouted.pop(topic, deque()):
                    self._resolve(item, item.failed(None, err))
                return
        waiting = self._unrouted.pop(topic, deque())
        for item, key, data in waiting:
            self._dispatch(topic, parts, item, key, data)

    def _seed_queue(
        self, topic: str
    ) -> deque[tuple[_Queued, bytes | str | None, bytes]] | None:
        """Named identity: the queue messages for ``topic`` wait in until its sequences
        are read from its brokers (None: ready). Other producers: None."""
        ident = self.identity
        if ident is None or not ident.named or topic in self._seeded:
            return None
        waiting = self._unrouted.get(topic)
        if waiting is None:
            waiting = self._unrouted[topic] = deque()
            self._spawn(self._route_later(topic))
        return waiting

    async def _seed(self, topic: str, parts: Sequence[Partition]) -> None:
        """Claim the named identity on ``topic``'s brokers and go on from the last sequence
        each stored for it (retried like a send; a fenced identity is not)."""
        ident = self.identity
        assert ident is not None
        cfg = self.config
        for attempt in range(cfg.retries + 1):
            try:
                for part, last in (await self.producer_sequences(topic, parts)).items():
                    k = (topic, part)
                    self._sequences[k] = max(self._sequences.get(k, 0), last + 1)
                break
            except ClientError as e:
                if not _retriable(e) or attempt == cfg.retries:
                    raise
                await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2**attempt)))
        self._seeded.add(topic)

    async def producer_sequences(
        self, topic: str, parts: Sequence[Partition] | None = None
    ) -> dict[Partition, int]:
        """Idempotent producer: claim the identity on the brokers of ``topic`` and return
        the last sequence each stored for it per partition (a partition it never wrote to
        is absent). Raises :class:`~notify.errors.ProducerFencedError` when a newer
        instance holds the (named) identity."""
        ident = self.identity
        if ident is None:
            raise ClientError("producer_sequences needs ProducerConfig(idempotent=True)")
        if parts is None:
            parts = await self.router.partitions(topic)
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

    def _restore_spools(self) -> None:
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
            s = self._sender(topic, part)
            s.spool = Spool(path)
            if not s.spool.empty:
                s._start_replay()

    async def _transmit(
        self, topic: str, part: Partition, items: Sequence[_Queued]
    ) -> MultiPutAck | list[_Ack | Exception]:
        """Send ``items`` to ``part`` once: the mput ack covering all their messages, or
        one ack or exception per message (in order)."""
        timeout = self.client_config.request_timeout_s
        conn = await self.pool.get(part.address)
        count = sum(it.count for it in items)
        try:
            ident = self.identity
            if ident is not None and ident.claimed(conn) is None:
                await ident.ensure(conn, timeout)  # a new connection: claim the identity
            if count > 1 and self.config.use_mput and part.address not in self._no_mput:
                r = await self._request_mput(conn, topic, part.partition, items, timeout)
                if not _unknown_command(r):
                    if r.code != 200:
                        return [broker_error(r.code, r.body)] * count
                    try:
                        return _parse_mput_reply(r, count)
                    except ClientError as e:
                        return [e] * count
                log.info("broker %s does not know mput: pipelining put", part.address)
                self._no_mput.add(part.address)
            return await self._pipelined_puts(conn, topic, part.partition, items, timeout)
        except ConnectionLostError:
            self.pool.discard(conn)
            raise

    async def _request_mput(
        self,
        conn: AsyncConnection,
        topic: str,
        partition: int,
        items: Sequence[_Queued],
        timeout: float,
    ) -> Response:
        body = _mput_body(items)
        count = sum(it.count for it in items)
        return await conn.request(lambda o: encode_mput(topic, partition, body, count, o), timeout)

    async def _pipelined_puts(
        self,
        conn: AsyncConnection,
        topic: str,
        partition: int,
        items: Sequence[_Queued],
        timeout: float,
    ) -> list[_Ack | Exception]:
        checksum: Callable[[bytes], int] | None = (
            rec.checksum if self.config.send_checksum else None
        )
        sent: list[tuple[int, asyncio.Future[Response]]] = []
        for flag, payload in [r for it in items for r in it.records()]:
            opaque = conn.next_opaque()
            cs = checksum(payload) if checksum is not None else None
            frame = encode_put(topic, partition, payload, flag, opaque, checksum=cs)
            sent.append((opaque, conn.send(frame, opaque)))
        await conn.drain()
        out: list[_Ack | Exception] = []
        for opaque, fut in sent:
            try:
                r = await conn.wait(fut, opaque, timeout)
            except (ConnectionLostError, RequestTimeoutError) as e:
                out.append(e)
                continue
            if r.code != 200:
                out.append(broker_error(r.code, r.body))
                continue
            try:
                out.append(_parse_put_reply(r))
            except ClientError as e:
                out.append(e)
        return out
