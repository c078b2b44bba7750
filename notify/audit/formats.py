"""Readers of the broker's files as columns: no Spark here, only bytes to Python lists.

Two inputs, each read one file at a time (one Spark input partition per file):

* partition segments ``<dataPath>/<topic>-<partition>/<20-digit start>.meta`` (layout in
  :mod:`notify.protocol.records`): one row per record. A record whose payload CRC does not match
  its header keeps its row (``checksum_ok`` false) as long as its length is sane; where the
  framing itself breaks (negative length, a length past the end of the file, a zero-filled
  area) one row with ``error`` set and no ``msg_id`` ends the file.
* redo transaction logs ``<dir>/redo.<N>`` (frames of :mod:`txlog.records`, bodies of
  :mod:`notify.protocol.logrecords`) and the ``checkpoint`` file: one row per frame; a frame that
  cannot be read ends its file with a ``CORRUPT`` row.

Times: PREPARE and COMMIT carry their own time; APPEND_MSG gets the time encoded in its first
message id (:func:`notify.protocol.idgen.split_id`), and so does every partition record.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from notify.protocol import accel, hotpath
from notify.protocol import logrecords as lr
from notify.protocol.idgen import BROKER_BITS, EPOCH_MS, SEQ_BITS
from notify.protocol.records import FLAG_ATTRIBUTE, HEADER, HEADER_SIZE
from notify.store.segment import NAME_DIGITS, parse_segment_name
from notify.txlog.checkpoint import CHECKPOINT_FILE, read_checkpoints
from notify.txlog.records import DEFAULT_MAX_RECORD_BYTES, CorruptReason, header_error
from notify.txlog.segment import list_segments, segment_path

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "KINDS",
    "LOG_COLUMNS",
    "TXLOG_COLUMNS",
    "SegmentFile",
    "TxlogColumns",
    "TxlogFile",
    "find_segments",
    "find_txlog_files",
    "id_time_ms",
    "read_segment",
    "read_txlog_file",
]

_ID_SHIFT: Final = BROKER_BITS + SEQ_BITS
_CRC_MASK: Final = 0x7FFFFFFF
_ATTR_LEN = struct.Struct(">i")
_PART_DIR: Final = re.compile(r"(.+)-(0|[1-9][0-9]*)")
#: Bytes read from a segment at a time (records never span segment files).
CHUNK: Final = 16 * 2**20
#: Suffix of a segment kept by the retention ``archive`` policy (a hard link of the segment,
#: same bytes): read like the live segment it was.
ARCHIVED: Final = ".arc"
#: Rows handed to Spark per Arrow batch.
BATCH_ROWS: Final = 32_768

KINDS: Final[dict[int, str]] = {
    lr.APPEND_MSG: "APPEND_MSG",
    lr.PREPARE: "PREPARE",
    lr.COMMIT: "COMMIT",
    lr.ROLLBACK: "ROLLBACK",
    lr.FORGET: "FORGET",
    lr.APPLIED: "APPLIED",
    lr.HEURISTIC: "HEURISTIC",
}


def id_time_ms(msg_id: int) -> int:
    """Unix milliseconds a broker message id was made at."""
    return (msg_id >> _ID_SHIFT) + EPOCH_MS


# ---------------------------------------------------------------------------- segments

#: (name, Spark SQL type) of the ``notify-log`` rows; ``payload`` only with the option.
LOG_COLUMNS: Final[list[tuple[str, str]]] = [
    ("topic", "string"),
    ("partition", "int"),
    ("file", "string"),
    ("segment_start", "long"),
    ("offset", "long"),
    ("msg_id", "long"),
    ("flag", "int"),
    ("checksum", "int"),
    ("checksum_ok", "boolean"),
    ("attribute", "string"),
    ("size", "int"),
    ("time_ms", "long"),
    ("error", "string"),
]


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment file of a partition; ``last`` when it is the partition's newest."""

    path: str
    topic: str
    partition: int
    start: int
    last: bool
    size: int

    @property
    def key(self) -> str:
        """What names the segment whatever its file is called (live or archived)."""
        return f"{self.topic}-{self.partition}/{self.start:0{NAME_DIGITS}d}"


def find_segments(
    data_path: str | os.PathLike[str], topics: set[str] | None = None
) -> list[SegmentFile]:
    """The segment files under ``data_path``, biggest first (so Spark starts the long tasks
    first). ``data_path`` may also be one partition directory."""
    root = Path(data_path)
    if not root.is_dir():
        raise FileNotFoundError(f"data directory {root} does not exist")
    dirs = (
        [root]
        if _PART_DIR.fullmatch(root.name) and _has_segments(root)
        else sorted(p for p in root.iterdir() if p.is_dir() and _PART_DIR.fullmatch(p.name))
    )
    out: list[SegmentFile] = []
    for d in dirs:
        m = _PART_DIR.fullmatch(d.name)
        assert m is not None
        topic, partition = m.group(1), int(m.group(2))
        if topics is not None and topic not in topics:
            continue
        names: dict[int, str] = {}
        for n in os.listdir(d):
            s = _segment_start(n)
            if s is not None and (s not in names or not n.endswith(ARCHIVED)):
                names[s] = n  # the live name wins over its archived link
        starts = sorted(names)
        for i, s in enumerate(starts):
            p = d / names[s]
            out.append(
                SegmentFile(str(p), topic, partition, s, i == len(starts) - 1, p.stat().st_size)
            )
    out.sort(key=lambda f: (-f.size, f.path))
    return out


def _segment_start(name: str) -> int | None:
    if name.endswith(ARCHIVED):
        name = name[: -len(ARCHIVED)]
    return parse_segment_name(name)


def _has_segments(d: Path) -> bool:
    return any(_segment_start(n) is not None for n in os.listdir(d))


class SegmentRecords:
    """The records of one segment file from ``start`` (a record boundary), a chunk at a
    time: iterating yields ``(base, buf, starts, oks)``, the chunk ``buf`` read at file
    position ``base``, the positions in it of its records (framing intact: ``HEADER`` and
    ``length`` bytes) and whether each one's CRC matches. A record whose framing is broken
    ends the walk: afterwards :attr:`error` says why (None for a clean end) and
    :attr:`error_at` at which file position."""

    def __init__(self, path: str | os.PathLike[str], start: int = 0):
        self.path = path
        self.start = start
        self.error: str | None = None
        self.error_at = 0

    def __iter__(self) -> Iterator[tuple[int, bytes, list[int], list[bool]]]:
        unpack = HEADER.unpack_from
        crc32 = zlib.crc32
        hs = HEADER_SIZE
        error: str | None = None
        error_at = 0
        with open(self.path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if self.start:
                f.seek(self.start)
            base = self.start  # file position of buf[0]
            buf = b""
            while True:
                data = f.read(CHUNK)
                buf = buf + data if buf else data
                mv = memoryview(buf)
                n = len(buf)
                pos = 0
                at_eof = not data or base + n >= file_size
                starts: list[int] = []
                oks: list[bool] = []
                while n - pos >= hs:
                    # the ordinary records in one compiled loop; the loop below handles
                    # what stopped it
                    pos = walk_records(buf, pos, starts, oks)
                    if n - pos < hs:
                        break
                    length, crc, mid, _flag = unpack(buf, pos)
                    end = pos + hs + length
                    if length <= 0 or end > n:
                        if length < 0:
                            error = f"bad length {length}"
                            break
                        if length == 0 and mid == 0 and crc == 0:
                            error = "zero-filled area"
                            break
                        if end > n:
                            break
                    starts.append(pos)
                    oks.append(crc32(mv[pos + hs : end]) & _CRC_MASK == crc)
                    pos = end
                mv.release()
                if starts:
                    yield base, buf, starts, oks
                if error is not None:
                    error_at = base + pos
                    break
                base += pos
                buf = buf[pos:]
                if at_eof:
                    if buf:
                        error = (
                            "zero-filled area"
                            if not any(buf)
                            else ("incomplete header" if len(buf) < hs else "incomplete record")
                        )
                        error_at = base
                    break
        self.error, self.error_at = error, error_at


def read_segment(
    seg: SegmentFile,
    with_payload: bool = False,
    batch_rows: int = BATCH_ROWS,
    start: int = 0,
) -> Iterator[dict[str, list[Any]]]:
    """Rows of one segment file as column lists, ``batch_rows`` rows at a time.

    ``start``: file position to begin at (a record boundary, e.g. where an earlier read
    stopped). The loop keeps only what needs each record (framing, CRC); the derived columns
    (size, time) are computed per batch.
    """
    names = [n for n, _ in LOG_COLUMNS] + (["payload"] if with_payload else [])
    unpack = HEADER.unpack_from
    hs = HEADER_SIZE
    offs: list[int] = []
    ids: list[int] = []
    flags: list[int] = []
    crcs: list[int] = []
    oks: list[bool] = []
    lens: list[int] = []
    attrs: dict[int, str] = {}
    payloads: list[bytes] = []
    payload = payloads if with_payload else None
    walk = SegmentRecords(seg.path, start)
    for base, buf, starts, chunk_oks in walk:
        seg_base = seg.start + base
        for pos, ok in zip(starts, chunk_oks, strict=True):
            length, crc, mid, flag = unpack(buf, pos)
            end = pos + hs + length
            offs.append(seg_base + pos)
            ids.append(mid)
            flags.append(flag)
            crcs.append(crc)
            oks.append(ok)
            lens.append(length)
            if flag & FLAG_ATTRIBUTE and length >= 4:
                (alen,) = _ATTR_LEN.unpack_from(buf, pos + hs)
                if 0 <= alen <= length - 4:
                    a0 = pos + hs + 4
                    attrs[len(ids) - 1] = buf[a0 : a0 + alen].decode("utf-8", "replace")
            if with_payload:
                payloads.append(buf[pos + hs : end])
            if len(ids) >= batch_rows:
                yield _segment_batch(seg, offs, ids, flags, crcs, oks, lens, attrs, payload)
                offs, ids, flags, crcs, oks, lens, payloads = [], [], [], [], [], [], []
                attrs = {}
                payload = payloads if with_payload else None
    error, error_at = walk.error, walk.error_at
    if ids or error is not None:
        cols = _segment_batch(seg, offs, ids, flags, crcs, oks, lens, attrs, payload)
        if error is not None:  # one row with the place and why ends the file
            consts = {"topic": seg.topic, "partition": seg.partition, "file": seg.path}
            consts["segment_start"] = seg.start
            consts["offset"] = seg.start + error_at
            consts["error"] = f"{error} at file position {error_at}"
            for name in names:
                cols[name].append(consts.get(name))
        yield cols


def _segment_batch(
    seg: SegmentFile,
    offs: list[int],
    ids: list[int],
    flags: list[int],
    crcs: list[int],
    oks: list[bool],
    lens: list[int],
    attrs: dict[int, str],
    payloads: list[bytes] | None,
) -> dict[str, list[Any]]:
    rows = len(ids)
    attr: list[str | None] = [None] * rows
    for i, a in attrs.items():
        attr[i] = a
    cols: dict[str, list[Any]] = {
        "topic": [seg.topic] * rows,
        "partition": [seg.partition] * rows,
        "file": [seg.path] * rows,
        "segment_start": [seg.start] * rows,
        "offset": offs,
        "msg_id": ids,
        "flag": flags,
        "checksum": crcs,
        "checksum_ok": oks,
        "attribute": attr,
        "size": [HEADER_SIZE + n for n in lens],
        "time_ms": [(m >> _ID_SHIFT) + EPOCH_MS for m in ids],
        "error": [None] * rows,
    }
    if payloads is not None:
        cols["payload"] = payloads
    return cols


# ---------------------------------------------------------------------------- redo logs

#: (name, Spark SQL type) of the ``notify-txlog`` rows.
TXLOG_COLUMNS: Final[list[tuple[str, str]]] = [
    ("file", "string"),
    ("file_no", "long"),
    ("position", "long"),
    ("type", "int"),
    ("kind", "string"),
    ("tx_key", "string"),
    ("time_ms", "long"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("msg_count", "int"),
    ("msg_ids", "array<long>"),
    ("checksums", "array<int>"),
    ("sizes", "array<int>"),
    ("placements", "array<struct<topic:string,partition:int,offset:long,count:int,bytes:long>>"),
    ("hints", "array<struct<topic:string,partition:int,hint:long>>"),
    ("timeout_s", "int"),
    ("producer_group", "string"),
    ("reason", "string"),
    ("outcome", "string"),
    ("crc", "long"),
    ("size", "int"),
    ("error", "string"),
]
TXLOG_NAMES: Final = [n for n, _ in TXLOG_COLUMNS]
_TXLOG_NAME: Final = re.compile(r"redo\.(0|[1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class TxlogFile:
    """A ``redo.<N>`` file (``file_no`` N) or the ``checkpoint`` file (``file_no`` -1)."""

    path: str
    file_no: int
    last: bool
    size: int

    @property
    def key(self) -> str:
        """``redo.<N>`` (``checkpoint`` for the checkpoint file)."""
        return f"redo.{self.file_no}" if self.file_no >= 0 else CHECKPOINT_FILE


def txlog_dir(path: str | os.PathLike[str]) -> Path:
    """The directory holding ``redo.<N>``: ``path`` itself or its ``transactions`` child (so
    a broker's dataLogPath or dataPath works too)."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"transaction log directory {p} does not exist")
    if not list_segments(p) and (p / "transactions").is_dir():
        return p / "transactions"
    return p


def find_txlog_files(path: str | os.PathLike[str], checkpoint: bool = True) -> list[TxlogFile]:
    """The redo files (and the checkpoint file) of a transaction log directory."""
    d = txlog_dir(path)
    numbers = list_segments(d)
    out = [
        TxlogFile(
            str(segment_path(d, n)), n, i == len(numbers) - 1, segment_path(d, n).stat().st_size
        )
        for i, n in enumerate(numbers)
    ]
    if checkpoint and (d / CHECKPOINT_FILE).is_file():
        out.append(
            TxlogFile(str(d / CHECKPOINT_FILE), -1, False, (d / CHECKPOINT_FILE).stat().st_size)
        )
    out.sort(key=lambda f: (-f.size, f.file_no))
    return out


_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_II = struct.Struct(">II")
_FRAME = struct.Struct(">II")
#: the walks over intact redo frames and ordinary records (compiled when built)
intact_frames = (accel.NATIVE or hotpath).intact_frames
walk_records = (accel.NATIVE or hotpath).walk_records
_PREP = struct.Struct(">qI")
_I64_U16 = struct.Struct(">qH")
_HINT = struct.Struct(">Iq")
_PLACE = struct.Struct(">IqIQ")
_SCALARS: Final = [
    n for n, t in TXLOG_COLUMNS if not t.startswith("array") and n not in ("file", "file_no")
]


def _str(b: bytes, p: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(b, p)
    p += 2
    if p + n > len(b):
        raise ValueError("string runs past the record")
    return b[p : p + n].decode("utf-8"), p + n


_APPEND_MSG: Final = lr.APPEND_MSG
_COMMIT: Final = lr.COMMIT
_APPLIED: Final = lr.APPLIED
_PREPARE: Final = lr.PREPARE
_ROLLBACK: Final = lr.ROLLBACK
_LISTS_OF: Final = {"APPEND_MSG": 0, "APPLIED": 1, "COMMIT": 2}


Row = tuple[Any, ...]


def _row(
    position: int,
    rtype: int,
    kind: str,
    key: str | None,
    crc: int,
    size: int,
    *,
    time_ms: int | None = None,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    msg_count: int | None = None,
    timeout: int | None = None,
    group: str | None = None,
    reason: str | None = None,
    outcome: str | None = None,
    error: str | None = None,
) -> Row:
    """A redo row's scalar columns in :data:`_SCALARS` order."""
    return (
        position,
        rtype,
        kind,
        key,
        time_ms,
        topic,
        partition,
        offset,
        msg_count,
        timeout,
        group,
        reason,
        outcome,
        crc,
        size,
        error,
    )


class TxlogColumns:
    """Rows of one redo file, built for Arrow: one tuple of the scalar columns per row
    (:data:`_SCALARS` order) and the list columns kept flat (values plus per-row offsets).
    Layouts of the bodies: :mod:`notify.protocol.logrecords`."""

    def __init__(self, f: TxlogFile):
        self.file = f
        self.tuples: list[tuple[Any, ...]] = []
        # msg_ids / checksums / sizes share offsets
        self.ids: list[int] = []
        self.crcs: list[int] = []
        self.sizes: list[int] = []
        self.ids_off: list[int] = [0]
        self.pl: tuple[list[str], list[int], list[int], list[int], list[int]] = ([], [], [], [], [])
        self.pl_off: list[int] = [0]
        self.h: tuple[list[str], list[int], list[int]] = ([], [], [])
        self.h_off: list[int] = [0]
        self.broken: set[int] = set()  # rows whose body could not be decoded

    @property
    def rows(self) -> int:
        return len(self.tuples)

    def columns(self) -> dict[str, list[Any]]:
        """The scalar columns by name."""
        if not self.tuples:
            return {n: [] for n in _SCALARS}
        return {n: list(v) for n, v in zip(_SCALARS, zip(*self.tuples, strict=True), strict=True)}

    def valid(self, which: int) -> list[bool]:
        """Per row: whether list column group ``which`` (0 messages, 1 placements, 2 hints)
        is set (its record kind has it and decoded)."""
        return [not x for x in self.invalid(which)]

    def invalid(self, which: int) -> list[bool]:
        """The negation of :meth:`valid` (Arrow's null mask)."""
        kind = ("APPEND_MSG", "APPLIED", "COMMIT")[which]
        out = [t[2] != kind for t in self.tuples]
        for i in self.broken:
            out[i] = True
        return out

    def _end_row(self, row: tuple[Any, ...]) -> None:
        self.tuples.append(row)
        self.ids_off.append(len(self.ids))
        self.pl_off.append(len(self.pl[0]))
        self.h_off.append(len(self.h[0]))

    def special(
        self,
        position: int,
        kind: str,
        size: int | None,
        error: str | None,
        time_ms: int | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self._end_row(
            (
                position,
                None,
                kind,
                None,
                time_ms,
                None,
                partition,
                offset,
                None,
                None,
                None,
                None,
                None,
                None,
                size,
                error,
            )
        )

    def add(self, position: int, b: bytes, crc: int) -> None:
        """One intact frame: ``b`` is its type byte and body."""
        rtype = b[0]
        size = 8 + len(b)
        row: tuple[Any, ...]
        try:
            key, p = _str(b, 1)
            decode = self._DECODERS.get(rtype)
            if decode is None:
                row = _row(position, rtype, KINDS.get(rtype) or f"TYPE_{rtype}", key, crc, size)
            else:
                row = decode(self, b, p, position, key, crc, size)
        except (ValueError, UnicodeDecodeError, struct.error, IndexError) as e:
            row = self._undecodable(position, b, crc, size, e)
        self._end_row(row)

    def _undecodable(self, position: int, b: bytes, crc: int, size: int, e: Exception) -> Row:
        """The row of a frame whose body does not decode (its key when it has one), with
        the list values a failed decode may have added dropped."""
        rtype = b[0]
        kind = KINDS.get(rtype) or f"TYPE_{rtype}"
        key: str | None = None
        with contextlib.suppress(Exception):
            key = lr.key_of(b[1:])
        del self.ids[self.ids_off[-1] :], self.crcs[self.ids_off[-1] :]
        del self.sizes[self.ids_off[-1] :]
        for col in self.pl:
            del col[self.pl_off[-1] :]
        for hcol in self.h:
            del hcol[self.h_off[-1] :]
        self.broken.add(len(self.tuples))
        return _row(position, rtype, kind, key, crc, size, error=f"undecodable {kind} body: {e}")

    def _append_msg(self, b: bytes, p: int, position: int, key: str, crc: int, size: int) -> Row:
        """APPEND_MSG: topic, partition, count, then whole records to the end of the body
        (their ids, checksums and sizes go to the list columns)."""
        topic, p = _str(b, p)
        part, count = _II.unpack_from(b, p)
        p += 8
        n = len(b)
        ids, crcs, sizes = self.ids, self.crcs, self.sizes
        unpack = HEADER.unpack_from
        start = len(ids)
        while n - p >= HEADER_SIZE:
            length, mcrc, mid, _flag = unpack(b, p)
            end = p + HEADER_SIZE + length
            if length < 0 or end > n:
                break
            ids.append(mid)
            crcs.append(mcrc)
            sizes.append(HEADER_SIZE + length)
            p = end
        got = len(ids) - start
        err = (
            None
            if got == count and p == n
            else f"APPEND_MSG says {count} records but holds {got} whole ones"
        )
        t = (ids[start] >> _ID_SHIFT) + EPOCH_MS if got else None
        return _row(
            position,
            _APPEND_MSG,
            "APPEND_MSG",
            key,
            crc,
            size,
            time_ms=t,
            topic=topic,
            partition=part,
            msg_count=count,
            error=err,
        )

    def _commit(self, b: bytes, p: int, position: int, key: str, crc: int, size: int) -> Row:
        """COMMIT: decided at, then its hints (one alone is also on the row)."""
        at, k = _I64_U16.unpack_from(b, p)
        p += 10
        ht, hp, hh = self.h
        for _ in range(k):
            topic, p = _str(b, p)
            part, hint = _HINT.unpack_from(b, p)
            p += 12
            ht.append(topic)
            hp.append(part)
            hh.append(hint)
        one = k == 1
        return _row(
            position,
            _COMMIT,
            "COMMIT",
            key,
            crc,
            size,
            time_ms=at,
            topic=ht[-1] if one else None,
            partition=hp[-1] if one else None,
            offset=hh[-1] if one else None,
        )

    def _applied(self, b: bytes, p: int, position: int, key: str, crc: int, size: int) -> Row:
        """APPLIED: its placements (one alone is also on the row); ``msg_count`` is the sum
        of their counts."""
        (k,) = _U16.unpack_from(b, p)
        p += 2
        pt, pp, po, pc, pb = self.pl
        total = 0
        for _ in range(k):
            topic, p = _str(b, p)
            part, off, cnt, nbytes = _PLACE.unpack_from(b, p)
            p += 24
            pt.append(topic)
            pp.append(part)
            po.append(off)
            pc.append(cnt)
            pb.append(nbytes)
            total += cnt
        one = k == 1
        return _row(
            position,
            _APPLIED,
            "APPLIED",
            key,
            crc,
            size,
            topic=pt[-1] if one else None,
            partition=pp[-1] if one else None,
            offset=po[-1] if one else None,
            msg_count=total,
        )

    def _prepare(self, b: bytes, p: int, position: int, key: str, crc: int, size: int) -> Row:
        """PREPARE: at, timeout, producer group."""
        at, timeout = _PREP.unpack_from(b, p)
        group, p = _str(b, p + 12)
        return _row(
            position, _PREPARE, "PREPARE", key, crc, size, time_ms=at, timeout=timeout, group=group
        )

    def _rollback(self, b: bytes, p: int, position: int, key: str, crc: int, size: int) -> Row:
        """ROLLBACK: the reason."""
        reason, p = _str(b, p)
        return _row(position, _ROLLBACK, "ROLLBACK", key, crc, size, reason=reason)

    def _heuristic(self, b: bytes, p: int, position: int, key: str, crc: int, size: int) -> Row:
        """HEURISTIC: who decided (``reason``) and the outcome."""
        h = lr.Heuristic.decode(b[1:])
        outcome = "commit" if h.commit else "rollback"
        return _row(
            position, lr.HEURISTIC, "HEURISTIC", key, crc, size, reason=h.by, outcome=outcome
        )

    _DECODERS: Final[dict[int, Callable[..., Row]]] = {
        _APPEND_MSG: _append_msg,
        _COMMIT: _commit,
        _APPLIED: _applied,
        _PREPARE: _prepare,
        _ROLLBACK: _rollback,
        lr.HEURISTIC: _heuristic,
    }

    def to_rows(self) -> list[dict[str, Any]]:
        """The rows as dicts over :data:`TXLOG_NAMES` (for tests and debugging)."""
        out = []
        msgs, places, hints = self.valid(0), self.valid(1), self.valid(2)
        for i, t in enumerate(self.tuples):
            row: dict[str, Any] = {"file": self.file.path, "file_no": self.file.file_no}
            row.update(zip(_SCALARS, t, strict=True))
            a, z = self.ids_off[i], self.ids_off[i + 1]
            row["msg_ids"] = self.ids[a:z] if msgs[i] else None
            row["checksums"] = self.crcs[a:z] if msgs[i] else None
            row["sizes"] = self.sizes[a:z] if msgs[i] else None
            a, z = self.pl_off[i], self.pl_off[i + 1]
            row["placements"] = (
                [
                    {
                        "topic": self.pl[0][j],
                        "partition": self.pl[1][j],
                        "offset": self.pl[2][j],
                        "count": self.pl[3][j],
                        "bytes": self.pl[4][j],
                    }
                    for j in range(a, z)
                ]
                if places[i]
                else None
            )
            a, z = self.h_off[i], self.h_off[i + 1]
            row["hints"] = (
                [
                    {"topic": self.h[0][j], "partition": self.h[1][j], "hint": self.h[2][j]}
                    for j in range(a, z)
                ]
                if hints[i]
                else None
            )
            out.append(row)
        return out


class TxlogFrames:
    """The intact frames of one redo file from ``start`` (a frame boundary), a chunk at a
    time: iterating yields ``(base, buf, frames)``, the chunk ``buf`` read at file position
    ``base`` and the positions in it of its intact frames (each ``length:u32 · crc:u32 ·
    payload``, checked as :func:`txlog.records.decode` does). The first frame that is not
    intact ends the walk: afterwards :attr:`error` says why (a :class:`CorruptReason`, None
    for a clean end) and :attr:`error_at` where; :attr:`file_size` is the file's size."""

    def __init__(self, path: str | os.PathLike[str], max_record_bytes: int, start: int = 0):
        self.path = path
        self.max_length = max_record_bytes + 1
        self.start = start
        self.error: str | None = None
        self.error_at = start
        self.file_size = 0

    def __iter__(self) -> Iterator[tuple[int, bytes, list[int]]]:
        crc32 = zlib.crc32
        unpack = _FRAME.unpack_from
        max_length = self.max_length
        error: str | None = None
        with open(self.path, "rb") as fh:
            file_size = self.file_size = os.fstat(fh.fileno()).st_size
            if self.start:
                fh.seek(self.start)
            base = self.start
            buf = b""
            while True:
                data = fh.read(CHUNK)
                buf = buf + data if buf else data
                n = len(buf)
                at_eof = not data or base + n >= file_size
                pos = 0
                frames: list[int] = []
                mv = memoryview(buf)
                while n - pos >= 8:
                    # the intact frames in one compiled loop; the check below says what
                    # stopped it (the frame there is never one that check passes)
                    pos = intact_frames(buf, pos, max_length, frames)
                    if n - pos < 8:
                        break
                    length, crc = unpack(buf, pos)
                    error = header_error(length, crc, max_length)
                    if error is not None:
                        break
                    end = pos + 8 + length
                    if end > n:
                        break
                    if crc32(mv[pos + 8 : end]) != crc:
                        error = CorruptReason.CRC_MISMATCH
                        break
                    if buf[pos + 8] == 0:
                        error = CorruptReason.BAD_TYPE
                        break
                    frames.append(pos)
                    pos = end
                mv.release()
                if frames:
                    yield base, buf, frames
                base += pos
                buf = buf[pos:]
                if error is not None:
                    break
                if at_eof:
                    if buf:
                        error = (
                            CorruptReason.ZERO_FILLED
                            if not any(buf)
                            else (
                                CorruptReason.TRUNCATED_HEADER
                                if len(buf) < 8
                                else CorruptReason.TRUNCATED_RECORD
                            )
                        )
                    break
        self.error, self.error_at = error, base

    def corrupt_row(self, cols: TxlogColumns) -> None:
        """After the walk: the ``CORRUPT`` row saying why it ended early, if it did."""
        if self.error is not None:
            at = self.error_at
            cols.special(at, "CORRUPT", self.file_size - at, f"{self.error} at position {at}")


def read_txlog_file(
    f: TxlogFile,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    batch_rows: int = BATCH_ROWS,
    start: int = 0,
) -> Iterator[TxlogColumns]:
    """Rows of one redo (or the checkpoint) file, ``batch_rows`` at a time.

    Frames are checked as :func:`txlog.records.decode` does (:class:`TxlogFrames`); the
    first frame that is not intact ends the file with a ``CORRUPT`` row saying why.
    ``start``: the file position to begin at (a frame boundary where an earlier read
    stopped; ignored for the checkpoint).
    """
    cols = TxlogColumns(f)
    if f.file_no < 0:
        _checkpoint_rows(cols, max_record_bytes)
        yield cols
        return
    unpack = _FRAME.unpack_from
    walk = TxlogFrames(f.path, max_record_bytes, start)
    for base, buf, frames in walk:
        for pos in frames:
            length, crc = unpack(buf, pos)
            cols.add(base + pos, buf[pos + 8 : pos + 8 + length], crc)
            if cols.rows >= batch_rows:
                yield cols
                cols = TxlogColumns(f)
    walk.corrupt_row(cols)
    if cols.rows:
        yield cols


def _checkpoint_rows(cols: TxlogColumns, max_record_bytes: int) -> None:
    d = Path(cols.file.path).parent
    cps, damaged = read_checkpoints(d, max_record_bytes)
    for i, cp in enumerate(cps):
        # replay starts in redo.<partition> at byte <offset>
        cols.special(
            i,
            "CHECKPOINT",
            len(cp.state),
            None,
            time_ms=int(cp.created * 1000),
            partition=cp.position.file_no,
            offset=cp.position.offset,
        )
    if damaged:
        cols.special(len(cps), "CORRUPT", None, f"{damaged} damaged checkpoint entries")


def redo_number(name: str) -> int | None:
    m = _TXLOG_NAME.fullmatch(name)
    return int(m.group(1)) if m else None
