"""Client test fixtures. The real broker comes from ``tests/conftest.py`` (``broker``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.client.fakebroker import FakeBroker


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    fb = FakeBroker()
    yield fb
    fb.close()


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.01) -> None:
    """Poll ``cond`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(step)
