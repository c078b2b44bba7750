"""Deterministic storage simulation: the real MessageStore and TxLog on the simulated disk,
crashed at random points (with torn writes and partial writeback) and recovered through the
real recovery code; see notify.sim.storage for the invariants checked.

``pytest tests/sim/test_storage_sim.py --sim-seed=N`` replays one seed;
``--sim-seeds=N --sim-first=M`` runs another range.
"""

from __future__ import annotations

import time

import pytest

from notify.sim.storage import run_many, run_seed


def test_storage_simulation(request: pytest.FixtureRequest) -> None:
    one = request.config.getoption("--sim-seed")
    first = request.config.getoption("--sim-first")
    count = request.config.getoption("--sim-seeds")
    seeds = [one] if one is not None else range(first, first + count)
    t0 = time.process_time()
    stats, failures = run_many(seeds, max_failures=5)
    cpu = time.process_time() - t0
    assert not failures, "\n".join(str(f) for f in failures)
    # the run must have exercised what it claims to check
    assert stats.seeds == len(seeds)
    if one is None and count >= 200:
        assert stats.crashes > count and stats.torn > count // 10
        assert stats.crash_points > count // 2 and stats.recovered_truncations > count // 10
        assert stats.rollbacks and stats.checkpoints and stats.enospc and stats.eio
    print(f"{len(seeds)} seeds, {cpu:.1f}s CPU: {stats}")


def test_a_seed_replays_identically() -> None:
    assert run_seed(1234) == run_seed(1234)
    assert run_seed(1234) != run_seed(1235)
