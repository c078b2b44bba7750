"""Concurrent readers of the simulated broker: consumers on their own connections, each
tailing every partition with ``get`` (through :meth:`~notify.store.partition.Partition.slice`,
the code that serves a real ``get``) and checking what it was served.

A reader step sends one to three gets at once (a pipelined batch: the broker serves it in one
step). Whenever a get reaches a partition's served end (a real broker answers 404), the
reader checks the transaction invariant:

    a reader is never served a proper subset of a transaction's messages while another of
    its partitions is at its served end

that is: for every transaction the reader was served any message of (before this get), every
message of it that lives in this partition has been served to the reader too. Messages of a
transaction that went through the delay queue are delivered when due, on their own, and are
not part of it.

Readers keep no state across a crash (consumers reconnect and read again from the start).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from notify.errors import NotifyError, OffsetOutOfRangeError
from notify.protocol import records
from notify.store.partition import Partition


@dataclass
class Reader:
    """One consumer connection tailing every partition it is given."""

    name: str
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: message ids served so far
    served: set[int] = field(default_factory=set)
    #: keys of transactions the reader was served a message of
    seen: set[str] = field(default_factory=set)
    gets: int = 0
    ends: int = 0


class Readers:
    """The readers of one simulated broker incarnation and their invariant."""

    def __init__(
        self,
        rng: random.Random,
        partitions: Callable[[], dict[tuple[str, int], Partition]],
        tx_of: Callable[[int], str | None],
        tx_messages: Callable[[str], list[tuple[str, int, int]]],
        fail: Callable[[str], None],
        log: Callable[[str], None],
        count: int = 3,
    ) -> None:
        self.rng = rng
        self.partitions = partitions
        self.tx_of = tx_of
        self.tx_messages = tx_messages
        self.fail = fail
        self.log = log
        self.readers = [Reader(f"r{i}") for i in range(count)]
        self.checks = 0
        self._parts: list[tuple[tuple[str, int], Partition]] | None = None

    def reset(self) -> None:
        """A crash: every reader reconnects and starts again from the first offsets."""
        self.readers = [Reader(r.name) for r in self.readers]
        self._parts = None

    def step(self) -> None:
        """One reader sends a batch of one to three gets (served in one broker step)."""
        rd = self.rng.choice(self.readers)
        if self._parts is None:  # the same partitions until the next crash
            self._parts = sorted(self.partitions().items())
        parts = self._parts
        if not parts:
            return
        for _ in range(self.rng.randrange(1, 4)):
            key, part = self.rng.choice(parts)
            self._get(rd, key, part)

    def _get(self, rd: Reader, key: tuple[str, int], part: Partition) -> None:
        off = rd.offsets.get(key, part.min_offset)
        window = self.rng.choice((40, 120, 400, 1 << 16))
        rd.gets += 1
        try:
            sl = part.slice(off, window, 1 << 20)
        except OffsetOutOfRangeError as e:
            self.fail(f"reader {rd.name}: {key[0]}-{key[1]} refused offset {off}: {e}")
            return
        if sl is None:
            rd.ends += 1
            self._at_end(rd, key)
            return
        data = sl.segment.read(sl.file_pos, sl.length)
        try:
            recs, used = records.decode_all(data, off)
        except NotifyError as e:
            self.fail(f"reader {rd.name}: {key[0]}-{key[1]}@{off} unreadable: {e}")
            return
        if not recs:  # a window shorter than the next record: a real client asks again wider
            return
        for r in recs:
            rd.served.add(r.msg_id)
            tx = self.tx_of(r.msg_id)
            if tx is not None:
                rd.seen.add(tx)
        rd.offsets[key] = off + used

    def _at_end(self, rd: Reader, key: tuple[str, int]) -> None:
        """The get reached ``key``'s served end: no transaction the reader saw part of may
        have a message here the reader was not served."""
        self.checks += 1
        for tx in rd.seen:
            for topic, p, mid in self.tx_messages(tx):
                if (topic, p) == key and mid not in rd.served:
                    got = sum(1 for m in self.tx_messages(tx) if m[2] in rd.served)
                    self.fail(
                        f"fractured read: reader {rd.name} was served {got} of "
                        f"{len(self.tx_messages(tx))} messages of {tx} and reached the served "
                        f"end of {topic}-{p} without its message {mid}"
                    )
                    return
