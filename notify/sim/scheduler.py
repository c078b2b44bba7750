"""A seeded, deterministic scheduler: the simulation's event loop.

Implements the core's ``Scheduler`` port: :meth:`SimScheduler.call_soon` and
:meth:`SimScheduler.call_later` return a :class:`SimHandle` whose ``cancel()`` works as
asyncio's. Nothing runs by itself: the simulation calls :meth:`SimScheduler.run_until_idle`
(run every ready callback, including the ones they schedule with ``call_soon``) and
:meth:`SimScheduler.advance` (move the :class:`~notify.sim.clock.SimClock` forward, running
timers in due order at their due time).

Interleaving: with ``shuffle=True`` the next callback is picked at random (from the seeded
``rng``) among the ready ones instead of first-in first-out, so a seed explores one of the
orders a real loop could produce when several things become ready together (completions of
concurrent fsyncs, replies from several peers). Timers due at the same instant become ready
together. An exception escaping a callback propagates out of the ``run`` call (a simulation
must fail loudly, not log and go on like asyncio).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

from notify.sim.clock import SimClock

__all__ = ["SimHandle", "SimScheduler", "SimulationStuck"]


class SimulationStuck(RuntimeError):
    """:meth:`SimScheduler.run_until_idle` ran more callbacks than its limit (a livelock)."""


class SimHandle:
    """A scheduled callback; :meth:`cancel` keeps it from running."""

    __slots__ = ("_cancelled", "args", "callback", "when")

    def __init__(self, when: float | None, callback: Callable[..., Any], args: tuple[Any, ...]):
        self.when = when
        self.callback = callback
        self.args = args
        self._cancelled = False

    def cancel(self) -> None:
        """Do not run the callback (no-op once it ran)."""
        self._cancelled = True

    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled

    def __repr__(self) -> str:
        state = " cancelled" if self._cancelled else ""
        name = getattr(self.callback, "__qualname__", self.callback)
        return f"<SimHandle {name} at {self.when}{state}>"


class SimScheduler:
    """Deterministic callbacks and timers on a :class:`SimClock`."""

    def __init__(
        self, clock: SimClock, rng: random.Random | None = None, shuffle: bool = False
    ) -> None:
        if shuffle and rng is None:
            raise ValueError("shuffle=True needs an rng")
        self.clock = clock
        self.rng = rng
        self.shuffle = shuffle
        self._ready: list[SimHandle] = []
        self._head = 0  # FIFO: index of the next ready callback in _ready
        self._timers: list[tuple[float, int, SimHandle]] = []
        self._seq = 0
        #: callbacks run so far
        self.steps = 0

    # ------------------------------------------------------------------ the port

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> SimHandle:
        """Run ``callback(*args)`` at the next opportunity (after those already ready)."""
        h = SimHandle(None, callback, args)
        self._ready.append(h)
        return h

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> SimHandle:
        """Run ``callback(*args)`` once ``delay`` seconds of simulated time have passed."""
        return self.call_at(self.clock.monotonic() + max(0.0, delay), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> SimHandle:
        """Run ``callback(*args)`` when the monotonic clock reaches ``when``."""
        h = SimHandle(when, callback, args)
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, h))
        return h

    def time(self) -> float:
        """The scheduler's notion of now (the clock's monotonic time), as asyncio's."""
        return self.clock.monotonic()

    # ------------------------------------------------------------------ running

    @property
    def ready(self) -> int:
        """Callbacks ready to run (cancelled ones included until they are skipped)."""
        return len(self._ready) - self._head

    def next_deadline(self) -> float | None:
        """When the earliest live timer is due, or None."""
        timers = self._timers
        while timers and timers[0][2].cancelled():
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def _pop_ready(self) -> SimHandle | None:
        ready = self._ready
        n = len(ready) - self._head
        if n <= 0:
            return None
        if self.shuffle and n > 1:
            assert self.rng is not None
            i = self._head + self.rng.randrange(n)
            ready[i], ready[self._head] = ready[self._head], ready[i]
        h = ready[self._head]
        self._head += 1
        if self._head > 1024 and self._head * 2 > len(ready):
            del ready[: self._head]
            self._head = 0
        return h

    def step(self) -> bool:
        """Run one ready callback; False when none is ready."""
        while True:
            h = self._pop_ready()
            if h is None:
                return False
            if not h.cancelled():
                break
        self.steps += 1
        h.callback(*h.args)
        return True

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Run ready callbacks until none is left (timers not yet due wait); their count."""
        n = 0
        while self.step():
            n += 1
            if n >= max_steps:
                raise SimulationStuck(f"{n} callbacks without becoming idle")
        return n

    def _release_due(self) -> None:
        now = self.clock.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            h = heapq.heappop(timers)[2]
            if not h.cancelled():
                self._ready.append(h)

    def advance(self, seconds: float, max_steps: int = 1_000_000) -> int:
        """Let ``seconds`` of simulated time pass, running every timer that falls due at its
        due time (and what it schedules); returns the callbacks run."""
        target = self.clock.monotonic() + seconds
        n = self.run_until_idle(max_steps)
        while True:
            due = self.next_deadline()
            if due is None or due > target:
                break
            self.clock.advance_to(due)
            self._release_due()
            n += self.run_until_idle(max_steps)
        self.clock.advance_to(target)
        self._release_due()
        return n + self.run_until_idle(max_steps)

    def run_until_timers_done(self, limit_s: float = 3600.0, max_steps: int = 1_000_000) -> int:
        """Run ready callbacks and jump the clock from timer to timer until nothing is
        scheduled, or ``limit_s`` of simulated time passed (periodic timers never end)."""
        end = self.clock.monotonic() + limit_s
        n = self.run_until_idle(max_steps)
        while (due := self.next_deadline()) is not None and due <= end:
            n += self.advance(due - self.clock.monotonic(), max_steps)
        return n
