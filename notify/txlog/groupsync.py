"""Group commit: many threads and asyncio tasks waiting for durability share writes and fsyncs.

Threads use leader/follower. A caller that needs durability (:meth:`FlushCoordinator.wait`
for a record already appended, :meth:`FlushCoordinator.commit` for a frame not yet written)
queues itself as a follower while a leader is active; otherwise it becomes the leader. The
leader takes every queued frame, has them written with one write syscall and then fsynced
once (the flush callback), which makes the whole log up to that point durable. It then wakes
exactly the followers it covered (each sleeps on its own lock, so waking them does not make
them fight over a shared one) and hands leadership to the oldest follower left, if any.

Under steady load this pipelines: while one leader's fsync runs (without the GIL), the
committers it will not cover run their Python code and queue up for the next flush.

Asyncio tasks never block their loop: per event loop there is at most one flush in flight
in a small executor (that flush is itself a thread caller of the leader/follower scheme, so it
shares fsyncs with plain threads) and at most one queued behind it. Tasks arriving while a
flush is in flight join the queued one, which is submitted when the in-flight one ends; its
snapshot is taken after every joiner appended, so one fsync covers them all.

Failures: if the write fails, nothing of the batch was appended and every committer in it gets
the error. If the fsync fails, the leader and every follower the flush was meant to cover get
the error; the kernel may have dropped the dirty pages, so those records must be treated as
having an unknown outcome.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from notify.errors import TxLogError
from notify.txlog.position import Position

__all__ = ["FlushCoordinator", "FlushFailed", "covered"]


class FlushFailed(Exception):
    """Raised by a flush callback whose fsync failed after the batch was written at ``start``."""

    def __init__(self, start: Position, end: Position, cause: BaseException) -> None:
        super().__init__(f"fsync up to {end} failed: {cause}")
        self.start = start
        self.end = end
        self.cause = cause


#: ``flush(frames) -> (start, end)``: write ``frames`` back to back with one syscall (none when
#: empty) at ``start``, then fsync everything before ``end``. Raises :class:`FlushFailed` if the
#: fsync fails; any other exception means nothing of ``frames`` was written.
FlushFn = Callable[[list[bytes]], tuple[Position, Position]]


def covered(durable: Position, pos: Position, need: Position) -> bool:
    """True when a durable prefix ending at ``durable`` covers the record at ``pos``.

    ``need`` is the log's end when the caller asked (the record's end is <= it); when ``pos``
    is itself an end boundary, ``pos == need`` and reaching it is enough.
    """
    return durable > pos or durable >= need


@dataclass
class _LoopState:
    inflight: asyncio.Future[None] | None = None
    queued: asyncio.Future[None] | None = None
    queued_need: Position = field(default_factory=lambda: Position(-1, -1))


_WAITING, _DONE, _FAILED, _LEAD = range(4)


class _Waiter:
    """A thread waiting for durability; it sleeps on ``lock`` until a leader releases it.

    A committer has a ``frame`` and no position until a leader wrote it; a syncer has a
    position (and ``need``, the log's end when it asked) and no frame.
    """

    __slots__ = ("cause", "frame", "lock", "message", "need", "pos", "state")

    def __init__(self, pos: Position | None, need: Position | None, frame: bytes | None) -> None:
        self.pos = pos
        self.need = need
        self.frame = frame
        self.state = _WAITING
        self.message = ""
        self.cause: BaseException | None = None
        self.lock: threading.Lock | None = None  # allocated (held) when it has to wait

    def sleep(self) -> None:
        """Block until :meth:`wake`; call :meth:`prepare` under the coordinator lock first."""
        assert self.lock is not None
        self.lock.acquire()

    def prepare(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()

    def pending(self) -> bool:
        return self.pos is None

    def is_covered(self, durable: Position) -> bool:
        return (
            self.pos is not None and self.need is not None and covered(durable, self.pos, self.need)
        )

    def wake(self, state: int, message: str = "", cause: BaseException | None = None) -> None:
        self.state, self.message, self.cause = state, message, cause
        assert self.lock is not None
        self.lock.release()


class FlushCoordinator:
    """Shares writes and fsyncs among concurrent committers (threads and asyncio tasks).

    ``flush`` is a :data:`FlushFn`; ``end()`` returns the current end of the log and
    ``durable`` is what is already known to be on stable storage.
    """

    def __init__(
        self,
        flush: FlushFn,
        end: Callable[[], Position],
        durable: Position,
        *,
        async_workers: int = 2,
    ) -> None:
        self._flush = flush
        self._end = end
        self._lock = threading.Lock()
        self._durable = durable
        self._leader = False  # a leader is active (flushing, or just handed over)
        self._waiters: list[_Waiter] = []
        self._loops: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._workers = async_workers
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._shut = False
        self.flushes = 0  # completed flushes (statistics)

    @property
    def durable(self) -> Position:
        """End of the prefix of the log known to be on stable storage."""
        return self._durable

    def advance(self, durable: Position) -> None:
        """Record that everything before ``durable`` was made durable by other means."""
        with self._lock:
            if durable > self._durable:
                self._durable = durable
                self._release(None, "", None)

    def target(self, pos: Position | None) -> tuple[Position, Position]:
        """``(pos, need)`` for a wait on ``pos`` (``None``: everything appended so far)."""
        end = self._end()
        if pos is None:
            return end, end
        if pos > end:
            raise TxLogError(f"position {pos} is beyond the end of the log {end}")
        return pos, end

    def wait(self, pos: Position | None = None) -> None:
        """Block until the record at ``pos`` (default: everything so far) is durable."""
        pos, need = self.target(pos)
        if covered(self._durable, pos, need):
            return
        self._join(_Waiter(pos, need, None))

    def commit(self, frame: bytes) -> Position:
        """Have ``frame`` written (batched with other committers) and fsynced; its position."""
        me = _Waiter(None, None, frame)
        self._join(me)
        assert me.pos is not None
        return me.pos

    def _join(self, me: _Waiter) -> None:
        with self._lock:
            if me.is_covered(self._durable):
                return
            follower = self._leader
            if follower:
                me.prepare()
                self._waiters.append(me)
            else:
                self._leader = True
        if follower:
            me.sleep()  # until a leader wakes us: see _release and _hand_over
            if me.state == _DONE:
                return
            if me.state == _FAILED:
                raise TxLogError(me.message) from me.cause
            # _LEAD: the previous leader handed over to us
        self._lead(me)

    def _lead(self, me: _Waiter) -> None:
        with self._lock:
            batch = [w for w in self._waiters if w.pending()]
            if batch:
                self._waiters = [w for w in self._waiters if not w.pending()]
            if me.pending():
                batch.insert(0, me)
            elif not batch and me.is_covered(self._durable):
                self._hand_over()  # made durable meanwhile (e.g. by a segment roll)
                return
        while True:
            try:
                start, end = self._flush([w.frame for w in batch if w.frame is not None])
                break
            except FlushFailed as exc:
                _place(batch, exc.start)
                message = f"fsync failed: {exc.cause}"
                with self._lock:
                    for w in batch:
                        if w is not me:
                            w.wake(_FAILED, message, exc.cause)
                    self._release(exc.end, message, exc.cause)
                    self._hand_over()
                raise TxLogError(message) from exc.cause
            except BaseException as exc:
                with self._lock:
                    for w in batch:  # nothing of the batch was written
                        if w is not me:
                            w.wake(_FAILED, str(exc), exc.__cause__ or exc)
                    if me.pending() or not batch:
                        self._hand_over()  # the next leader meets the same error, if it persists
                        raise
                # a syncer whose record is already written: the others' write failed, retry
                # with the fsync alone
                batch = []
        _place(batch, start)
        with self._lock:
            self.flushes += 1
            if end > self._durable:
                self._durable = end
            for w in batch:
                if w is not me:
                    w.wake(_DONE)
            self._release(None, "", None)
            self._hand_over()

    def _release(
        self, failed_end: Position | None, message: str, cause: BaseException | None
    ) -> None:
        """Wake the syncers now covered, or covered by a failed flush. ``_lock`` held."""
        keep = []
        for w in self._waiters:
            if w.is_covered(self._durable):
                w.wake(_DONE)
            elif failed_end is not None and w.is_covered(failed_end):
                w.wake(_FAILED, message, cause)
            else:
                keep.append(w)
        self._waiters = keep

    def _hand_over(self) -> None:
        """End of a leader's turn: the oldest waiting follower leads next. ``_lock`` held."""
        if self._waiters:
            self._waiters.pop(0).wake(_LEAD)
        else:
            self._leader = False

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._shut:
                raise TxLogError("the transaction log is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix="txlog-fsync"
                )
            return self._executor

    def shutdown(self) -> None:
        """Wait for in-flight asyncio flushes and stop the executor; idempotent."""
        with self._executor_lock:
            self._shut = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    async def wait_async(self, pos: Position | None = None) -> None:
        """Like :meth:`wait` without blocking the running event loop."""
        loop = asyncio.get_running_loop()
        pos, need = self.target(pos)
        while not covered(self._durable, pos, need):
            state = self._loops.get(loop)
            if state is None:
                state = self._loops[loop] = _LoopState()
            if state.inflight is None:
                fut = self._submit(loop, state)
            else:
                if state.queued is None:
                    state.queued = loop.create_future()
                if need > state.queued_need:
                    state.queued_need = need
                fut = state.queued
            await asyncio.shield(fut)

    def _submit(self, loop: asyncio.AbstractEventLoop, state: _LoopState) -> asyncio.Future[None]:
        try:
            fut = loop.run_in_executor(self._get_executor(), self.wait)
        except RuntimeError as exc:  # executor shut down concurrently: the log was closed
            raise TxLogError(f"the transaction log is closed: {exc}") from exc
        state.inflight = fut
        fut.add_done_callback(lambda f: self._on_done(loop, state, f))
        return fut

    def _on_done(
        self, loop: asyncio.AbstractEventLoop, state: _LoopState, done: asyncio.Future[None]
    ) -> None:
        if not done.cancelled():
            done.exception()  # mark retrieved; the awaiters got it through shield()
        state.inflight = None
        queued, state.queued = state.queued, None
        need, state.queued_need = state.queued_need, Position(-1, -1)
        if queued is not None and not queued.done():
            if self._durable >= need:
                queued.set_result(None)
            else:
                try:
                    nxt = self._submit(loop, state)
                except TxLogError as exc:
                    queued.set_exception(exc)
                    self._loops.pop(loop, None)
                    return
                nxt.add_done_callback(lambda f: _chain(f, queued))
        if state.inflight is None and state.queued is None:
            self._loops.pop(loop, None)


def _place(batch: list[_Waiter], start: Position) -> None:
    """Give the committers of a batch written at ``start`` their positions."""
    file_no, offset = start
    for w in batch:
        if w.frame is not None:
            w.pos = Position(file_no, offset)
            offset += len(w.frame)
            w.frame = None
    end = Position(file_no, offset)
    for w in batch:
        w.need = end


def _chain(src: asyncio.Future[None], dst: asyncio.Future[None]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(None)
