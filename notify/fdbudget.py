"""How many file descriptors the broker can still spare (topic creation over REST and config
reload check new partitions against it: each disk partition keeps its active segment open)."""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Final

#: Wire connections admitted whatever the descriptor budget says.
MIN_CONNECTIONS: Final = 16


def open_fds() -> int:
    """File descriptors this process has open (0 where the OS does not say)."""
    for d in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(d))
    return 0


def connection_budget(reserve: int, others: int, current: int) -> int:
    """How many wire connections the descriptors allow in all: the ``current`` ones plus
    what ``RLIMIT_NOFILE`` leaves once the open descriptors, ``reserve`` (segments,
    checkpoints, new topics) and ``others`` (the HTTP port's cap) are set aside; never below
    ``MIN_CONNECTIONS`` (a limit too low for the rest still lets a few clients in)."""
    spare, _how = spare_fds(reserve + others)
    return max(MIN_CONNECTIONS, current + spare)


def spare_fds(reserve: int) -> tuple[int, str]:
    """File descriptors new partitions may still use, and how that was worked out."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**31, "no RLIMIT_NOFILE"
    used = open_fds()
    return soft - used - reserve, f"RLIMIT_NOFILE {soft}, {used} open, fdReserve {reserve}"
