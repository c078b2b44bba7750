"""Message ids: their layout (read by clients: a message's timestamp and broker) and the
broker's generator. Snowflake-like, one signed 64-bit integer::

    bit 63       62 ........... 22   21 ....... 12   11 ........ 0
        0        milliseconds since   broker id       sequence in
                 EPOCH_MS (41 bits)   (10 bits)       the ms (12 bits)

Ids are strictly increasing per broker; a batch gets consecutive ids. When a millisecond's
4096 sequence numbers are used up (or the clock steps back) the generator borrows from the
next millisecond, so it never blocks and never repeats."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

EPOCH_MS: Final = 1_577_836_800_000  # 2020-01-01T00:00:00Z
BROKER_BITS: Final = 10
SEQ_BITS: Final = 12
MAX_BATCH: Final = 1 << SEQ_BITS


class IdGenerator:
    """Allocates message ids for one broker (single-threaded use: the broker's event loop)."""

    __slots__ = ("_broker", "_clock", "_last_ms", "_seq")

    def __init__(self, broker_id: int, clock: Callable[[], float] = time.time):
        if not 0 <= broker_id < (1 << BROKER_BITS):
            raise ValueError(f"broker id {broker_id} does not fit {BROKER_BITS} bits")
        self._broker = broker_id
        self._clock = clock
        self._last_ms = 0
        self._seq = 0

    def next_block(self, count: int) -> int:
        """Reserve ``count`` (1..4096) consecutive ids and return the first."""
        if not 1 <= count <= MAX_BATCH:
            raise ValueError(f"id block of {count} outside 1..{MAX_BATCH}")
        now = int(self._clock() * 1000) - EPOCH_MS
        if now > self._last_ms:
            self._last_ms = now
            self._seq = 0
        if self._seq + count > MAX_BATCH:
            self._last_ms += 1
            self._seq = 0
        first = (self._last_ms << (BROKER_BITS + SEQ_BITS)) | (self._broker << SEQ_BITS) | self._seq
        self._seq += count
        return first

    def next(self) -> int:
        return self.next_block(1)


def split_id(msg_id: int) -> tuple[int, int, int]:
    """``(unix_ms, broker_id, sequence)`` of a message id."""
    seq = msg_id & (MAX_BATCH - 1)
    broker = (msg_id >> SEQ_BITS) & ((1 << BROKER_BITS) - 1)
    ms = (msg_id >> (BROKER_BITS + SEQ_BITS)) + EPOCH_MS
    return ms, broker, seq
