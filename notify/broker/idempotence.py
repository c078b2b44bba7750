"""Idempotent producers: drop a retried put the partition already stored.

An idempotent producer (``ProducerConfig(idempotent=True)``) claims an identity on each of
its connections (the ``producer`` verb, :mod:`notify.protocol.identity`), puts that producer
id and a per-partition sequence number into each message's attribute block
(:mod:`notify.protocol.properties`, record flag bit 1), and keeps at most one batch in flight
per partition. So a put (or ``mput``) whose sequences are not above the last batch stored
for its producer in that partition is a retry of that batch, whose acknowledgement was lost
(a dropped connection, a timeout, a 503 after the local write): it is not written again but
answered with the stored batch's ids and offsets. A put naming an identity its connection
has not claimed (or whose claim a newer instance fenced) is refused before any of that.

The state is, per partition, ``producer id -> last batch`` (first and last sequence, first
message id, first offset, end offset), bounded by ``maxIdempotentProducers`` per partition
(least recently used out), plus the holder (epoch, instance) of every named identity; all
of it within ``producerStateMaxBytes`` (estimated at :data:`ENTRY_BYTES` plus the id per
entry): beyond, the least recently used entries of identities no connection holds are
forgotten, and a put or claim that still finds no room is refused (503). It is rebuilt from
the records themselves: at start from the snapshot ``<dataPath>/producer-states.json``
(written at start, then with the recovery points and at shutdown, each time only when it
changed) plus a scan of what the partition holds past the snapshot (all of a partition
created after it); a slave observes the records it appends, so a promoted slave knows the
producers too. When the snapshot covers more than a crash left in a partition, the batches
past the recovered end are forgotten (they were lost, so a retry of them must be stored).
Records and snapshot entries whose producer id is malformed or longer than
``maxProducerIdLength`` are ignored (no connection could have claimed them).
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
from notify.protocol import hotpath, records
from notify.protocol.accel import NATIVE
from notify.protocol.identity import Claim, ClaimReply, proves, split_id
from notify.protocol.properties import FLAG_PROPERTIES, record_producer
from notify.store.partition import Partition

log = logging.getLogger("notify.broker")

SNAPSHOT_FILE: Final = "producer-states.json"

_SCAN_WINDOW: Final = 1 << 20
#: Estimated bytes of one entry of the state besides its producer id (a last batch in its
#: partition's table and the LRU order, or a named identity's holder): measured with
#: tracemalloc in tests/broker/test_producer_identity.py.
ENTRY_BYTES: Final = 560
_REGISTRY: Final = ""  # the LRU key's partition slot of a named identity's holder
#: holders ``stats producers`` shows (the newest), which a slave learns every few seconds
HOLDERS_SHOWN: Final = 256


@dataclass(frozen=True, slots=True)
class Holder:
    """The instance that holds a named identity: the newest epoch claimed, and its
    instance token. A connection's claim keeps the very object it was given: a newer
    claim replaces it in the registry, and puts through the old one are fenced."""

    epoch: int
    instance: str


#: What an anonymous identity's connections hold (anonymous identities are never fenced).
ANONYMOUS: Final = Holder(0, "-")


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


#: the compiled batch reader when the build matches (notify.protocol.accel)
_producer_batch = NATIVE.producer_batch if NATIVE is not None else hotpath.producer_batch


def batch_producer(buf: bytes) -> tuple[str, int, int] | str | None:
    """The producer of whole validated records ``buf`` (an mput): ``(producer id, first
    sequence, last sequence)`` when every record names that id with consecutive sequences,
    None when none names a producer, else why the batch is refused (one compiled walk over
    the headers and each attribute's suffix: no Python per record; the broker's mput gets
    the same verdict from its check of the records, :func:`batch_verdict`)."""
    return batch_verdict(buf, *_producer_batch(buf))


def batch_verdict(
    buf: bytes, verdict: int, ps: int, pe: int, first: int, last: int
) -> tuple[str, int, int] | str | None:
    """:func:`batch_producer` from :func:`notify.protocol.hotpath.check_batch`'s answer."""
    if verdict == hotpath.NO_PRODUCER:
        return None
    if verdict == hotpath.MIXED_PRODUCERS:
        return (
            "an mput's records name one producer with consecutive sequences, or none; "
            "this one mixes them"
        )
    return buf[ps:pe].decode("ascii"), first, last


class ProducerStates:
    """The last batch of every idempotent producer per partition, the holders of named
    identities and which connections hold what (see module doc)."""

    def __init__(
        self,
        max_producers: int,
        max_bytes: int = 64 << 20,
        max_id_length: int = 128,
        max_per_connection: int = 1024,
    ):
        self.max_producers = max_producers
        self.max_bytes = max_bytes
        self.max_id_length = max_id_length
        self.max_per_connection = max_per_connection
        self._parts: dict[str, OrderedDict[str, LastBatch]] = {}
        #: every entry, least recently used first: (partition key, pid) of a last batch,
        #: ("", pid) of a named identity's holder
        self._order: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: named identity -> its holder
        self.named: dict[str, Holder] = {}
        self._newest: OrderedDict[str, None] = OrderedDict()  # holders set last
        #: producer id -> connections that hold it (their entries are not evicted)
        self._bound: dict[str, int] = {}
        self.bytes = 0
        #: counts state changes: the snapshot is written only when it (or an end) moved
        self.changes = 0
        self._saved: tuple[int, tuple[int, ...]] | None = None
        self.duplicates = 0
        self.evicted = 0
        self.refused = 0
        self.fenced = 0

    @staticmethod
    def key(part: Partition) -> str:
        return f"{part.topic}-{part.index}"

    # ------------------------------------------------------------------ identities

    def claim(self, held: dict[str, Holder], c: Claim) -> tuple[int, bytes]:
        """A connection holding ``held`` claims ``c``: ``(200, reply body)`` and ``held``
        updated, or ``(code, error text)``."""
        pid = c.producer_id
        if len(pid) > self.max_id_length:
            return 400, (
                f"producer id of {len(pid)} characters exceeds maxProducerIdLength "
                f"{self.max_id_length}"
            ).encode()
        if not proves(pid, c.secret):
            return 403, f"producer {pid}: the secret does not prove this id".encode()
        if pid not in held and len(held) >= self.max_per_connection:
            self.refused += 1
            return 503, (
                f"this connection holds {len(held)} producer identities "
                f"(maxProducerIdsPerConnection={self.max_per_connection})"
            ).encode()
        if not c.named:
            holder = ANONYMOUS
        else:
            cur = self.named.get(pid)
            if cur is not None and (cur.epoch, cur.instance) == (c.epoch, c.instance):
                holder = cur
                self._order.move_to_end((_REGISTRY, pid))
            elif cur is None or c.epoch > cur.epoch:
                if cur is None and not self._room(pid):
                    self.refused += 1
                    return 503, self._full(pid)
                holder = Holder(c.epoch, c.instance)
                self._set_holder(pid, holder)
                if cur is not None:
                    log.info(
                        "producer %s claimed by a newer instance (epoch %d > %d): the older "
                        "one is fenced",
                        pid,
                        c.epoch,
                        cur.epoch,
                    )
            else:
                self.fenced += 1
                return 409, self.fenced_text(pid, cur).encode()
        if pid not in held:
            self._bound[pid] = self._bound.get(pid, 0) + 1
        held[pid] = holder
        return 200, ClaimReply(pid, holder.epoch, self.sequences(pid)).encode()

    @staticmethod
    def fenced_text(pid: str, holder: Holder) -> str:
        return (
            f"fenced: producer {pid} is held by a newer instance (epoch {holder.epoch}); "
            "this instance must stop"
        )

    def _set_holder(self, pid: str, holder: Holder) -> None:
        if pid not in self.named:
            self.bytes += ENTRY_BYTES + len(pid)
        self.named[pid] = holder
        self._order[(_REGISTRY, pid)] = None
        self._order.move_to_end((_REGISTRY, pid))
        self._newest[pid] = None
        self._newest.move_to_end(pid)
        if len(self._newest) > HOLDERS_SHOWN:
            self._newest.popitem(last=False)
        self.changes += 1

    def newest_holders(self) -> list[tuple[str, object]]:
        """``stats producers``: the holders of the named identities claimed last (at most
        :data:`HOLDERS_SHOWN`, oldest first), ``<id> <epoch> <instance>``; a slave learns
        them every few seconds, so a promoted one fences the instances they replaced."""
        named = self.named
        return [
            (pid, f"{h.epoch} {h.instance}")
            for pid in self._newest
            if (h := named.get(pid)) is not None
        ]

    def learn_holder(self, pid: str, epoch: int, instance: str) -> None:
        """A slave learns its master's holder of ``pid`` (kept when newer than its own)."""
        cur = self.named.get(pid)
        if not self._usable(pid) or (cur is not None and cur.epoch >= epoch):
            return
        if cur is not None or self._room(pid):
            self._set_holder(pid, Holder(epoch, instance))

    def release(self, held: dict[str, Holder]) -> None:
        """A connection that held ``held`` closed."""
        bound = self._bound
        for pid in held:
            n = bound.get(pid, 0) - 1
            if n > 0:
                bound[pid] = n
            else:
                bound.pop(pid, None)
        held.clear()

    def refusal(self, held: dict[str, Holder] | None, pid: str) -> tuple[int, str] | None:
        """Why a connection holding ``held`` may not put as ``pid`` (None: it may)."""
        h = held.get(pid) if held else None
        if h is None:
            return 403, (
                f"producer {pid[:80]} is not claimed on this connection: send "
                "'producer <id> <secret> <epoch> <instance> <opaque>' first"
            )
        if h is not ANONYMOUS:
            cur = self.named.get(pid)
            if cur is not h:
                if cur is None:  # forgotten (state budget): the holder claims it again
                    self._set_holder(pid, h)
                    return None
                self.fenced += 1
                return 409, self.fenced_text(pid, cur)
        return None

    def sequences(self, pid: str) -> dict[tuple[str, int], int]:
        """The last sequence ``pid`` stored per ``(topic, partition)``."""
        out: dict[tuple[str, int], int] = {}
        for key, table in self._parts.items():
            b = table.get(pid)
            if b is not None:
                topic, _, index = key.rpartition("-")
                out[(topic, int(index))] = b.last_seq
        return out

    # ------------------------------------------------------------------ the budget

    def _full(self, pid: str) -> bytes:
        return (
            f"producer {pid}: the idempotent producers' state is full "
            f"(producerStateMaxBytes={self.max_bytes}); retry later"
        ).encode()

    def room_for(self, part: Partition, pid: str) -> bytes | None:
        """None when ``pid`` may store a batch in ``part`` (it has an entry there, or one
        fits the budget, making room by forgetting entries no connection holds); else the
        refusal's text (counted)."""
        table = self._parts.get(self.key(part))
        if table is not None and pid in table:
            return None
        if self._room(pid):
            return None
        self.refused += 1
        return self._full(pid)

    def _room(self, pid: str) -> bool:
        need = ENTRY_BYTES + len(pid)
        if self.bytes + need <= self.max_bytes:
            return True
        self._evict(need)
        return self.bytes + need <= self.max_bytes

    def _evict(self, need: int) -> None:
        """Forget the least recently used entries of identities no connection holds until
        ``need`` more bytes fit (held ones met on the way count as used now)."""
        order = self._order
        bound = self._bound
        tries = len(order)
        while order and self.bytes + need > self.max_bytes and tries > 0:
            tries -= 1
            (key, pid), _ = order.popitem(last=False)
            if pid in bound:
                order[(key, pid)] = None
                continue
            self.evicted += 1
            self.changes += 1
            self.bytes -= ENTRY_BYTES + len(pid)
            if key == _REGISTRY:
                self.named.pop(pid, None)
                self._newest.pop(pid, None)
            else:
                table = self._parts.get(key)
                if table is not None:
                    table.pop(pid, None)

    # ------------------------------------------------------------------ last batches

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
        key = self.key(part)
        table = self._parts.get(key)
        if table is None:
            table = self._parts[key] = OrderedDict()
        self.changes += 1
        if pid in table:
            table[pid] = batch
            table.move_to_end(pid)
            self._order.move_to_end((key, pid))
            return
        table[pid] = batch
        self._order[(key, pid)] = None
        self.bytes += ENTRY_BYTES + len(pid)
        while len(table) > self.max_producers:
            old, _ = table.popitem(last=False)
            self._order.pop((key, old), None)
            self.bytes -= ENTRY_BYTES + len(old)
            self.evicted += 1
        if self.bytes > self.max_bytes:  # a slave's or the scan's records: no one to refuse
            self._evict(0)

    def forget_from(self, part: Partition, offset: int) -> None:
        """Batches stored at or after ``offset`` were taken back (refused puts)."""
        table = self._parts.get(self.key(part))
        if table is not None:
            key = self.key(part)
            for pid in [p for p, b in table.items() if b.end_offset > offset]:
                del table[pid]
                self._order.pop((key, pid), None)
                self.bytes -= ENTRY_BYTES + len(pid)
                self.changes += 1

    def observe(self, part: Partition, buf: bytes | bytearray | memoryview, base: int) -> None:
        """Record the idempotent batches among whole records ``buf`` stored at ``base``
        (a slave's appends, the scan at start). Consecutive records of one producer form
        one batch."""
        if not has_properties(buf):
            return
        cur: tuple[str, int, int, int, int] | None = None  # pid, first, last, id, offset
        end = base
        longest = self.max_id_length
        for rec in records.decode_all(buf, base, verify=False)[0]:
            got = record_producer(rec.flag, rec.payload)
            if got is not None and (len(got[0]) > longest or split_id(got[0]) is None):
                got = None  # no connection could have claimed it
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
        doc: dict[str, Any] = {
            "version": 2,
            "named": {pid: [h.epoch, h.instance] for pid, h in self.named.items()},
            "partitions": {},
        }
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

    def snapshot_if_changed(
        self, parts: list[Partition]
    ) -> tuple[tuple[int, tuple[int, ...]], bytes] | None:
        """``(mark, snapshot)`` when the state or a partition's end moved since the last
        :meth:`saved` mark, else None (an idle broker writes nothing)."""
        mark = (self.changes, tuple(p.end for p in parts))
        if mark == self._saved:
            return None
        return mark, self.snapshot(parts)

    def saved(self, mark: tuple[int, tuple[int, ...]]) -> None:
        """The snapshot of ``mark`` is on disk."""
        self._saved = mark

    def save(self, data_dir: Path, snapshot: bytes, fs: FileSystem = OS_FS) -> None:
        """Write a :meth:`snapshot` atomically (off the loop)."""
        write_file_atomically(fs, data_dir / SNAPSHOT_FILE, snapshot)

    def _usable(self, pid: object) -> bool:
        return isinstance(pid, str) and len(pid) <= self.max_id_length and bool(split_id(pid))

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
        if not isinstance(doc, dict):
            doc = {}
        dropped = 0
        for pid, (epoch, instance) in dict(doc.get("named") or {}).items():
            if self._usable(pid):
                self._set_holder(pid, Holder(int(epoch), str(instance)))
            else:
                dropped += 1
        saved = doc.get("partitions", {})
        for part in parts:
            entry = saved.get(self.key(part))
            if entry is None:
                if saved:  # created after the snapshot (a topic added at runtime): all of it
                    self._scan(part, part.min_offset, part.end)
                continue
            end = part.end
            forgotten = 0
            for pid, v in entry["producers"].items():
                if not self._usable(pid):
                    dropped += 1
                    continue
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
        if dropped:
            log.warning(
                "idempotent producers: %d snapshot entries with ids no connection can claim "
                "(malformed, or over maxProducerIdLength %d) dropped",
                dropped,
                self.max_id_length,
            )

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
