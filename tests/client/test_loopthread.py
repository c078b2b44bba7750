"""LoopThread.post and ThreadFuture: how send_future() hands a message to the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from notify.client._loopthread import LoopThread, ThreadFuture
from notify.errors import ClientError


def test_post_runs_fifo_with_call_and_reports_into_its_future() -> None:
    lt = LoopThread(use_uvloop=False)
    try:
        order: list[str] = []
        out1: ThreadFuture[int] = ThreadFuture()

        def first() -> None:
            assert threading.current_thread() is not threading.main_thread()
            order.append("post")
            out1.set_result(1)

        def second() -> asyncio.Future[int]:
            order.append("call")
            f: asyncio.Future[int] = lt.loop.create_future()
            f.set_result(2)
            return f

        lt.post(first, out1)
        f2 = lt.call(second)
        assert out1.result(5) == 1 and f2.result(5) == 2
        assert order == ["post", "call"]

        out2: ThreadFuture[int] = ThreadFuture()

        def boom() -> None:
            raise ValueError("bad message")

        lt.post(boom, out2)  # an exception of fn goes into the future
        with pytest.raises(ValueError, match="bad message"):
            out2.result(5)
    finally:
        lt.stop()
    with pytest.raises(ClientError, match="closed"):
        lt.post(lambda: None, ThreadFuture())


def test_thread_future_drops_a_result_after_cancel() -> None:
    f: ThreadFuture[int] = ThreadFuture()
    assert f.cancel()
    f.set_result(1)  # the caller gave up: no InvalidStateError in the loop
    f.set_exception(ValueError())
    assert f.cancelled()
    plain: concurrent.futures.Future[int] = concurrent.futures.Future()
    plain.cancel()
    with pytest.raises(concurrent.futures.InvalidStateError):
        plain.set_result(1)  # what ThreadFuture guards against
