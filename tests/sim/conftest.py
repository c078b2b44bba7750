"""Options of the simulation tests: replay one seed, or change how many seeds run."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simulation")
    group.addoption("--sim-seed", type=int, default=None, help="run only this simulation seed")
    group.addoption(
        "--sim-seeds", type=int, default=2000, help="simulation seeds to run (default 2000)"
    )
    group.addoption("--sim-first", type=int, default=0, help="first simulation seed (default 0)")
