"""Incremental audits: a run over a prefix of the files, then over the grown files, gives
exactly what a full audit of the grown files gives, parsing only the added bytes."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from notify.audit import formats
from tests.audit.conftest import BrokerLogs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.slow


def _cut(data: Path) -> dict[Path, bytes]:
    """Cut every redo file and newest segment back to the middle of its records (t-0 and
    the redo log in the middle of a record: a torn tail now, whole later); return the
    original bytes."""
    saved: dict[Path, bytes] = {}
    for f in formats.find_txlog_files(data / "transactions", checkpoint=False):
        rows = [r for b in formats.read_txlog_file(f) for r in b.to_rows()]
        at = rows[len(rows) // 2]["position"] + 5
        p = Path(f.path)
        saved[p] = p.read_bytes()
        p.write_bytes(saved[p][:at])
    for seg in formats.find_segments(data):
        if not seg.last:
            continue
        offs = [o for c in formats.read_segment(seg) for o in c["offset"] if o is not None]
        if len(offs) < 2:
            continue
        at = offs[len(offs) // 2] - seg.start + (7 if (seg.topic, seg.partition) == ("t", 0) else 0)
        p = Path(seg.path)
        saved[p] = p.read_bytes()
        p.write_bytes(saved[p][:at])
    return saved


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    cols = sorted(c for c in df.columns if not c.startswith("_"))
    return sorted((tuple(r) for r in df.select(*cols).collect()), key=repr)


def test_incremental_run_equals_full_audit(
    spark: SparkSession, broker_logs: BrokerLogs, tmp_path: Path
) -> None:
    from notify.audit import audit

    data = tmp_path / "data"
    shutil.copytree(broker_logs.corrupt, data)
    state = tmp_path / "state"
    now = int(time.time() * 1000) + 5_000
    kw: dict[str, Any] = {
        "txlog": data / "transactions",
        "data": data,
        "coordinator_log": broker_logs.coord_mismatch,
        "tx_timeout_s": 1.0,
        "now_ms": now,
    }
    saved = _cut(data)
    first = audit(spark, state=state, **kw)
    try:
        assert not first.incremental
        early = first.finding_counts()
        assert early.get("txlog_torn_tail") == 1 and early.get("segment_torn_tail") == 1
        first.save_state()
        # each redo file is consumed up to its torn record, else to its end
        consumed = json.loads((state / "files.json").read_text())["consumed"]
        torn = {
            int(r["file_no"]): int(r["position"])
            for r in first.txlog.filter("kind = 'CORRUPT' AND file_no >= 0").collect()
        }
        redo = formats.find_txlog_files(data / "transactions", checkpoint=False)
        assert torn and {f.key: consumed[f.key] for f in redo} == {
            f.key: torn.get(f.file_no, f.size) for f in redo
        }
    finally:
        first.unpersist()
    for p, b in saved.items():
        p.write_bytes(b)

    inc = audit(spark, state=state, **kw)
    full = audit(spark, **kw)
    try:
        assert inc.incremental and not full.incremental
        read, all_read = inc.read_stats(), full.read_stats()
        # only what was added was parsed; the rest came from the state
        assert 0 < read["log_rows_read"] < all_read["log_rows_read"]
        assert 0 < read["txlog_rows_read"] < all_read["txlog_rows_read"]
        assert read["log_rows_from_state"] + read["log_rows_read"] == all_read["log_rows_read"]
        assert _rows(inc.findings) == _rows(full.findings)
        assert _rows(inc.transactions) == _rows(full.transactions)
        assert _rows(inc.messages) == _rows(full.messages)
        # the redo records by kind, counted in the pass that counts the findings
        for r in (inc, full):
            by_kind = r.txlog.groupBy("kind").count().collect()
            assert r.txlog_kinds == {k["kind"]: k["count"] for k in by_kind}
        counts = inc.finding_counts()
        assert "txlog_torn_tail" not in counts and "segment_torn_tail" not in counts
        assert counts["committed_missing"] == 1 and counts["uncommitted_visible"] == 1
        inc.save_state()
    finally:
        inc.unpersist()
        full.unpersist()
    # nothing added: the next run parses nothing and still finds the same; --full resets
    again = audit(spark, state=state, **kw)
    try:
        assert again.read_stats()["log_rows_read"] == 0
        assert _rows(again.findings) == _rows(full.findings)
    finally:
        again.unpersist()
