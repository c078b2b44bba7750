"""Fetch window sizing: grow when a window holds no whole record, shrink back after."""

from __future__ import annotations

from notify.protocol.records import HEADER_SIZE, first_record_size


class FetchSizer:
    """The ``maxSize`` of the next ``get`` of one partition.

    Starts at ``initial``. When a fetched window held no whole record the next window is at
    least the first record's size (read from its header when the window has 4 bytes) and at
    least twice the current one, bounded by ``maximum``. After a window that held a record
    the size goes back to ``initial``.
    """

    __slots__ = ("current", "initial", "maximum")

    def __init__(self, initial: int, maximum: int):
        if initial < HEADER_SIZE:
            raise ValueError(f"max_size must be at least {HEADER_SIZE} bytes")
        self.initial = initial
        self.maximum = max(initial, maximum)
        self.current = initial

    @property
    def grown(self) -> bool:
        """The window is larger than the initial size."""
        return self.current > self.initial

    @property
    def exhausted(self) -> bool:
        """The window is at its maximum and may still be too small."""
        return self.current >= self.maximum

    def no_whole_record(self, window: bytes | memoryview) -> int:
        """Record a window without a whole record; returns the next size."""
        need = first_record_size(window[:4]) if len(window) >= 4 else None
        grow = self.current * 2
        if need is not None and need > grow:
            grow = need
        self.current = min(self.maximum, grow)
        return self.current

    def got_records(self) -> int:
        """Record a window that held at least one whole record; returns the next size."""
        self.current = self.initial
        return self.current
