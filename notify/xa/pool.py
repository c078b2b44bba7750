"""Registered participant factories and a small pool of idle participants per name."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from notify.xa.errors import NotRegisteredError, ParticipantError
from notify.xa.ids import validate_name
from notify.xa.participant import Participant, ParticipantFactory

log = logging.getLogger("notify.xa")


class ParticipantPool:
    """Factories by name; at most ``max_idle`` idle participants kept per name. Thread-safe."""

    def __init__(self, max_idle: int = 16):
        self.max_idle = max_idle
        self._factories: dict[str, ParticipantFactory] = {}
        self._idle: dict[str, list[Participant]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def register(self, name: str, factory: ParticipantFactory) -> None:
        """Register (or replace) the factory of ``name``."""
        validate_name(name)
        with self._lock:
            old = self._idle.pop(name, [])
            self._factories[name] = factory
        for p in old:
            _close(p)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        with self._lock:
            return list(self._factories)

    def fresh(self, name: str) -> Participant:
        """A new participant from the factory (a new connection)."""
        with self._lock:
            factory = self._factories.get(name)
        if factory is None:
            raise NotRegisteredError(f"no participant registered as {name!r}")
        try:
            return factory()
        except ParticipantError:
            raise
        except Exception as e:  # a user factory: translate at the boundary
            raise ParticipantError(f"factory of {name!r} failed: {e}") from e

    def acquire(self, name: str) -> Participant:
        """An idle participant of ``name``, or a new one."""
        with self._lock:
            if name not in self._factories:
                raise NotRegisteredError(f"no participant registered as {name!r}")
            idle = self._idle.get(name)
            if idle:
                return idle.pop()
        return self.fresh(name)

    def release(self, name: str, p: Participant, healthy: bool) -> None:
        """Give ``p`` back: pooled when healthy and there is room, closed otherwise."""
        if healthy:
            with self._lock:
                idle = self._idle.setdefault(name, [])
                if (
                    not self._closed
                    and self._factories.get(name) is not None
                    and (len(idle) < self.max_idle)
                ):
                    idle.append(p)
                    return
        _close(p)

    @contextlib.contextmanager
    def borrowed(self, name: str) -> Iterator[Participant]:
        """``with pool.borrowed(name) as p``: healthy unless the block raises."""
        p = self.acquire(name)
        ok = False
        try:
            yield p
            ok = True
        finally:
            self.release(name, p, ok)

    def close(self) -> None:
        """Close every idle participant; later releases close theirs."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for ps in idle.values():
            for p in ps:
                _close(p)


def _close(p: Participant) -> None:
    try:
        p.close()
    except Exception as e:  # close must not raise: log a faulty one
        log.warning("closing %r failed: %s", p, e)
