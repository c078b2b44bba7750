"""A broker for an application's tests, in this process: :func:`broker`.

The broker runs on a thread of its own with its own event loop (no child process, no
imports paid again), listens on a free 127.0.0.1 port, keeps its data in a temporary
directory and creates topics the first time a client names them (``autoCreateTopics``)::

    from notify.client import connect
    from notify.testing import broker

    with broker() as b, connect([b.address]) as session:
        session.create_producer().send("orders", b"order 42")

The pytest plugin (:mod:`notify.testing.pytest_plugin`) gives the same as the
``notify_broker`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from notify.config import parse_config

from .process import render_ini

if TYPE_CHECKING:
    from notify.broker.app import Broker

__all__ = ["TestBroker", "broker"]


class TestBroker:
    """A broker on a thread of this process (see the module doc). ``start()`` returns once
    it accepts connections; ``stop()`` closes it (and removes its directory when it made
    one). ``topics``: ``{name: partitions}`` created at start; any other topic is created
    with ``partitions`` partitions when first named. ``system``: more ``[system]`` keys of
    ``server.ini`` (e.g. ``{"maxMessageSize": 1024}``)."""

    __test__ = False  # not a test class for pytest

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        topics: dict[str, int] | None = None,
        partitions: int = 1,
        system: dict[str, Any] | None = None,
    ):
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="notify-test-broker-"))
        self.topics = dict(topics or {})
        self.system: dict[str, Any] = {
            "autoCreateTopics": "true",
            "numPartitions": partitions,
            **(system or {}),
        }
        self.host = "127.0.0.1"
        self.port = 0
        self._broker: Broker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``, for ``connect([address])``."""
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> TestBroker:
        """Start serving; raises what the broker's start raised."""
        if self._thread is not None:
            raise RuntimeError("this test broker is already started")
        from notify.broker.app import Broker

        text = render_ini(self.directory / "data", 0, self.topics, self.system)
        config = parse_config(text)
        started = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()
        broker = Broker(config)

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(broker.start())
            except BaseException as e:
                failure.append(e)
                started.set()
                return
            started.set()
            loop.run_until_complete(broker.wait_closed())

        self._loop, self._broker = loop, broker
        self._thread = threading.Thread(target=run, name="notify-test-broker", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s):
            raise RuntimeError(f"the test broker did not start within {timeout_s}s")
        if failure:
            self._thread.join()
            self._thread = None
            loop.close()
            raise failure[0]
        self.port = broker.port
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker (pending writes flushed) and remove its directory if made here."""
        loop, broker, thread = self._loop, self._broker, self._thread
        self._thread = None
        if loop is not None and broker is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(timeout_s)
            thread.join(timeout_s)
            if not thread.is_alive():
                _close_loop(loop)
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> TestBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on the stopped broker's loop and close it."""
    pending = asyncio.all_tasks(loop)
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


@contextlib.contextmanager
def broker(
    directory: str | Path | None = None,
    *,
    topics: dict[str, int] | None = None,
    partitions: int = 1,
    system: dict[str, Any] | None = None,
) -> Iterator[TestBroker]:
    """A :class:`TestBroker` started for the ``with`` block and stopped after it::

    with notify.testing.broker() as b:
        with connect([b.address]) as session: ...
    """
    b = TestBroker(directory, topics=topics, partitions=partitions, system=system)
    b.start()
    try:
        yield b
    finally:
        b.stop()
