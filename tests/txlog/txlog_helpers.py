"""Helpers shared by the txlog tests."""

from __future__ import annotations

import threading
from collections.abc import Callable

from notify.txlog import TxLog


class FsyncCounter:
    """Replaces ``TxLog._fsync`` of one log: counts calls, optionally injects failures.

    ``fail`` is called before each fsync; if it returns an exception, that is raised instead
    of syncing; ``before`` runs first (a test can block or slow the fsync there).
    """

    def __init__(self, log: TxLog) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        self._real: Callable[[int], None] = log._fsync
        self.fail: Callable[[], BaseException | None] = lambda: None
        self.before: Callable[[], None] = lambda: None
        log._fsync = self  # type: ignore[method-assign]

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.calls += 1
        self.before()
        exc = self.fail()
        if exc is not None:
            raise exc
        self._real(fd)


def fail_times(
    n: int, exc_factory: Callable[[], BaseException]
) -> Callable[[], BaseException | None]:
    """A ``fail`` hook that fails the next ``n`` calls."""
    left = [n]
    lock = threading.Lock()

    def hook() -> BaseException | None:
        with lock:
            if left[0] > 0:
                left[0] -= 1
                return exc_factory()
        return None

    return hook
