"""Client test fixtures. The real broker comes from ``tests/conftest.py`` (``broker``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.fakebroker import FakeBroker
from tests.helpers import wait_until as wait_until  # imported from here by earlier tests


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    fb = FakeBroker()
    yield fb
    fb.close()
