"""A bounded window of recently processed message ids (duplicate suppression)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from itertools import islice


class DuplicateWindow:
    """LRU set of the last ``capacity`` keys seen.

    :meth:`seen` answers whether a key is in the window and refreshes it; :meth:`add` inserts
    a key, evicting the least recently seen one beyond ``capacity``. ``capacity`` 0 disables
    the window. A plain dict in recency order (a refresh re-inserts the key): its bulk
    operations (:meth:`none_seen`, :meth:`add_new`, what a batch of fresh messages costs)
    run in C.
    """

    __slots__ = ("_d", "capacity")

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._d: dict[Hashable, None] = {}

    def seen(self, key: Hashable) -> bool:
        """True when ``key`` is in the window (and refresh it)."""
        d = self._d
        if key in d:
            del d[key]
            d[key] = None
            return True
        return False

    def add(self, key: Hashable) -> None:
        """Insert ``key``, evicting the least recently seen key beyond capacity."""
        if not self.capacity:
            return
        d = self._d
        if key in d:
            del d[key]
        d[key] = None
        if len(d) > self.capacity:
            self._evict()

    def none_seen(self, keys: Sequence[Hashable]) -> bool:
        """True when ``keys`` are distinct and none is in the window."""
        return self._d.keys().isdisjoint(keys) and len(set(keys)) == len(keys)

    def add_new(self, keys: Sequence[Hashable]) -> None:
        """:meth:`add` for keys :meth:`none_seen` accepted, in one update."""
        if not self.capacity:
            return
        d = self._d
        d.update(dict.fromkeys(keys))
        if len(d) > self.capacity:
            self._evict()

    def _evict(self) -> None:
        d = self._d
        oldest = list(islice(d, len(d) - self.capacity))
        deque(map(d.__delitem__, oldest), maxlen=0)

    def forget(self, match: Callable[[Hashable], bool]) -> int:
        """Drop the keys ``match`` accepts (e.g. a partition sought back); how many."""
        gone = [k for k in self._d if match(k)]
        for k in gone:
            del self._d[k]
        return len(gone)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d
