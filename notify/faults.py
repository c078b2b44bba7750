"""Fault injection for crash tests: named points where the process kills itself.

Set ``NOTIFY_CRASHPOINTS=name[,name...]`` in a broker's (or coordinator's) environment and the
process sends itself SIGKILL the first time it reaches one of those points, so a test can
crash it between two precise steps (for example after the COMMIT record is durable and
before any message is applied). Unset, :func:`crashpoint` costs one set lookup.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

_POINTS: Final = frozenset(p for p in os.environ.get("NOTIFY_CRASHPOINTS", "").split(",") if p)


def crashpoint(name: str) -> None:
    """SIGKILL this process if ``name`` was armed in ``NOTIFY_CRASHPOINTS``."""
    if name in _POINTS:
        sys.stderr.write(f"crashpoint {name}: SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def armed() -> frozenset[str]:
    return _POINTS
