"""Real adapters for the core's ports (:mod:`notify.core.ports`): the system clock and the
asyncio event loop as a scheduler. The simulation (:mod:`notify.sim`) has its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class SystemClock:
    """``time.monotonic`` and ``time.time``."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()


class AsyncioScheduler:
    """Deferred calls on an asyncio loop."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> asyncio.Handle:
        return self.loop.call_soon(callback, *args)

    def call_later(
        self, delay: float, callback: Callable[..., Any], *args: Any
    ) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback, *args)
