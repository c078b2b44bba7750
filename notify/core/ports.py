"""What the core needs from the world, as typing Protocols (no implementations here).

The broker passes real adapters (:mod:`notify.runtime`: the system clock, the asyncio loop);
the deterministic simulation (:mod:`notify.sim`) passes simulated ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Clock(Protocol):
    """Time as the core sees it."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, intervals)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch (persisted timestamps)."""
        ...


class Handle(Protocol):
    """A scheduled call that can be cancelled."""

    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Deferred calls on the core's single thread."""

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Handle: ...

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Handle: ...
