"""A bounded window of recently processed message ids (duplicate suppression)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence


class DuplicateWindow:
    """A set of the recently seen keys, bounded by two generations of ``capacity``.

    Keys go into the young generation; once it holds ``capacity`` keys it becomes the old
    one and the previous old generation is dropped. So the window always remembers at least
    the last ``capacity`` distinct keys added or seen (and at most about twice that, plus
    one batch), in two sets whose bulk operations (:meth:`none_seen`, :meth:`add_new`: what a
    batch of fresh messages costs) run in C with no per-key eviction. :meth:`seen` answers
    whether a key is in the window and refreshes it (moves it to the young generation).
    ``capacity`` 0 disables the window.
    """

    __slots__ = ("_old", "_young", "capacity")

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._young: set[Hashable] = set()
        self._old: set[Hashable] = set()

    def seen(self, key: Hashable) -> bool:
        """True when ``key`` is in the window (and refresh it)."""
        if key in self._young:
            return True
        if key in self._old:
            self._old.discard(key)
            self._put(key)
            return True
        return False

    def add(self, key: Hashable) -> None:
        """Insert ``key`` (it stays remembered for at least ``capacity`` more keys)."""
        if not self.capacity:
            return
        self._old.discard(key)
        self._put(key)

    def _put(self, key: Hashable) -> None:
        self._young.add(key)
        self._age()

    def _age(self) -> None:
        """A full young generation becomes the old one (the previous old one is dropped)."""
        if len(self._young) >= self.capacity:
            self._old, self._young = self._young, set()

    def none_seen(self, keys: Sequence[Hashable]) -> bool:
        """True when ``keys`` are distinct and none is in the window."""
        ks = set(keys)
        return len(ks) == len(keys) and self._young.isdisjoint(ks) and self._old.isdisjoint(ks)

    def add_new(self, keys: Sequence[Hashable]) -> None:
        """:meth:`add` for keys :meth:`none_seen` accepted, in one update."""
        if not self.capacity:
            return
        self._young.update(keys)
        self._age()

    def forget(self, match: Callable[[Hashable], bool]) -> int:
        """Drop the keys ``match`` accepts (e.g. a partition sought back); how many."""
        n = 0
        for gen in (self._young, self._old):
            gone = [k for k in gen if match(k)]
            gen.difference_update(gone)
            n += len(gone)
        return n

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._young or key in self._old
