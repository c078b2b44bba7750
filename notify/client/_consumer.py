"""The pull consumer core (asyncio). The synchronous :class:`Consumer` runs this same code.

Per subscribed partition one task fetches windows of raw records (``get``), decodes the
whole records (a window may end mid-record), and hands each message, in offset order, to
the listener; the next window is prefetched while the listener works. Then:

* filter (predicate or attribute value set) -> skipped messages still advance the offset;
* duplicate window (bounded LRU of ``(partition, msgId)``) -> counted, not delivered again;
* listener failure or timeout -> retried ``max_retries`` times with growing delay, then the
  message is written to the local :class:`RecoverStore` (fsync) and consumption moves on;
  an APScheduler job re-delivers recover-store messages every ``recover_interval_s`` and
  turns them into dead letters after ``max_recover_attempts``;
* the offset of a partition advances only past messages that were handled (delivered,
  filtered, duplicate or safely in the recover store); offsets are committed every
  ``commit_interval_s``, on :meth:`AsyncConsumer.commit` and on shutdown, so a killed
  process re-consumes from its last commit (at-least-once).

Group assignment: without a cluster every consumer takes the static share
``member_index``/``member_count`` of each topic (contiguous, as MetaQ splits). With a
configserver (``connect(zk=...)``; issue #7) a :class:`configserver.GroupMember` registers the
consumer in its group and drives :class:`_ClusterTarget`: partitions are fetched only while
this consumer holds their owner node; a rebalance stops the partitions that move, commits
their offsets and releases them before anyone else claims them.

Replies: ``404`` = nothing new (idle backoff ``idle_backoff_min_s`` doubling to
``idle_backoff_max_s``, or a long poll when ``long_poll_ms`` > 0); ``301`` = continue at the
offset in the body; a window without a whole record grows ``maxSize`` (see
:class:`~notify.client._fetchsize.FetchSizer`). Connection failures back off and resume from
the in-memory offset once the pool has reconnected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import shutil
import signal
import threading
import uuid
import warnings
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Hashable,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from configserver import ConfigServer, GroupMember, PartitionInfo
from notify.client.transport import AsyncConnection
from notify.errors import (
    BrokerError,
    ClientError,
    ConnectionLostError,
    NotifyError,
    ProtocolError,
    SubscriptionNotStartedWarning,
)
from notify.protocol.frames import Response, encode_get, encode_offset
from notify.protocol.idgen import split_id
from notify.protocol.records import (
    CorruptRecordError,
    Record,
    decode_all,
    decode_as,
    first_record_size,
)
from notify.protocol.replies import parse_offset

from ._config import (
    DATA_DIR_ENV,
    LEGACY_DATA_DIR,
    MAX_OFFSET,
    ClientConfig,
    ConsumerConfig,
    default_data_dir,
)
from ._connection import ConnectionPool
from ._dedup import DuplicateWindow
from ._errors import ListenerTimeoutError
from ._fetchsize import FetchSizer
from ._message import Message
from ._recover import RecoverStore, StoredMessage
from ._routing import Partition, StaticBrokerDirectory, TopicRouter
from .offsets import FileOffsetStore, OffsetStore, TopicPartitionOffset

log = logging.getLogger("notify.client")

MessageListener = Callable[[Message], Any]
"""A listener: a plain callable (run on the consumer's executor) or a coroutine function."""
MessageFilter = Callable[[Message], bool] | Collection[str]
"""A filter: a predicate over the message, or the set of attribute values to accept."""

_CORRUPT_REFETCHES = 3


@dataclass(slots=True)
class ConsumerStats:
    """Counters of one consumer (a snapshot is returned by ``stats``)."""

    fetches: int = 0
    empty_fetches: int = 0
    fetch_errors: int = 0
    messages: int = 0
    delivered: int = 0
    filtered: int = 0
    duplicates: int = 0
    listener_failures: int = 0
    recover_stored: int = 0
    recovered: int = 0
    recover_failures: int = 0
    dead_lettered: int = 0
    redirects: int = 0
    fetch_growths: int = 0
    corrupt_skipped: int = 0
    commits: int = 0

    def snapshot(self) -> ConsumerStats:
        """A copy of the counters."""
        return ConsumerStats(**asdict(self))


def _make_filter(f: MessageFilter | None) -> Callable[[Message], bool] | None:
    if f is None:
        return None
    if callable(f):
        return f
    values = frozenset(f)
    return lambda m: m.attribute in values


@dataclass(slots=True)
class _Subscription:
    topic: str
    listener: MessageListener | None
    max_size: int
    accept: Callable[[Message], bool] | None
    is_async: bool


class _Cursor:
    """Position of the consumer in one partition."""

    __slots__ = (
        "acked",
        "busy",
        "corrupt",
        "deadline",
        "dirty",
        "done",
        "end_checked",
        "msg_id",
        "partition",
        "paused",
        "pending",
        "position",
        "resumed",
        "sizer",
        "stopped",
        "task",
        "timed_out",
        "topic",
        "watch_done",
        "watch_run",
        "watch_since",
    )

    def __init__(self, topic: str, partition: Partition, sizer: FetchSizer):
        self.topic = topic
        self.partition = partition
        self.sizer = sizer
        self.position = -1  # next offset to fetch
        self.done = -1  # offset up to which everything is handled (committable)
        self.msg_id = -1
        self.end_checked = -1  # position last checked for being beyond the end (see _get)
        self.dirty = False
        self.corrupt = 0
        # listener watchdog: the cursor task is cancelled when ``deadline`` passes
        self.task: asyncio.Task[None] | None = None
        self.deadline = 0.0  # 0: no listener running
        self.timed_out = False
        # a run of messages (_deliver_run) is watched by its progress instead: the
        # watchdog times how long ``done`` stays where it first saw it
        self.watch_run = False
        self.watch_done = -1
        self.watch_since = 0.0
        # cluster mode (issue #7): stop this partition only / a message is being handled
        self.stopped = False
        self.busy = False
        # pull API: offset handled by the application (counted at the next fetch/commit),
        # the fetch running for this partition, pause/resume
        self.acked = -1
        self.pending: asyncio.Task[list[Message]] | None = None
        self.paused = False
        self.resumed: asyncio.Event | None = None


def _share(parts: list[Partition], index: int, count: int) -> list[Partition]:
    """Contiguous share ``index`` of ``count`` (the first ``P % C`` members get one more)."""
    if count <= 1:
        return parts
    per, extra = divmod(len(parts), count)
    start = index * per + min(index, extra)
    return parts[start : start + per + (1 if index < extra else 0)]


def _instance_id(cfg: ConsumerConfig) -> str:
    if cfg.instance_id:
        return cfg.instance_id
    path = Path(cfg.data_dir) / f"{cfg.group}.instance"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    iid = f"{os.uname().nodename}-{uuid.uuid4().hex[:12]}".replace(" ", "_")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(iid)
    os.replace(tmp, path)
    return iid


class AsyncConsumer:
    """Pull consumer (asyncio API).

    ``subscribe`` topics, then :meth:`complete_subscribe` starts one fetch task per
    partition; or call :meth:`fetch` / iterate :meth:`messages` to drive your own loop.
    Create it with :meth:`AsyncMessageSessionFactory.create_consumer`.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        router: TopicRouter,
        client_config: ClientConfig,
        config: ConsumerConfig,
        offset_store: OffsetStore | None = None,
        executor: concurrent.futures.Executor | None = None,
        cluster: ConfigServer | None = None,
    ):
        if not config.group or " " in config.group:
            raise ClientError(f"invalid consumer group {config.group!r}")
        self.pool = pool
        self.router = router
        self.client_config = client_config
        self.config = config
        data_dir = Path(config.data_dir)
        self.group = f"{config.group}-{_instance_id(config)}" if config.broadcast else config.group
        self._own_store = offset_store is None or config.broadcast
        if offset_store is None or config.broadcast:
            offset_store = FileOffsetStore(data_dir / "offsets")
            _adopt_legacy_offsets(config, offset_store, self.group)
        self.offset_store: OffsetStore = offset_store
        self._migrated: asyncio.Future[None] | None = None
        log.info("consumer group %s: offsets in %s", self.group, _where(offset_store, self.group))
        self.recover_store = RecoverStore(data_dir, self.group)
        self._own_executor = executor is None and config.listener_threads > 0
        if executor is None and config.listener_threads > 0:
            executor = concurrent.futures.ThreadPoolExecutor(
                config.listener_threads, thread_name_prefix=f"notify-listener-{config.group}"
            )
        self._executor = executor
        self._subs: dict[str, _Subscription] = {}
        self._cursors: dict[tuple[str, Partition], _Cursor] = {}
        self._manual: dict[str, list[_Cursor]] = {}
        self._manual_rr: dict[str, int] = {}
        self._dedup = DuplicateWindow(config.dedup_window)
        #: (broker id, partition) -> its tag in the duplicate window's keys (_dedup_base)
        self._dedup_tags: dict[tuple[int, int], int] = {}
        self._stats = ConsumerStats()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop_evt: asyncio.Event | None = None
        self._run_stop: asyncio.Event | None = None
        self._stopping = False
        #: :meth:`request_stop` was called (a signal, or the application): :meth:`run`
        #: returns and every ``messages()`` iteration ends (any thread may read it)
        self.stop_requested = False
        self._started = False
        self._closed = False
        self._commit_lock: asyncio.Lock | None = None
        self._recover_lock: asyncio.Lock | None = None
        self._scheduler: Any = None
        self._watchdog: asyncio.Task[None] | None = None
        # configserver (issue #7): group membership drives the assignment when set
        self._cluster = cluster
        self._member: GroupMember | None = None

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` began."""
        return self._closed

    @property
    def member(self) -> GroupMember | None:
        """The group membership (cluster mode), else None."""
        return self._member

    # -- public API

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the consumer's counters."""
        return self._stats.snapshot()

    def subscribe(
        self,
        topic: str,
        listener: MessageListener | None = None,
        max_size: int = 1 << 20,
        filter: MessageFilter | None = None,
    ) -> AsyncConsumer:
        """Subscribe to ``topic`` (before :meth:`complete_subscribe`); returns self.

        ``listener`` is called once per message, in offset order per partition: a coroutine
        function runs on the loop, a plain callable on the consumer's executor (inline when
        ``listener_threads`` is 0). Without a listener the topic is read with :meth:`fetch`.
        ``filter`` keeps only matching messages (predicate or attribute values).
        """
        if self._started and listener is not None:
            raise ClientError("subscribe after complete_subscribe is not supported")
        if topic in self._subs:
            raise ClientError(f"topic {topic!r} is already subscribed")
        FetchSizer(max_size, self.config.max_fetch_bytes)  # validates max_size
        is_async = listener is not None and (
            inspect.iscoroutinefunction(listener)
            or inspect.iscoroutinefunction(getattr(listener, "__call__", None))  # noqa: B004
        )
        self._subs[topic] = _Subscription(topic, listener, max_size, _make_filter(filter), is_async)
        return self

    async def complete_subscribe(self) -> None:
        """Start consuming every subscribed topic that has a listener."""
        if self._closed:
            raise ClientError("consumer is closed")
        if self._started:
            return
        self._started = True
        self._init_sync_objects()
        if self._cluster is not None:
            await self._join_group(self._cluster)
        else:
            for sub in self._subs.values():
                if sub.listener is None:
                    continue
                for part in await self._assigned(sub.topic):
                    self._start_cursor(sub, part)
        if self.config.commit_interval_s > 0:
            self._spawn(self._commit_loop())
        if any(s.listener is not None for s in self._subs.values()):
            self._start_scheduler()

    start = complete_subscribe

    async def fetch(self, topic: str, max_wait_s: float = 1.0) -> list[Message]:
        """Fetch the next messages of ``topic`` (one window of one partition).

        Every partition of the consumer's share is polled concurrently (one fetch in
        flight each, long-polled when ``long_poll_ms`` > 0), so a message on any partition
        is returned as soon as it arrives. The messages returned by the previous call count
        as processed (committable) when this is called again or on :meth:`commit`. Returns
        [] when nothing arrived within ``max_wait_s``.
        """
        cursors = await self._manual_for(topic)
        for cur in cursors:
            self._mark_done(cur)
        got = await self._take(topic, cursors, max_wait_s)
        if got is None:
            return []
        cur, out, end = got
        cur.acked = end
        return out

    async def messages(
        self, topic: str, idle_timeout_s: float | None = None
    ) -> AsyncIterator[Message]:
        """Iterate the messages of ``topic``; each counts as processed when the next is asked.

        Partitions are polled concurrently (see :meth:`fetch`). Ends when the consumer shuts
        down, after :meth:`request_stop` or, with ``idle_timeout_s``, once that long passed
        without a message. What was processed is committed whenever the iteration ends
        (also by an exception or ``break``). While it runs in the main thread, SIGTERM
        ends it the same way instead of killing the process, unless the application set
        a SIGTERM handler of its own.
        """
        loop = asyncio.get_running_loop()
        last = loop.time()
        installed = _add_loop_stop_handler(loop, self.request_stop)
        try:
            while self.iterating:
                wait = next_wait(idle_timeout_s, loop.time() - last)
                if wait <= 0:
                    return
                got = await self.next_batch(topic, wait)
                if got is not None:
                    for m in self.handed_out(got):
                        yield m
                    last = loop.time()
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGTERM)
            await self.commit_quietly()

    @property
    def iterating(self) -> bool:
        """Whether a ``messages()`` iteration goes on (not stopping, closed or asked to)."""
        return not (self._stopping or self._closed or self.stop_requested)

    def handed_out(self, got: tuple[_Cursor, list[Message], int]) -> Iterator[Message]:
        """The messages of one :meth:`next_batch`, each counted as processed when the next
        is asked; ends early after :meth:`request_stop` (the rest comes again)."""
        cur, out, end = got
        for m in out:
            yield m
            cur.acked = m.next_offset  # asked for the next one: m is processed
            if self.stop_requested:
                return
        cur.acked = end

    async def next_batch(
        self, topic: str, max_wait_s: float
    ) -> tuple[_Cursor, list[Message], int] | None:
        """The iterator's step: ``(cursor, messages, end)`` or None after ``max_wait_s``.
        Nothing counts as processed until the caller sets ``cursor.acked`` (the offset up
        to which the application is done: a message's ``next_offset``, or ``end``)."""
        return await self._take(topic, await self._manual_for(topic), max_wait_s)

    async def _manual_for(self, topic: str) -> list[_Cursor]:
        if self._closed:
            raise ClientError("consumer is closed")
        if self._cluster is not None:
            return await self._cluster_manual_for(topic)
        self._init_sync_objects()
        sub = self._subs.get(topic)
        if sub is None:
            sub = self._subs[topic] = _Subscription(topic, None, 1 << 20, None, False)
        elif sub.listener is not None and self._started:
            raise ClientError(f"topic {topic!r} is consumed by a listener")
        return await self._manual_cursors(sub)

    async def _cluster_manual_for(self, topic: str) -> list[_Cursor]:
        """Cluster mode: the cursors of the partitions the group gives this member. The
        list changes in place as the group rebalances (see :class:`_ClusterTarget`); the
        first call joins the group when :meth:`complete_subscribe` was not called."""
        sub = self._subs.get(topic)
        if sub is not None and sub.listener is not None:
            raise ClientError(f"topic {topic!r} is consumed by a listener")
        if sub is None:
            if self._started:
                raise ClientError(
                    f"topic {topic!r} was not subscribed before the consumer joined its group: "
                    "in cluster mode subscribe every topic before complete_subscribe()"
                )
            self._subs[topic] = _Subscription(topic, None, 1 << 20, None, False)
        if not self._started:
            await self.complete_subscribe()
        return self._manual.setdefault(topic, [])

    async def _take(
        self, topic: str, cursors: list[_Cursor], max_wait_s: float
    ) -> tuple[_Cursor, list[Message], int] | None:
        """The next delivered batch of one partition ``(cursor, messages, end offset)``
        within ``max_wait_s``, or None. Fetches stay in flight between calls."""
        sub = self._subs[topic]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, max_wait_s)
        while not self._stopping:
            n = len(cursors)
            start = self._manual_rr.get(topic, 0)
            running: list[asyncio.Task[list[Message]]] = []
            for i in range(n):
                cur = cursors[(start + i) % n]
                if cur.paused or cur.stopped:
                    continue
                task = cur.pending
                if task is None:
                    task = cur.pending = self._spawn_fetch(self._poll_one(cur))
                if not task.done():
                    running.append(task)
                    continue
                cur.pending = None
                if task.cancelled() or not (msgs := task.result()):
                    continue
                self._manual_rr[topic] = (start + i + 1) % n
                cur.position = msgs[-1].next_offset
                cur.msg_id = msgs[-1].msg_id
                out = self._accepted(sub, msgs)
                if out:
                    return cur, out, cur.position
                cur.acked = cur.position  # all filtered or duplicates: handled
            remaining = deadline - loop.time()
            if remaining <= 0 or not running:
                if remaining > 0:  # every partition paused
                    await self._sleep(min(remaining, 0.05))
                    continue
                return None
            await asyncio.wait(running, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        return None

    def _dedup_base(self, part: Partition) -> int:
        """The duplicate window's key of a message is ``base | msg_id``: ints hash and
        compare several times cheaper than (broker, partition, id) tuples. ``base`` is a
        small per-partition tag above the 64 bits of the id."""
        bp = (part.broker_id, part.partition)
        tag = self._dedup_tags.get(bp)
        if tag is None:
            tag = self._dedup_tags[bp] = len(self._dedup_tags) + 1
        return tag << 64

    def _accepted(self, sub: _Subscription, msgs: list[Message]) -> list[Message]:
        out = []
        for m in msgs:
            self._stats.messages += 1
            if sub.accept is not None and not sub.accept(m):
                self._stats.filtered += 1
                continue
            key = self._dedup_base(m.partition) | m.msg_id
            if self._dedup.seen(key):
                self._stats.duplicates += 1
                continue
            self._dedup.add(key)
            self._stats.delivered += 1
            out.append(m)
        return out

    def _spawn_fetch(self, coro: Awaitable[list[Message]]) -> asyncio.Task[list[Message]]:
        task: asyncio.Task[list[Message]] = asyncio.ensure_future(coro)
        task.add_done_callback(_swallow)
        return task

    async def _poll_one(self, cur: _Cursor) -> list[Message]:
        """Fetch at ``cur.position`` until messages arrive (pull API; one per partition):
        long-polled, or with the idle backoff when the broker answers at once."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        idle = err_backoff = cfg.idle_backoff_min_s
        held_s = cfg.long_poll_ms / 2000
        while not self._stopping:
            issued = loop.time()
            try:
                msgs = await self._fetch_window(cur)
            except (ClientError, OSError) as e:
                self._stats.fetch_errors += 1
                log.debug("fetch %s %s: %s", cur.topic, cur.partition, e)
                await self._sleep(err_backoff)
                err_backoff = min(err_backoff * 2, self.client_config.reconnect_backoff_max_s)
                continue
            if msgs:
                return msgs
            err_backoff = cfg.idle_backoff_min_s
            if cfg.long_poll_ms <= 0 or loop.time() - issued < held_s:
                await self._sleep(idle)
                idle = min(idle * 2, cfg.idle_backoff_max_s)
        return []

    def _cancel_pending(self, cur: _Cursor) -> None:
        if cur.pending is not None:
            cur.pending.cancel()
            cur.pending = None

    # -- position control: seek, pause/resume

    async def seek(
        self,
        topic: str,
        partitions: Partition | str | Iterable[Partition | str] | None = None,
        *,
        offset: int | str | None = None,
        timestamp: float | datetime | None = None,
    ) -> dict[str, int]:
        """Move the consumer of ``topic`` to ``offset`` or to the first message at or after
        ``timestamp``; returns ``{"<brokerId>-<part>": new offset}``.

        ``partitions``: one partition (a :class:`Partition` or ``"<brokerId>-<part>"``), a
        list of them, or None for the consumer's whole share of the topic. ``offset``: a
        byte offset (the ``offset`` of a :class:`Message`, or ``next_offset`` to skip
        it), ``"earliest"`` or ``"latest"``; a byte offset that is not a record start is
        the caller's responsibility (the broker serves from there). ``timestamp``: Unix
        seconds or an aware datetime, matched against the time in the message ids (the
        broker's clock at put). A listener finishes the message it is running first; a
        message already returned by :meth:`fetch` is not delivered again unless the new
        offset is before it. Before :meth:`complete_subscribe` (or the first fetch) the
        offsets are committed to the offset store, where the start reads them.
        """
        if (offset is None) == (timestamp is None):
            raise ClientError("give exactly one of offset= or timestamp=")
        if isinstance(offset, str) and offset not in ("earliest", "latest"):
            raise ClientError(f"offset must be a byte offset, earliest or latest: {offset!r}")
        if isinstance(offset, int) and offset < 0:
            raise ClientError(f"negative offset {offset}")
        self._init_sync_objects()
        parts = await self._select(topic, partitions)
        out: dict[str, int] = {}
        pending: list[TopicPartitionOffset] = []
        for part in parts:
            if timestamp is not None:
                target = await self._offset_for_time(topic, part, _as_unix_s(timestamp))
            elif isinstance(offset, str):
                end = 0 if offset == "earliest" else MAX_OFFSET
                target = await self._ask_offset(topic, part, end)
            else:
                assert offset is not None
                target = offset
            out[str(part)] = target
            self._dedup.forget(_of_tag(self._dedup_base(part) >> 64))
            if not await self._move(topic, part, target):
                pending.append(TopicPartitionOffset(topic, str(part), target))
        if pending:
            await asyncio.to_thread(self.offset_store.commit, self.group, pending)
        log.info("group %s seeks %s to %s", self.group, topic, out)
        return out

    def pause(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None = None
    ) -> None:
        """Stop fetching ``partitions`` of ``topic`` (all of them by default) until
        :meth:`resume`; a running listener finishes its message, the rest of its window is
        fetched again on resume. Other partitions go on."""
        for cur in self._cursors_of(topic, partitions):
            if not cur.paused:
                cur.paused = True
                cur.resumed = asyncio.Event()
                self._cancel_pending(cur)

    def resume(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None = None
    ) -> None:
        """Fetch paused partitions of ``topic`` again (all of them by default)."""
        for cur in self._cursors_of(topic, partitions):
            cur.paused = False
            if cur.resumed is not None:
                cur.resumed.set()
                cur.resumed = None

    def paused(self, topic: str | None = None) -> list[str]:
        """The paused partitions (``"<brokerId>-<part>"``) of ``topic`` or of every topic."""
        return sorted(
            str(c.partition)
            for c in self._all_cursors()
            if c.paused and (topic is None or c.topic == topic)
        )

    def _cursors_of(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None
    ) -> list[_Cursor]:
        wanted = None if partitions is None else {str(p) for p in _as_list(partitions)}
        curs = [c for c in self._all_cursors() if c.topic == topic]
        if wanted is not None:
            unknown = wanted - {str(c.partition) for c in curs}
            if unknown:
                raise ClientError(f"this consumer does not read {topic} {sorted(unknown)}")
            curs = [c for c in curs if str(c.partition) in wanted]
        return curs

    async def _select(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None
    ) -> list[Partition]:
        mine = [c.partition for c in self._all_cursors() if c.topic == topic]
        if not mine:
            mine = await self._assigned(topic)
        if partitions is None:
            return mine
        by_id = {str(p): p for p in mine}
        out = []
        for p in _as_list(partitions):
            part = by_id.get(str(p))
            if part is None:
                raise ClientError(f"this consumer does not read {topic} {p}")
            out.append(part)
        return out

    async def _move(self, topic: str, part: Partition, target: int) -> bool:
        """Put the live cursor of ``part`` at ``target``; False when there is none."""
        moved = False
        for cur in self._manual.get(topic, []):
            if cur.partition == part:
                self._cancel_pending(cur)
                self._reposition(cur, target)
                moved = True
        live = self._cursors.get((topic, part))
        sub = self._subs.get(topic)
        if live is not None and sub is not None:
            running = live.task is not None and not live.task.done()
            await self._stop_cursor(live)
            self._reposition(live, target)
            live.stopped = False
            if running:
                live.task = self._spawn(self._run_cursor(sub, live))
            moved = True
        return moved

    @staticmethod
    def _reposition(cur: _Cursor, target: int) -> None:
        cur.position = cur.done = cur.acked = target
        cur.end_checked = -1
        cur.dirty = True

    async def _ask_offset(self, topic: str, part: Partition, value: int) -> int:
        """The broker's answer to ``offset`` at ``value`` (0: first offset, MAX: end)."""
        conn = await self.pool.get(part.address)
        try:
            r = await conn.request(
                lambda o: encode_offset(topic, self.group, part.partition, value, o),
                self.client_config.request_timeout_s,
            )
        except ConnectionLostError:
            self.pool.discard(conn)
            raise
        if r.code != 200:
            raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
        try:
            return parse_offset(r.body)
        except ProtocolError as e:
            raise ClientError(str(e)) from None

    async def _read_at(self, topic: str, part: Partition, offset: int, size: int) -> list[Record]:
        """Whole records of one window at ``offset`` (no long poll; [] at the end)."""
        conn = await self.pool.get(part.address)
        while True:
            try:
                r = await conn.request(
                    functools.partial(encode_get, topic, self.group, part.partition, offset, size),
                    self.client_config.request_timeout_s,
                )
            except ConnectionLostError:
                self.pool.discard(conn)
                raise
            if r.code in (404, 301):
                return []
            if r.code != 200:
                raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
            recs, _ = decode_all(r.body, offset)
            if recs or not r.body:
                return recs
            need = first_record_size(r.body[:4]) or size * 2
            if size >= self.config.max_fetch_bytes:
                raise ClientError(f"record at offset {offset} exceeds max_fetch_bytes")
            size = min(max(need, size * 2), self.config.max_fetch_bytes)

    async def _offset_for_time(self, topic: str, part: Partition, ts: float) -> int:
        """Offset of the first record of ``part`` whose id time is >= ``ts`` (else the end).

        Segment starts (``offset`` answers the start of the segment holding a position)
        are bisected on their first record's time; the segment found is then read forward.
        """
        target_ms = int(ts * 1000)
        first = await self._ask_offset(topic, part, 0)
        end = await self._ask_offset(topic, part, MAX_OFFSET)
        best, lo, hi = first, first, end
        while lo < hi:
            mid = (lo + hi) // 2
            seg = await self._ask_offset(topic, part, mid)
            if seg <= best:
                lo = mid + 1
                continue
            recs = await self._read_at(topic, part, seg, 4096)
            if recs and split_id(recs[0].msg_id)[0] < target_ms:
                best, lo = seg, mid + 1
            else:
                hi = seg
        pos = best
        while pos < end:
            recs = await self._read_at(topic, part, pos, 1 << 20)
            if not recs:
                break
            for r in recs:
                if split_id(r.msg_id)[0] >= target_ms:
                    return r.offset
            pos = recs[-1].offset + recs[-1].size
        return max(pos, end)

    # -- blocking run with signal handling

    def request_stop(self) -> None:
        """Make :meth:`run` return (after a clean shutdown) and end every ``messages()``
        iteration (each commits what was processed); call it on the consumer's loop
        (signal handlers installed there do)."""
        self.stop_requested = True
        self._init_sync_objects()
        assert self._run_stop is not None
        self._run_stop.set()

    async def run(
        self, timeout_s: float | None = None, signals: Iterable[int] | None = None
    ) -> None:
        """Consume with the subscribed listeners until stopped, then shut down cleanly.

        Starts the consumer (:meth:`complete_subscribe`) if needed and returns after
        SIGTERM or SIGINT (handlers installed on the running loop while it runs, when it
        is the main thread's), :meth:`request_stop`, or ``timeout_s``; then running
        listeners finish (up to the shutdown timeout) and offsets are committed.
        """
        self._init_sync_objects()
        await self.complete_subscribe()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for sig in signal_list(signals):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        assert self._run_stop is not None
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._run_stop.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.shutdown()

    run_forever = run

    def _on_signal(self, sig: int) -> None:
        log.info("group %s: signal %d, shutting down", self.group, sig)
        self.request_stop()

    async def commit(self) -> None:
        """Store the offsets of everything handled so far (also runs periodically)."""
        self._init_sync_objects()
        assert self._commit_lock is not None
        async with self._commit_lock:
            for cursors in self._manual.values():
                for cur in cursors:
                    self._mark_done(cur)
            dirty = [c for c in self._all_cursors() if c.dirty and c.done >= 0]
            if not dirty:
                return
            offsets = [
                TopicPartitionOffset(c.topic, str(c.partition), c.done, c.msg_id) for c in dirty
            ]
            for c in dirty:
                c.dirty = False
            try:
                await asyncio.to_thread(self.offset_store.commit, self.group, offsets)
            except BaseException:
                for c in dirty:
                    c.dirty = True
                raise
            self._stats.commits += 1

    async def commit_quietly(self) -> None:
        """:meth:`commit` unless the consumer is closed; a failure is logged (for the ends
        of iterations, where the application is already leaving)."""
        if self._closed:
            return
        try:
            await self.commit()
        except ClientError as e:
            log.error("offset commit of group %s failed: %s", self.group, e)

    def never_started(self) -> list[str]:
        """The topics subscribed with a listener while :meth:`complete_subscribe` was never
        called (nothing of them was consumed)."""
        if self._started:
            return []
        return sorted(t for t, sub in self._subs.items() if sub.listener is not None)

    async def recover_now(self) -> int:
        """Run one re-delivery round of the recover store now; returns messages recovered."""
        self._init_sync_objects()
        return await self._recover_round()

    async def shutdown(self, timeout_s: float = 5.0, *, warn: bool = True) -> None:
        """Stop fetching, let running listeners finish (up to ``timeout_s``), commit, close.

        Warns (:class:`~notify.errors.SubscriptionNotStartedWarning`) when topics were
        subscribed with a listener but never started (``warn=False``: the caller does)."""
        if self._closed:
            return
        try:
            await self._shutdown(timeout_s)
        finally:
            if warn:
                warn_never_started([self])

    async def _shutdown(self, timeout_s: float) -> None:
        self._closed = True
        self._init_sync_objects()
        self._stopping = True
        assert self._stop_evt is not None
        self._stop_evt.set()
        for cursors in self._manual.values():
            for cur in cursors:
                self._cancel_pending(cur)
        if self._member is not None:
            await self._member.stop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        tasks = list(self._tasks)
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=timeout_s)
            for t in still:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._member is not None and self._cluster is not None:
            # disconnected (e.g. ZooKeeper restarting): give the session a chance to come
            # back, so the final commit and the release happen and nothing is redone
            await self._cluster.wait_connected(self.client_config.zk_session_timeout_s)
        try:
            await self.commit()
        except ClientError as e:
            log.error("final offset commit of group %s failed: %s", self.group, e)
        if self._member is not None:  # offsets committed: release the partitions, leave
            await self._member.leave()
        if self._own_store:
            self.offset_store.close()
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    close = shutdown

    # -- setup

    def _init_sync_objects(self) -> None:
        if self._stop_evt is None:
            self._stop_evt = asyncio.Event()
            self._run_stop = asyncio.Event()
            self._commit_lock = asyncio.Lock()
            self._recover_lock = asyncio.Lock()

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _all_cursors(self) -> list[_Cursor]:
        out = list(self._cursors.values())
        for cs in self._manual.values():
            out.extend(cs)
        return out

    async def _assigned(self, topic: str) -> list[Partition]:
        parts = await self.router.partitions(topic)
        return _share(sorted(parts), self.config.member_index, self.config.member_count)

    def _start_cursor(self, sub: _Subscription, part: Partition) -> None:
        if (sub.topic, part) in self._cursors:
            return
        cur = _Cursor(sub.topic, part, FetchSizer(sub.max_size, self.config.max_fetch_bytes))
        self._cursors[(sub.topic, part)] = cur
        cur.task = self._spawn(self._run_cursor(sub, cur))

    # -- cluster mode (configserver, issue #7)

    async def _join_group(self, cluster: ConfigServer) -> None:
        topics = list(self._subs)  # listener topics and fetch()/messages() topics alike
        if not topics:
            return
        cfg = self.config
        self._member = GroupMember(
            cluster,
            self.group,
            topics,
            _ClusterTarget(self),
            consumer_id=cfg.consumer_id,
            strategy=cfg.assignment,
            retry_max_s=cfg.rebalance_retry_max_s,
        )
        try:
            await self._member.start()
        except NotifyError as e:  # configserver errors, translated at the client boundary
            self._member = None
            raise ConnectionLostError(f"cannot join group {self.group}: {e}") from e

    async def _stop_cursor(self, cur: _Cursor) -> None:
        """Stop fetching one partition at a message boundary (a running listener finishes
        its message, up to the listener timeout); the cursor keeps its position."""
        cur.stopped = True
        task, cur.task = cur.task, None
        if task is None or task.done():
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.listener_timeout_s or 30.0) + 1.0
        while not task.done():
            if not cur.busy or loop.time() >= deadline:
                task.cancel()
                break
            await asyncio.wait({task}, timeout=0.01)
        await asyncio.wait({task})

    async def _manual_cursors(self, sub: _Subscription) -> list[_Cursor]:
        cursors = self._manual.get(sub.topic)
        if cursors is None:
            cursors = []
            for part in await self._assigned(sub.topic):
                cur = _Cursor(
                    sub.topic, part, FetchSizer(sub.max_size, self.config.max_fetch_bytes)
                )
                await self._init_offset(cur)
                cursors.append(cur)
            self._manual[sub.topic] = cursors
        return cursors

    @staticmethod
    def _mark_done(cur: _Cursor) -> None:
        if cur.acked > cur.done:  # (a 301 may have moved ``done`` past it already)
            cur.done = cur.acked
            cur.dirty = True

    def _start_scheduler(self) -> None:
        sched = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
        sched.add_job(
            self._recover_job,
            "interval",
            seconds=self.config.recover_interval_s,
            id="notify-recover",
            max_instances=1,
            coalesce=True,
        )
        sched.start()
        self._scheduler = sched

    async def _recover_job(self) -> None:
        if self._stopping:
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await self._recover_round()
        except Exception:  # pragma: no cover - logged, next round retries
            log.exception("recover round of group %s failed", self.group)

    # -- I/O helpers

    async def _sleep(self, delay_s: float) -> None:
        assert self._stop_evt is not None
        if delay_s <= 0 or self._stop_evt.is_set():
            return
        try:
            async with asyncio.timeout(delay_s):
                await self._stop_evt.wait()
        except TimeoutError:
            pass

    async def _get(self, cur: _Cursor, offset: int, max_size: int) -> Response:
        conn = await self.pool.get(cur.partition.address)
        wait_ms = self.config.long_poll_ms
        timeout = self.client_config.request_timeout_s + wait_ms / 1000
        topic, group, part = cur.topic, self.group, cur.partition.partition
        self._stats.fetches += 1
        try:
            r = await conn.request(
                lambda o: encode_get(topic, group, part, offset, max_size, o, max_wait_ms=wait_ms),
                timeout,
            )
            if r.code == 404 and cur.end_checked != offset:
                r = await self._past_end(conn, cur, offset, r)
            return r
        except ConnectionLostError:
            self.pool.discard(conn)
            raise

    async def _past_end(
        self, conn: AsyncConnection, cur: _Cursor, offset: int, miss: Response
    ) -> Response:
        """MetaQ answers a get beyond the end of a partition with the same 404 as "nothing
        new yet" (301 only with ``updateConsumerOffsets``). Once per position, ask ``offset``:
        an end below our position (the partition was emptied or recreated, or the stored
        offset is wrong) is treated as MetaQ's 301 to that end."""
        cur.end_checked = offset
        topic, group, part = cur.topic, self.group, cur.partition.partition
        # ``offset`` at Long.MAX_VALUE answers the visible end (at ``offset`` itself it would
        # answer the start of the segment holding it once new data has arrived meanwhile,
        # which is not an end and would rewind us)
        r = await conn.request(
            lambda o: encode_offset(topic, group, part, MAX_OFFSET, o),
            self.client_config.request_timeout_s,
        )
        if r.code == 200:
            try:
                end = int(r.body.split()[0])
            except (IndexError, ValueError):
                return miss
            if end < offset:
                return Response("result", 301, miss.opaque, b"%d" % end)
        return miss

    async def _migrate_offsets(self) -> None:
        """Once: re-key a version 1 offset file from broker positions to broker ids."""
        store = self.offset_store
        if not isinstance(store, FileOffsetStore):
            return
        directory = self.router.directory
        positions = directory.legacy_ids() if isinstance(directory, StaticBrokerDirectory) else None
        await asyncio.to_thread(store.migrate_keys, self.group, positions)

    async def _init_offset(self, cur: _Cursor) -> None:
        if self._migrated is None:
            self._migrated = asyncio.ensure_future(self._migrate_offsets())
        try:
            await asyncio.shield(self._migrated)
        except ClientError:
            self._migrated = None  # try again with the next partition
            raise
        stored = await asyncio.to_thread(
            self.offset_store.load, self.group, cur.topic, str(cur.partition)
        )
        if stored is not None:
            cur.position = cur.done = stored.offset
            cur.msg_id = stored.msg_id
            return
        target = 0 if self.config.initial_offset == "earliest" else MAX_OFFSET
        if self.config.initial_offset not in ("earliest", "latest"):
            raise ClientError(
                f"initial_offset must be earliest or latest, not {self.config.initial_offset!r}"
            )
        cur.position = cur.done = await self._ask_offset(cur.topic, cur.partition, target)
        cur.dirty = True

    def _decode(self, cur: _Cursor, offset: int, r: Response) -> list[Message] | None:
        """Messages of a reply to a get at ``offset``; None: ask again at ``cur.position``."""
        if r.code == 404:
            self._stats.empty_fetches += 1
            return []
        if r.code == 301:
            try:
                cur.position = parse_offset(r.body)
            except ProtocolError as e:
                raise ClientError(str(e)) from None
            self._stats.redirects += 1
            log.info("%s %s: offset %d moved to %d", cur.topic, cur.partition, offset, cur.position)
            if cur.done < 0 or cur.done == offset:
                cur.done = cur.position
                cur.dirty = True
            return None
        if r.code != 200:
            raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
        body = r.body
        if not body:
            self._stats.empty_fetches += 1
            return []
        topic, part = cur.topic, cur.partition
        try:
            recs, _ = decode_as(body, offset, Message, topic, part)
            cur.corrupt = 0
        except CorruptRecordError as e:
            good = e.position - offset
            recs, _ = decode_as(memoryview(body)[:good], offset, Message, topic, part)
            if not recs:
                cur.corrupt += 1
                if cur.corrupt < _CORRUPT_REFETCHES:
                    return None
                size = first_record_size(body[:4]) or 0
                log.error(
                    "%s %s: skipping corrupt record at offset %d (%d bytes)",
                    cur.topic,
                    cur.partition,
                    offset,
                    size,
                )
                self._stats.corrupt_skipped += 1
                cur.corrupt = 0
                cur.position = offset + max(size, 20)
                return None
        if not recs:
            if cur.sizer.exhausted:
                log.error(
                    "%s %s: record at offset %d does not fit %d bytes (max_fetch_bytes)",
                    cur.topic,
                    cur.partition,
                    offset,
                    cur.sizer.current,
                )
                raise ClientError(f"record at offset {offset} exceeds max_fetch_bytes")
            cur.sizer.no_whole_record(body)
            self._stats.fetch_growths += 1
            return None
        cur.sizer.got_records()
        return recs

    async def _fetch_window(self, cur: _Cursor) -> list[Message]:
        """Fetch at ``cur.position`` until messages, 404 or an error (manual API)."""
        for _ in range(64):
            offset = cur.position
            msgs = self._decode(cur, offset, await self._get(cur, offset, cur.sizer.current))
            if msgs is not None:
                return msgs
        return []

    # -- listener mode

    async def _run_cursor(self, sub: _Subscription, cur: _Cursor) -> None:
        cfg = self.config
        backoff = cfg.idle_backoff_min_s
        while not self._stopping and not cur.stopped and cur.position < 0:
            try:
                await self._init_offset(cur)
                break
            except (ClientError, OSError) as e:
                log.warning("%s %s: initial offset: %s", cur.topic, cur.partition, e)
                await self._sleep(backoff)
                backoff = min(backoff * 2, self.client_config.reconnect_backoff_max_s)
        idle = cfg.idle_backoff_min_s
        err_backoff = cfg.idle_backoff_min_s
        loop = asyncio.get_running_loop()
        # a broker that ignores the long-poll wait answers 404 at once: then poll as usual
        held_s = cfg.long_poll_ms / 2000
        prefetch: tuple[int, int, asyncio.Task[Response], float] | None = None
        try:
            while not self._stopping and not cur.stopped:
                if cur.paused:
                    await self._wait_resumed(cur)
                    continue
                offset, size = cur.position, cur.sizer.current
                try:
                    if prefetch is not None and prefetch[:2] == (offset, size):
                        task, issued = prefetch[2], prefetch[3]
                        prefetch = None
                        resp = await task
                    else:
                        if prefetch is not None:
                            prefetch[2].cancel()
                            prefetch = None
                        issued = loop.time()
                        resp = await self._get(cur, offset, size)
                    msgs = self._decode(cur, offset, resp)
                except (ClientError, OSError) as e:
                    self._stats.fetch_errors += 1
                    log.debug("fetch %s %s @%d: %s", cur.topic, cur.partition, offset, e)
                    await self._sleep(err_backoff)
                    err_backoff = min(err_backoff * 2, self.client_config.reconnect_backoff_max_s)
                    continue
                err_backoff = cfg.idle_backoff_min_s
                if msgs is None:
                    continue
                if not msgs:
                    if cfg.long_poll_ms <= 0 or loop.time() - issued < held_s:
                        await self._sleep(idle)
                        idle = min(idle * 2, cfg.idle_backoff_max_s)
                    continue
                idle = cfg.idle_backoff_min_s
                nxt = msgs[-1].next_offset
                ptask = asyncio.ensure_future(self._get(cur, nxt, cur.sizer.current))
                ptask.add_done_callback(_swallow)
                prefetch = (nxt, cur.sizer.current, ptask, loop.time())
                cur.position = nxt
                done, stop = await self._deliver_run(sub, cur, msgs, nxt)
                if stop:
                    continue
                for m in msgs[done:] if done else msgs:
                    if self._stopping or cur.stopped or cur.paused:
                        cur.position = cur.done if cur.paused else cur.position
                        break
                    cur.busy = True
                    try:
                        handled = await self._handle(sub, m, cur)
                    finally:
                        cur.busy = False
                    if not handled:
                        break
                    cur.done = m.next_offset
                    cur.msg_id = m.msg_id
                    cur.dirty = True
        finally:
            if prefetch is not None:
                prefetch[2].cancel()

    async def _wait_resumed(self, cur: _Cursor) -> None:
        evt = cur.resumed
        if evt is None:
            return
        stop = self._stop_evt
        assert stop is not None
        waits = [asyncio.ensure_future(evt.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _deliver_run(
        self, sub: _Subscription, cur: _Cursor, msgs: list[Message], end: int
    ) -> tuple[int, bool]:
        """Deliver the messages of one fetch in one loop while nothing unusual happens (no
        filter, none of them in the duplicate window, the listener async or inline and
        succeeding): no coroutine, key lookup or stats update per message. Returns
        ``(handled, stop)``: the first ``handled`` messages are done (a failing one is
        handed to :meth:`_handle` with its first attempt counted); ``stop``: shutdown
        interrupted that one (the offset must not move past it)."""
        listener = sub.listener
        inline = not sub.is_async and self._executor is None
        if listener is None or sub.accept is not None or not (sub.is_async or inline):
            return 0, False
        base = self._dedup_base(cur.partition)
        keys = [base | m[3] for m in msgs]
        dedup = self._dedup
        if not dedup.none_seen(keys):
            return 0, False
        timeout = self.config.listener_timeout_s
        watched = sub.is_async and timeout is not None
        limit = timeout or 0.0
        if watched and self._watchdog is None:
            self._watchdog = self._spawn(self._watchdog_loop(limit))
        last = len(msgs) - 1
        n = 0
        err: Exception | None = None
        cur.busy = True
        # no clock read per message: the watchdog sees ``cur.done`` move (see _watchdog_loop)
        cur.watch_since = 0.0
        cur.watch_run = watched
        try:
            for m in msgs:
                if self._stopping or cur.stopped or cur.paused:
                    break
                if inline:
                    listener(m)
                else:
                    await listener(m)
                cur.done = msgs[n + 1][2] if n < last else end
                cur.msg_id = m[3]
                n += 1
        except asyncio.CancelledError:
            if not cur.timed_out:
                raise
            cur.timed_out = False
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            m = msgs[n]
            err = ListenerTimeoutError(
                f"listener took more than {timeout} s on {m.topic} {m.partition}@{m.offset}"
            )
        except Exception as e:
            err = e
        finally:
            cur.busy = False
            cur.watch_run = False
            if n:
                self._stats.messages += n
                self._stats.delivered += n
                dedup.add_new(keys[:n])
                cur.dirty = True
        if err is None:
            return n, False
        m = msgs[n]
        cur.busy = True
        try:
            handled = await self._handle(sub, m, cur, err)
        finally:
            cur.busy = False
        if not handled:
            return n, True
        cur.done = m.next_offset
        cur.msg_id = m.msg_id
        cur.dirty = True
        return n + 1, False

    async def _handle(
        self, sub: _Subscription, m: Message, cur: _Cursor, failed: Exception | None = None
    ) -> bool:
        """Deliver one message; False when shutdown interrupted it (offset must not move).

        ``failed``: the listener already failed once on it with this error (filter and
        duplicate window already passed)."""
        st = self._stats
        st.messages += 1
        key = self._dedup_base(m.partition) | m.msg_id
        if failed is None:
            if sub.accept is not None and not sub.accept(m):
                st.filtered += 1
                return True
            if self._dedup.seen(key):
                st.duplicates += 1
                return True
        cfg = self.config
        delay = cfg.retry_delay_s
        last: Exception | None = None
        for attempt in range(cfg.max_retries + 1):
            try:
                if attempt == 0 and failed is not None:
                    raise failed
                await self._invoke_watched(sub, m, cur)
            except Exception as e:
                st.listener_failures += 1
                last = e
                log.debug(
                    "listener failed on %s %s@%d (attempt %d): %r",
                    m.topic,
                    m.partition,
                    m.offset,
                    attempt + 1,
                    e,
                )
                if attempt < cfg.max_retries:
                    await self._sleep(delay)
                    if self._stopping or cur.stopped:
                        return False
                    delay = min(delay * 2, cfg.retry_delay_max_s)
                continue
            st.delivered += 1
            self._dedup.add(key)
            return True
        await self._store_for_recovery(m, last)
        self._dedup.add(key)
        return True

    async def _store_for_recovery(self, m: Message, err: Exception | None) -> None:
        backoff = 0.1
        while True:
            try:
                await asyncio.to_thread(self.recover_store.add, m, repr(err))
                self._stats.recover_stored += 1
                log.warning(
                    "message %s %s@%d handed to the recover store after %d attempts",
                    m.topic,
                    m.partition,
                    m.offset,
                    self.config.max_retries + 1,
                )
                return
            except ClientError as e:  # disk trouble: do not move past the message
                log.error("cannot store message for recovery: %s", e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _invoke_watched(self, sub: _Subscription, m: Message, cur: _Cursor) -> None:
        """Run the listener in the cursor's task under the watchdog's per-message timeout.

        (One shared watchdog instead of an ``asyncio.timeout`` per message, which would cost
        a timer per message.)
        """
        listener = sub.listener
        assert listener is not None
        timeout = self.config.listener_timeout_s
        if timeout is None or not (sub.is_async or self._executor is not None):
            await self._invoke(sub, m, None)
            return
        if self._watchdog is None:
            self._watchdog = self._spawn(self._watchdog_loop(timeout))
        cur.deadline = asyncio.get_running_loop().time() + timeout
        try:
            if sub.is_async:
                await listener(m)
            else:
                assert self._executor is not None
                await asyncio.get_running_loop().run_in_executor(self._executor, listener, m)
        except asyncio.CancelledError:
            if not cur.timed_out:
                raise
            cur.timed_out = False
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ListenerTimeoutError(
                f"listener took more than {timeout} s on {m.topic} {m.partition}@{m.offset}"
            ) from None
        finally:
            cur.deadline = 0.0

    async def _watchdog_loop(self, timeout: float) -> None:
        """Cancel a cursor's task whose listener runs past ``timeout`` on one message: a
        single delivery sets ``cur.deadline``; during a run (:meth:`_deliver_run`) the
        message is timed from the first tick that saw ``cur.done`` (which moves once per
        message) where it is, so it is never cut early and at most one period late."""
        loop = asyncio.get_running_loop()
        period = min(max(timeout / 4, 0.01), 0.5)
        while not self._stopping:
            await self._sleep(period)
            now = loop.time()
            for cur in self._cursors.values():
                if cur.timed_out or cur.task is None:
                    continue
                if cur.watch_run:
                    if cur.watch_since == 0.0 or cur.done != cur.watch_done:
                        cur.watch_done, cur.watch_since = cur.done, now
                        continue
                    late = now - cur.watch_since > timeout
                else:
                    late = 0.0 < cur.deadline < now
                if late:
                    cur.timed_out = True
                    cur.task.cancel()

    async def _invoke(self, sub: _Subscription, m: Message, _cur: _Cursor | None) -> None:
        listener = sub.listener
        assert listener is not None
        timeout = self.config.listener_timeout_s
        try:
            if sub.is_async:
                async with asyncio.timeout(timeout):
                    await listener(m)
            elif self._executor is None:
                listener(m)
            else:
                fut = asyncio.get_running_loop().run_in_executor(self._executor, listener, m)
                async with asyncio.timeout(timeout):
                    await fut
        except TimeoutError:
            raise ListenerTimeoutError(
                f"listener took more than {timeout} s on {m.topic} {m.partition}@{m.offset}"
            ) from None

    async def _recover_round(self) -> int:
        assert self._recover_lock is not None
        async with self._recover_lock:
            pending: list[StoredMessage] = await asyncio.to_thread(self.recover_store.pending)
            addrs = {str(c.partition): c.partition.address for c in self._all_cursors()}
            ok = 0
            for sm in pending:
                if self._stopping:
                    break
                sub = self._subs.get(sm.topic)
                if sub is None or sub.listener is None:
                    continue
                msg = sm.to_message(addrs.get(sm.partition, ""))
                try:
                    await self._invoke(sub, msg, None)
                except Exception as e:
                    self._stats.recover_failures += 1
                    dead = await asyncio.to_thread(
                        self.recover_store.failed, sm, repr(e), self.config.max_recover_attempts
                    )
                    if dead:
                        self._stats.dead_lettered += 1
                        log.error("message %s became a dead letter: %r", sm.id, e)
                    continue
                await asyncio.to_thread(self.recover_store.remove, sm)
                self._stats.recovered += 1
                ok += 1
            return ok

    async def _commit_loop(self) -> None:
        interval = self.config.commit_interval_s
        refresh_every = max(1, int(self.client_config.metadata_ttl_s / max(interval, 0.001)))
        n = 0
        while not self._stopping:
            await self._sleep(interval)
            if self._stopping:
                return
            await self.commit_quietly()
            n += 1
            if n % refresh_every == 0 and self._cluster is None:
                await self._refresh_partitions()

    async def _refresh_partitions(self) -> None:
        """Start fetching partitions added to a subscribed topic since the start."""
        for sub in self._subs.values():
            if sub.listener is None:
                continue
            try:
                parts = await self._assigned(sub.topic)
            except ClientError:
                continue
            for p in parts:
                self._start_cursor(sub, p)


class _ClusterTarget:
    """The consumer as a :class:`configserver.AssignmentTarget` (called by its GroupMember,
    one call at a time)."""

    def __init__(self, consumer: AsyncConsumer):
        self.c = consumer

    def _cursor(self, topic: str, p: PartitionInfo) -> _Cursor | None:
        return self.c._cursors.get((topic, Partition(p.broker_id, p.partition, p.address)))

    def _manual_cursor(self, topic: str, p: PartitionInfo) -> _Cursor | None:
        part = Partition(p.broker_id, p.partition, p.address)
        return next((cur for cur in self.c._manual.get(topic, ()) if cur.partition == part), None)

    async def assign(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        c = self.c
        sub = c._subs.get(topic)
        if sub is None or c._stopping:
            return
        if sub.listener is None:
            await self._assign_manual(sub, partitions)
            return
        for p in partitions:
            cur = self._cursor(topic, p)
            if cur is None:
                c._start_cursor(sub, Partition(p.broker_id, p.partition, p.address))
            elif cur.task is None or cur.task.done():  # suspended: resume where handled
                cur.stopped = False
                if cur.done >= 0:
                    cur.position = cur.done
                cur.task = c._spawn(c._run_cursor(sub, cur))

    async def _assign_manual(self, sub: _Subscription, partitions: Sequence[PartitionInfo]) -> None:
        """fetch()/messages() topic: a cursor per newly owned partition, starting at the
        committed offset (read after the claim, so the previous owner's last commit counts);
        a suspended one resumes where the application's processing reached."""
        c = self.c
        cursors = c._manual.setdefault(sub.topic, [])
        for p in partitions:
            cur = self._manual_cursor(sub.topic, p)
            if cur is not None:
                if cur.stopped:
                    cur.stopped = False
                    if cur.done >= 0:
                        cur.position = cur.done
                continue
            part = Partition(p.broker_id, p.partition, p.address)
            cur = _Cursor(sub.topic, part, FetchSizer(sub.max_size, c.config.max_fetch_bytes))
            await c._init_offset(cur)
            cursors.append(cur)

    def _drop_manual(self, curs: Sequence[_Cursor]) -> None:
        for cur in curs:
            self.c._cancel_pending(cur)
            cursors = self.c._manual.get(cur.topic)
            if cursors is not None and cur in cursors:
                cursors.remove(cur)

    async def revoke(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        c = self.c
        manual = [cur for p in partitions if (cur := self._manual_cursor(topic, p)) is not None]
        if manual:  # what the application processed is committed; the rest is redelivered
            for cur in manual:
                cur.stopped = True
                c._mark_done(cur)
            try:
                await c.commit()
            except ClientError as e:
                log.error("group %s: commit before releasing %s failed: %s", c.group, topic, e)
            self._drop_manual(manual)
        curs = [cur for p in partitions if (cur := self._cursor(topic, p)) is not None]
        if not curs:
            return
        await asyncio.gather(*(c._stop_cursor(cur) for cur in curs))
        try:
            await c.commit()
        except ClientError as e:
            log.error("group %s: commit before releasing %s failed: %s", c.group, topic, e)
        for cur in curs:
            c._cursors.pop((cur.topic, cur.partition), None)

    async def suspend(self) -> None:
        c = self.c
        for cursors in c._manual.values():
            for cur in cursors:
                c._cancel_pending(cur)
                cur.stopped = True
        await asyncio.gather(*(c._stop_cursor(cur) for cur in list(c._cursors.values())))

    async def lost(self) -> None:
        c = self.c
        self._drop_manual([cur for cursors in c._manual.values() for cur in cursors])
        curs = list(c._cursors.values())
        await asyncio.gather(*(c._stop_cursor(cur) for cur in curs))
        for cur in curs:
            c._cursors.pop((cur.topic, cur.partition), None)


def _where(store: OffsetStore, group: str) -> str:
    if isinstance(store, FileOffsetStore):
        return str(store.path(group).absolute())
    return repr(store)


def _adopt_legacy_offsets(cfg: ConsumerConfig, store: FileOffsetStore, group: str) -> None:
    """A consumer on the default ``data_dir`` whose group has offsets only in the old
    default (``./.notify-client``, relative to the working directory) takes a copy of them."""
    if Path(cfg.data_dir) != default_data_dir():
        return
    old = FileOffsetStore(LEGACY_DATA_DIR / "offsets").path(group)
    new = store.path(group)
    if new.exists() or not old.is_file():
        return
    new.parent.mkdir(parents=True, exist_ok=True)
    tmp = new.with_name(new.name + ".tmp")
    shutil.copyfile(old, tmp)
    os.replace(tmp, new)
    log.warning(
        "group %s: offsets copied from the old default %s to %s (the default data_dir is "
        "no longer relative to the working directory; set ConsumerConfig.data_dir or %s)",
        group,
        old.absolute(),
        new,
        DATA_DIR_ENV,
    )


def _of_tag(tag: int) -> Callable[[Hashable], bool]:
    """The duplicate window's keys of one partition (see ``_dedup_base``)."""
    return lambda k: isinstance(k, int) and k >> 64 == tag


def _as_list(parts: Partition | str | Iterable[Partition | str]) -> list[Partition | str]:
    if isinstance(parts, Partition | str):
        return [parts]
    return list(parts)


def _as_unix_s(ts: float | datetime) -> float:
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise ClientError("timestamp must be timezone-aware (e.g. UTC)")
        return ts.timestamp()
    return float(ts)


def next_wait(idle_timeout_s: float | None, idle_for_s: float) -> float:
    """How long a ``messages()`` iteration's next fetch may wait (<= 0: its idle timeout
    passed): at most half a second, to see a stop."""
    if idle_timeout_s is None:
        return 0.5
    return min(0.5, idle_timeout_s - idle_for_s)


def warn_never_started(consumers: Iterable[AsyncConsumer]) -> None:
    """One :class:`~notify.errors.SubscriptionNotStartedWarning` naming every consumer of
    ``consumers`` that had listeners subscribed but was never started."""
    lost = [(c.group, topics) for c in consumers if (topics := c.never_started())]
    if not lost:
        return
    names = "; ".join(f"group {g}: {', '.join(t)}" for g, t in lost)
    warnings.warn(
        SubscriptionNotStartedWarning(
            f"consumer closed without complete_subscribe() (or run()): the listeners of "
            f"{names} never received anything; call complete_subscribe() after subscribe()"
        ),
        stacklevel=3,
    )


def sigterm_is_default() -> bool:
    """True in the main thread while SIGTERM has its default action (kill the process):
    then a ``messages()`` iteration may take SIGTERM over to stop cleanly."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    except ValueError:  # pragma: no cover - not the main interpreter
        return False


def _add_loop_stop_handler(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> bool:
    """Make SIGTERM call ``stop`` on ``loop`` (see :func:`sigterm_is_default`); whether a
    handler was installed (the caller removes it)."""
    if not sigterm_is_default():
        return False
    try:
        loop.add_signal_handler(signal.SIGTERM, stop)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def signal_list(signals: Iterable[int] | None) -> list[int]:
    """The signals :meth:`AsyncConsumer.run` stops on (default SIGTERM and SIGINT)."""
    return [signal.SIGTERM, signal.SIGINT] if signals is None else list(signals)


def _swallow(t: asyncio.Future[Any]) -> None:
    if not t.cancelled():
        t.exception()
