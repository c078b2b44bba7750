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
from notify.audit.state import TABLES
from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.idgen import BROKER_BITS, EPOCH_MS, SEQ_BITS
from notify.store.segment import segment_name
from notify.txlog.records import encode as frame
from notify.txlog.segment import segment_path
from tests.audit.conftest import BrokerLogs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from notify.audit import AuditResult

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


def _tables(res: AuditResult, coordinator: bool) -> dict[str, list[str]]:
    """The output tables of ``res`` but ``messages`` (and its coordinator table when
    ``coordinator``), each row as JSON of its sorted columns, sorted: one Spark job."""
    from pyspark.sql import functions as F

    from notify.audit.checks import _union

    names = ["findings", "transactions", "stuck_prepared", "topic_hours", "tx_hours"]
    names += ["coordinator"] if coordinator else []
    parts = []
    for name in names:
        df = getattr(res, name)
        cols = sorted(c for c in df.columns if not c.startswith("_"))
        row = F.to_json(F.struct(*cols), {"ignoreNullFields": "false"})
        parts.append(df.select(F.lit(name).alias("t"), row.alias("j")))
    out: dict[str, list[str]] = {n: [] for n in names}
    for r in _union(parts).collect():
        out[r["t"]].append(r["j"])
    return {n: sorted(rows) for n, rows in out.items()}


def _same(inc: AuditResult, full: AuditResult) -> None:
    """An incremental run's outputs are a full audit's (all but ``messages``)."""
    coordinator = full.coordinator is not None
    if coordinator:
        assert inc.coordinator is not None
    got, want = _tables(inc, coordinator), _tables(full, coordinator)
    for name in want:
        assert got[name] == want[name], name
    assert inc.txlog_kinds == full.txlog_kinds


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
        assert inc.messages is None
        _same(inc, full)
        # the redo records by kind, counted in the pass that counts the findings
        by_kind = full.txlog.groupBy("kind").count().collect()
        assert full.txlog_kinds == {k["kind"]: k["count"] for k in by_kind}
        counts = inc.finding_counts()
        assert "txlog_torn_tail" not in counts and "segment_torn_tail" not in counts
        assert counts["committed_missing"] == 1 and counts["uncommitted_visible"] == 1
        inc.save_state()
    finally:
        inc.unpersist()
        full.unpersist()
    # (a run with nothing added parses nothing: the blocks test below)
    # a full run that stops between dropping the earlier state and recording its own leaves
    # no state to trust: the next run reads everything
    reset = audit(spark, state=state, full=True, **kw)
    try:
        writes = reset.state_writes()
        assert len(writes) == len(TABLES) and not (state / "files.json").exists()
        writes[0]()  # then the run stops
    finally:
        reset.unpersist()
    after = audit(spark, state=state, **kw)
    try:
        assert not after.incremental
        assert _rows(after.findings) == _rows(full.findings)
        after.save_state()  # the table the stopped run wrote is replaced
        assert json.loads((state / "files.json").read_text())["runs"] == 1
    finally:
        after.unpersist()


def test_incremental_run_after_deletions_equals_full_audit(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Between two runs retention deletes a partition's oldest segment, a checkpoint deletes
    the oldest redo file, and records are appended to both logs. The incremental run carries
    over only what still holds: a duplicate whose other copy was deleted goes away, a
    transaction with records in the deleted redo file is aggregated again from what is left,
    an APPLIED arriving late moves a message's expected range, a message appearing late is
    found (duplicate, or visible after a rollback), a new transaction's missing message is
    reported; all equal to a full audit of the same files."""
    from notify.audit import audit

    q = tmp_path / "q-0"
    q.mkdir()
    txdir = tmp_path / "transactions"
    txdir.mkdir()
    id0 = ((int(time.time() * 1000) - EPOCH_MS) << (BROKER_BITS + SEQ_BITS)) | 1
    m = {i: records.encode(id0 + i, 0, b"message %d" % i) for i in range(10)}
    seg_a = [m[1], m[2]]  # m[2] here is a stray copy: the committed one is in seg_b
    a_len = sum(map(len, seg_a))
    seg_b = [m[0], m[5], m[2], m[3], m[6]]
    at: dict[int, int] = {}
    off = 0
    for i, rec in [(1, m[1]), (-2, m[2]), (0, m[0]), (5, m[5]), (2, m[2]), (3, m[3]), (6, m[6])]:
        if i >= 0:
            at[i] = off
        off += len(rec)

    def put(key: str, i: int) -> bytes:
        return frame(lr.APPEND_MSG, lr.AppendMsg(key, "q", 0, 1, m[i]).encode())

    def commit(key: str, hint: int) -> bytes:
        return frame(lr.COMMIT, lr.Commit(key, 1, (("q", 0, hint),)).encode())

    def applied(key: str, offset: int, i: int) -> bytes:
        return frame(lr.APPLIED, lr.Applied(key, (("q", 0, offset, 1, len(m[i])),)).encode())

    redo0 = [put("TX:0", 0), commit("TX:0", a_len), applied("TX:0", at[0], 0), put("TX:5", 5)]
    redo1 = [
        commit("TX:5", a_len),
        applied("TX:5", at[5], 5),
        put("TX:1", 1),
        commit("TX:1", 0),
        applied("TX:1", at[1], 1),
        put("TX:2", 2),
        commit("TX:2", a_len),
        applied("TX:2", at[2], 2),
        put("TX:3", 3),
        commit("TX:3", a_len),  # APPLIED comes in the second run
        put("TX:4", 4),  # still open in the first run
        put("TX:6", 6),
        commit("TX:6", a_len),
        applied("TX:6", at[6], 6),
        put("TX:7", 7),
        frame(lr.ROLLBACK, lr.Rollback("TX:7", "rollback").encode()),
    ]
    segment_path(txdir, 0).write_bytes(b"".join(redo0))
    segment_path(txdir, 1).write_bytes(b"".join(redo1))
    (q / segment_name(0)).write_bytes(b"".join(seg_a))
    (q / segment_name(a_len)).write_bytes(b"".join(seg_b))
    state = tmp_path / "state"
    (state / "not-the-audits").mkdir(parents=True)  # --state may name a directory in use
    kw: dict[str, Any] = {"txlog": txdir, "data": tmp_path}
    first = audit(spark, state=state, **kw)
    try:
        assert first.finding_counts() == {"committed_duplicate": 1}
        first.save_state()
        assert (state / "not-the-audits").is_dir()  # a full run replaces only its tables
    finally:
        first.unpersist()

    # retention and a checkpoint delete the oldest files; both logs grow
    (q / segment_name(0)).unlink()
    segment_path(txdir, 0).unlink()
    end_b = a_len + sum(map(len, seg_b))
    with open(q / segment_name(a_len), "ab") as fh:
        fh.write(m[4] + m[6] + m[7])
    with open(segment_path(txdir, 1), "ab") as fh:
        fh.write(
            applied("TX:3", at[3] + 1, 3)  # a range that misses where m[3] is
            + commit("TX:4", end_b)
            + applied("TX:4", end_b, 4)
            + put("TX:9", 9)
            + commit("TX:9", end_b)
            + applied("TX:9", end_b + 1000, 9)  # never written
        )
    inc = audit(spark, state=state, **kw)
    full = audit(spark, **kw)
    try:
        assert inc.incremental
        _same(inc, full)
        found = sorted((r["check"], r["msg_id"] - id0) for r in full.findings.collect())
        assert found == [
            ("committed_duplicate", 6),
            ("committed_misplaced", 3),
            ("committed_missing", 9),
            ("uncommitted_visible", 7),
        ]
        # TX:0 went with redo.0; TX:5 lost its APPEND_MSG with it
        tx = {r["tx_key"]: r for r in inc.transactions.collect()}
        assert "TX:0" not in tx and not tx["TX:5"]["has_append"]
        assert tx["TX:4"]["outcome"] == "committed"
        read = inc.read_stats()
        assert read["txlog_rows_read"] == 6 and read["log_rows_read"] == 3
        inc.save_state()
    finally:
        inc.unpersist()
        full.unpersist()


def test_incremental_run_carries_the_blocks_it_does_not_redo(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Message ids span three blocks (about 70 minutes of ids each). A run redoes only the
    blocks something happened in: a late duplicate in the middle block redoes it (with the
    transaction that spans it and the oldest block), while the oldest block's missing
    message and the oldest segment's checksum mismatch are carried; after retention deletes
    that segment, the missing message's range lies below the partition and is no longer
    reported, though its block is still not redone. Every run equals a full audit."""
    from notify.audit import audit

    q = tmp_path / "q-0"
    q.mkdir()
    txdir = tmp_path / "transactions"
    txdir.mkdir()
    shift = BROKER_BITS + SEQ_BITS
    now = int(time.time() * 1000)
    b_ms = [now - 150 * 60_000, now - 75 * 60_000, now]  # three blocks
    ids = {
        name: ((b_ms[b] - EPOCH_MS) << shift) | i
        for i, (name, b) in enumerate(
            [("a", 0), ("a2", 1), ("b", 0), ("c", 1), ("bad", 1), ("d", 1), ("e", 2), ("f", 2)]
        )
    }
    blocks = {name: i >> 44 for name, i in ids.items()}
    assert len({blocks["a"], blocks["c"], blocks["e"]}) == 3
    m = {name: records.encode(i, 0, b"payload " + name.encode()) for name, i in ids.items()}
    # a stored checksum the payload does not match
    m["bad"] = records.encode(ids["bad"], 0, b"payload bad", crc=12345)
    seg0 = [m["c"], m["bad"]]
    s1 = sum(map(len, seg0))
    seg1 = [m["a2"], m["b"], m["d"], m["e"]]
    at: dict[str, int] = {}
    off = 0
    for name in ["c", "bad", "a2", "b", "d", "e"]:
        at[name] = off
        off += len(m[name])

    def put(key: str, name: str) -> bytes:
        return frame(lr.APPEND_MSG, lr.AppendMsg(key, "q", 0, 1, m[name]).encode())

    def commit(key: str, hint: int) -> bytes:
        return frame(lr.COMMIT, lr.Commit(key, 1, (("q", 0, hint),)).encode())

    def applied(key: str, name: str) -> bytes:
        placed = (("q", 0, at[name], 1, len(m[name])),)
        return frame(lr.APPLIED, lr.Applied(key, placed).encode())

    redo = [
        # TX:A spans the oldest two blocks; its message of the oldest is missing
        put("TX:A", "a"),
        put("TX:A", "a2"),
        commit("TX:A", 0),
        put("TX:B", "b"),
        commit("TX:B", s1),
        applied("TX:B", "b"),
        put("TX:C", "c"),
        commit("TX:C", 0),
        applied("TX:C", "c"),
        put("TX:D", "d"),
        frame(lr.ROLLBACK, lr.Rollback("TX:D", "rollback").encode()),
        put("TX:E", "e"),
        commit("TX:E", s1),
        applied("TX:E", "e"),
    ]
    segment_path(txdir, 0).write_bytes(b"".join(redo))
    (q / segment_name(0)).write_bytes(b"".join(seg0))
    (q / segment_name(s1)).write_bytes(b"".join(seg1))
    state = tmp_path / "state"
    kw: dict[str, Any] = {"txlog": txdir, "data": tmp_path}

    def check(expected: list[tuple[str, str]]) -> AuditResult:
        inc = audit(spark, state=state, **kw)
        # a run with state is a full audit until the state holds a run: compared with a
        # full audit once it is incremental
        full = audit(spark, **kw) if inc.incremental else inc
        try:
            if full is not inc:
                _same(inc, full)
            by_id = {i: name for name, i in ids.items()}
            found = sorted((r["check"], by_id[r["msg_id"]]) for r in full.findings.collect())
            assert found == expected
            inc.save_state()
        finally:
            full.unpersist()
            inc.unpersist()
        return inc

    first = check(
        [
            ("checksum_mismatch", "bad"),
            ("committed_missing", "a"),
            ("uncommitted_visible", "d"),
        ]
    )
    assert not first.incremental and first.blocks is None

    # a late copy of c (the middle block) and a new transaction in the newest block
    with open(q / segment_name(s1), "ab") as fh:
        fh.write(m["c"] + m["f"])
    at["f"] = off + len(m["c"])
    with open(segment_path(txdir, 0), "ab") as fh:
        fh.write(put("TX:F", "f") + commit("TX:F", s1) + applied("TX:F", "f"))
    second = check(
        [
            ("checksum_mismatch", "bad"),
            ("committed_duplicate", "c"),
            ("committed_missing", "a"),
            ("uncommitted_visible", "d"),
        ]
    )
    assert second.incremental and second.blocks == sorted({blocks["c"], blocks["f"]})
    assert second.read_stats()["log_rows_read"] == 2
    # TX:A is aggregated again (a message in a redone block), TX:B is carried
    assert second.stats["keys_changed"] == 1 and second.stats["keys_redone"] == 5

    # retention deletes the oldest segment: its block (the middle one) is redone; the
    # missing message of the oldest block is carried and now lies below the partition
    (q / segment_name(0)).unlink()
    third = check([("committed_misplaced", "c"), ("uncommitted_visible", "d")])
    assert third.incremental and third.blocks == [blocks["c"]]
    assert third.read_stats()["log_rows_read"] == 0
