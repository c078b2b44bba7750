"""Idempotent producers: drop a retried put the partition already stored.

An idempotent producer (``ProducerConfig(idempotent=True)``) puts a producer id and a
per-partition sequence number into each message's attribute block
(:mod:`notify.protocol.properties`, record flag bit 1), and keeps at most one batch in flight
per partition. So a put (or ``mput``) whose sequences are not above the last batch stored
for its producer in that partition is a retry of that batch, whose acknowledgement was lost
(a dropped connection, a timeout, a 503 after the local write): it is not written again but
answered with the stored batch's ids and offsets.

The state is, per partition, ``producer id -> last batch`` (first and last sequence, first
message id, first offset, end offset), bounded by ``maxIdempotentProducers`` per partition
(least recently used out). It is rebuilt from the records themselves: at start from the
snapshot ``<dataPath>/producer-states.json`` (written at start, then with the recovery
points, and at shutdown) plus a scan of what the partition holds past the snapshot (all of
a partition created after it); a slave observes the records it
appends, so a promoted slave knows the producers too. When the snapshot covers more than a
crash left in a partition, the batches past the recovered end are forgotten (they were
lost, so a retry of them must be stored).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from notify.fs import OS_FS, FileSystem, write_file_atomically
from notify.protocol import records
from notify.protocol.properties import FLAG_PROPERTIES, producer_sequence
from notify.store.partition import Partition

log = logging.getLogger("notify.broker")

SNAPSHOT_FILE: Final = "producer-states.json"

_SCAN_WINDOW: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class LastBatch:
    """The last batch a producer stored in a partition."""

    first_seq: int
    last_seq: int
    first_id: int
    first_offset: int
    end_offset: int

    @property
    def count(self) -> int:
        return self.last_seq - self.first_seq + 1


def has_properties(buf: bytes | bytearray | memoryview) -> bool:
    """True when a record of the whole records ``buf`` has the properties flag bit (reads
    the headers only: the cheap test before anything is decoded)."""
    if not _may_hold_mark(buf):
        return False
    pos, n = 0, len(buf)
    unpack = records.HEADER.unpack_from
    while n - pos >= records.HEADER_SIZE:
        length, _crc, _mid, flag = unpack(buf, pos)
        if flag & FLAG_PROPERTIES:
            return True
        pos += records.HEADER_SIZE + length
    return False


def _may_hold_mark(buf: bytes | bytearray | memoryview) -> bool:
    """False when no properties block can be in ``buf``: no U+001E followed by ``{``
    (memchr per candidate). Binary payloads with many 0x1E bytes give up after a few
    candidates: True, and the caller walks the headers."""
    data = bytes(buf) if isinstance(buf, memoryview) else buf
    find = data.find
    i = find(30)
    n = len(data) - 1
    for _ in range(16):
        if not 0 <= i < n:
            return False
        if data[i + 1] == 123:
            return True
        i = find(30, i + 1)
    return True


def batch_producer(buf: bytes | bytearray | memoryview) -> tuple[str, int, int] | None:
    """``(producer id, first sequence, last sequence)`` of whole validated records ``buf``
    when its first and last records come from one idempotent producer and their sequences
    span exactly the batch (what the client sends: consecutive sequences), else None. Only
    those two records are parsed."""
    starts: list[int] = []
    pos, n = 0, len(buf)
    unpack = records.HEADER.unpack_from
    while n - pos >= records.HEADER_SIZE:
        starts.append(pos)
        pos += records.HEADER_SIZE + unpack(buf, pos)[0]
    if not starts:
        return None
    ends = [_producer_at(buf, starts[0]), _producer_at(buf, starts[-1])]
    first, last = ends
    if first is None or last is None or first[0] != last[0]:
        return None
    if last[1] - first[1] + 1 != len(starts):
        return None
    return first[0], first[1], last[1]


def _producer_at(buf: bytes | bytearray | memoryview, pos: int) -> tuple[str, int] | None:
    length, _crc, _mid, flag = records.HEADER.unpack_from(buf, pos)
    start = pos + records.HEADER_SIZE
    return record_producer(flag, bytes(buf[start : start + length]))


def record_producer(flag: int, payload: bytes) -> tuple[str, int] | None:
    """``(producer id, sequence)`` of one record's payload, or None."""
    if not flag & FLAG_PROPERTIES:
        return None
    try:
        text, _ = records.split_payload(payload, flag)
    except (ValueError, UnicodeDecodeError):
        return None
    return None if text is None else producer_sequence(text)


class ProducerStates:
    """The last batch of every idempotent producer per partition (see module doc)."""

    def __init__(self, max_producers: int):
        self.max_producers = max_producers
        self._parts: dict[str, OrderedDict[str, LastBatch]] = {}
        self.duplicates = 0

    @staticmethod
    def key(part: Partition) -> str:
        return f"{part.topic}-{part.index}"

    def last(self, part: Partition, pid: str) -> LastBatch | None:
        """The last batch ``pid`` stored in ``part``."""
        table = self._parts.get(self.key(part))
        return None if table is None else table.get(pid)

    def duplicate_of(self, part: Partition, pid: str, first_seq: int) -> LastBatch | None:
        """The stored batch a put starting at ``first_seq`` repeats (counted), or None."""
        last = self.last(part, pid)
        if last is None or first_seq > last.last_seq:
            return None
        self.duplicates += 1
        return last

    def record(self, part: Partition, pid: str, batch: LastBatch) -> None:
        """``pid`` stored ``batch`` in ``part`` (appended or replicated)."""
        table = self._parts.setdefault(self.key(part), OrderedDict())
        table[pid] = batch
        table.move_to_end(pid)
        while len(table) > self.max_producers:
            table.popitem(last=False)

    def forget_from(self, part: Partition, offset: int) -> None:
        """Batches stored at or after ``offset`` were taken back (refused puts)."""
        table = self._parts.get(self.key(part))
        if table is not None:
            for pid in [p for p, b in table.items() if b.end_offset > offset]:
                del table[pid]

    def observe(self, part: Partition, buf: bytes | bytearray | memoryview, base: int) -> None:
        """Record the idempotent batches among whole records ``buf`` stored at ``base``
        (a slave's appends, the scan at start). Consecutive records of one producer form
        one batch."""
        if not has_properties(buf):
            return
        cur: tuple[str, int, int, int, int] | None = None  # pid, first, last, id, offset
        end = base
        for rec in records.decode_all(buf, base, verify=False)[0]:
            got = record_producer(rec.flag, rec.payload)
            if cur is not None and (got is None or got[0] != cur[0] or got[1] != cur[2] + 1):
                self.record(part, cur[0], LastBatch(cur[1], cur[2], cur[3], cur[4], end))
                cur = None
            if got is not None:
                if cur is None:
                    cur = (got[0], got[1], got[1], rec.msg_id, rec.offset)
                else:
                    cur = (cur[0], cur[1], got[1], cur[3], cur[4])
            end = rec.offset + rec.size
        if cur is not None:
            self.record(part, cur[0], LastBatch(cur[1], cur[2], cur[3], cur[4], end))

    def locate(self, part: Partition, batch: LastBatch, seq: int) -> tuple[int, int] | None:
        """``(msg id, offset)`` of the record of sequence ``seq`` inside ``batch`` (read
        back from the partition: a batch rebuilt by a scan may join several puts)."""
        if seq == batch.first_seq:
            return batch.first_id, batch.first_offset
        pos = batch.first_offset
        while pos < batch.end_offset:
            buf = part.read(pos, batch.end_offset - pos)
            recs, used = records.decode_all(buf, pos, verify=False)
            if not recs:
                return None
            for rec in recs:
                got = record_producer(rec.flag, rec.payload)
                if got is not None and got[1] == seq:
                    return rec.msg_id, rec.offset
            pos += used
        return None

    # ------------------------------------------------------------------ persistence

    def snapshot(self, parts: Iterable[Partition]) -> bytes:
        """The state with each partition's end (call on the loop: a consistent cut)."""
        doc: dict[str, Any] = {"version": 1, "partitions": {}}
        for part in parts:  # every partition: producers that come later are scanned for
            table: Mapping[str, LastBatch] = self._parts.get(self.key(part)) or {}
            doc["partitions"][self.key(part)] = {
                "end": part.end,
                "producers": {
                    pid: [b.first_seq, b.last_seq, b.first_id, b.first_offset, b.end_offset]
                    for pid, b in table.items()
                },
            }
        return json.dumps(doc, separators=(",", ":")).encode()

    def save(self, data_dir: Path, snapshot: bytes, fs: FileSystem = OS_FS) -> None:
        """Write a :meth:`snapshot` atomically (off the loop)."""
        write_file_atomically(fs, data_dir / SNAPSHOT_FILE, snapshot)

    def load(self, data_dir: Path, parts: Iterable[Partition]) -> None:
        """Rebuild the state at start: the snapshot, then the records past it."""
        path = data_dir / SNAPSHOT_FILE
        doc: dict[str, Any] = {}
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.error("idempotent producers: snapshot %s unreadable (%s): ignored", path, e)
        saved = doc.get("partitions", {}) if isinstance(doc, dict) else {}
        for part in parts:
            entry = saved.get(self.key(part))
            if entry is None:
                if saved:  # created after the snapshot (a topic added at runtime): all of it
                    self._scan(part, part.min_offset, part.end)
                continue
            end = part.end
            forgotten = 0
            for pid, v in entry["producers"].items():
                batch = LastBatch(*(int(x) for x in v))
                if batch.end_offset <= end:
                    self.record(part, pid, batch)
                else:
                    forgotten += 1
            if forgotten:
                log.warning(
                    "idempotent producers of %s: %d last batches lost in the crash forgotten",
                    self.key(part),
                    forgotten,
                )
            self._scan(part, max(int(entry["end"]), part.min_offset), end)

    def _scan(self, part: Partition, start: int, end: int) -> None:
        pos = start
        while pos < end:
            buf = part.read(pos, min(_SCAN_WINDOW, end - pos))
            recs, used = records.decode_all(buf, pos, verify=False)
            if not recs:
                buf = part.read(pos, records.first_record_size(buf[:4]) or _SCAN_WINDOW)
                recs, used = records.decode_all(buf, pos, verify=False)
                if not recs:
                    break
            self.observe(part, memoryview(buf)[:used], pos)
            pos += used
