"""The pytest plugin shipped with notify (entry point ``pytest11``): the ``notify_broker``
fixture, a real broker for each test that asks for it::

    def test_order_is_published(notify_broker):
        with connect([notify_broker.address]) as session:
            ...

The broker (:class:`notify.testing.TestBroker`) runs in the test's process on a free
127.0.0.1 port, keeps its data in a temporary directory, creates topics on first use
and is stopped after the test. Loading the plugin imports nothing of the broker: a test
that does not ask for the fixture pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .inproc import TestBroker

__all__ = ["notify_broker"]


@pytest.fixture
def notify_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """A started :class:`~notify.testing.TestBroker` (``.address`` is its
    ``"127.0.0.1:<port>"``), stopped after the test; its data stays in pytest's temporary
    directory for a failed test to be looked at."""
    b = TestBroker(tmp_path_factory.mktemp("notify-broker"))
    b.start()
    try:
        yield b
    finally:
        b.stop()
