"""A background event loop thread: how the synchronous API runs the asyncio core."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from notify.errors import ClientError

T = TypeVar("T")

#: A blocking call made on the loop thread itself (it would wait for itself forever).
_INLINE_MESSAGE = (
    "blocking client call from the client's own event loop thread "
    "(a listener running inline?): use the asyncio API there"
)


class ThreadFuture(concurrent.futures.Future[T]):
    """A thread-safe future the loop resolves directly (no asyncio future chained to it).

    A result or exception arriving after the caller cancelled it is dropped (a plain
    ``concurrent.futures.Future`` would raise ``InvalidStateError`` in the loop)."""

    def set_result(self, result: T) -> None:
        try:  # noqa: SIM105 - per message: no context manager
            super().set_result(result)
        except concurrent.futures.InvalidStateError:
            pass

    def set_exception(self, exception: BaseException | None) -> None:
        try:  # noqa: SIM105 - per message: no context manager
            super().set_exception(exception)
        except concurrent.futures.InvalidStateError:
            pass


def new_event_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    """A fresh event loop, uvloop's when asked for and installed."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def _chain_result(out: concurrent.futures.Future[T], f: asyncio.Future[T]) -> None:
    if out.done():  # cancelled by the caller (a timeout)
        return
    if f.cancelled():
        out.cancel()
    elif (exc := f.exception()) is not None:
        out.set_exception(exc)
    else:
        out.set_result(f.result())


class LoopThread:
    """Runs an event loop forever in a daemon thread until :meth:`stop`."""

    def __init__(self, use_uvloop: bool = True, name: str = "notify-client"):
        self.loop = new_event_loop(use_uvloop)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        self._calls: collections.deque[
            tuple[Callable[[], Any], concurrent.futures.Future[Any], bool]
        ] = collections.deque()
        self._wake_pending = False
        self._calls_lock = threading.Lock()
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; a thread-safe future of its result."""
        if self.loop.is_closed():
            coro.close()
            raise ClientError("session is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (not from the loop thread)."""
        if self.in_loop_thread:
            coro.close()
            raise ClientError(_INLINE_MESSAGE)
        return _wait(self.submit(coro), timeout_s)

    def run_call(self, fn: Callable[[], asyncio.Future[T]], timeout_s: float | None = None) -> T:
        """:meth:`call` and wait for the result (not from the loop thread); on timeout the
        future ``fn`` returned is cancelled."""
        if self.in_loop_thread:
            raise ClientError(_INLINE_MESSAGE)
        return _wait(self.call(fn), timeout_s)

    def call(self, fn: Callable[[], asyncio.Future[T]]) -> concurrent.futures.Future[T]:
        """Call ``fn`` on the loop (FIFO with other calls) and chain the future it returns.

        Calls from other threads go through one queue: a burst of calls costs one wake-up
        of the loop (one ``call_soon_threadsafe``), not one each. Every call queued before
        a later ``submit``/``run`` still runs before it."""
        out: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue(fn, out, True)
        return out

    def post(self, fn: Callable[[], None], out: concurrent.futures.Future[Any]) -> None:
        """Call ``fn`` on the loop, FIFO with :meth:`call` (same queue, same wake-up);
        ``fn`` resolves ``out`` itself (no asyncio future chained). An exception ``fn``
        raises goes into ``out``; so does "session is closed" if the loop stops first."""
        self._queue(fn, out, False)

    def _queue(
        self, fn: Callable[[], Any], out: concurrent.futures.Future[Any], chain: bool
    ) -> None:
        if self.loop.is_closed():
            raise ClientError("session is closed")
        # Under the lock: a thread that sees a wake-up pending knows it is already scheduled,
        # so its later submit()/run() goes behind it (FIFO per thread).
        with self._calls_lock:
            self._calls.append((fn, out, chain))
            if not self._wake_pending:
                try:
                    self.loop.call_soon_threadsafe(self._run_calls)
                except RuntimeError:  # closed meanwhile
                    self._calls.pop()
                    raise ClientError("session is closed") from None
                self._wake_pending = True

    def _run_calls(self) -> None:
        # Clear the flag first: a call queued after the last popleft below then wakes us
        # again, one queued before it is run here.
        with self._calls_lock:
            self._wake_pending = False
        calls = self._calls
        while calls:
            fn, out, chain = calls.popleft()
            if not chain:  # post(): fn resolves out
                try:
                    fn()
                except BaseException as e:
                    if not out.done():
                        out.set_exception(e)
                continue
            try:
                inner = fn()
            except BaseException as e:
                out.set_exception(e)
                continue
            inner.add_done_callback(functools.partial(_chain_result, out))
            out.add_done_callback(functools.partial(self._cancel_inner, inner))

    def _cancel_inner(
        self, inner: asyncio.Future[Any], out: concurrent.futures.Future[Any]
    ) -> None:
        """The caller cancelled the thread-safe future: cancel the loop's one too."""
        if out.cancelled() and not inner.done() and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(inner.cancel)

    def stop(self) -> None:
        """Cancel what still runs, stop the loop, join the thread and close the loop."""
        if self.loop.is_closed():
            return
        if self.in_loop_thread:
            raise ClientError("cannot stop the client loop from its own thread")

        async def _shutdown() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(_shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        while self._calls:  # queued after the loop stopped: never ran
            _fn, out, _chain = self._calls.popleft()
            if not out.done():
                out.set_exception(ClientError("session is closed"))


#: The longest a blocked caller sleeps at once. A signal the kernel hands to another thread
#: (the loop's, an executor's) does not interrupt a sleep of the main thread: Ctrl-C and a
#: SIGTERM handler take effect when it wakes, so it wakes at least this often.
_WAKE_S: Final = 0.25


def _wait(fut: concurrent.futures.Future[T], timeout_s: float | None) -> T:
    """``fut``'s result; cancelled when ``timeout_s`` passes first (then TimeoutError).

    Waits in slices of :data:`_WAKE_S` so that signal handlers (KeyboardInterrupt) run in
    the waiting main thread whichever thread received the signal."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = _WAKE_S if deadline is None else min(_WAKE_S, deadline - time.monotonic())
        try:
            return fut.result(max(left, 0.0))
        except concurrent.futures.TimeoutError:
            if fut.done():  # finished meanwhile, or raised a TimeoutError of its own
                return fut.result()
            if deadline is not None and time.monotonic() >= deadline:
                fut.cancel()
                raise
