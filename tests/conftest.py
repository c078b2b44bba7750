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
