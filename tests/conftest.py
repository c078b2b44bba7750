"""Shared fixtures: real broker processes on loopback.

``broker`` is a fresh broker (topics test:4, orders:2, single:1) per test; ``broker_factory``
builds one with other topics or ``[system]`` keys. Both are real child processes, stopped
(or already killed by the test) at teardown.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from notify.testing import BrokerProcess

pytest_plugins = ["tests.services_conftest"]

IN_CI = bool(os.environ.get("CI"))

BrokerFactory = Callable[..., BrokerProcess]

#: Files that take 20 s or more (a full run's ``--durations``), longest first: collected
#: first, so the xdist workers (``--dist loadfile`` hands out files in collection order,
#: see :func:`pytest_xdist_make_scheduler`) start on them and end together instead of one
#: finishing a long file alone.
SLOW_FIRST: tuple[str, ...] = (
    "tests/audit/test_cluster.py",
    "tests/audit/test_incremental.py",
    "tests/sim/test_core_sim.py",
    "tests/audit/test_audit.py",
    "tests/cluster/test_e2e.py",
    "tests/security/test_wire_resources.py",
    "tests/faults/test_kill9.py",
    "tests/outbox/test_crash.py",
    "tests/coordinator/test_random.py",
    "tests/sim/test_storage_sim.py",
    "tests/offsets/test_exactly_once.py",
    "tests/audit/test_reuse.py",
)
#: Files one worker runs together, one after the other, as one unit: the audit tests that
#: use the local Spark session share it (a JVM: seconds to start, and its first audits run
#: cold) and the broker logs they audit, made once per worker. (The cluster test runs its
#: audit in processes of its own: it goes to the other worker meanwhile.)
ONE_WORKER: dict[str, str] = {
    f"tests/audit/{name}.py": "tests/audit (local Spark)"
    for name in ("test_audit", "test_incremental", "test_reuse", "test_stages")
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::", 1)[0], len(SLOW_FIRST)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the files of each :data:`ONE_WORKER` unit together, and the
    units handed out in collection order (xdist sorts them by test count by default,
    which put the longest files last)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ONE_WORKER.get(path, path)

    config.option.loadscopereorder = False
    return Scheduling(config, log)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    started: list[BrokerProcess] = []

    def make(
        topics: dict[str, Any] | None = None, name: str = "broker", **system: Any
    ) -> BrokerProcess:
        b = BrokerProcess(tmp_path / f"{name}{len(started)}", topics=topics, system=system)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory()
