"""The bulk (numpy) readers give the rows of the record-at-a-time readers, on real broker logs
and on files with every kind of damage the record-at-a-time readers report."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from notify.audit import bulk, formats
from notify.audit.sources import _arrow_schema, _log_columns
from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.txlog.records import encode as frame
from tests.audit.conftest import BrokerLogs

_ID = 123 << 22


def _txlog_rows_both(d: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ref: list[dict[str, Any]] = []
    new: list[dict[str, Any]] = []
    for f in sorted(formats.find_txlog_files(d), key=lambda x: x.file_no):
        for start in (0, *([] if f.file_no < 0 else [_second_frame(f)])):
            ref += [
                r
                for c in formats.read_txlog_file(f, start=start)
                for r in bulk.txlog_batch(c).to_pylist()
            ]
            new += [r for b in bulk.read_txlog_batches(f, start=start) for r in b.to_pylist()]
    return ref, new


def _second_frame(f: formats.TxlogFile) -> int:
    rows = [p for c in formats.read_txlog_file(f) for p in c.columns()["position"]]
    return int(rows[1]) if len(rows) > 1 else 0


def _segment_rows_both(d: Path, payload: bool) -> tuple[list[Any], list[Any]]:
    schema = _arrow_schema(_log_columns({"payload": str(payload)}))
    ref: list[Any] = []
    new: list[Any] = []
    for s in formats.find_segments(d):
        for c in formats.read_segment(s, with_payload=payload):
            arrays = [pa.array(c[fl.name], fl.type) for fl in schema]
            ref += pa.RecordBatch.from_arrays(arrays, schema=schema).to_pylist()
        new += [
            r
            for b in bulk.read_segment_batches(s, schema, with_payload=payload)
            for r in b.to_pylist()
        ]
    return ref, new


def test_bulk_readers_match_on_broker_logs(broker_logs: BrokerLogs) -> None:
    for d in (broker_logs.clean, broker_logs.corrupt):
        ref, new = _txlog_rows_both(d)
        assert ref and new == ref
        for payload in (False, True):
            sref, snew = _segment_rows_both(d, payload)
            assert sref and snew == sref


def _str(s: bytes) -> bytes:
    return struct.pack(">H", len(s)) + s


def test_bulk_txlog_reader_matches_on_damaged_bodies(tmp_path: Path) -> None:
    recs = records.encode(_ID, 0, b"a") + records.encode(_ID + 1, 0, b"bb")
    good_commit = lr.Commit("k1", 5, (("t", 0, 7), ("u", 1, 9))).encode()
    frames = [
        frame(lr.APPEND_MSG, lr.AppendMsg("k1", "t", 0, 2, recs).encode()),
        frame(lr.APPEND_MSG, lr.AppendMsg("k2", "t", 1, 3, recs).encode()),  # count says 3
        frame(lr.APPEND_MSG, lr.AppendMsg("k3", "t", 1, 2, recs + b"\0\0\0").encode()),  # tail
        frame(lr.APPEND_MSG, lr.AppendMsg("k4", "t", 1, 0, b"").encode()),  # no records
        frame(lr.PREPARE, lr.Prepare("k1", 3, 60, "grp").encode()),
        frame(lr.PREPARE, lr.Prepare("k1", 3, 60, "grp").encode()[:-2]),  # group cut short
        frame(lr.COMMIT, good_commit),
        frame(lr.COMMIT, lr.Commit("k5", 5, (("t", 2, 7),)).encode()),
        frame(lr.COMMIT, good_commit[:-3]),  # last hint cut short
        frame(lr.APPLIED, lr.Applied("k1", (("t", 0, 0, 1, 21), ("u", 1, 0, 1, 22))).encode()),
        frame(lr.APPLIED, lr.Applied("k5", (("t", 2, 40, 2, 43),)).encode()),
        frame(lr.APPLIED, lr.Applied("k6", ()).encode()),
        frame(lr.ROLLBACK, lr.Rollback("k2", "why").encode()),
        frame(lr.ROLLBACK, _str(b"k\xff") + _str(b"bad key")),  # not UTF-8
        frame(lr.COMMIT, _str(b"k7") + struct.pack(">qH", 1, 1) + _str(b"t\xfe") + b"\0" * 12),
        frame(lr.HEURISTIC, lr.Heuristic("k8", True, "admin").encode()),
        frame(lr.FORGET, lr.Forget("k8").encode()),
        frame(77, _str(b"k9") + b"whatever"),  # unknown type
        frame(lr.ROLLBACK, b"\x00"),  # no key
    ]
    d = tmp_path / "tx"
    d.mkdir()
    (d / "redo.0").write_bytes(b"".join(frames))
    (d / "redo.1").write_bytes(b"".join(frames[:3]) + frames[3][:-1])  # torn tail
    ref, new = _txlog_rows_both(d)
    assert new == ref
    # each file is read whole and from its second frame: count the distinct rows
    errors = {(r["file_no"], r["position"], r["error"]) for r in ref if r["error"]}
    assert len([e for e in errors if "undecodable" in e[2]]) == 5
    assert len([e for e in errors if "whole ones" in e[2]]) == 4  # two per file
    assert len({(r["file_no"], r["position"]) for r in ref if r["kind"] == "CORRUPT"}) == 1
    assert {r["kind"] for r in ref} >= {"HEURISTIC", "FORGET", "TYPE_77"}


def test_bulk_segment_reader_matches_on_damage(tmp_path: Path) -> None:
    attr = struct.pack(">i", 3) + b"abc" + b"body"
    good = records.encode(_ID, 0, b"x") + records.encode(_ID + 1, records.FLAG_ATTRIBUTE, attr)
    bad_crc = records.encode(_ID + 2, 0, b"y", crc=5)
    cases = {
        "a-0": good + bad_crc + records.encode(_ID + 3, 0, b"zz")[:-1],  # torn tail
        "a-1": good + b"\0" * 40,  # zero-filled
        "a-2": good + struct.pack(">iiqi", -4, 0, 0, 0),  # bad length
        "a-3": good + records.encode(_ID + 4, 0, b""),  # an empty payload is a record
    }
    for name, data in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{0:020d}.meta").write_bytes(data)
    for payload in (False, True):
        ref, new = _segment_rows_both(tmp_path, payload)
        assert new == ref
        assert sum(1 for r in ref if r["error"]) == 3
        assert [r["attribute"] for r in ref if r["attribute"]] == ["abc"] * 4
        assert sum(1 for r in ref if r["checksum_ok"] is False) == 1


def test_bulk_txlog_reader_falls_back_per_kind(tmp_path: Path) -> None:
    """A string that is not UTF-8 in any list or column of each vectorised kind, and a cut
    HEURISTIC body: those rows are decoded record at a time, the rest in bulk, the same rows
    as the record-at-a-time reader."""
    bad = _str(b"t\xfe")
    frames = [
        frame(lr.APPLIED, _str(b"k1") + struct.pack(">H", 1) + bad + b"\0" * 24),
        frame(lr.PREPARE, _str(b"k2") + struct.pack(">qI", 1, 2) + bad),
        frame(lr.APPEND_MSG, _str(b"k3") + bad + struct.pack(">II", 0, 0)),
        frame(lr.ROLLBACK, _str(b"k4") + bad),
        frame(lr.HEURISTIC, lr.Heuristic("k5", False, "admin").encode()[:-1]),
        frame(lr.HEURISTIC, lr.Heuristic("k6", True, "admin").encode()),
        frame(lr.COMMIT, lr.Commit("k7", 5, (("t", 2, 7),)).encode()),
    ]
    d = tmp_path / "tx"
    d.mkdir()
    (d / "redo.0").write_bytes(b"".join(frames))
    ref, new = _txlog_rows_both(d)
    assert new == ref
    undecodable = {r["tx_key"] for r in ref if r["error"] and "undecodable" in r["error"]}
    assert undecodable == {"k1", "k2", "k3", "k4", "k5"}
    assert next((r["kind"], r["outcome"]) for r in ref if r["tx_key"] == "k6") == (
        "HEURISTIC",
        "commit",
    )
