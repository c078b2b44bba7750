"""Listener mode: a fetch task per partition hands each message, in offset order, to the
subscription's listener; the next window is prefetched while the listener works. Then:

* filter (predicate or attribute value set) -> skipped messages still advance the offset;
* duplicate window (the fetcher's) -> counted, not delivered again;
* listener failure or timeout -> retried ``max_retries`` times with growing delay, then the
  message is written to the local :class:`RecoverStore` (fsync) and consumption moves on;
  an APScheduler job re-delivers recover-store messages every ``recover_interval_s`` and
  turns them into dead letters after ``max_recover_attempts``;
* the offset of a partition advances only past messages that were handled (delivered,
  filtered, duplicate or safely in the recover store).

A listener is a coroutine function (run on the loop) or a plain callable (on the consumer's
executor, or inline when ``listener_threads`` is 0). One watchdog task cuts a listener that
runs past ``listener_timeout_s`` on one message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from notify.errors import ClientError

from ._errors import ListenerTimeoutError
from ._fetcher import Fetcher, swallow
from ._message import Message
from ._recover import RecoverStore, StoredMessage
from ._subscription import ConsumerContext, ConsumerPart, Cursor, Subscription

log = logging.getLogger("notify.client")


class Delivery(ConsumerPart):
    """The listener side of one consumer (see the module docstring). ``init_offset``
    positions a new cursor (the committer's)."""

    def __init__(
        self,
        ctx: ConsumerContext,
        fetcher: Fetcher,
        recover_store: RecoverStore,
        executor: concurrent.futures.Executor | None,
        init_offset: Callable[[Cursor], Awaitable[None]],
    ):
        super().__init__(ctx)
        self.fetcher = fetcher
        self.recover_store = recover_store
        self.executor = executor
        self.init_offset = init_offset
        self._watchdog: asyncio.Task[None] | None = None
        self._scheduler: Any = None
        self._recover_lock: asyncio.Lock | None = None

    # -- the fetch task of a partition

    async def run_cursor(self, sub: Subscription, cur: Cursor) -> None:
        """Fetch ``cur``'s partition and deliver its messages until stopped."""
        cfg = self.config
        life = self.life
        await self._position(cur)
        idle = err_backoff = cfg.idle_backoff_min_s
        loop = asyncio.get_running_loop()
        # a broker that ignores the long-poll wait answers 404 at once: then poll as usual
        held_s = cfg.long_poll_ms / 2000
        prefetch: tuple[int, int, asyncio.Task[Any], float] | None = None
        fetcher = self.fetcher
        try:
            while not life.stopping and not cur.stopped:
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
                        resp = await fetcher.get(cur, offset, size)
                    msgs = fetcher.decode(cur, offset, resp)
                except (ClientError, OSError) as e:
                    self.stats.fetch_errors += 1
                    log.debug("fetch %s %s @%d: %s", cur.topic, cur.partition, offset, e)
                    await life.sleep(err_backoff)
                    err_backoff = min(err_backoff * 2, self.client_config.reconnect_backoff_max_s)
                    continue
                err_backoff = cfg.idle_backoff_min_s
                if msgs is None:
                    continue
                if not msgs:
                    if cfg.long_poll_ms <= 0 or loop.time() - issued < held_s:
                        await life.sleep(idle)
                        idle = min(idle * 2, cfg.idle_backoff_max_s)
                    continue
                idle = cfg.idle_backoff_min_s
                nxt = msgs[-1].next_offset
                ptask = asyncio.ensure_future(fetcher.get(cur, nxt, cur.sizer.current))
                ptask.add_done_callback(swallow)
                prefetch = (nxt, cur.sizer.current, ptask, loop.time())
                cur.position = nxt
                await self._deliver_window(sub, cur, msgs, nxt)
        finally:
            if prefetch is not None:
                prefetch[2].cancel()

    async def _position(self, cur: Cursor) -> None:
        """Give a new cursor its starting offset, retrying while the broker is away."""
        backoff = self.config.idle_backoff_min_s
        while not self.life.stopping and not cur.stopped and cur.position < 0:
            try:
                await self.init_offset(cur)
                return
            except (ClientError, OSError) as e:
                log.warning("%s %s: initial offset: %s", cur.topic, cur.partition, e)
                await self.life.sleep(backoff)
                backoff = min(backoff * 2, self.client_config.reconnect_backoff_max_s)

    async def _deliver_window(
        self, sub: Subscription, cur: Cursor, msgs: list[Message], end: int
    ) -> None:
        """Deliver the messages of one fetch: in one run while nothing unusual happens,
        then one at a time; ``cur.done`` follows the handled ones."""
        done, stop = await self._deliver_run(sub, cur, msgs, end)
        if stop:
            return
        for m in msgs[done:] if done else msgs:
            if self.life.stopping or cur.stopped or cur.paused:
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

    async def _wait_resumed(self, cur: Cursor) -> None:
        evt = cur.resumed
        if evt is None:
            return
        waits = [asyncio.ensure_future(evt.wait()), asyncio.ensure_future(self.life.event.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _deliver_run(
        self, sub: Subscription, cur: Cursor, msgs: list[Message], end: int
    ) -> tuple[int, bool]:
        """Deliver the messages of one fetch in one loop while nothing unusual happens (no
        filter, none of them in the duplicate window, the listener async or inline and
        succeeding): no coroutine, key lookup or stats update per message. Returns
        ``(handled, stop)``: the first ``handled`` messages are done (a failing one is
        handed to :meth:`_handle` with its first attempt counted); ``stop``: shutdown
        interrupted that one (the offset must not move past it)."""
        listener = sub.listener
        inline = not sub.is_async and self.executor is None
        if listener is None or sub.accept is not None or not (sub.is_async or inline):
            return 0, False
        base = self.fetcher.dedup_base(cur.partition)
        keys = [base | m[3] for m in msgs]
        dedup = self.fetcher.dedup
        if not dedup.none_seen(keys):
            return 0, False
        timeout = self.config.listener_timeout_s
        watched = sub.is_async and timeout is not None
        if watched and self._watchdog is None:
            self._watchdog = self.life.spawn(self._watchdog_loop(timeout or 0.0))
        life = self.life
        last = len(msgs) - 1
        n = 0
        err: Exception | None = None
        cur.busy = True
        # no clock read per message: the watchdog sees ``cur.done`` move (see _watchdog_loop)
        cur.watch_since = 0.0
        cur.watch_run = watched
        try:
            for m in msgs:
                if life.stopping or cur.stopped or cur.paused:
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
            err = _timed_out(cur, msgs[n], timeout)
        except Exception as e:
            err = e
        finally:
            cur.busy = False
            cur.watch_run = False
            if n:
                self.stats.messages += n
                self.stats.delivered += n
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
        self, sub: Subscription, m: Message, cur: Cursor, failed: Exception | None = None
    ) -> bool:
        """Deliver one message; False when shutdown interrupted it (offset must not move).

        ``failed``: the listener already failed once on it with this error (filter and
        duplicate window already passed)."""
        st = self.stats
        st.messages += 1
        dedup = self.fetcher.dedup
        key = self.fetcher.dedup_base(m.partition) | m.msg_id
        if failed is None:
            if sub.accept is not None and not sub.accept(m):
                st.filtered += 1
                return True
            if dedup.seen(key):
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
                    await self.life.sleep(delay)
                    if self.life.stopping or cur.stopped:
                        return False
                    delay = min(delay * 2, cfg.retry_delay_max_s)
                continue
            st.delivered += 1
            dedup.add(key)
            return True
        await self._store_for_recovery(m, last)
        dedup.add(key)
        return True

    async def _store_for_recovery(self, m: Message, err: Exception | None) -> None:
        backoff = 0.1
        while True:
            try:
                await asyncio.to_thread(self.recover_store.add, m, repr(err))
                self.stats.recover_stored += 1
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

    # -- running a listener, under a timeout

    async def _invoke_watched(self, sub: Subscription, m: Message, cur: Cursor) -> None:
        """Run the listener in the cursor's task under the watchdog's per-message timeout.

        (One shared watchdog instead of an ``asyncio.timeout`` per message, which would cost
        a timer per message.)
        """
        listener = sub.listener
        assert listener is not None
        timeout = self.config.listener_timeout_s
        if timeout is None or not (sub.is_async or self.executor is not None):
            await self.invoke(sub, m)
            return
        if self._watchdog is None:
            self._watchdog = self.life.spawn(self._watchdog_loop(timeout))
        cur.deadline = asyncio.get_running_loop().time() + timeout
        try:
            if sub.is_async:
                await listener(m)
            else:
                assert self.executor is not None
                await asyncio.get_running_loop().run_in_executor(self.executor, listener, m)
        except asyncio.CancelledError:
            if not cur.timed_out:
                raise
            raise _timed_out(cur, m, timeout) from None
        finally:
            cur.deadline = 0.0

    async def _watchdog_loop(self, timeout: float) -> None:
        """Cancel a cursor's task whose listener runs past ``timeout`` on one message: a
        single delivery sets ``cur.deadline``; during a run (:meth:`_deliver_run`) the
        message is timed from the first tick that saw ``cur.done`` (which moves once per
        message) where it is, so it is never cut early and at most one period late."""
        loop = asyncio.get_running_loop()
        period = min(max(timeout / 4, 0.01), 0.5)
        while not self.life.stopping:
            await self.life.sleep(period)
            now = loop.time()
            for cur in self.state.cursors.values():
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

    async def invoke(self, sub: Subscription, m: Message) -> None:
        """Run the listener on ``m`` under its own timeout (no cursor's task to cancel)."""
        listener = sub.listener
        assert listener is not None
        timeout = self.config.listener_timeout_s
        try:
            if sub.is_async:
                async with asyncio.timeout(timeout):
                    await listener(m)
            elif self.executor is None:
                listener(m)
            else:
                fut = asyncio.get_running_loop().run_in_executor(self.executor, listener, m)
                async with asyncio.timeout(timeout):
                    await fut
        except TimeoutError:
            raise ListenerTimeoutError(
                f"listener took more than {timeout} s on {m.topic} {m.partition}@{m.offset}"
            ) from None

    # -- the recover store

    def start_scheduler(self) -> None:
        """Start the recover store's periodic re-delivery."""
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

    def stop_scheduler(self) -> None:
        """Stop the periodic re-delivery (a running round finishes)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    async def _recover_job(self) -> None:
        if self.life.stopping:
            return
        task = asyncio.current_task()
        if task is not None:
            self.life.track(task)
        try:
            await self.recover_round()
        except Exception:  # pragma: no cover - logged, next round retries
            log.exception("recover round of group %s failed", self.fetcher.group)

    async def recover_round(self) -> int:
        """Deliver the recover store's messages once more; returns how many succeeded."""
        if self._recover_lock is None:
            self._recover_lock = asyncio.Lock()
        async with self._recover_lock:
            store = self.recover_store
            pending: list[StoredMessage] = await asyncio.to_thread(store.pending)
            addrs = {str(c.partition): c.partition.address for c in self.state.all_cursors()}
            ok = 0
            for sm in pending:
                if self.life.stopping:
                    break
                sub = self.state.subs.get(sm.topic)
                if sub is None or sub.listener is None:
                    continue
                try:
                    await self.invoke(sub, sm.to_message(addrs.get(sm.partition, "")))
                except Exception as e:
                    self.stats.recover_failures += 1
                    dead = await asyncio.to_thread(
                        store.failed, sm, repr(e), self.config.max_recover_attempts
                    )
                    if dead:
                        self.stats.dead_lettered += 1
                        log.error("message %s became a dead letter: %r", sm.id, e)
                    continue
                await asyncio.to_thread(store.remove, sm)
                self.stats.recovered += 1
                ok += 1
            return ok


def _timed_out(cur: Cursor, m: Message, timeout: float | None) -> ListenerTimeoutError:
    """The error of a listener the watchdog cut on ``m`` (the cursor's task uncancelled)."""
    cur.timed_out = False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return ListenerTimeoutError(
        f"listener took more than {timeout} s on {m.topic} {m.partition}@{m.offset}"
    )
