"""Wrapping public methods and undoing it: the instrumentation's only contact with the
classes it traces (their public methods; nothing inside them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()


class Patches:
    """Methods replaced on classes, restorable in reverse order."""

    def __init__(self) -> None:
        self._done: list[tuple[type, str, object]] = []

    def wrap(self, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` by ``make(original)``; nothing when it has no such
        attribute (an API that this version of the client does not have)."""
        current = getattr(owner, name, _MISSING)
        if current is _MISSING:
            return
        own = owner.__dict__.get(name, _MISSING)
        wrapper = make(current)
        wrapper.__wrapped__ = current
        setattr(owner, name, wrapper)
        self._done.append((owner, name, own))

    def restore(self) -> None:
        """Put every original back (an inherited one by removing the override)."""
        while self._done:
            owner, name, own = self._done.pop()
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)

    def __len__(self) -> int:
        return len(self._done)
