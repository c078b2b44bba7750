"""A simulated clock: time moves only when the simulation says so.

Implements the core's ``Clock`` port (``monotonic()``, ``time()``). The monotonic and the
wall clock start at the given values and advance together with :meth:`SimClock.advance`; the
wall clock alone can be stepped (:meth:`SimClock.step_wall`, like an NTP correction) to check
that nothing measures durations with it.
"""

from __future__ import annotations

__all__ = ["SimClock"]

#: 2023-11-14T22:13:20Z: a fixed, realistic wall-clock start
DEFAULT_WALL_START = 1_700_000_000.0


class SimClock:
    """Deterministic time for the simulation."""

    __slots__ = ("_mono", "_wall")

    def __init__(self, wall: float = DEFAULT_WALL_START, monotonic: float = 0.0) -> None:
        self._mono = monotonic
        self._wall = wall

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        return self._mono

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch."""
        return self._wall

    def time_ns(self) -> int:
        """Wall-clock nanoseconds since the Unix epoch."""
        return round(self._wall * 1e9)

    def monotonic_ns(self) -> int:
        """Monotonic nanoseconds."""
        return round(self._mono * 1e9)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` (>= 0) pass on both clocks."""
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self._mono += seconds
        self._wall += seconds

    def advance_to(self, monotonic: float) -> None:
        """Advance until ``monotonic()`` is ``monotonic`` (no-op when already past it)."""
        if monotonic > self._mono:
            self.advance(monotonic - self._mono)

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone, either way (an NTP correction); monotonic is unchanged."""
        self._wall += seconds

    def __repr__(self) -> str:
        return f"SimClock(monotonic={self._mono!r}, wall={self._wall!r})"
