"""When partitions are forced to disk, and who waits for it (MetaQ's flush policy).

* ``unflushThreshold = 0``: group commit. Every append returns a future that completes when
  an fdatasync covering it has finished; replies wait for it. fsyncs run in rounds: while
  one round runs, every partition appended to queues for the next, which fsyncs them all
  concurrently (they share the journal commit and the disk's cache flush), so N concurrent
  producers share fsyncs within a partition and across partitions.
* ``unflushThreshold = N > 0``: appends are acknowledged at once; when N messages are
  unflushed, the appends that crossed the threshold wait for the fsync that follows (as
  MetaQ forces inside the append), so ``unflushThreshold=1`` acknowledges only fsynced data.
* ``unflushInterval`` ms: a timer forces any partition with unflushed data that long.

fsyncs run on a small thread pool so the event loop keeps serving during them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future as CFuture
from concurrent.futures import ThreadPoolExecutor

from notify.errors import StoreError
from notify.store.partition import Partition

log = logging.getLogger("notify.store")


class Flusher:
    """Applies the flush policy of each partition; one per broker event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        threshold_of: Callable[[Partition], int],
        interval_ms_of: Callable[[Partition], int],
        threads: int = 8,
    ):
        self._loop = loop
        self._threshold_of = threshold_of
        self._interval_ms_of = interval_ms_of
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="notify-fsync")
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        self.on_flushed: list[Callable[[Partition], None]] = []
        #: observers of each completed fsync's seconds (notify.http.metrics' histogram)
        self.on_fsync: list[Callable[[float], None]] = []
        self._next: dict[Partition, asyncio.Future[int]] = {}
        self._inflight = 0
        self._kick_scheduled = False
        self._round_done: list[tuple[Partition, asyncio.Future[int], int]] = []

    def after_append(self, part: Partition, count: int) -> asyncio.Future[int] | None:
        """Call right after appending ``count`` records; await the result before replying."""
        if part.memory:
            return None
        threshold = self._threshold_of(part)
        if threshold == 0:
            return self.request(part)
        part.unflushed += count
        if part.unflushed >= threshold:
            return self.request(part)
        return None

    def request(self, part: Partition) -> asyncio.Future[int]:
        """A future for an fsync of ``part`` that starts after everything appended so far.

        Requests are grouped into rounds: every partition that asks while a round is in
        flight joins the next one, and a round fsyncs all its partitions concurrently, so
        they share the journal commit and the device cache flush.
        """
        fut = self._next.get(part)
        if fut is None:
            fut = self._next[part] = self._loop.create_future()
            part.flush_next = fut
            if not self._inflight and not self._kick_scheduled:
                self._kick_scheduled = True
                self._loop.call_soon(self._kick)
        return fut

    def _kick(self) -> None:
        self._kick_scheduled = False
        if self._inflight or not self._next:
            return
        batch, self._next = self._next, {}
        self._inflight = len(batch)
        t0 = time.perf_counter()
        for part, fut in batch.items():
            part.flush_next = None
            part.flush_inflight = fut
            part.unflushed = 0
            target = part.end
            part.begin_sync()
            seg = part.active
            cf: CFuture[None] = self._pool.submit(seg.sync)
            cf.add_done_callback(
                lambda f, p=part, fu=fut, tg=target: self._loop.call_soon_threadsafe(  # type: ignore[misc]
                    self._done, p, fu, tg, f, t0
                )
            )

    def _done(
        self,
        part: Partition,
        fut: asyncio.Future[int],
        target: int,
        cf: CFuture[None],
        t0: float,
    ) -> None:
        """One partition's fsync of the round finished. Nothing becomes visible or is
        acknowledged before the whole round has finished: a transaction applied to several
        partitions in one loop turn is in one round, so readers see all of it or none."""
        part.flush_inflight = None
        part.last_flush = time.monotonic()
        self._inflight -= 1
        exc = cf.exception()
        if exc is not None:
            # After a failed fsync the page cache may have dropped the dirty pages: what is
            # in the file is unknown. Stop accepting writes rather than acknowledge on top.
            part.fail(
                f"{part.topic}-{part.index} is read-only after an fsync failure ({exc}); "
                "restart the broker to recover the partition"
            )
            log.error("%s", part.failed)
            err = StoreError(part.failed)
            if not fut.done():
                fut.set_exception(err)
            nxt = self._next.pop(part, None)
            part.flush_next = None
            if nxt is not None and not nxt.done():
                nxt.set_exception(err)
        else:
            self.fsyncs += 1
            elapsed = time.perf_counter() - t0
            self.fsync_seconds += elapsed
            for observe in self.on_fsync:
                observe(elapsed)
            self._round_done.append((part, fut, target))
        if self._inflight:
            return
        finished, self._round_done = self._round_done, []
        for p, _f, tg in finished:
            p.mark_flushed(tg)  # tells the partition's visibility hook (parked gets, commits)
        for p, f, tg in finished:
            if not f.done():
                f.set_result(tg)
            for cb in self.on_flushed:
                cb(p)
        if self._next:
            self._kick()

    def tick(self, partitions: list[Partition]) -> None:
        """Force partitions whose oldest unflushed write is older than their interval."""
        now = time.monotonic()
        for part in partitions:
            if part.memory or part.closed or part.failed or part.flush_inflight is not None:
                continue
            if part.end <= part.flushed_end:
                part.last_flush = now
                continue
            interval = self._interval_ms_of(part) / 1000.0
            if interval > 0 and now - part.last_flush >= interval:
                fut = self.request(part)
                fut.add_done_callback(_consume_exception)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _consume_exception(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()
