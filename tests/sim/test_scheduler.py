"""The simulated clock and the seeded scheduler (notify.sim.clock, notify.sim.scheduler)."""

from __future__ import annotations

import random

import pytest

from notify.sim.clock import SimClock
from notify.sim.scheduler import SimScheduler, SimulationStuck


def test_clock_moves_only_when_advanced() -> None:
    c = SimClock(wall=1000.0, monotonic=5.0)
    assert (c.monotonic(), c.time()) == (5.0, 1000.0)
    c.advance(2.5)
    assert (c.monotonic(), c.time(), c.time_ns()) == (7.5, 1002.5, 1002_500_000_000)
    c.step_wall(-100.0)  # an NTP step: durations measured on monotonic are unaffected
    assert (c.monotonic(), c.time()) == (7.5, 902.5)
    with pytest.raises(ValueError):
        c.advance(-1)


def test_call_soon_fifo_and_nested() -> None:
    s = SimScheduler(SimClock())
    out: list[str] = []
    s.call_soon(out.append, "a")
    s.call_soon(lambda: (out.append("b"), s.call_soon(out.append, "d")))
    s.call_soon(out.append, "c")
    assert s.run_until_idle() == 4
    assert out == ["a", "b", "c", "d"]


def test_timers_run_in_due_order_at_their_time_and_cancel_works() -> None:
    clock = SimClock()
    s = SimScheduler(clock)
    seen: list[tuple[str, float]] = []

    def note(tag: str) -> None:
        seen.append((tag, clock.monotonic()))

    s.call_later(3.0, note, "c")
    s.call_later(1.0, note, "a")
    h = s.call_later(2.0, note, "cancelled")
    s.call_later(2.0, lambda: s.call_later(0.5, note, "b"))  # scheduled by a timer
    h.cancel()
    assert s.advance(0.5) == 0 and seen == []
    s.advance(10.0)
    assert seen == [("a", 1.0), ("b", 2.5), ("c", 3.0)]
    assert clock.monotonic() == 10.5
    assert s.next_deadline() is None


def test_shuffle_explores_orders_deterministically() -> None:
    def order(seed: int) -> tuple[int, ...]:
        s = SimScheduler(SimClock(), random.Random(seed), shuffle=True)
        out: list[int] = []
        for i in range(6):
            s.call_soon(out.append, i)
        s.run_until_idle()
        return tuple(out)

    assert order(3) == order(3)
    orders = {order(seed) for seed in range(30)}
    assert len(orders) > 10
    assert all(sorted(o) == list(range(6)) for o in orders)


def test_livelock_is_reported() -> None:
    s = SimScheduler(SimClock())

    def again() -> None:
        s.call_soon(again)

    s.call_soon(again)
    with pytest.raises(SimulationStuck):
        s.run_until_idle(max_steps=100)


def test_exceptions_propagate() -> None:
    s = SimScheduler(SimClock())
    s.call_soon(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        s.run_until_idle()


def test_run_until_timers_done_stops_at_the_limit_for_periodic_timers() -> None:
    clock = SimClock()
    s = SimScheduler(clock)
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(clock.monotonic())
        s.call_later(1.0, tick)

    s.call_later(1.0, tick)
    s.run_until_timers_done(limit_s=5.0)
    assert ticks == [1.0, 2.0, 3.0, 4.0, 5.0]
