"""The file readers behind the data sources, on real broker logs, without Spark."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from notify.audit import formats
from notify.audit.coordinator import read_coordinator_log
from tests.audit.conftest import BrokerLogs


def _rows(data: Path, topic: str, part: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for seg in formats.find_segments(data):
        if (seg.topic, seg.partition) == (topic, part):
            for cols in formats.read_segment(seg, with_payload=True):
                n = len(cols["offset"])
                out += [{k: v[i] for k, v in cols.items()} for i in range(n)]
    return out


def test_segment_rows_flag_bad_checksums_and_broken_tails(
    broker_logs: BrokerLogs, tmp_path: Path
) -> None:
    clean = _rows(broker_logs.clean, "t", 0)
    assert clean and all(r["checksum_ok"] and r["error"] is None for r in clean)
    assert [r["offset"] for r in clean] == sorted(r["offset"] for r in clean)
    assert b"c3-flip-me" in [r["payload"] for r in clean]
    bad = _rows(broker_logs.corrupt, "t", 0)
    assert [r["msg_id"] for r in bad if not r["checksum_ok"]] == [broker_logs.flipped_id]
    assert len(bad) == len(clean)
    # a torn tail: the reader keeps the whole records and ends with one error row
    part = tmp_path / "t-0"
    shutil.copytree(broker_logs.clean / "t-0", part)
    seg = sorted(part.glob("*.meta"))[-1]
    seg.write_bytes(seg.read_bytes()[:-3])
    torn = _rows(tmp_path, "t", 0)
    assert len(torn) == len(clean)
    assert torn[-1]["msg_id"] is None and "incomplete record" in str(torn[-1]["error"])
    (tmp_path / "t-1").mkdir()
    (tmp_path / "t-1" / f"{0:020d}.meta").write_bytes(b"\0" * 64)
    (row,) = _rows(tmp_path, "t", 1)
    assert "zero-filled" in str(row["error"])


def test_txlog_rows(broker_logs: BrokerLogs) -> None:
    files = formats.find_txlog_files(broker_logs.clean)  # dataPath: finds transactions/
    rows = [r for f in files for b in formats.read_txlog_file(f) for r in b.to_rows()]
    kinds = {r["kind"] for r in rows}
    assert {"APPEND_MSG", "COMMIT", "APPLIED", "ROLLBACK", "PREPARE", "CHECKPOINT"} <= kinds
    assert not [r for r in rows if r["error"]]
    batch = [r for r in rows if r["kind"] == "APPEND_MSG" and r["msg_count"] == 2]
    assert len(batch) == 1 and len(batch[0]["msg_ids"]) == 2  # the mput
    # the hint key lost its APPLIED in the copies, not its COMMIT
    hint = [r["kind"] for r in rows if r["tx_key"] == broker_logs.hint_key]
    assert "COMMIT" in hint and "APPLIED" not in hint
    prep = [r for r in rows if r["kind"] == "PREPARE" and r["tx_key"] == broker_logs.prepared_key]
    assert prep[0]["timeout_s"] == 3600 and prep[0]["time_ms"] > 0
    lost = [r for r in rows if r["kind"] == "ROLLBACK" and r["tx_key"] == "TX:s2:1"]
    assert lost[0]["reason"] == "connection lost"


def test_coordinator_log(broker_logs: BrokerLogs) -> None:
    clean = read_coordinator_log(broker_logs.coord_clean)
    assert clean.coordinator_id == "tm1" and clean.complete and not clean.errors
    assert [d.ended for d in clean.decisions.values()] == [True]
    bad = read_coordinator_log(broker_logs.coord_mismatch)
    assert sorted((d.outcome, d.ended) for d in bad.decisions.values()) == [
        ("commit", False),
        ("commit", True),
    ]


def test_archived_segments_are_read(broker_logs: BrokerLogs, tmp_path: Path) -> None:
    """A segment the retention ``archive`` policy kept as ``<name>.arc`` is read like the
    live one (same key, so an incremental audit sees the same file), and the live name wins
    while both exist."""
    part = tmp_path / "t-0"
    shutil.copytree(broker_logs.clean / "t-0", part)
    (seg,) = sorted(part.glob("*.meta"))
    live = _rows(tmp_path, "t", 0)
    os.link(seg, seg.with_name(seg.name + formats.ARCHIVED))
    assert [s.path for s in formats.find_segments(tmp_path)] == [str(seg)]
    seg.unlink()
    end = int(seg.name[:-5]) + len(live) * 1000
    (part / f"{end:020d}.meta").write_bytes(b"")  # the new active segment
    found = sorted(formats.find_segments(tmp_path), key=lambda s: s.start)
    assert [Path(s.path).name for s in found] == [seg.name + ".arc", f"{end:020d}.meta"]
    assert not found[0].last and found[0].key == f"t-0/{seg.name[:-5]}"
    strip = [{k: v for k, v in r.items() if k != "file"} for r in live]
    assert [{k: v for k, v in r.items() if k != "file"} for r in _rows(tmp_path, "t", 0)] == strip
