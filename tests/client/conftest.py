"""Client test fixtures. The real broker comes from ``tests/conftest.py`` (``broker``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.fakebroker import FakeBroker
from tests.helpers import wait_until as wait_until  # imported from here by earlier tests


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    fb = FakeBroker()
    yield fb
    fb.close()


def kill_when_marked(code: str, marker: Path, *args: str, timeout: float = 30.0) -> str:
    """Run ``code`` in a child interpreter (``sys.argv[1:]`` = ``args``), wait until it
    writes ``marker`` (whole: write a temporary file and rename it), SIGKILL it there and
    return the marker's text."""
    child = subprocess.Popen([sys.executable, "-c", code, *args])
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return marker.read_text()
