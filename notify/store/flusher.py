"""When partitions are forced to disk, and who waits for it (MetaQ's flush policy).

* ``unflushThreshold = 0``: group commit. Every append returns a future that completes when
  an fdatasync covering it has finished; replies wait for it. While one fsync runs, later
  appends queue behind a single follow-up fsync, so N concurrent producers share fsyncs.
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
        threads: int = 4,
    ):
        self._loop = loop
        self._threshold_of = threshold_of
        self._interval_ms_of = interval_ms_of
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="notify-fsync")
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        self.on_flushed: list[Callable[[Partition], None]] = []

    def after_append(self, part: Partition, count: int) -> asyncio.Future[int] | None:
        """Call right after appending ``count`` records; await the result before replying."""
        threshold = self._threshold_of(part)
        if threshold == 0:
            return self.request(part)
        part.unflushed += count
        if part.unflushed >= threshold:
            return self.request(part)
        return None

    def request(self, part: Partition) -> asyncio.Future[int]:
        """A future for an fsync that starts after everything appended so far."""
        inflight = part.flush_inflight
        if inflight is None:
            fut: asyncio.Future[int] = self._loop.create_future()
            part.flush_inflight = fut
            self._start(part, fut)
            return fut
        nxt = part.flush_next
        if nxt is None:
            nxt = self._loop.create_future()
            part.flush_next = nxt
        assert isinstance(nxt, asyncio.Future)
        return nxt

    def _start(self, part: Partition, fut: asyncio.Future[int]) -> None:
        target = part.end
        seg = part.active
        part.unflushed = 0
        t0 = time.perf_counter()

        def sync() -> float:
            seg.sync()
            return time.perf_counter() - t0

        cf: CFuture[float] = self._pool.submit(sync)
        cf.add_done_callback(
            lambda f: self._loop.call_soon_threadsafe(self._done, part, fut, target, f)
        )

    def _done(
        self, part: Partition, fut: asyncio.Future[int], target: int, cf: CFuture[float]
    ) -> None:
        part.flush_inflight = None
        part.last_flush = time.monotonic()
        exc = cf.exception()
        if exc is not None:
            # After a failed fsync the page cache may have dropped the dirty pages: what is
            # in the file is unknown. Stop accepting writes rather than acknowledge on top.
            part.failed = (
                f"{part.topic}-{part.index} is read-only after an fsync failure ({exc}); "
                "restart the broker to recover the partition"
            )
            log.error("%s", part.failed)
            err = StoreError(part.failed)
            if not fut.done():
                fut.set_exception(err)
            nxt = part.flush_next
            part.flush_next = None
            if isinstance(nxt, asyncio.Future) and not nxt.done():
                nxt.set_exception(err)
            return
        self.fsyncs += 1
        self.fsync_seconds += cf.result()
        if target > part.flushed_end:
            part.flushed_end = target
        if target > part.visible_end:
            part.visible_end = target
        if not fut.done():
            fut.set_result(target)
        for cb in self.on_flushed:
            cb(part)
        nxt = part.flush_next
        if isinstance(nxt, asyncio.Future):
            part.flush_next = None
            part.flush_inflight = nxt
            self._start(part, nxt)

    def tick(self, partitions: list[Partition]) -> None:
        """Force partitions whose oldest unflushed write is older than their interval."""
        now = time.monotonic()
        for part in partitions:
            if part.closed or part.failed or part.flush_inflight is not None:
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
