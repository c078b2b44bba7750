"""Bulk (vectorised) decoding of redo files into Arrow record batches.

The record-at-a-time reader :func:`notify.audit.formats.read_txlog_file` builds Python
objects for every frame, body field and message (about 13 µs a record with the Arrow
conversion). Here one short Python loop finds the frame boundaries and checks each frame's
CRC (as :func:`txlog.records.decode` does); every field is then read for all frames of a
chunk at once with numpy gathers at computed offsets, the lists inside a body (the records of
an APPEND_MSG, the hints of a COMMIT, the placements of an APPLIED) by advancing one pointer
per frame together, and the string columns are built from (start, length) pairs straight into
Arrow buffers. The rows are those of the record-at-a-time reader, column for column
(``tests/audit/test_bulk.py`` compares both on real and damaged logs).

The byte layouts are not restated: field offsets and widths come from the ``struct`` formats
of :mod:`notify.audit.formats` (which take them from :mod:`notify.protocol.logrecords` and
:mod:`notify.protocol.records`). Frames of any other kind (HEURISTIC, FORGET, unknown
types) and frames whose body does not decode are handed to
:meth:`~notify.audit.formats.TxlogColumns.add`, so their rows and error messages are exactly
the record-at-a-time reader's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from notify.audit import formats
from notify.audit.formats import TxlogColumns, TxlogFile
from notify.protocol import logrecords as lr
from notify.protocol.idgen import EPOCH_MS
from notify.protocol.records import FLAG_ATTRIBUTE, HEADER, HEADER_SIZE
from notify.txlog.records import DEFAULT_MAX_RECORD_BYTES

__all__ = ["arrow_schema", "read_txlog_batches", "txlog_batch"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_NP: Final = {"B": "u1", "H": "u2", "i": "i4", "I": "u4", "q": "i8", "Q": "u8"}


def _fields(st: struct.Struct) -> list[tuple[int, str]]:
    """(offset, numpy big-endian dtype) of each field of a ``>``-ordered struct format."""
    fmt = st.format
    order, chars = fmt[0], fmt[1:]
    assert order == ">", fmt
    return [(struct.calcsize(order + chars[:i]), ">" + _NP[c]) for i, c in enumerate(chars)]


_FRAME_F: Final = _fields(formats._FRAME)  # length, crc
_FRAME_SIZE: Final = formats._FRAME.size
_U16: Final = ">u2"
_STR_LEN: Final = formats._U16.size
_REC_F: Final = _fields(HEADER)  # length, crc, id, flag
_PART_COUNT_F: Final = _fields(formats._II)  # APPEND_MSG partition, count
_PREP_F: Final = _fields(formats._PREP)  # prepared_at_ms, timeout_s
_AT_K_F: Final = _fields(formats._I64_U16)  # COMMIT decided_at_ms, n
_HINT_F: Final = _fields(formats._HINT)  # partition, hint
_PLACE_F: Final = _fields(formats._PLACE)  # partition, offset, count, bytes
_ID_SHIFT: Final = formats._ID_SHIFT
#: Rows per Arrow batch handed to Spark (a chunk's rows are decoded at once, then sliced).
_OUT_ROWS: Final = 4 * formats.BATCH_ROWS
_VECTOR_KINDS: Final = (lr.APPEND_MSG, lr.COMMIT, lr.APPLIED, lr.PREPARE, lr.ROLLBACK)


def arrow_schema(columns: list[tuple[str, str]]) -> Any:
    """The Arrow schema of ``(name, Spark SQL type)`` columns of the data sources."""
    place = pa.struct(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("count", pa.int32()),
            ("bytes", pa.int64()),
        ]
    )
    hint = pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("hint", pa.int64())])
    simple = {
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        "boolean": pa.bool_(),
        "binary": pa.binary(),
        "array<long>": pa.list_(pa.int64()),
        "array<int>": pa.list_(pa.int32()),
    }
    fields = []
    for name, t in columns:
        if t in simple:
            fields.append(pa.field(name, simple[t]))
        elif t.startswith("array<struct<topic:string,partition:int,offset"):
            fields.append(pa.field(name, pa.list_(place)))
        else:
            fields.append(pa.field(name, pa.list_(hint)))
    return pa.schema(fields)


TXLOG_SCHEMA: Final = arrow_schema(formats.TXLOG_COLUMNS)


def txlog_batch(cols: TxlogColumns, schema: Any = TXLOG_SCHEMA) -> Any:
    """An Arrow record batch of :data:`~notify.audit.formats.TXLOG_COLUMNS` from the
    record-at-a-time reader's columns."""
    n = cols.rows
    nulls = {w: pa.array(cols.invalid(w), pa.bool_()) for w in (0, 1, 2)}

    def lists(offsets: list[int], which: int, values: Any) -> Any:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=nulls[which])

    arrays: list[Any] = []
    scalars = cols.columns()
    for fl in schema:
        name = fl.name
        if name == "file":
            arrays.append(pa.repeat(pa.scalar(cols.file.path, pa.string()), n))
        elif name == "file_no":
            arrays.append(pa.repeat(pa.scalar(cols.file.file_no, pa.int64()), n))
        elif name in ("msg_ids", "checksums", "sizes"):
            vals = {"msg_ids": cols.ids, "checksums": cols.crcs, "sizes": cols.sizes}[name]
            arrays.append(lists(cols.ids_off, 0, pa.array(vals, fl.type.value_type)))
        elif name == "placements":
            st = fl.type.value_type
            values = pa.StructArray.from_arrays(
                [pa.array(v, st.field(i).type) for i, v in enumerate(cols.pl)], fields=list(st)
            )
            arrays.append(lists(cols.pl_off, 1, values))
        elif name == "hints":
            st = fl.type.value_type
            values = pa.StructArray.from_arrays(
                [pa.array(v, st.field(i).type) for i, v in enumerate(cols.h)], fields=list(st)
            )
            arrays.append(lists(cols.h_off, 2, values))
        else:
            arrays.append(pa.array(scalars[name], fl.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---------------------------------------------------------------------------- gathers


class _Buf:
    """A chunk of a redo file as bytes, read at many offsets at once."""

    def __init__(self, buf: bytes):
        self.buf = buf
        self.u8 = np.frombuffer(buf, np.uint8)
        self.last = max(0, len(buf) - 8)

    def get(self, off: I64, dtype: str) -> I64:
        """The big-endian integers of ``dtype`` at ``off`` (clamped into the buffer: the
        callers check the bounds and drop the rows that are out of them)."""
        width = np.dtype(dtype).itemsize
        if not len(off):
            return np.zeros(0, np.int64)
        at = np.minimum(np.maximum(off, 0), len(self.u8) - width)
        idx = at[:, None] + np.arange(width, dtype=np.int64)
        out: I64 = self.u8[idx].view(dtype).reshape(-1).astype(np.int64)
        return out

    def strings(self, start: I64, length: I64) -> tuple[Any, Mask]:
        """A string array of the bytes ``[start, start + length)`` of each row, and which rows
        are not valid UTF-8 (those get an empty string)."""
        n = len(start)
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(length, out=offsets[1:])
        total = int(offsets[-1])
        idx = np.repeat(start - offsets[:-1], length) + np.arange(total, dtype=np.int64)
        data = self.u8[idx] if total else np.zeros(0, np.uint8)
        arr = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
        bad = np.zeros(n, np.bool_)
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            raw = data.tobytes()
            for i in range(n):
                try:
                    raw[offsets[i] : offsets[i + 1]].decode("utf-8")
                except UnicodeDecodeError:
                    bad[i] = True
            keep = np.where(bad, 0, length)
            return self.strings(start, keep)[0], bad
        return arr, bad


def _walk_list(
    b: _Buf, rows: I64, cur: I64, count: I64, end: I64, fixed: int
) -> tuple[I64, I64, I64, I64, Mask]:
    """Elements ``n * (topic:str, <fixed bytes>)`` of each row, starting at ``cur`` with
    ``count`` elements, within ``end``. Returns per element (row, topic start, topic length,
    start of the fixed part), in row then element order, and per row whether it broke."""
    broken = np.zeros(len(rows), np.bool_)
    cur = cur.copy()
    out_r: list[I64] = []
    out_s: list[I64] = []
    out_l: list[I64] = []
    out_f: list[I64] = []
    active = np.flatnonzero(count > 0)
    j = 0
    while len(active):
        c = cur[active]
        e = end[active]
        ok = c + _STR_LEN <= e
        tl = b.get(c, _U16)
        fo = c + _STR_LEN + tl
        ok &= fo + fixed <= e
        broken[active[~ok]] = True
        a = active[ok]
        out_r.append(a)
        out_s.append(c[ok] + _STR_LEN)
        out_l.append(tl[ok])
        out_f.append(fo[ok])
        cur[a] = fo[ok] + fixed
        j += 1
        active = a[count[a] > j]
    if not out_r:
        z = np.zeros(0, np.int64)
        return z, z, z, z, broken
    r = np.concatenate(out_r)
    order = np.argsort(r, kind="stable")
    return (
        r[order],
        np.concatenate(out_s)[order],
        np.concatenate(out_l)[order],
        np.concatenate(out_f)[order],
        broken,
    )


class _Frames:
    """The frames of one chunk (``frames``: their starts in ``b``): header fields, kind, the
    key and the end of each body. ``ok`` marks the rows still decoded here; a step that
    finds a body it cannot read clears its row (decoded record at a time instead)."""

    def __init__(self, b: _Buf, frames: I64, fallback: set[int]):
        self.n = len(frames)
        self.length = b.get(frames + _FRAME_F[0][0], _FRAME_F[0][1])
        self.crc = b.get(frames + _FRAME_F[1][0], _FRAME_F[1][1])
        body = frames + _FRAME_SIZE
        self.end = body + self.length
        self.rtype: I64 = b.u8[np.minimum(body, len(b.u8) - 1)].astype(np.int64)
        ok = np.isin(self.rtype, _VECTOR_KINDS) & (body + 1 + _STR_LEN <= self.end)
        if fallback:
            ok[np.fromiter(fallback, np.int64)] = False
        self.klen = b.get(body + 1, _U16)
        self.kstart = body + 1 + _STR_LEN
        self.p1 = self.kstart + self.klen  # the body after the key
        ok &= self.p1 <= self.end
        self.ok: Mask = ok

    def rows_of(self, kind: int) -> I64:
        """The rows of ``kind`` still decoded here."""
        return np.flatnonzero(self.ok & (self.rtype == kind))

    def keep(self, rows: I64, good: Mask) -> I64:
        """Drop the ``rows`` not ``good`` (a bound check failed); the good ones."""
        self.ok[rows[~good]] = False
        return rows[good]


class _Columns:
    """The per-row columns of a chunk's rows (values and validity; null by default), and
    the error of a row that decoded with one (an APPEND_MSG whose count is off)."""

    def __init__(self, n: int):
        def z() -> I64:
            return np.zeros(n, np.int64)

        def f() -> Mask:
            return np.zeros(n, np.bool_)

        self.time_ms, self.time_v = z(), f()
        self.topic_s, self.topic_l, self.topic_v = z(), z(), f()
        self.part, self.offset, self.offset_v = z(), z(), f()
        self.msg_count, self.mc_v = z(), f()
        self.timeout, self.group_s, self.group_l = z(), z(), z()
        self.reason_s, self.reason_l = z(), z()
        self.errors: dict[int, str] = {}


class _Messages(NamedTuple):
    """The records of the APPEND_MSG rows ``rows``: ``got`` whole ones each, their ids,
    checksums and sizes in row order, and per chunk row how many (``counts``)."""

    rows: I64
    got: I64
    ids: I64
    crcs: I64
    sizes: I64
    counts: I64


class _Elements(NamedTuple):
    """The list elements (hints, placements) of some rows: per element its row, topic
    (start, length) and fixed fields (``values``), and per chunk row how many."""

    row: I64
    topic_s: I64
    topic_l: I64
    values: list[I64]
    counts: I64


def _append_msgs(b: _Buf, fr: _Frames, cols: _Columns) -> _Messages:
    """APPEND_MSG: topic, partition, count, then whole records to the end of the frame (the
    walk advances one pointer per row together)."""
    a = fr.rows_of(lr.APPEND_MSG)
    pa1, ea = fr.p1[a], fr.end[a]
    tl = b.get(pa1, _U16)
    p2 = pa1 + _STR_LEN + tl
    good = (pa1 + _STR_LEN <= ea) & (p2 + formats._II.size <= ea)
    a = fr.keep(a, good)
    pa1, ea, tl, p2 = pa1[good], ea[good], tl[good], p2[good]
    cols.topic_s[a], cols.topic_l[a], cols.topic_v[a] = pa1 + _STR_LEN, tl, True
    cols.part[a] = b.get(p2 + _PART_COUNT_F[0][0], _PART_COUNT_F[0][1])
    count = b.get(p2 + _PART_COUNT_F[1][0], _PART_COUNT_F[1][1])
    cols.msg_count[a], cols.mc_v[a] = count, True
    cur = p2 + formats._II.size
    m_r: list[I64] = []
    m_at: list[I64] = []
    m_len: list[I64] = []
    active = np.flatnonzero(ea - cur >= HEADER_SIZE)
    while len(active):
        c = cur[active]
        ln = b.get(c + _REC_F[0][0], _REC_F[0][1])
        rend = c + HEADER_SIZE + ln
        whole = (ln >= 0) & (rend <= ea[active])
        w = active[whole]
        m_r.append(w)
        m_at.append(c[whole])
        m_len.append(ln[whole])
        cur[w] = rend[whole]
        active = w[ea[w] - cur[w] >= HEADER_SIZE]
    if m_r:
        mr = np.concatenate(m_r)
        order = np.argsort(mr, kind="stable")
        mr = mr[order]
        m_start = np.concatenate(m_at)[order]
        m_size = np.concatenate(m_len)[order] + HEADER_SIZE
    else:
        mr = m_start = m_size = np.zeros(0, np.int64)
    got = np.bincount(mr, minlength=len(a)).astype(np.int64)
    ids = b.get(m_start + _REC_F[2][0], _REC_F[2][1])
    mcrc = b.get(m_start + _REC_F[1][0], _REC_F[1][1])
    first = np.zeros(len(a) + 1, np.int64)
    np.cumsum(got, out=first[1:])
    has = got > 0
    cols.time_ms[a[has]] = (ids[first[:-1][has]] >> _ID_SHIFT) + EPOCH_MS
    cols.time_v[a[has]] = True
    for i in np.flatnonzero((got != count) | (cur != ea)):
        cols.errors[int(a[i])] = (
            f"APPEND_MSG says {int(count[i])} records but holds {int(got[i])} whole ones"
        )
    counts = np.zeros(fr.n, np.int64)
    counts[a] = got
    return _Messages(a, got, ids, mcrc, m_size, counts)


def _elements(
    b: _Buf, fr: _Frames, rows: I64, cur: I64, k: I64, fields: list[tuple[int, str]], size: int
) -> _Elements:
    """The ``k`` elements ``(topic, <size> fixed bytes)`` of each of ``rows`` from ``cur``
    (rows whose list breaks are dropped); ``fields`` read from the fixed part."""
    el_r, el_s, el_l, el_f, broken = _walk_list(b, rows, cur, k, fr.end[rows], size)
    fr.ok[rows[broken]] = False
    values = [b.get(el_f + off, dtype) for off, dtype in fields]
    row = rows[el_r]
    counts = np.zeros(fr.n, np.int64)
    np.add.at(counts, row, 1)
    return _Elements(row, el_s, el_l, values, counts)


def _commits(b: _Buf, fr: _Frames, cols: _Columns) -> _Elements:
    """COMMIT: decided at, then n hints ``(topic, partition, hint)``."""
    c_rows = fr.rows_of(lr.COMMIT)
    pcm = fr.p1[c_rows]
    good = pcm + formats._I64_U16.size <= fr.end[c_rows]
    c_rows, pcm = fr.keep(c_rows, good), pcm[good]
    cols.time_ms[c_rows] = b.get(pcm + _AT_K_F[0][0], _AT_K_F[0][1])
    cols.time_v[c_rows] = True
    k = b.get(pcm + _AT_K_F[1][0], _AT_K_F[1][1])
    start = pcm + formats._I64_U16.size
    return _elements(b, fr, c_rows, start, k, _HINT_F, formats._HINT.size)


def _placements(b: _Buf, fr: _Frames, cols: _Columns) -> _Elements:
    """APPLIED: n placements ``(topic, partition, offset, count, bytes)``; the row's
    ``msg_count`` is the sum of their counts."""
    p_rows = fr.rows_of(lr.APPLIED)
    pp = fr.p1[p_rows]
    good = pp + _STR_LEN <= fr.end[p_rows]
    p_rows, pp = fr.keep(p_rows, good), pp[good]
    k = b.get(pp, _U16)
    pl = _elements(b, fr, p_rows, pp + _STR_LEN, k, _PLACE_F, formats._PLACE.size)
    totals = np.zeros(fr.n, np.int64)
    np.add.at(totals, pl.row, pl.values[2])
    cols.msg_count[p_rows] = totals[p_rows]
    cols.mc_v[p_rows] = True
    return pl


def _single_on_row(cols: _Columns, el: _Elements) -> None:
    """A row with one hint / placement: its topic, partition and offset on the row itself."""
    single = np.flatnonzero(el.counts[el.row] == 1)
    r1 = el.row[single]
    cols.topic_s[r1], cols.topic_l[r1], cols.topic_v[r1] = (
        el.topic_s[single],
        el.topic_l[single],
        True,
    )
    cols.part[r1], cols.offset[r1], cols.offset_v[r1] = (
        el.values[0][single],
        el.values[1][single],
        True,
    )


def _prepares(b: _Buf, fr: _Frames, cols: _Columns) -> None:
    """PREPARE: at, timeout, producer group."""
    q = fr.rows_of(lr.PREPARE)
    pq, eq = fr.p1[q], fr.end[q]
    gl = b.get(pq + formats._PREP.size, _U16)
    gs = pq + formats._PREP.size + _STR_LEN
    good = (gs <= eq) & (gs + gl <= eq)
    q, pq, gl, gs = fr.keep(q, good), pq[good], gl[good], gs[good]
    cols.time_ms[q], cols.time_v[q] = b.get(pq + _PREP_F[0][0], _PREP_F[0][1]), True
    cols.timeout[q] = b.get(pq + _PREP_F[1][0], _PREP_F[1][1])
    cols.group_s[q], cols.group_l[q] = gs, gl


def _rollbacks(b: _Buf, fr: _Frames, cols: _Columns) -> None:
    """ROLLBACK: the reason."""
    rb = fr.rows_of(lr.ROLLBACK)
    pr, er = fr.p1[rb], fr.end[rb]
    rl = b.get(pr, _U16)
    good = (pr + _STR_LEN <= er) & (pr + _STR_LEN + rl <= er)
    rb, pr, rl = fr.keep(rb, good), pr[good], rl[good]
    cols.reason_s[rb], cols.reason_l[rb] = pr + _STR_LEN, rl


class _Strings(NamedTuple):
    keys: Any
    topics: Any
    groups: Any
    reasons: Any
    hint_topics: Any
    place_topics: Any


def _strings(
    b: _Buf, fr: _Frames, cols: _Columns, hints: _Elements, places: _Elements
) -> tuple[_Strings, set[int]]:
    """The string columns, and the rows with a string that is not UTF-8 (decoded record at
    a time)."""
    ok = fr.ok
    keys, bad = b.strings(fr.kstart, np.where(ok, fr.klen, 0))
    bad_rows = set(np.flatnonzero(bad & ok).tolist())
    topics, bad = b.strings(cols.topic_s, np.where(cols.topic_v & ok, cols.topic_l, 0))
    bad_rows |= set(np.flatnonzero(bad & ok).tolist())
    groups, bad = b.strings(cols.group_s, np.where(ok, cols.group_l, 0))
    bad_rows |= set(np.flatnonzero(bad & ok).tolist())
    reasons, bad = b.strings(cols.reason_s, np.where(ok, cols.reason_l, 0))
    bad_rows |= set(np.flatnonzero(bad & ok).tolist())
    h_topics, bad = b.strings(hints.topic_s, hints.topic_l)
    bad_rows |= set(hints.row[bad & ok[hints.row]].tolist())
    pl_topics, bad = b.strings(places.topic_s, places.topic_l)
    bad_rows |= set(places.row[bad & ok[places.row]].tolist())
    return _Strings(keys, topics, groups, reasons, h_topics, pl_topics), bad_rows


def _decode(
    b: _Buf, frames: I64, base: int, f: TxlogFile, fallback: set[int]
) -> tuple[Any, set[int]]:
    """The batch of the frames starting at ``frames`` (in ``b``) but those in ``fallback``,
    and the frames to decode record at a time (other kinds, bodies that do not decode)."""
    fr = _Frames(b, frames, fallback)
    cols = _Columns(fr.n)
    msgs = _append_msgs(b, fr, cols)
    hints = _commits(b, fr, cols)
    places = _placements(b, fr, cols)
    for el in (hints, places):
        _single_on_row(cols, el)
    _prepares(b, fr, cols)
    _rollbacks(b, fr, cols)
    strings, bad_rows = _strings(b, fr, cols, hints, places)
    if bad_rows:
        return _decode(b, frames, base, f, fallback | bad_rows)
    rest = fallback | set(np.flatnonzero(~fr.ok).tolist())
    return _batch(f, frames + base, fr, cols, msgs, hints, places, strings), rest


def _batch(
    f: TxlogFile,
    positions: I64,
    fr: _Frames,
    cols: _Columns,
    msgs: _Messages,
    hints: _Elements,
    places: _Elements,
    strings: _Strings,
) -> Any:
    """The record batch of the rows still decoded here (``fr.ok``), in frame order."""
    ok, rtype = fr.ok, fr.rtype
    v = np.flatnonzero(ok)

    def col(values: I64, valid: Mask, typ: Any) -> Any:
        return pa.array(values[v].astype(typ.to_pandas_dtype()), typ, mask=~valid[v])

    def strs(arr: Any, valid: Mask | None) -> Any:
        out = arr.take(pa.array(v))
        if valid is not None:
            out = pc.if_else(pa.array(valid[v]), out, pa.scalar(None, pa.string()))
        return out

    def lists(counts: I64, kind_rows: Mask, values: Any) -> Any:
        # values are in row order for all rows; keep those of the vectorised rows
        sel = counts[v]
        offsets = np.zeros(len(v) + 1, np.int32)
        np.cumsum(sel, out=offsets[1:])
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), values, mask=pa.array(~kind_rows[v])
        )

    def structs(el: _Elements, names: Any, kinds: list[Any]) -> Any:
        keep = ok[el.row]
        values = [strings_of(el).filter(pa.array(keep))]
        values += [pa.array(x[keep].astype(t)) for x, t in zip(el.values, kinds, strict=True)]
        return pa.StructArray.from_arrays(values, fields=list(names))

    def strings_of(el: _Elements) -> Any:
        return strings.hint_topics if el is hints else strings.place_topics

    is_kind = {kd: (rtype == kd) & ok for kd in (lr.APPEND_MSG, lr.APPLIED, lr.COMMIT)}
    a = msgs.rows
    m_keep = ok[a][np.repeat(np.arange(len(a)), msgs.got)] if len(a) else np.zeros(0, np.bool_)
    hint_t = TXLOG_SCHEMA.field("hints").type.value_type
    place_t = TXLOG_SCHEMA.field("placements").type.value_type
    hint_arr = structs(hints, hint_t, [np.int32, np.int64])
    place_arr = structs(places, place_t, [np.int32, np.int64, np.int32, np.int64])
    kinds = np.array([formats.KINDS[t] for t in _VECTOR_KINDS], dtype=object)
    kind_of = np.zeros(max(_VECTOR_KINDS) + 1, np.int64)
    kind_of[list(_VECTOR_KINDS)] = np.arange(len(_VECTOR_KINDS))
    err = [cols.errors.get(int(i)) for i in v] if cols.errors else None
    rows = len(v)
    appends = is_kind[lr.APPEND_MSG]
    arrays: dict[str, Any] = {
        "file": pa.repeat(pa.scalar(f.path, pa.string()), rows),
        "file_no": pa.repeat(pa.scalar(f.file_no, pa.int64()), rows),
        "position": pa.array(positions[v], pa.int64()),
        "type": pa.array(rtype[v].astype(np.int32)),
        "kind": pa.array(kinds[kind_of[rtype[v]]].tolist(), pa.string()),
        "tx_key": strs(strings.keys, None),
        "time_ms": col(cols.time_ms, cols.time_v, pa.int64()),
        "topic": strs(strings.topics, cols.topic_v),
        "partition": col(cols.part, cols.topic_v, pa.int32()),
        "offset": col(cols.offset, cols.offset_v, pa.int64()),
        "msg_count": col(cols.msg_count, cols.mc_v, pa.int32()),
        "msg_ids": lists(msgs.counts, appends, pa.array(msgs.ids[m_keep])),
        "checksums": lists(msgs.counts, appends, pa.array(msgs.crcs[m_keep].astype(np.int32))),
        "sizes": lists(msgs.counts, appends, pa.array(msgs.sizes[m_keep].astype(np.int32))),
        "placements": lists(places.counts, is_kind[lr.APPLIED], place_arr),
        "hints": lists(hints.counts, is_kind[lr.COMMIT], hint_arr),
        "timeout_s": col(cols.timeout, (rtype == lr.PREPARE), pa.int32()),
        "producer_group": strs(strings.groups, rtype == lr.PREPARE),
        "reason": strs(strings.reasons, rtype == lr.ROLLBACK),
        "outcome": pa.nulls(rows, pa.string()),
        "crc": pa.array(fr.crc[v]),
        "size": pa.array((fr.length[v] + _FRAME_SIZE).astype(np.int32)),
        "error": pa.array(err, pa.string()) if err else pa.nulls(rows, pa.string()),
    }
    return pa.RecordBatch.from_arrays([arrays[fl.name] for fl in TXLOG_SCHEMA], schema=TXLOG_SCHEMA)


def read_txlog_batches(
    f: TxlogFile,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    start: int = 0,
) -> Iterator[Any]:
    """Arrow record batches of one redo file (or the checkpoint file): the rows of
    :func:`~notify.audit.formats.read_txlog_file`, in file order, decoded in bulk."""
    if f.file_no < 0:
        for cols in formats.read_txlog_file(f, max_record_bytes, start=start):
            yield txlog_batch(cols)
        return
    walk = formats.TxlogFrames(f.path, max_record_bytes, start)
    for base, buf, frames in walk:
        yield from _batches(buf, np.array(frames, np.int64), base, f)
    if walk.error is not None:
        cols = TxlogColumns(f)
        walk.corrupt_row(cols)
        yield txlog_batch(cols)


def _batches(buf: bytes, frames: I64, base: int, f: TxlogFile) -> Iterator[Any]:
    b = _Buf(buf)
    batch, rest = _decode(b, frames, base, f, set())
    if rest:
        cols = TxlogColumns(f)
        for i in sorted(rest):
            p = int(frames[i])
            length, crc = formats._FRAME.unpack_from(buf, p)
            cols.add(base + p, buf[p + 8 : p + 8 + length], crc)
        table = pa.Table.from_batches([batch, txlog_batch(cols)]).sort_by("position")
        yield from table.to_batches(max_chunksize=_OUT_ROWS)
    elif batch.num_rows:
        yield batch


# ---------------------------------------------------------------------------- segments

_ATTR_LEN_SIZE: Final = formats._ATTR_LEN.size


def read_segment_batches(
    seg: formats.SegmentFile, schema: Any, with_payload: bool = False, start: int = 0
) -> Iterator[Any]:
    """Arrow record batches of one segment file with the columns of ``schema``
    (:data:`~notify.audit.formats.LOG_COLUMNS`, and ``payload`` when ``with_payload``): the
    rows of :func:`~notify.audit.formats.read_segment`, the header fields read in bulk."""
    walk = formats.SegmentRecords(seg.path, start)
    for base, buf, starts, oks in walk:
        batch = _segment_batch(seg, schema, buf, starts, oks, base, with_payload)
        for i in range(0, batch.num_rows, _OUT_ROWS):
            yield batch.slice(i, _OUT_ROWS)
    error, error_at = walk.error, walk.error_at
    if error is not None:  # one row with the place and why ends the file
        consts: dict[str, Any] = {"topic": seg.topic, "partition": seg.partition}
        consts |= {"file": seg.path, "segment_start": seg.start}
        consts["offset"] = seg.start + error_at
        consts["error"] = f"{error} at file position {error_at}"
        yield pa.RecordBatch.from_arrays(
            [pa.array([consts.get(fl.name)], fl.type) for fl in schema], schema=schema
        )


def _segment_batch(
    seg: formats.SegmentFile,
    schema: Any,
    buf: bytes,
    starts: list[int],
    oks: list[bool],
    base: int,
    with_payload: bool,
) -> Any:
    b = _Buf(buf)
    p = np.array(starts, np.int64)
    rows = len(p)
    length = b.get(p + _REC_F[0][0], _REC_F[0][1])
    ids = b.get(p + _REC_F[2][0], _REC_F[2][1])
    flags = b.get(p + _REC_F[3][0], _REC_F[3][1])
    attr: Any = pa.nulls(rows, pa.string())
    has_attr = np.flatnonzero((flags & FLAG_ATTRIBUTE != 0) & (length >= _ATTR_LEN_SIZE))
    if len(has_attr):
        vals: list[str | None] = [None] * rows
        for i in has_attr.tolist():
            at = starts[i] + HEADER_SIZE
            (alen,) = formats._ATTR_LEN.unpack_from(buf, at)
            if 0 <= alen <= int(length[i]) - _ATTR_LEN_SIZE:
                a0 = at + _ATTR_LEN_SIZE
                vals[i] = buf[a0 : a0 + alen].decode("utf-8", "replace")
        attr = pa.array(vals, pa.string())
    arrays: dict[str, Any] = {
        "topic": pa.repeat(pa.scalar(seg.topic, pa.string()), rows),
        "partition": pa.repeat(pa.scalar(seg.partition, pa.int32()), rows),
        "file": pa.repeat(pa.scalar(seg.path, pa.string()), rows),
        "segment_start": pa.repeat(pa.scalar(seg.start, pa.int64()), rows),
        "offset": pa.array(p + (seg.start + base)),
        "msg_id": pa.array(ids),
        "flag": pa.array(flags.astype(np.int32)),
        "checksum": pa.array(b.get(p + _REC_F[1][0], _REC_F[1][1]).astype(np.int32)),
        "checksum_ok": pa.array(oks, pa.bool_()),
        "attribute": attr,
        "size": pa.array((length + HEADER_SIZE).astype(np.int32)),
        "time_ms": pa.array((ids >> _ID_SHIFT) + EPOCH_MS),
        "error": pa.nulls(rows, pa.string()),
    }
    if with_payload:
        lens = length.tolist()
        arrays["payload"] = pa.array(
            [
                buf[s + HEADER_SIZE : s + HEADER_SIZE + ln]
                for s, ln in zip(starts, lens, strict=True)
            ],
            pa.binary(),
        )
    return pa.RecordBatch.from_arrays([arrays[fl.name] for fl in schema], schema=schema)
