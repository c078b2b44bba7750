"""How many file descriptors the broker can still spare (topic creation over REST and config
reload check new partitions against it: each disk partition keeps its active segment open)."""

from __future__ import annotations

import contextlib
import os
import resource


def open_fds() -> int:
    """File descriptors this process has open (0 where the OS does not say)."""
    for d in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(d))
    return 0


def spare_fds(reserve: int) -> tuple[int, str]:
    """File descriptors new partitions may still use, and how that was worked out."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**31, "no RLIMIT_NOFILE"
    used = open_fds()
    return soft - used - reserve, f"RLIMIT_NOFILE {soft}, {used} open, fdReserve {reserve}"
