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
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from notify.codec import records as rec
from notify.codec.wire import Response, encode_mput, encode_put
from notify.errors import BrokerError, ClientError, ConnectionLostError, RequestTimeoutError

from ._config import ClientConfig, ProducerConfig
from ._connection import BrokerConnection, ConnectionPool
from ._message import SendResult
from ._routing import Partition, TopicRouter
from ._selectors import PartitionSelector, RoundRobinSelector
from ._spool import Spool, existing_spools

log = logging.getLogger("notify.client")

_Ack = tuple[int, int]  # (msg_id, offset)


class _Item:
    __slots__ = ("flag", "future", "payload")

    def __init__(self, payload: bytes, flag: int, future: asyncio.Future[SendResult]):
        self.payload = payload
        self.flag = flag
        self.future = future


def _retriable(e: BaseException) -> bool:
    return isinstance(e, ConnectionLostError | RequestTimeoutError) or (
        isinstance(e, BrokerError) and e.retriable
    )


def _parse_put_reply(r: Response) -> _Ack:
    parts = r.body.split()
    try:
        return int(parts[0]), int(parts[2])
    except (IndexError, ValueError):
        raise ClientError(f"malformed put reply body {r.body[:80]!r}") from None


def _parse_mput_reply(r: Response, items: Sequence[_Item]) -> list[_Ack]:
    parts = r.body.split()
    try:
        first_id, first_off, count = int(parts[0]), int(parts[2]), int(parts[3])
    except (IndexError, ValueError):
        raise ClientError(f"malformed mput reply body {r.body[:80]!r}") from None
    if count != len(items):
        raise ClientError(f"mput reply acknowledges {count} of {len(items)} messages")
    acks: list[_Ack] = []
    off = first_off
    for i, it in enumerate(items):
        acks.append((first_id + i, off if first_off >= 0 else -1))
        off += rec.HEADER_SIZE + len(it.payload)
    return acks


def _unknown_command(r: Response) -> bool:
    return r.code == 400 and b"unknown command" in r.body.lower()


class _PartitionSender:
    """The queue and pump of one global partition."""

    def __init__(self, producer: AsyncProducer, topic: str, partition: Partition):
        self.p = producer
        self.topic = topic
        self.partition = partition
        self.queue: deque[_Item] = deque()
        self.in_flight = 0
        self.scheduled = False
        self.spool: Spool | None = None
        self.replay_task: asyncio.Task[None] | None = None

    def add(self, item: _Item) -> None:
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
        while self.queue and self.in_flight < cfg.max_in_flight_per_partition:
            batch: list[_Item] = []
            size = 0
            while self.queue and len(batch) < cfg.batch_max_count:
                it = self.queue[0]
                if batch and size + len(it.payload) + rec.HEADER_SIZE > cfg.batch_max_bytes:
                    break
                batch.append(self.queue.popleft())
                size += len(it.payload) + rec.HEADER_SIZE
            self.in_flight += 1
            self.p._spawn(self._send_batch(batch))

    async def _send_batch(self, batch: list[_Item]) -> None:
        try:
            await self._send_with_retries(batch)
        finally:
            self.in_flight -= 1
            if self.queue:
                self.pump()
            self.p._maybe_idle()

    async def _send_with_retries(self, batch: list[_Item]) -> None:
        cfg = self.p.config
        todo = batch
        last: BaseException | None = None
        for attempt in range(cfg.retries + 1):
            if attempt:
                await asyncio.sleep(min(5.0, cfg.retry_backoff_s * (2 ** (attempt - 1))))
            try:
                results = await self.p._transmit(self.topic, self.partition, todo)
            except BaseException as e:  # translated per batch below
                if isinstance(e, asyncio.CancelledError):
                    self._fail(todo, ConnectionLostError("producer closed"))
                    raise
                results = [e if isinstance(e, Exception) else ClientError(str(e))] * len(todo)
            retry: list[_Item] = []
            for it, res in zip(todo, results, strict=True):
                if isinstance(res, tuple):
                    self.p._resolve(it, SendResult(True, self.partition, res[1], res[0]))
                elif _retriable(res):
                    last = res
                    retry.append(it)
                else:
                    if isinstance(res, BrokerError) and res.code == 404:
                        self.p.router.invalidate(self.topic)
                    err = res if isinstance(res, ClientError) else ClientError(str(res))
                    self.p._resolve(it, SendResult(False, self.partition, error=err))
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

    def _fail(self, items: Sequence[_Item], err: Exception) -> None:
        for it in items:
            self.p._resolve(it, SendResult(False, self.partition, error=err))

    # -- ordered mode spool

    def _spool_obj(self) -> Spool:
        if self.spool is None:
            assert self.p.config.spool_dir is not None
            path = Path(self.p.config.spool_dir) / self.topic / f"{self.partition}.spool"
            self.spool = Spool(path)
        return self.spool

    def _to_spool(self, items: Sequence[_Item]) -> None:
        spool = self._spool_obj()
        try:
            spool.append([(it.flag, it.payload) for it in items])
        except ClientError as e:
            self._fail(items, e)
            return
        for it in items:
            self.p._resolve(it, SendResult(True, self.partition, spooled=True))
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
            items = [_Item(payload, flag, loop.create_future()) for flag, payload in msgs]
            try:
                results = await self.p._transmit(self.topic, self.partition, items)
            except (ClientError, OSError) as e:
                results = [e] * len(items)
            ok = 0
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

    Create it with :meth:`AsyncMessageSessionFactory.create_producer`. All methods must be
    called on the session's event loop.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        router: TopicRouter,
        client_config: ClientConfig,
        config: ProducerConfig,
        selector: PartitionSelector | None = None,
    ):
        self.pool = pool
        self.router = router
        self.client_config = client_config
        self.config = config
        if config.ordered and config.max_in_flight_per_partition != 1:
            config.max_in_flight_per_partition = 1
        self.selector: PartitionSelector = selector or RoundRobinSelector()
        self._senders: dict[tuple[str, Partition], _PartitionSender] = {}
        self._unrouted: dict[str, deque[tuple[_Item, bytes | str | None, bytes]]] = {}
        self._no_mput: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outstanding = 0
        self._idle: asyncio.Event | None = None
        self._closed = False
        self._closing_hard = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats_spool_replayed = 0
        self._spools_restored = False

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
    ) -> SendResult:
        """Send one message and wait for its result (never raises for a failed send)."""
        return await self.send_nowait(topic, data, attribute, key)

    def send_nowait(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue one message; the future resolves to its :class:`SendResult`.

        Messages queued one after the other for the same partition are sent in that order.
        Raises :class:`ClientError` when the producer is closed.
        """
        if self._closed:
            raise ClientError("producer is closed")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ClientError(f"message data must be bytes, not {type(data).__name__}")
        payload, flag = rec.make_payload(bytes(data), attribute)
        loop = self.loop
        fut: asyncio.Future[SendResult] = loop.create_future()
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
            return fut
        self._dispatch(topic, parts, item, key, payload)
        return fut

    async def flush(self) -> None:
        """Wait until every queued message has its result."""
        while self._outstanding:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
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

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def outstanding(self) -> int:
        """Messages queued or in flight."""
        return self._outstanding

    # -- internals

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _resolve(self, item: _Item, result: SendResult) -> None:
        if not item.future.done():
            item.future.set_result(result)
        self._outstanding -= 1
        if not self._outstanding and self._idle is not None:
            self._idle.set()

    def _maybe_idle(self) -> None:
        if not self._outstanding and self._idle is not None:
            self._idle.set()

    def _dispatch(
        self,
        topic: str,
        parts: Sequence[Partition],
        item: _Item,
        key: bytes | str | None,
        data: bytes,
    ) -> None:
        try:
            part = self.selector(topic, parts, key, data)
        except Exception as e:
            err = e if isinstance(e, ClientError) else ClientError(f"partition selector: {e}")
            self._resolve(item, SendResult(False, None, error=err))
            return
        self._sender(topic, part).add(item)

    def _sender(self, topic: str, part: Partition) -> _PartitionSender:
        s = self._senders.get((topic, part))
        if s is None:
            s = self._senders[(topic, part)] = _PartitionSender(self, topic, part)
        elif not s.partition.address and part.address:
            s.partition = part  # a restored spool's partition, now routed
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
                self._resolve(item, SendResult(False, None, error=err))
            return
        waiting = self._unrouted.pop(topic, deque())
        for item, key, data in waiting:
            self._dispatch(topic, parts, item, key, data)

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
        self, topic: str, part: Partition, items: Sequence[_Item]
    ) -> list[_Ack | Exception]:
        """Send ``items`` to ``part`` once; one ack or exception per item."""
        timeout = self.client_config.request_timeout_s
        conn = await self.pool.get(part.address)
        try:
            if len(items) > 1 and self.config.use_mput and part.address not in self._no_mput:
                r = await self._request_mput(conn, topic, part.partition, items, timeout)
                if not _unknown_command(r):
                    if r.code != 200:
                        err = BrokerError(r.code, r.body.decode("utf-8", "replace"))
                        return [err] * len(items)
                    return list(_parse_mput_reply(r, items))
                log.info("broker %s does not know mput: pipelining put", part.address)
                self._no_mput.add(part.address)
            return await self._pipelined_puts(conn, topic, part.partition, items, timeout)
        except ConnectionLostError:
            self.pool.discard(conn)
            raise

    async def _request_mput(
        self,
        conn: BrokerConnection,
        topic: str,
        partition: int,
        items: Sequence[_Item],
        timeout: float,
    ) -> Response:
        encode = rec.encode
        body = b"".join([encode(0, it.flag, it.payload) for it in items])
        return await conn.request(
            lambda o: encode_mput(topic, partition, body, len(items), o), timeout
        )

    async def _pipelined_puts(
        self,
        conn: BrokerConnection,
        topic: str,
        partition: int,
        items: Sequence[_Item],
        timeout: float,
    ) -> list[_Ack | Exception]:
        checksum: Callable[[bytes], int] | None = (
            rec.checksum if self.config.send_checksum else None
        )
        sent: list[tuple[int, asyncio.Future[Response]]] = []
        for it in items:
            opaque = conn.next_opaque()
            cs = checksum(it.payload) if checksum is not None else None
            frame = encode_put(topic, partition, it.payload, it.flag, opaque, checksum=cs)
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
                out.append(BrokerError(r.code, r.body.decode("utf-8", "replace")))
                continue
            try:
                out.append(_parse_put_reply(r))
            except ClientError as e:
                out.append(e)
        return out
