"""What a consumer reads and where it stands (aiokafka's ``consumer/subscription_state.py``),
with the state its parts share: :class:`ConsumerStats` and :class:`Lifecycle`.

:class:`SubscriptionState` holds the subscriptions (a topic, its listener or none, its
filter), one :class:`Cursor` per partition read (listener mode: ``cursors``, a fetch task
each; the pull API of ``fetch()``/``messages()``: ``manual``, polled together) and their
pause state. A cursor's offsets: ``position`` is the next offset to fetch, ``done`` the
offset up to which everything is handled (what a commit stores), ``acked`` the offset the
application reported done through the pull API (counted into ``done`` at the next fetch
or commit). No I/O here.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection, Coroutine, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from notify.errors import ClientError

from ._config import ClientConfig, ConsumerConfig
from ._fetchsize import FetchSizer
from ._message import Message
from ._routing import Partition

MessageListener = Callable[[Message], Any]
"""A listener: a plain callable (run on the consumer's executor) or a coroutine function."""
MessageFilter = Callable[[Message], bool] | Collection[str]
"""A filter: a predicate over the message, or the set of attribute values to accept."""


def make_filter(f: MessageFilter | None) -> Callable[[Message], bool] | None:
    """The predicate of a :data:`MessageFilter` (None: accept everything)."""
    if f is None:
        return None
    if callable(f):
        return f
    values = frozenset(f)
    return lambda m: m.attribute in values


@dataclass(slots=True)
class Subscription:
    """One subscribed topic: its listener (None: read with ``fetch()``/``messages()``),
    the first fetch size, the filter and whether the listener is a coroutine function."""

    topic: str
    listener: MessageListener | None
    max_size: int
    accept: Callable[[Message], bool] | None
    is_async: bool


class Cursor:
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
        self.end_checked = -1  # position last checked for being beyond the end (Fetcher.get)
        self.dirty = False
        self.corrupt = 0
        # listener watchdog: the cursor task is cancelled when ``deadline`` passes
        self.task: asyncio.Task[None] | None = None
        self.deadline = 0.0  # 0: no listener running
        self.timed_out = False
        # a run of messages (Delivery.deliver_run) is watched by its progress instead:
        # the watchdog times how long ``done`` stays where it first saw it
        self.watch_run = False
        self.watch_done = -1
        self.watch_since = 0.0
        # cluster mode: stop this partition only / a message is being handled
        self.stopped = False
        self.busy = False
        # pull API: offset handled by the application (counted at the next fetch/commit),
        # the fetch running for this partition, pause/resume
        self.acked = -1
        self.pending: asyncio.Task[list[Message]] | None = None
        self.paused = False
        self.resumed: asyncio.Event | None = None

    def mark_done(self) -> None:
        """Count what the application acknowledged (pull API) as handled."""
        if self.acked > self.done:  # (a 301 may have moved ``done`` past it already)
            self.done = self.acked
            self.dirty = True

    def reposition(self, target: int) -> None:
        """Move to ``target``: fetched, handled and acknowledged up to there (a seek)."""
        self.position = self.done = self.acked = target
        self.end_checked = -1
        self.dirty = True

    def cancel_pending(self) -> None:
        """Cancel the pull API's fetch in flight for this partition."""
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None


class SubscriptionState:
    """The subscriptions and cursors of one consumer (see the module docstring)."""

    def __init__(self, max_fetch_bytes: int):
        self.max_fetch_bytes = max_fetch_bytes
        self.subs: dict[str, Subscription] = {}
        #: listener mode: a cursor (and its fetch task) per (topic, partition)
        self.cursors: dict[tuple[str, Partition], Cursor] = {}
        #: pull API: the cursors of each topic, polled together
        self.manual: dict[str, list[Cursor]] = {}
        #: pull API: the cursor of each topic to look at first (round robin)
        self.manual_rr: dict[str, int] = {}

    def subscribe(
        self,
        topic: str,
        listener: MessageListener | None,
        max_size: int,
        filter: MessageFilter | None,
    ) -> Subscription:
        """Add the subscription of ``topic`` (raises :class:`ClientError` when it has one)."""
        if topic in self.subs:
            raise ClientError(f"topic {topic!r} is already subscribed")
        FetchSizer(max_size, self.max_fetch_bytes)  # validates max_size
        is_async = listener is not None and (
            inspect.iscoroutinefunction(listener)
            or inspect.iscoroutinefunction(getattr(listener, "__call__", None))  # noqa: B004
        )
        sub = Subscription(topic, listener, max_size, make_filter(filter), is_async)
        self.subs[topic] = sub
        return sub

    def pull(self, topic: str) -> Subscription:
        """The subscription of ``topic`` read through the pull API (made on first use)."""
        sub = self.subs.get(topic)
        if sub is None:
            sub = self.subs[topic] = Subscription(topic, None, 1 << 20, None, False)
        return sub

    def with_listener(self) -> list[Subscription]:
        """The subscriptions that have a listener."""
        return [s for s in self.subs.values() if s.listener is not None]

    def new_cursor(self, sub: Subscription, part: Partition) -> Cursor:
        """A cursor (not positioned yet) for ``part`` of ``sub``'s topic."""
        return Cursor(sub.topic, part, FetchSizer(sub.max_size, self.max_fetch_bytes))

    def all_cursors(self) -> list[Cursor]:
        """Every cursor, listener mode and pull API."""
        out = list(self.cursors.values())
        for cs in self.manual.values():
            out.extend(cs)
        return out

    def manual_cursor(self, topic: str, part: Partition) -> Cursor | None:
        """The pull API's cursor of ``part`` of ``topic``, if there is one."""
        return next((c for c in self.manual.get(topic, ()) if c.partition == part), None)

    def drop_manual(self, curs: Iterable[Cursor]) -> None:
        """Forget pull API cursors (their fetches cancelled)."""
        for cur in curs:
            cur.cancel_pending()
            cursors = self.manual.get(cur.topic)
            if cursors is not None and cur in cursors:
                cursors.remove(cur)

    def cursors_of(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None
    ) -> list[Cursor]:
        """The cursors of ``topic`` (of ``partitions`` only, when given: each must be read
        by this consumer)."""
        wanted = None if partitions is None else {str(p) for p in as_list(partitions)}
        curs = [c for c in self.all_cursors() if c.topic == topic]
        if wanted is not None:
            unknown = wanted - {str(c.partition) for c in curs}
            if unknown:
                raise ClientError(f"this consumer does not read {topic} {sorted(unknown)}")
            curs = [c for c in curs if str(c.partition) in wanted]
        return curs

    def pause(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None
    ) -> None:
        """Mark ``partitions`` of ``topic`` paused (their pull fetches cancelled)."""
        for cur in self.cursors_of(topic, partitions):
            if not cur.paused:
                cur.paused = True
                cur.resumed = asyncio.Event()
                cur.cancel_pending()

    def resume(
        self, topic: str, partitions: Partition | str | Iterable[Partition | str] | None
    ) -> None:
        """Mark ``partitions`` of ``topic`` not paused (waking their fetch tasks)."""
        for cur in self.cursors_of(topic, partitions):
            cur.paused = False
            if cur.resumed is not None:
                cur.resumed.set()
                cur.resumed = None

    def paused(self, topic: str | None = None) -> list[str]:
        """The paused partitions (``"<brokerId>-<part>"``) of ``topic`` or of every topic."""
        return sorted(
            str(c.partition)
            for c in self.all_cursors()
            if c.paused and (topic is None or c.topic == topic)
        )


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


class Lifecycle:
    """A consumer's stop state and tasks, shared by its parts (on the consumer's loop):
    ``stopping`` once its shutdown began (:meth:`sleep` returns early then); ``tasks``: the
    tasks the shutdown waits for (:meth:`spawn`, :meth:`track`)."""

    def __init__(self) -> None:
        self.stopping = False
        self._event: asyncio.Event | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task the shutdown waits for."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.track(task)
        return task

    def track(self, task: asyncio.Task[None]) -> None:
        """Make the shutdown wait for ``task`` too (until it is done)."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def event(self) -> asyncio.Event:
        """Set once stopping (made on first use, on the loop)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def stop(self) -> None:
        """Begin stopping: sleeps end, loops see ``stopping``."""
        self.stopping = True
        self.event.set()

    async def sleep(self, delay_s: float) -> None:
        """Sleep ``delay_s`` seconds, or less when stopping begins meanwhile."""
        evt = self.event
        if delay_s <= 0 or evt.is_set():
            return
        try:
            async with asyncio.timeout(delay_s):
                await evt.wait()
        except TimeoutError:
            pass


@dataclass(slots=True)
class ConsumerContext:
    """What the parts of one consumer share: its settings, its group on the wire, its
    counters, its stop state and its subscription state."""

    client_config: ClientConfig
    config: ConsumerConfig
    group: str
    stats: ConsumerStats
    life: Lifecycle
    state: SubscriptionState


class ConsumerPart:
    """Base of a consumer's parts (fetcher, delivery, commits): the shared context's
    fields as attributes."""

    def __init__(self, ctx: ConsumerContext):
        self.client_config = ctx.client_config
        self.config = ctx.config
        self.group = ctx.group
        self.stats = ctx.stats
        self.life = ctx.life
        self.state = ctx.state


def share(parts: list[Partition], index: int, count: int) -> list[Partition]:
    """Contiguous share ``index`` of ``count`` (the first ``P % C`` members get one more)."""
    if count <= 1:
        return parts
    per, extra = divmod(len(parts), count)
    start = index * per + min(index, extra)
    return parts[start : start + per + (1 if index < extra else 0)]


def as_list(parts: Partition | str | Iterable[Partition | str]) -> list[Partition | str]:
    """One partition or several, as a list."""
    if isinstance(parts, Partition | str):
        return [parts]
    return list(parts)
