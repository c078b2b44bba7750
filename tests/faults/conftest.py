"""Fault-injection suite: kill -9 under load, a full disk, wire fuzzing, resource floods.

Everything runs against real broker processes on 127.0.0.1. ``NOTIFY_FAULTS_LONG=1`` runs
the bigger version; ``NOTIFY_FAULTS_SEED`` replays a randomized run. The figures go to
tests/artifacts/faults-summary.json at the end of the session.
"""

from __future__ import annotations

import os
import random
import resource
from collections.abc import Iterator

import pytest

from tests.faults import summary


@pytest.fixture(scope="session", autouse=True)
def _faults_summary() -> Iterator[None]:
    yield
    summary.write()


@pytest.fixture(scope="session")
def fault_seed() -> int:
    """The seed of this run's random choices (recorded in the summary and in failures)."""
    env = os.environ.get("NOTIFY_FAULTS_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(1 << 32)
    summary.record("run", seed=seed)
    return seed


@pytest.fixture(scope="session")
def many_fds() -> int:
    """Raise this process's open-file limit (brokers started afterwards inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
