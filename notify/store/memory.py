"""Memory-backed partitions (``[topic=NAME] store=memory``): same offsets, same protocol,
no disk. Data is lost on restart — a topic chooses this for throughput over safety, as
Notify's memory store did.

Records live in chunks of at most ``chunk_bytes`` that play the role of segment files
(a ``get`` never crosses one). Above ``max_bytes`` the oldest chunks are dropped
(``memoryFullPolicy=drop_oldest``: consumers behind get a 301 to the new first offset) or
producers are refused with 503 (``refuse``).
"""

from __future__ import annotations

from pathlib import Path

from notify.errors import StoreFullError
from notify.store.gate import settle
from notify.store.partition import Partition, RecoveryReport


class MemorySegment:
    """A segment whose bytes are in memory (``fd`` is -1: never sent with sendfile)."""

    __slots__ = ("buf", "path", "start")

    fd = -1

    def __init__(self, start: int, label: str):
        self.start = start
        self.buf = bytearray()
        self.path = Path(f"<memory:{label}@{start}>")

    @property
    def size(self) -> int:
        return len(self.buf)

    @property
    def end(self) -> int:
        return self.start + len(self.buf)

    def append(self, data: bytes | bytearray | memoryview) -> int:
        pos = self.end
        self.buf += data
        return pos

    def read(self, file_pos: int, length: int) -> bytes:
        return bytes(self.buf[file_pos : file_pos + length])

    def sync(self) -> None:
        pass

    def truncate(self, size: int) -> None:
        del self.buf[size:]

    def close(self) -> None:
        self.buf = bytearray()


class MemoryPartition(Partition):
    """A :class:`Partition` kept in memory, bounded by ``max_bytes``."""

    memory = True

    def __init__(self, topic: str, index: int, max_bytes: int, drop_oldest: bool, chunk_bytes: int):
        super().__init__(topic, index, Path(f"<memory:{topic}-{index}>"), chunk_bytes, False)
        self.max_bytes = max_bytes
        self.drop_oldest = drop_oldest
        self.dropped_bytes = 0
        self._add(MemorySegment(0, f"{topic}-{index}"))  # type: ignore[arg-type]
        self.recovery = RecoveryReport(topic, index, "<memory>", 0, 0, None, 0.0)

    def append(self, data: bytes | bytearray | memoryview, hold: bool = False) -> int:
        """As :meth:`Partition.append`; never held (a memory topic is lost on restart by
        design, a synchronous slave's refusal does not take it back)."""
        n = len(data)
        if n > self.max_bytes:
            raise StoreFullError(
                f"{self.topic}-{self.index}: {n} bytes exceed memoryMaxBytes {self.max_bytes}"
            )
        while self.size_bytes + n > self.max_bytes:
            if not self.drop_oldest:
                raise StoreFullError(
                    f"memory topic {self.topic} is full ({self.size_bytes} of "
                    f"{self.max_bytes} bytes) and memoryFullPolicy=refuse"
                )
            if len(self.segments) == 1:
                self._roll()
            first = self.segments[0]
            self.dropped_bytes += first.size
            self.delete_segments_before(first.end)
        offset = super().append(data)
        self.flushed_end = self.end
        return offset

    def _roll(self) -> MemorySegment:  # type: ignore[override]
        seg = MemorySegment(self.end, f"{self.topic}-{self.index}")
        self._add(seg)  # type: ignore[arg-type]
        return seg

    def sync(self) -> None:
        self.flushed_end = self.end
        settle((self,))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for seg in self.segments:
            seg.close()
