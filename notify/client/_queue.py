"""Queue consumers: the broker pushes messages of a queue group, the client acknowledges
each one (README "Queues").

:class:`AsyncQueueConsumer` keeps one dedicated connection per broker holding the topic
(reconnecting and subscribing again after a failure: what it held there went back to the
group at once), receives pushed ``qmsg`` frames up to its credit, and acknowledges with
``qack``. Acknowledgements made in the same event-loop turn go out as one frame per broker
(batched); each awaits the broker's answer, which for accept and reject comes only once
they are durable. Use ``async for msg in consumer`` and ``await msg.ack()`` /
``release(delay=...)`` / ``reject()`` / ``renew()``, or give a ``listener``: it runs per
message (plain callables on a thread), its return accepts the message and an exception
releases it (redelivered, dead-lettered after ``queueMaxDeliveries``).

Cluster mode (``connect(zk=...)`` on ZooKeeper): before each subscription the consumer
registers ``consumers/<group>/queue-ids/<topic>/<consumerId>`` (ephemeral) and names its id
in ``qsub``; a broker drops a consumer whose node goes (its session ended) by closing the
connection, and the consumer registers and subscribes again once it can.

:class:`QueueConsumer` and :class:`SyncQueueMessage` are the synchronous wrappers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, cast

from notify.client.transport import AsyncConnection, TransportOptions, open_connection
from notify.configserver import ConfigServer, ConfigServerError, new_consumer_id
from notify.errors import ClientError, ConnectionLostError
from notify.protocol.frames import QBATCH_RUN, Response, decode_qbatch, encode_line, encode_qack
from notify.protocol.records import HEADER, HEADER_SIZE, split_payload

from ._facade import AsyncCloses, Closes
from ._loopthread import LoopThread
from ._routing import TopicRouter

log = logging.getLogger("notify.client")

QueueListener = Callable[["QueueMessage"], Any] | Callable[["QueueMessage"], Awaitable[Any]]
BatchListener = (
    Callable[[list["QueueMessage"]], Any] | Callable[[list["QueueMessage"]], Awaitable[Any]]
)
#: one acknowledgement to send: (wire kind, partition, offset, end offset, delay ms); kinds
#: in upper case name the message at ``offset``, in lower case every message in [offset, end)
AckItem = tuple[bytes, int, int, int, int]
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0


class QueueMessage:
    """A message pushed to a queue consumer; acknowledge it exactly once with
    :meth:`ack`, :meth:`release` or :meth:`reject` (:meth:`renew` keeps the lock)."""

    # the record stays in the pushed frame (``_buf`` at ``_pos``): its fields are read when
    # asked for, so a batch of messages costs little more than its frame
    __slots__ = ("_broker", "_buf", "_end", "_pos", "delivery_count", "offset", "partition")

    def __init__(self, topic: str, broker: _Broker, partition: int, offset: int, count: int,
                 record: bytes):
        # ``topic`` is the consumer's (read back through ``broker``)
        if len(record) < HEADER_SIZE:
            raise ClientError(f"pushed record of {len(record)} bytes is too short")
        length = HEADER.unpack_from(record, 0)[0]
        if length < 0 or HEADER_SIZE + length > len(record):
            raise ClientError(f"pushed record of {len(record)} bytes is cut short")
        self._broker = broker
        self._buf = record
        self._pos = 0
        self.partition = partition
        self.offset = offset
        self.delivery_count = count
        self._end = offset + HEADER_SIZE + length

    @property
    def topic(self) -> str:
        """The topic it was published to."""
        return self._broker.owner.topic

    @property
    def msg_id(self) -> int:
        """The message id the broker gave it."""
        return int(HEADER.unpack_from(self._buf, self._pos)[2])

    @property
    def flag(self) -> int:
        """The record's flag bits."""
        return int(HEADER.unpack_from(self._buf, self._pos)[3])

    @property
    def payload(self) -> bytes:
        """The record's payload (attribute block and data)."""
        start = self._pos + HEADER_SIZE
        return self._buf[start : start + self._end - self.offset - HEADER_SIZE]

    @property
    def data(self) -> bytes:
        """The application bytes."""
        return split_payload(self.payload, self.flag)[1]

    @property
    def attribute(self) -> str | None:
        """The message attribute (MetaQ's string tag), or None."""
        return split_payload(self.payload, self.flag)[0]

    @property
    def broker(self) -> str:
        """Address of the broker that pushed it."""
        return self._broker.address

    @property
    def group(self) -> str:
        """The queue group it was delivered to."""
        return self._broker.owner.group

    @property
    def partition_key(self) -> str:
        """The global partition ``"<brokerId>-<part>"`` (as offset stores key it): with
        :attr:`topic`, :attr:`group` and :attr:`offset` it names the message for good."""
        return f"{self._broker.broker_id}-{self.partition}"

    async def ack(self) -> bool:
        """Accept: done with (durable when this returns True; False: the lock was lost,
        e.g. it timed out or the connection dropped, and the message goes to another)."""
        return await self._broker.acknowledge((b"A", self.partition, self.offset, self._end, 0))

    async def release(self, delay: float = 0.0) -> bool:
        """Give it back for redelivery, no earlier than ``delay`` seconds from now."""
        ms = int(delay * 1000)
        return await self._broker.acknowledge((b"R", self.partition, self.offset, self._end, ms))

    async def reject(self) -> bool:
        """Never deliver it again: it goes to the group's dead-letter queue."""
        return await self._broker.acknowledge((b"X", self.partition, self.offset, self._end, 0))

    async def renew(self) -> bool:
        """Keep the lock for another ``queueLockTimeout``."""
        return await self._broker.acknowledge((b"N", self.partition, self.offset, self._end, 0))

    def __repr__(self) -> str:
        return (f"QueueMessage({self.topic!r}, {self.broker} {self.partition}:{self.offset}, "
                f"delivery_count={self.delivery_count})")


class _Broker:
    """One broker's connection of a queue consumer, with its acknowledgement batcher."""

    def __init__(self, owner: AsyncQueueConsumer, address: str, broker_id: int = 0):
        self.owner = owner
        self.address = address
        self.broker_id = broker_id
        self.conn: AsyncConnection | None = None
        self.credit = 0
        #: the broker takes ``qbsub`` (batched pushes) and range acknowledgements
        self.ranges = False
        self._items: list[AckItem] = []
        self._waiters: list[tuple[AckItem, asyncio.Future[bool]]] = []
        self._flush_scheduled = False
        self.task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    async def run(self) -> None:
        """Connect, subscribe, and do it again after a failure until closed."""
        backoff = RECONNECT_MIN_S
        o = self.owner
        while not o.closed:
            if o.cluster is not None:
                try:
                    await o.cluster.register_queue_consumer(o.group, o.topic, o.consumer_id)
                except ConfigServerError as e:
                    log.info("queue consumer: cannot register in ZooKeeper: %s", e)
                    await asyncio.sleep(backoff)
                    backoff = min(RECONNECT_MAX_S, backoff * 2)
                    continue
            try:
                conn = await open_connection(self.address, o.options)
            except ClientError as e:
                log.info("queue consumer: %s unreachable: %s", self.address, e)
                await asyncio.sleep(backoff)
                backoff = min(RECONNECT_MAX_S, backoff * 2)
                continue
            conn.push_handler = self._on_push
            self.conn = conn
            try:
                qsub: list[object] = ["qbsub", o.topic, o.group, o.credit, o.start]
                if o.cluster is not None:
                    qsub.append(o.consumer_id)
                r = await conn.request(functools.partial(_encode_qsub, qsub))
                self.ranges = r.code != 400 or b"unknown command" not in r.body
                if not self.ranges:  # an older broker: one qmsg frame per message
                    qsub[0] = "qsub"
                    r = await conn.request(functools.partial(_encode_qsub, qsub))
                if r.code == 409:  # our ZooKeeper node went in the meantime: register again
                    raise ConnectionLostError(r.body.decode(errors="replace"))
                if r.code != 200:
                    text = r.body.decode(errors="replace")
                    raise ClientError(f"{self.address}: qsub refused ({r.code}): {text}")
                self.credit = int(r.body)
                backoff = RECONNECT_MIN_S
                self.subscribed.set()
                await conn.closed_future
            except ConnectionLostError as e:
                log.info("queue consumer: %s lost: %s", self.address, e)
            except ClientError as e:
                o.error = e
                self.subscribed.set()
                conn.close()
                return
            finally:
                if not o.closed and o.error is None:
                    self.subscribed.clear()
                self.conn = None
                conn.close()
            if not o.closed:
                await asyncio.sleep(backoff)
                backoff = min(RECONNECT_MAX_S, backoff * 2)

    def _on_push(self, conn: AsyncConnection, r: Response) -> None:
        try:
            if r.kind == "qbatch":
                msgs, runs = _batch_messages(self, r.body)
                self.owner.deliver_batch(self, msgs, runs)
                return
            msg = QueueMessage(self.owner.topic, self, r.partition, r.offset, r.code, r.body)
        except ClientError as e:
            log.error("queue consumer: %s", e)
            return
        self.owner.deliver_batch(self, [msg], [(r.partition, msg.offset, msg._end, 1)])

    def acknowledge(self, item: AckItem) -> asyncio.Future[bool]:
        """Queue one ``qack`` item; all items of this loop turn go in one frame. The
        future tells whether the broker applied it (durably)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not self.acknowledge_nowait(item):
            fut.set_result(False)  # the broker released it when the connection dropped
        else:
            self._waiters.append((item, fut))
        return fut

    def acknowledge_nowait(self, item: AckItem) -> bool:
        """Queue one ``qack`` item nobody waits for; False when not connected."""
        conn = self.conn
        if conn is None or not conn.is_open:
            return False
        self._items.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_scheduled = False
        items, self._items = self._items, []
        waiters, self._waiters = self._waiters, []
        conn = self.conn
        o = self.owner
        if conn is None or not conn.is_open:
            for _, f in waiters:
                if not f.done():
                    f.set_result(False)
            return
        body = _ack_body(items, self.ranges)
        try:
            fut = conn.submit(lambda op: encode_qack(o.topic, o.group, body, op))
        except ConnectionLostError:
            for _, f in waiters:
                if not f.done():
                    f.set_result(False)
            return
        fut.add_done_callback(lambda f: _resolve(f, waiters))


def _encode_qsub(tokens: list[object], opaque: int) -> bytes:
    return encode_line(*tokens, opaque)


def _batch_messages(
    broker: _Broker, body: bytes
) -> tuple[list[QueueMessage], list[tuple[int, int, int, int]]]:
    """The messages of a ``qbatch`` frame and its runs ``(partition, from, to, n)``."""
    msgs: list[QueueMessage] = []
    append = msgs.append
    runs = []
    new = QueueMessage.__new__
    unpack = HEADER.unpack_from
    hs = HEADER_SIZE
    for p, count, n, first, pos in decode_qbatch(body):
        off, start = first, pos
        size = QBATCH_RUN.unpack_from(body, pos - QBATCH_RUN.size)[4]
        end = pos + size
        for _ in range(n):
            length = hs + unpack(body, pos)[0] if end - pos >= hs else -1
            if length < hs or pos + length > end:
                raise ClientError(f"qbatch run of {n} records at {first} is cut short")
            m = new(QueueMessage)
            m._broker = broker
            m._buf = body
            m._pos = pos
            m.partition = p
            m.offset = off
            m.delivery_count = count
            off = m._end = off + length
            pos += length
            append(m)
        if pos != start + size:
            raise ClientError(
                f"qbatch run at {first}: {n} records fill {pos - start} of {size} bytes"
            )
        runs.append((p, first, off, n))
    return msgs, runs


def _ack_body(items: list[AckItem], ranges: bool) -> bytes:
    """``qack`` items; with ``ranges`` (a broker that takes them) the accepts of one
    partition at consecutive offsets go as one ``a <p> <from> <to>`` line."""
    lines: list[bytes] = []
    spans: dict[int, list[tuple[int, int, bool]]] = {}
    for kind, p, off, end, delay in items:
        if ranges and (kind == b"A" or kind == b"a"):
            spans.setdefault(p, []).append((off, end, kind == b"A"))
        elif kind == b"R" or kind == b"r":
            if kind == b"r":
                lines.append(b"r %d %d %d %d" % (p, off, end, delay))
            else:
                lines.append(b"R %d %d %d" % (p, off, delay))
        elif kind.islower():
            lines.append(b"%s %d %d %d" % (kind, p, off, end))
        else:
            lines.append(b"%s %d %d" % (kind, p, off))
    for p, ss in spans.items():
        ss.sort()
        a, b, one = ss[0]
        for off, end, single in ss[1:]:
            if off == b:
                b, one = end, False
                continue
            lines.append(b"A %d %d" % (p, a) if one else b"a %d %d %d" % (p, a, b))
            a, b, one = off, end, single
        lines.append(b"A %d %d" % (p, a) if one else b"a %d %d %d" % (p, a, b))
    return b"\n".join(lines) + b"\n"


def _refused_spans(lines: list[str]) -> list[tuple[int, int, int]]:
    """``(partition, from, to)`` named by the refusal lines of a ``qack`` reply
    (``<p>:<off> ...`` or ``<p>:<from>..<to> ...``)."""
    out = []
    for s in lines:
        head = s.split(" ", 1)[0]
        p, _, rest = head.partition(":")
        try:
            if ".." in rest:
                lo, hi = rest.split("..", 1)
                out.append((int(p), int(lo), int(hi)))
            else:
                out.append((int(p), int(rest), int(rest) + 1))
        except ValueError:
            continue
    return out


def _resolve(
    fut: asyncio.Future[Response], waiters: list[tuple[AckItem, asyncio.Future[bool]]]
) -> None:
    """Per item: applied unless the reply names it among the refused (or refused more
    items than it describes)."""
    if fut.cancelled() or fut.exception() is not None:
        for _, f in waiters:
            if not f.done():
                f.set_result(False)
        return
    r = fut.result()
    lines = r.body.decode(errors="replace").split("\n")
    refused_n = 0
    if r.code == 200:
        with contextlib.suppress(ValueError, IndexError):
            refused_n = int(lines[0].split()[1])
    shown = lines[1:]
    spans = _refused_spans(shown) if refused_n else []
    for (_kind, p, off, _end, _delay), f in waiters:
        if f.done():
            continue
        bad = r.code != 200 or (
            refused_n > 0
            and (refused_n > len(shown) or any(q == p and lo <= off < hi for q, lo, hi in spans))
        )
        f.set_result(not bad)


class AsyncQueueConsumer(AsyncCloses):
    """A consumer of queue group ``group`` of ``topic`` (asyncio; see the module doc)."""

    def __init__(
        self,
        router: TopicRouter,
        options: TransportOptions,
        topic: str,
        group: str,
        credit: int = 100,
        listener: QueueListener | None = None,
        start: str = "earliest",
        cluster: ConfigServer | None = None,
        batch_listener: BatchListener | None = None,
    ):
        if credit < 1:
            raise ClientError("credit must be >= 1")
        if listener is not None and batch_listener is not None:
            raise ClientError("give a listener or a batch_listener, not both")
        if start not in ("earliest", "latest"):
            raise ClientError("start must be 'earliest' or 'latest'")
        self.router = router
        self.options = options
        self.topic = topic
        self.group = group
        self.credit = credit
        self.start = start
        self.listener = listener
        #: cluster mode (ZooKeeper): the registration brokers watch (the Queues guide)
        self.cluster = cluster
        self.consumer_id = new_consumer_id(group)
        self.closed = False
        self.error: ClientError | None = None
        self._brokers: dict[str, _Broker] = {}
        self._queue: asyncio.Queue[QueueMessage] = asyncio.Queue()
        self._listener_tasks: set[asyncio.Task[None]] = set()
        self._async_listener = inspect.iscoroutinefunction(listener)
        #: called with the messages of each pushed frame (the Queues guide)
        self.batch_listener = batch_listener
        self._async_batch = inspect.iscoroutinefunction(batch_listener)

    async def start_consuming(self, timeout_s: float = 10.0) -> None:
        """Subscribe on every broker holding the topic (waits for the first answers)."""
        parts = await self.router.partitions(self.topic)
        ids = {p.address: p.broker_id for p in parts}
        for address in sorted(ids):
            b = self._brokers[address] = _Broker(self, address, ids[address])
            b.task = asyncio.get_running_loop().create_task(b.run())
        async with asyncio.timeout(timeout_s):
            for b in self._brokers.values():
                await b.subscribed.wait()
        if self.error is not None:
            await self.close()
            raise self.error

    def deliver_batch(
        self, broker: _Broker, msgs: list[QueueMessage], runs: list[tuple[int, int, int, int]]
    ) -> None:
        """The messages of one pushed frame (on the loop), ``runs`` their ``(partition,
        from, to, n)``: to the batch listener in one call, else one by one."""
        if self.closed:
            return
        if self.batch_listener is None:
            deliver = self.deliver
            for m in msgs:
                deliver(m)
            return
        t = asyncio.get_running_loop().create_task(self._run_batch(broker, msgs, runs))
        self._listener_tasks.add(t)
        t.add_done_callback(self._listener_tasks.discard)

    async def _run_batch(
        self, broker: _Broker, msgs: list[QueueMessage], runs: list[tuple[int, int, int, int]]
    ) -> None:
        """Run the batch listener: its return accepts every message of the batch, an
        exception releases them all (one range item per run)."""
        assert self.batch_listener is not None
        try:
            if self._async_batch:
                await cast(Coroutine[Any, Any, Any], self.batch_listener(msgs))
            else:
                res = await asyncio.get_running_loop().run_in_executor(
                    None, self.batch_listener, msgs
                )
                if inspect.isawaitable(res):
                    await res
        except Exception as e:
            log.error("queue batch listener failed on %d message(s): released for "
                      "redelivery (%s: %s)", len(msgs), type(e).__name__, e)
            accept = False
        else:
            accept = True
        if broker.ranges:
            kind = b"a" if accept else b"r"
            for p, a, b, n in runs:
                if n == 1:
                    broker.acknowledge_nowait((kind.upper(), p, a, b, 0))
                else:
                    broker.acknowledge_nowait((kind, p, a, b, 0))
        else:
            kind = b"A" if accept else b"R"
            for m in msgs:
                broker.acknowledge_nowait((kind, m.partition, m.offset, m._end, 0))

    def deliver(self, msg: QueueMessage) -> None:
        """A pushed message (on the loop): to the listener or the iterator."""
        if self.closed:
            return
        if self.listener is None:
            self._queue.put_nowait(msg)  # bounded by the credit granted per broker
            return
        if self._async_listener:
            self._start_async(msg)
            return
        t = asyncio.get_running_loop().create_task(self._run_listener(msg))
        self._listener_tasks.add(t)
        t.add_done_callback(self._listener_tasks.discard)

    def _start_async(self, msg: QueueMessage) -> None:
        """Run an ``async def`` listener in a task of its own (listeners run concurrently,
        up to the credit)."""
        t = asyncio.get_running_loop().create_task(self._run_async(msg))
        self._listener_tasks.add(t)
        t.add_done_callback(self._listener_tasks.discard)

    async def _run_async(self, msg: QueueMessage) -> None:
        assert self.listener is not None
        try:
            await cast(Coroutine[Any, Any, Any], self.listener(msg))
        except Exception as e:
            self._settle(msg, e)
        else:
            self._settle(msg, None)

    def _settle(self, msg: QueueMessage, error: BaseException | None) -> None:
        """A listener's outcome: accept on return, release on an exception. Not waited
        for: the acknowledgement goes out with the others of this loop turn."""
        if error is not None:
            log.error("queue listener failed on %r: released for redelivery (%s: %s)",
                      msg, type(error).__name__, error)
            kind = b"R"
        else:
            kind = b"A"
        msg._broker.acknowledge_nowait((kind, msg.partition, msg.offset, msg._end, 0))

    async def _run_listener(self, msg: QueueMessage) -> None:
        assert self.listener is not None
        try:
            res = await asyncio.get_running_loop().run_in_executor(None, self.listener, msg)
            if inspect.isawaitable(res):
                await res
        except Exception:
            log.exception("queue listener failed on %r: released for redelivery", msg)
            await msg.release()
            return
        await msg.ack()

    def __aiter__(self) -> AsyncIterator[QueueMessage]:
        return self

    async def __anext__(self) -> QueueMessage:
        if self.closed:
            raise StopAsyncIteration
        return await self._queue.get()

    async def get(self, timeout_s: float | None = None) -> QueueMessage | None:
        """The next pushed message, or None after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def close(self) -> None:
        """Leave the group: the brokers return what this consumer still holds at once."""
        if self.closed:
            return
        self.closed = True
        for t in list(self._listener_tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(t), 5)
        for b in self._brokers.values():
            if b.conn is not None:
                b.conn.close()
            if b.task is not None:
                b.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await b.task
        if self.cluster is not None:
            with contextlib.suppress(ConfigServerError):
                await self.cluster.unregister_queue_consumer(
                    self.group, self.topic, self.consumer_id
                )



class SyncQueueMessage:
    """:class:`QueueMessage` with blocking acknowledgement methods."""

    def __init__(self, msg: QueueMessage, lt: LoopThread):
        self.message = msg
        self._lt = lt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    def ack(self) -> bool:
        return bool(self._lt.run(self.message.ack()))

    def release(self, delay: float = 0.0) -> bool:
        return bool(self._lt.run(self.message.release(delay)))

    def reject(self) -> bool:
        return bool(self._lt.run(self.message.reject()))

    def renew(self) -> bool:
        return bool(self._lt.run(self.message.renew()))


def settle_all(messages: Sequence[SyncQueueMessage], accept: bool) -> list[bool]:
    """Accept (``accept``) or release all ``messages`` at once: the acknowledgements go out
    together (one ``qack`` frame per broker) and this waits for the answers, one per
    message as :meth:`QueueMessage.ack` gives them."""
    if not messages:
        return []
    lt = messages[0]._lt

    async def run() -> list[bool]:
        acks = [m.message.ack() if accept else m.message.release() for m in messages]
        return list(await asyncio.gather(*acks))

    return lt.run(run())


class QueueConsumer(Closes):
    """Synchronous queue consumer: ``for msg in consumer.messages(): ...; msg.ack()``."""

    def __init__(self, core: AsyncQueueConsumer, lt: LoopThread):
        self.core = core
        self._lt = lt

    def get(self, timeout_s: float | None = None) -> SyncQueueMessage | None:
        """The next pushed message, or None after ``timeout_s``."""
        msg = self._lt.run(self.core.get(timeout_s))
        return None if msg is None else SyncQueueMessage(msg, self._lt)

    def messages(self, idle_timeout_s: float | None = None) -> Iterator[SyncQueueMessage]:
        """Pushed messages as they come; ends after ``idle_timeout_s`` without one."""
        while not self.core.closed:
            msg = self.get(idle_timeout_s)
            if msg is None:
                return
            yield msg

    def close(self) -> None:
        self._lt.run(self.core.close())
