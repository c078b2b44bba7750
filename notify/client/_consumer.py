"""The pull consumer (asyncio). The synchronous :class:`Consumer` runs this same code.

:class:`AsyncConsumer` is the API; its parts follow aiokafka's ``consumer/`` package:

* ``_subscription``: what it reads and where it stands (subscriptions, a cursor per
  partition, pause state), its counters and its stop state;
* ``_fetcher``: ``get`` requests and their replies, the duplicate window, the pull API's
  concurrent polling (``fetch()``/``messages()``), offset look-ups for ``seek``;
* ``_delivery``: listener mode (a fetch task per partition, retries, the recover store,
  the listener watchdog);
* ``_commits``: where each partition starts and the offset commits (every
  ``commit_interval_s``, on :meth:`AsyncConsumer.commit`, before a rebalance releases
  partitions, and however the consumer stops, so a killed process re-consumes from its last
  commit: at-least-once);
* ``_group``: group coordination in cluster mode (a configserver's group membership drives
  the assignment); without a cluster each consumer takes the static share
  ``member_index``/``member_count`` of each topic (contiguous, as MetaQ splits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path

from notify.configserver import ConfigServer, GroupMember
from notify.errors import ClientError, SubscriptionNotStartedWarning

from ._commits import OffsetCommitter, default_store, instance_id, where
from ._config import MAX_OFFSET, ClientConfig, ConsumerConfig
from ._connection import ConnectionPool
from ._delivery import Delivery
from ._fetcher import Batch, Fetcher
from ._group import join_group
from ._message import Message
from ._recover import RecoverStore
from ._routing import Partition, TopicRouter
from ._subscription import (
    ConsumerContext,
    ConsumerStats,
    Cursor,
    Lifecycle,
    MessageFilter,
    MessageListener,
    Subscription,
    SubscriptionState,
    as_list,
    share,
)
from .offsets import OffsetStore, TopicPartitionOffset

__all__ = ["AsyncConsumer", "ConsumerStats", "MessageFilter", "MessageListener"]

log = logging.getLogger("notify.client")

#: How partitions may be named to ``seek``, ``pause`` and ``resume``.
Partitions = Partition | str | Iterable[Partition | str] | None


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
        self.group = f"{config.group}-{instance_id(config)}" if config.broadcast else config.group
        own_store = offset_store is None or config.broadcast
        if offset_store is None or config.broadcast:
            offset_store = default_store(config, self.group)
        self.offset_store: OffsetStore = offset_store
        log.info("consumer group %s: offsets in %s", self.group, where(offset_store, self.group))
        self.recover_store = RecoverStore(Path(config.data_dir), self.group)
        self._own_executor = executor is None and config.listener_threads > 0
        if executor is None and config.listener_threads > 0:
            executor = concurrent.futures.ThreadPoolExecutor(
                config.listener_threads, thread_name_prefix=f"notify-listener-{config.group}"
            )
        self._executor = executor
        self._stats = ConsumerStats()
        self.life = Lifecycle()
        self.state = SubscriptionState(config.max_fetch_bytes)
        ctx = ConsumerContext(
            client_config, config, self.group, self._stats, self.life, self.state
        )
        self.fetcher = Fetcher(ctx, pool)
        self.offsets = OffsetCommitter(ctx, offset_store, own_store, self.fetcher, router)
        self.delivery = Delivery(
            ctx, self.fetcher, self.recover_store, executor, self.offsets.init_offset
        )
        #: :meth:`request_stop` was called (a signal, or the application): :meth:`run`
        #: returns and every ``messages()`` iteration ends (any thread may read it)
        self.stop_requested = False
        self._run_stop: asyncio.Event | None = None
        self._started = False
        self._closed = False
        # configserver: group membership drives the assignment when set
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
        ``filter`` keeps only matching messages (predicate or attribute values). A consumer
        closed with listeners that were never started (no :meth:`complete_subscribe`)
        warns: :class:`~notify.errors.SubscriptionNotStartedWarning`.
        """
        if self._started and listener is not None:
            raise ClientError("subscribe after complete_subscribe is not supported")
        self.state.subscribe(topic, listener, max_size, filter)
        return self

    async def complete_subscribe(self) -> None:
        """Start consuming every subscribed topic that has a listener."""
        if self._closed:
            raise ClientError("consumer is closed")
        if self._started:
            return
        self._started = True
        if self._cluster is not None:
            self._member = await join_group(self, self._cluster)
        else:
            for sub in self.state.with_listener():
                for part in await self._assigned(sub.topic):
                    self.start_cursor(sub, part)
        if self.config.commit_interval_s > 0:
            self.life.spawn(self._commit_loop())
        if self.state.with_listener():
            self.delivery.start_scheduler()

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
            cur.mark_done()
        got = await self.fetcher.take(self.state.subs[topic], cursors, max_wait_s)
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
        return not (self.life.stopping or self._closed or self.stop_requested)

    def handed_out(self, got: Batch) -> Iterator[Message]:
        """The messages of one :meth:`next_batch`, each counted as processed when the next
        is asked; ends early after :meth:`request_stop` (the rest comes again)."""
        cur, out, end = got
        for m in out:
            yield m
            cur.acked = m.next_offset  # asked for the next one: m is processed
            if self.stop_requested:
                return
        cur.acked = end

    async def next_batch(self, topic: str, max_wait_s: float) -> Batch | None:
        """The iterator's step: ``(cursor, messages, end)`` or None after ``max_wait_s``.
        Nothing counts as processed until the caller sets ``cursor.acked`` (the offset up
        to which the application is done: a message's ``next_offset``, or ``end``)."""
        cursors = await self._manual_for(topic)
        return await self.fetcher.take(self.state.subs[topic], cursors, max_wait_s)

    async def _manual_for(self, topic: str) -> list[Cursor]:
        if self._closed:
            raise ClientError("consumer is closed")
        if self._cluster is not None:
            return await self._cluster_manual_for(topic)
        sub = self.state.subs.get(topic)
        if sub is not None and sub.listener is not None and self._started:
            raise ClientError(f"topic {topic!r} is consumed by a listener")
        return await self._manual_cursors(self.state.pull(topic))

    async def _cluster_manual_for(self, topic: str) -> list[Cursor]:
        """Cluster mode: the cursors of the partitions the group gives this member. The
        list changes in place as the group rebalances (see :class:`._group.ClusterTarget`);
        the first call joins the group when :meth:`complete_subscribe` was not called."""
        sub = self.state.subs.get(topic)
        if sub is not None and sub.listener is not None:
            raise ClientError(f"topic {topic!r} is consumed by a listener")
        if sub is None:
            if self._started:
                raise ClientError(
                    f"topic {topic!r} was not subscribed before the consumer joined its group: "
                    "in cluster mode subscribe every topic before complete_subscribe()"
                )
            self.state.pull(topic)
        if not self._started:
            await self.complete_subscribe()
        return self.state.manual.setdefault(topic, [])

    async def _manual_cursors(self, sub: Subscription) -> list[Cursor]:
        cursors = self.state.manual.get(sub.topic)
        if cursors is None:
            cursors = []
            for part in await self._assigned(sub.topic):
                cur = self.state.new_cursor(sub, part)
                await self.offsets.init_offset(cur)
                cursors.append(cur)
            self.state.manual[sub.topic] = cursors
        return cursors

    # -- position control: seek, pause/resume

    async def seek(
        self,
        topic: str,
        partitions: Partitions = None,
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
        fetcher = self.fetcher
        out: dict[str, int] = {}
        pending: list[TopicPartitionOffset] = []
        for part in await self._select(topic, partitions):
            if timestamp is not None:
                target = await fetcher.offset_for_time(topic, part, _as_unix_s(timestamp))
            elif isinstance(offset, str):
                end = 0 if offset == "earliest" else MAX_OFFSET
                target = await fetcher.ask_offset(topic, part, end)
            else:
                assert offset is not None
                target = offset
            out[str(part)] = target
            fetcher.forget(part)
            if not await self._move(topic, part, target):
                pending.append(TopicPartitionOffset(topic, str(part), target))
        if pending:
            await self.offsets.store_offsets(pending)
        log.info("group %s seeks %s to %s", self.group, topic, out)
        return out

    def pause(self, topic: str, partitions: Partitions = None) -> None:
        """Stop fetching ``partitions`` of ``topic`` (all of them by default) until
        :meth:`resume`; a running listener finishes its message, the rest of its window is
        fetched again on resume. Other partitions go on."""
        self.state.pause(topic, partitions)

    def resume(self, topic: str, partitions: Partitions = None) -> None:
        """Fetch paused partitions of ``topic`` again (all of them by default)."""
        self.state.resume(topic, partitions)

    def paused(self, topic: str | None = None) -> list[str]:
        """The paused partitions (``"<brokerId>-<part>"``) of ``topic`` or of every topic."""
        return self.state.paused(topic)

    async def _select(self, topic: str, partitions: Partitions) -> list[Partition]:
        mine = [c.partition for c in self.state.all_cursors() if c.topic == topic]
        if not mine:
            mine = await self._assigned(topic)
        if partitions is None:
            return mine
        by_id = {str(p): p for p in mine}
        out = []
        for p in as_list(partitions):
            part = by_id.get(str(p))
            if part is None:
                raise ClientError(f"this consumer does not read {topic} {p}")
            out.append(part)
        return out

    async def _move(self, topic: str, part: Partition, target: int) -> bool:
        """Put the live cursor of ``part`` at ``target``; False when there is none."""
        moved = False
        for cur in self.state.manual.get(topic, []):
            if cur.partition == part:
                cur.cancel_pending()
                cur.reposition(target)
                moved = True
        live = self.state.cursors.get((topic, part))
        sub = self.state.subs.get(topic)
        if live is not None and sub is not None:
            running = live.task is not None and not live.task.done()
            await self.stop_cursor(live)
            live.reposition(target)
            live.stopped = False
            if running:
                live.task = self.life.spawn(self.delivery.run_cursor(sub, live))
            moved = True
        return moved

    # -- stopping: run with signal handling, commit, shutdown

    def request_stop(self) -> None:
        """Make :meth:`run` return (after a clean shutdown) and end every ``messages()``
        iteration (each commits what was processed); call it on the consumer's loop
        (signal handlers installed there do)."""
        self.stop_requested = True
        self._stop_event().set()

    def _stop_event(self) -> asyncio.Event:
        if self._run_stop is None:
            self._run_stop = asyncio.Event()
        return self._run_stop

    async def run(
        self, timeout_s: float | None = None, signals: Iterable[int] | None = None
    ) -> None:
        """Consume with the subscribed listeners until stopped, then shut down cleanly.

        Starts the consumer (:meth:`complete_subscribe`) if needed and returns after
        SIGTERM or SIGINT (handlers installed on the running loop while it runs, when it
        is the main thread's), :meth:`request_stop`, or ``timeout_s``; then running
        listeners finish (up to the shutdown timeout) and offsets are committed.
        """
        stop = self._stop_event()
        await self.complete_subscribe()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for sig in signal_list(signals):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await stop.wait()
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
        await self.offsets.commit()

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
        return sorted(s.topic for s in self.state.with_listener())

    async def recover_now(self) -> int:
        """Run one re-delivery round of the recover store now; returns messages recovered."""
        return await self.delivery.recover_round()

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
        self.life.stop()
        for cursors in self.state.manual.values():
            for cur in cursors:
                cur.cancel_pending()
        if self._member is not None:
            await self._member.stop()
        self.delivery.stop_scheduler()
        tasks = list(self.life.tasks)
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
        self.offsets.close()
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    close = shutdown

    # -- cursors of listener mode

    async def _assigned(self, topic: str) -> list[Partition]:
        parts = await self.router.partitions(topic)
        return share(sorted(parts), self.config.member_index, self.config.member_count)

    def start_cursor(self, sub: Subscription, part: Partition) -> None:
        """Start fetching ``part`` for ``sub``'s listener (unless it is fetched already)."""
        if (sub.topic, part) in self.state.cursors:
            return
        cur = self.state.new_cursor(sub, part)
        self.state.cursors[(sub.topic, part)] = cur
        cur.task = self.life.spawn(self.delivery.run_cursor(sub, cur))

    async def stop_cursor(self, cur: Cursor) -> None:
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

    async def _commit_loop(self) -> None:
        interval = self.config.commit_interval_s
        refresh_every = max(1, int(self.client_config.metadata_ttl_s / max(interval, 0.001)))
        n = 0
        while not self.life.stopping:
            await self.life.sleep(interval)
            if self.life.stopping:
                return
            await self.commit_quietly()
            n += 1
            if n % refresh_every == 0 and self._cluster is None:
                await self._refresh_partitions()

    async def _refresh_partitions(self) -> None:
        """Start fetching partitions added to a subscribed topic since the start."""
        for sub in self.state.with_listener():
            try:
                parts = await self._assigned(sub.topic)
            except ClientError:
                continue
            for p in parts:
                self.start_cursor(sub, p)


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


def _as_unix_s(ts: float | datetime) -> float:
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise ClientError("timestamp must be timezone-aware (e.g. UTC)")
        return ts.timestamp()
    return float(ts)
