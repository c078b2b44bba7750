"""Positions in the log."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Position"]


class Position(NamedTuple):
    """A place in the log: segment number and byte offset in it. Totally ordered.

    A record's position is where its frame starts. ``Position(n, size_of_n)`` and
    ``Position(n + 1, 0)`` denote the same point between records.
    """

    file_no: int
    offset: int
