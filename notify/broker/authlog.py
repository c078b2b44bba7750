"""Failed authentications: counted, and logged as one aggregated line per interval.

A client guessing secrets can fail thousands of times a second; one WARNING each would
flood the log (and the disk). :func:`record_auth_failure` counts every failure (``/metrics``:
``notify_auth_failures_total``) and logs the first one at once, then at most one line per
``authFailureLogInterval`` with the count and the busiest peers of that interval. Used by the
wire port and the HTTP port alike. The counter is per process.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Final

log = logging.getLogger("notify.auth")

#: Distinct peers remembered per interval (the rest are counted as "others").
MAX_PEERS_TRACKED: Final = 16
#: Peers named in one log line.
MAX_PEERS_SHOWN: Final = 5
DEFAULT_INTERVAL_S: Final = 10.0


class AuthFailureLog:
    """Counts failures and rate-limits their log lines (memory: at most
    ``MAX_PEERS_TRACKED`` peers whatever a client does)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S):
        self.interval_s = interval_s
        self.total = 0
        self._pending = 0
        self._peers: dict[str, int] = {}
        self._others = 0
        self._window_start = time.monotonic()
        self._last_emit = -math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()

    def record(self, peer: str) -> None:
        """Count one failed authentication from ``peer``."""
        with self._lock:
            self.total += 1
            if self._pending == 0:
                self._window_start = time.monotonic()
            self._pending += 1
            if peer in self._peers or len(self._peers) < MAX_PEERS_TRACKED:
                self._peers[peer] = self._peers.get(peer, 0) + 1
            else:
                self._others += 1
            wait = self._last_emit + self.interval_s - time.monotonic()
            if wait <= 0:
                self._emit_locked()
                return
            if self._timer is None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return  # flushed by the next failure
                self._timer = loop.call_later(wait, self.flush)

    def flush(self) -> None:
        """Log what was counted since the last line (nothing if nothing was)."""
        with self._lock:
            self._timer = None
            self._emit_locked()

    def _emit_locked(self) -> None:
        if self._pending == 0:
            return
        now = time.monotonic()
        busiest = sorted(self._peers.items(), key=lambda kv: -kv[1])[:MAX_PEERS_SHOWN]
        shown = ", ".join(f"{p} x{n}" for p, n in busiest)
        rest = self._pending - sum(n for _p, n in busiest)
        if rest:
            shown += f", others x{rest}"
        if self._pending == 1:
            log.warning("authentication failed (%s)", shown)
        else:
            log.warning(
                "authentication failed %d times in the last %.1f s (%s)",
                self._pending,
                max(now - self._window_start, 0.0),
                shown,
            )
        self._pending = 0
        self._peers.clear()
        self._others = 0
        self._last_emit = now
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


_LOG: Final = AuthFailureLog()


def configure(interval_s: float) -> None:
    """Set the interval between two log lines (``authFailureLogInterval``)."""
    _LOG.interval_s = interval_s


def record_auth_failure(peer: str) -> None:
    """Count one failed authentication (wire or HTTP) from ``peer``; rate-limited logging."""
    _LOG.record(peer)


def auth_failures_total() -> int:
    """Failed authentications since the process started."""
    return _LOG.total
