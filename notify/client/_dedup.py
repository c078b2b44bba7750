"""A bounded window of recently processed message ids (duplicate suppression)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class DuplicateWindow:
    """LRU set of the last ``capacity`` keys seen.

    :meth:`seen` answers whether a key is in the window and refreshes it; :meth:`add` inserts
    a key, evicting the least recently seen one beyond ``capacity``. ``capacity`` 0 disables
    the window.
    """

    __slots__ = ("_d", "capacity")

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._d: OrderedDict[Hashable, None] = OrderedDict()

    def seen(self, key: Hashable) -> bool:
        """True when ``key`` is in the window (and refresh it)."""
        if key in self._d:
            self._d.move_to_end(key)
            return True
        return False

    def add(self, key: Hashable) -> None:
        """Insert ``key``, evicting the least recently seen key beyond capacity."""
        if not self.capacity:
            return
        d = self._d
        if key in d:
            d.move_to_end(key)
            return
        d[key] = None
        if len(d) > self.capacity:
            d.popitem(last=False)

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
