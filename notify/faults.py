"""Fault injection for crash tests: named points where the process kills itself or stalls.

Set ``NOTIFY_CRASHPOINTS=name[,name...]`` in a broker's (or coordinator's) environment and the
process sends itself SIGKILL the first time it reaches one of those points, so a test can
crash it between two precise steps (for example after the COMMIT record is durable and
before any message is applied). Unset, :func:`crashpoint` costs one set lookup.

``NOTIFY_PAUSEPOINTS=name:seconds[,...]`` makes the process block (the whole thread, like a
slow recovery would) for that long the first time it reaches ``name``, so a test can act in a
precise window, for example send SIGTERM while the broker is still starting.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Final

_POINTS: Final = frozenset(p for p in os.environ.get("NOTIFY_CRASHPOINTS", "").split(",") if p)


def crashpoint(name: str) -> None:
    """SIGKILL this process if ``name`` was armed in ``NOTIFY_CRASHPOINTS``."""
    if name in _POINTS:
        sys.stderr.write(f"crashpoint {name}: SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _pauses(spec: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in spec.split(","):
        name, sep, seconds = item.partition(":")
        if name and sep:
            out[name] = float(seconds)
    return out


_PAUSES: Final = _pauses(os.environ.get("NOTIFY_PAUSEPOINTS", ""))
_paused: set[str] = set()


def pausepoint(name: str) -> None:
    """Block for the time armed for ``name`` in ``NOTIFY_PAUSEPOINTS`` (first visit only)."""
    seconds = _PAUSES.get(name)
    if seconds is not None and name not in _paused:
        _paused.add(name)
        sys.stderr.write(f"pausepoint {name}: {seconds}s\n")
        sys.stderr.flush()
        time.sleep(seconds)


def armed() -> frozenset[str]:
    return _POINTS
