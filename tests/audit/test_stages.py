"""Each stage of the audit on a handful of hand-made rows (no files but where a stage lists
them): the transactions, the message matching, the counting passes, the findings, the
counts per hour and the state's tables. ``test_audit``/``test_incremental`` run them
together on real broker logs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from notify.audit import formats
from notify.audit.state import AuditState, save_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from notify.audit.checks import AuditInputs

pytestmark = pytest.mark.slow

T_COLUMNS = [(n, t) for n, t in formats.TXLOG_COLUMNS if n not in ("file", "type", "crc", "offset")]
T_DDL = ", ".join(f"`{n}` {t}" for n, t in T_COLUMNS) + ", `_new` boolean"
M_DDL = (
    "topic string, partition int, segment_start long, offset long, msg_id long, "
    "checksum int, checksum_ok boolean, size int, time_ms long, error string, _new boolean"
)
HOUR = 3_600_000


def _t(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    full = [{"file_no": 0, "_new": True, "size": 10, **r} for r in rows]
    names = [n for n, _t in T_COLUMNS] + ["_new"]
    return spark.createDataFrame([tuple(r.get(n) for n in names) for r in full], T_DDL)


def _m(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    """Rows ``(topic, partition, segment_start, offset, msg_id, checksum, time_ms)`` of
    whole records (``checksum_ok``, 30 bytes, parsed now)."""
    return spark.createDataFrame(
        [(t, p, s, o, i, c, True, 30, ms, None, True) for t, p, s, o, i, c, ms in rows], M_DDL
    )


def append(key: str, pos: int, part: int, ids: list[int], t: int = 1000) -> dict[str, Any]:
    return {
        "position": pos,
        "kind": "APPEND_MSG",
        "tx_key": key,
        "time_ms": t,
        "topic": "q",
        "partition": part,
        "msg_count": len(ids),
        "msg_ids": ids,
        "checksums": [i + 10 for i in ids],
        "sizes": [30] * len(ids),
    }


def commit(key: str, pos: int, *hints: tuple[int, int], t: int = 1500) -> dict[str, Any]:
    return {
        "position": pos,
        "kind": "COMMIT",
        "tx_key": key,
        "time_ms": t,
        "hints": [{"topic": "q", "partition": p, "hint": h} for p, h in hints],
    }


def applied(key: str, pos: int, *placed: tuple[int, int, int, int]) -> dict[str, Any]:
    return {
        "position": pos,
        "kind": "APPLIED",
        "tx_key": key,
        "placements": [
            {"topic": "q", "partition": p, "offset": o, "count": c, "bytes": b}
            for p, o, c, b in placed
        ],
    }


def record(key: str, pos: int, kind: str, **cols: Any) -> dict[str, Any]:
    return {"position": pos, "kind": kind, "tx_key": key, **cols}


def xid(n: int) -> str:
    return f"XID:1:{f'tm1-{n}'.encode().hex()}:{b'b'.hex()}:tm1"


def _redo(spark: SparkSession) -> DataFrame:
    """A committed transaction over two partitions (A); a key used twice, rolled back then
    prepared (B); an active one (C); a committed one without APPLIED, checked against its
    hint (D: found below it, misplaced; E: found twice; F: its hint below the partition's
    oldest segment); a heuristic commit (H); three XA branches (rolled back, committed,
    active)."""
    return _t(
        spark,
        [
            append("A", 0, 0, [1, 2]),
            append("A", 10, 1, [3], t=1100),
            commit("A", 20, (0, 100), (1, 200)),
            applied("A", 30, (0, 100, 2, 60), (1, 200, 1, 30)),
            append("B", 40, 0, [4], t=2000),
            record("B", 50, "ROLLBACK", reason="r1"),
            append("B", 60, 0, [5], t=3000),
            record("B", 70, "PREPARE", time_ms=3100, timeout_s=60, producer_group="g"),
            append("C", 80, 1, [6]),
            append("D", 90, 0, [8]),
            commit("D", 100, (0, 500)),
            append("E", 110, 1, [9]),
            commit("E", 120, (1, 590)),
            append("F", 130, 1, [10]),
            commit("F", 140, (1, 50)),
            append("H", 150, 0, [7]),
            record("H", 160, "HEURISTIC", outcome="commit", reason="admin"),
            append(xid(1), 170, 1, [14]),
            record(xid(1), 180, "ROLLBACK", reason="r"),
            append(xid(2), 190, 1, [12]),
            commit(xid(2), 200, (1, 200)),
            append(xid(3), 210, 1, [13]),
        ],
    )


def _log(spark: SparkSession) -> DataFrame:
    """id 1 in place; id 2 with another checksum; id 3 missing; id 4 (rolled back)
    visible; id 8 below its hint; id 9 twice; id 12 after its hint."""
    return _m(
        spark,
        [
            ("q", 0, 100, 100, 1, 11, 1000),
            ("q", 0, 100, 130, 2, 99, 2000),
            ("q", 0, 100, 300, 4, 14, HOUR + 5),
            ("q", 0, 100, 400, 8, 18, HOUR + 100_000),
            ("q", 1, 200, 600, 9, 19, 1000),
            ("q", 1, 200, 610, 9, 19, 1000),
            ("q", 1, 200, 250, 12, 22, 1000),
        ],
    )


def _segments(tmp: str = "/d") -> list[formats.SegmentFile]:
    return [
        formats.SegmentFile(f"{tmp}/q-0/100.meta", "q", 0, 100, True, 1000),
        formats.SegmentFile(f"{tmp}/q-1/200.meta", "q", 1, 200, True, 1000),
    ]


@dataclass
class Stages:
    """The stages run on :func:`_redo` and :func:`_log` (lazy DataFrames)."""

    T: DataFrame
    M: DataFrame
    parts: DataFrame
    base_i: DataFrame
    agg: DataFrame
    tp: DataFrame
    tx: DataFrame
    E_rows: DataFrame
    A: DataFrame
    matched: DataFrame
    details: DataFrame


@pytest.fixture(scope="module")
def stages(spark: SparkSession) -> Iterator[Stages]:
    from notify.audit import checks, matching, transactions

    # cached as audit() caches them (the redo rows partitioned by key), and the expected rows
    # the finding builders join back to: each test's queries start from there
    cached = []

    def keep(df: DataFrame) -> DataFrame:
        cached.append(df.cache())
        return df

    T, M = keep(_redo(spark).repartition("tx_key")), keep(_log(spark))
    parts = checks.partition_table(spark, _segments())
    agg, base_i = transactions.incarnations(transactions.tx_records(T), keep)
    tp = keep(transactions.tx_partitions(base_i))
    tx = keep(transactions.transactions(agg, tp))
    E_rows = keep(matching.expected_rows(base_i, tp, tx, parts))
    A = matching.partition_messages(M)
    matched = keep(matching.match_messages(matching.expected_messages(E_rows), A))
    details = matching.message_details(E_rows)
    yield Stages(T, M, parts, base_i, agg, tp, tx, E_rows, A, matched, details)
    for df in cached:
        df.unpersist()


def test_transactions_one_row_per_incarnation(stages: Stages) -> None:
    """A key begun again after its ROLLBACK is two incarnations; the outcome, counts,
    string columns and partitions of each come from its own records."""
    cols = ["tx_key", "inc", "outcome", "messages", "bytes", "records", "partitions"]
    got = {(r["tx_key"], r["inc"]): tuple(r[c] for c in cols[2:]) for r in stages.tx.collect()}
    assert got == {
        ("A", 0): ("committed", 3, 90, 4, 2),
        ("B", 0): ("rolled_back", 1, 30, 2, 1),
        ("B", 1): ("prepared", 1, 30, 2, 1),
        ("C", 0): ("active", 1, 30, 1, 1),
        ("D", 0): ("committed", 1, 30, 2, 1),
        ("E", 0): ("committed", 1, 30, 2, 1),
        ("F", 0): ("committed", 1, 30, 2, 1),
        ("H", 0): ("heuristic_commit", 1, 30, 2, 1),
        (xid(1), 0): ("rolled_back", 1, 30, 2, 1),
        (xid(2), 0): ("committed", 1, 30, 2, 1),
        (xid(3), 0): ("active", 1, 30, 1, 1),
    }
    rows = {(r["tx_key"], r["inc"]): r for r in stages.tx.collect()}
    a, b0, b1 = rows["A", 0], rows["B", 0], rows["B", 1]
    assert a["history_complete"] and a["duration_ms"] == 500 and not a["xa"]
    assert (a["first_file_no"], a["first_position"]) == (0, 0)
    assert b0["rollback_reason"] == "r1" and b0["producer_group"] is None
    assert (b1["producer_group"], b1["timeout_s"], b1["prepared_at_ms"]) == ("g", 60, 3100)
    assert b1["first_position"] == 60 and rows[xid(1), 0]["xa"]
    assert rows["H", 0]["heuristic"] == "commit"


def test_incarnations_number_each_record(spark: SparkSession) -> None:
    """Every record gets its incarnation; a key not used again stays in one (the window
    runs only over reused keys)."""
    from notify.audit.transactions import incarnations, tx_records

    base = tx_records(_redo(spark))
    _agg, base_i = incarnations(base, lambda df: df)
    got = sorted((r["tx_key"], r["position"], r["inc"]) for r in base_i.collect())
    assert [(p, i) for k, p, i in got if k == "B"] == [(40, 0), (50, 0), (60, 1), (70, 1)]
    assert {i for k, _p, i in got if k != "B"} == {0}
    assert len(got) == base.count()


def test_tx_partitions_bytes_placement_and_hint(stages: Stages) -> None:
    """Per incarnation and partition: the bytes put, the APPLIED placement's end and the
    COMMIT hint (null where the records have none)."""
    got = {
        (r["tx_key"], r["inc"], r["partition"]): (r["total"], r["exp_end"], r["hint"])
        for r in stages.tp.filter("tx_key IN ('A', 'B', 'D')").collect()
    }
    assert got == {
        ("A", 0, 0): (60, 160, 100),
        ("A", 0, 1): (30, 230, 200),
        ("B", 0, 0): (30, None, None),
        ("B", 1, 0): (30, None, None),
        ("D", 0, 0): (30, None, 500),
    }


def test_matching_counts_each_check_once(stages: Stages) -> None:
    """Each expected message of a checkable transaction (history complete, not a
    heuristic outcome) is matched with its partition: one row each, and each condition of
    :func:`match_conditions` holds on the one message made to fail it."""
    from notify.audit.checks import count_rows
    from notify.audit.matching import match_conditions

    rows = {r["msg_id"]: r for r in stages.matched.collect()}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 13, 14]  # not H's 7
    one = rows[1]
    assert (one["n_here"], one["found_offset"], one["_lower"], one["_upper"]) == (1, 100, 100, 160)
    assert (rows[8]["_lower"], rows[8]["_upper"]) == (500, None)
    assert rows[10]["_expired"] and not rows[3]["_expired"]
    assert (rows[4]["n_here"], rows[4]["n_any"], rows[4]["_committed"]) == (1, 1, False)
    found, read, _ = count_rows("", stages.matched, match_conditions(), [], "")
    assert read == {}
    assert found == {
        "committed_missing": 1,  # 3 (10 is below the partition: expired)
        "committed_duplicate": 1,  # 9
        "committed_misplaced": 1,  # 8
        "committed_checksum_differs": 1,  # 2
        "uncommitted_visible": 1,  # 4
    }


def test_with_details_gives_every_message_its_transaction(stages: Stages) -> None:
    """The messages table: one row per expected message with its transaction's columns."""
    from notify.audit.matching import DETAIL_COLUMNS, with_details

    rows = with_details(stages.details, stages.matched, small=False).collect()
    assert len(rows) == 12
    by_id = {r["msg_id"]: r for r in rows}
    three = by_id[3]
    assert (three["tx_key"], three["tx_outcome"], three["exp_start"], three["exp_end"]) == (
        "A",
        "committed",
        200,
        230,
    )
    assert (three["size"], three["checksum"], three["idx"], three["min_offset"]) == (30, 13, 0, 200)
    assert set(DETAIL_COLUMNS) <= set(rows[0].asDict())


def _found(dfs: list[DataFrame]) -> list[tuple[Any, ...]]:
    from notify.audit.checks import _union

    if not dfs:
        return []
    return sorted(
        (r["check"], r["tx_key"], r["msg_id"], r["offset"], r["detail"])
        for r in _union(dfs).collect()
    )


def test_message_findings(stages: Stages) -> None:
    """The committed checks report where the message should be or was found; a visible
    uncommitted message is reported where its copy is; a check counted 0 is not built."""
    from notify.audit.findings import committed_findings, visible_findings
    from notify.audit.matching import match_conditions

    conds = match_conditions()
    counts = {c: 1 for c in conds}
    made = committed_findings(stages.matched, stages.details, conds, counts)
    made += visible_findings(
        stages.matched, stages.details, stages.A, conds["uncommitted_visible"], 1
    )
    found = _found(made)
    assert [f[:4] for f in found] == [
        ("committed_checksum_differs", "A", 2, 130),
        ("committed_duplicate", "E", 9, 600),
        ("committed_misplaced", "D", 8, 400),
        ("committed_missing", "A", 3, 200),
        ("uncommitted_visible", "B", 4, 300),
    ]
    details = [f[4] for f in found]
    assert details[2] == "found at 400; expected at or after COMMIT hint 500"
    assert details[3] == "committed message not in its partition; expected in [200, 230)"
    assert details[4] == "message of a rolled_back transaction is visible (put to q-0)"
    assert committed_findings(stages.matched, stages.details, conds, dict.fromkeys(conds, 0)) == []
    assert (
        visible_findings(stages.matched, stages.details, stages.A, conds["uncommitted_visible"], 0)
        == []
    )


def test_stuck_prepared_by_logged_or_given_timeout(stages: Stages) -> None:
    """A prepared transaction is stuck once older than its logged timeout (60 s), or the
    one given."""
    from notify.audit.findings import stuck_findings, stuck_prepared

    tx = stages.tx.drop("_last_file_no")
    stuck = stuck_prepared(tx, 3100 + 61_000, None)
    assert [(r["tx_key"], r["inc"], r["age_s"]) for r in stuck.collect()] == [("B", 1, 61.0)]
    (f,) = stuck_findings(stuck).collect()
    assert (f["check"], f["file"], f["position"]) == ("stuck_prepared", "redo.0", 60)
    assert f["detail"] == "prepared 61.0 s ago (timeout 60.0 s), 1 messages in doubt"
    assert stuck_prepared(tx, 3100 + 61_000, 100.0).count() == 0


def test_coordinator_findings(spark: SparkSession, stages: Stages) -> None:
    """The coordinator's decisions against the broker's XA outcomes: commit decided but
    rolled back, committed with no decision in an incomplete log, a decision for a branch
    never prepared; its unacknowledged heuristics and unreadable records."""
    from notify.audit.coordinator import CoordinatorLog, DecisionRow, HeuristicRow
    from notify.audit.findings import coordinator_findings, coordinator_table

    def decision(n: int, outcome: str) -> DecisionRow:
        return DecisionRow(f"tm1-{n}".encode().hex(), 1, outcome, "coordinator", 5, "tm1", [])

    clog = CoordinatorLog(
        "/c",
        "tm1",
        1,
        complete=False,
        decisions={"1": decision(1, "commit"), "3": decision(3, "rollback")},
        heuristics=[HeuristicRow("ab", "db", "b", "mixed", "commit", 7, "oops")],
        errors=["bad record"],
    )
    table = coordinator_table(spark, clog, stages.tx.drop("_last_file_no"))
    assert sorted((r["gtrid"], r["outcome"], r["decision"]) for r in table.collect()) == [
        ("tm1-1", "rolled_back", "commit"),
        ("tm1-2", "committed", None),
        ("tm1-3", "active", "rollback"),
    ]
    found = _found(coordinator_findings(spark, clog, table))
    assert [(c, k, d) for c, k, _i, _o, d in found] == [
        ("coordinator_heuristic", None, "db: mixed (decision commit) gtrid ab: oops"),
        ("coordinator_log_corrupt", None, "unreadable coordinator log record: bad record"),
        (
            "decision_unknown",
            xid(2),
            "broker committed; the coordinator log no longer covers this decision",
        ),
        ("heuristic_mismatch", xid(1), "coordinator decided commit, broker rolled back"),
        ("heuristic_mismatch", xid(3), "coordinator decided rollback for a branch never prepared"),
    ]


def test_log_and_txlog_findings(spark: SparkSession) -> None:
    """A record whose payload fails its CRC; a framing error in a partition's newest
    segment (torn tail) and in an older one (corrupt); CORRUPT redo rows in the checkpoint,
    the newest redo file and an older one; an undecodable redo record."""
    from notify.audit.checks import log_conditions, partition_table, txlog_conditions
    from notify.audit.findings import log_findings, txlog_findings

    rows = [
        ("q", 0, 0, 10, 5, 1, False, 30, 1, None, True),
        ("q", 0, 0, 40, None, None, None, None, None, "bad length", True),
        ("q", 0, 100, 150, None, None, None, None, None, "torn", True),
    ]
    M = spark.createDataFrame(rows, M_DDL)
    parts = partition_table(
        spark,
        [
            formats.SegmentFile("/d/q-0/0.meta", "q", 0, 0, False, 100),
            formats.SegmentFile("/d/q-0/100.meta", "q", 0, 100, True, 100),
        ],
    )
    found = _found(log_findings(M, parts, "/d", log_conditions()["checksum_mismatch"], 1, 2))
    assert [(c, o) for c, _k, _i, o, _d in found] == [
        ("checksum_mismatch", 10),
        ("segment_corrupt", 40),
        ("segment_torn_tail", 150),
    ]
    assert log_findings(M, parts, "/d", log_conditions()["checksum_mismatch"], 0, 0) == []
    T = _t(
        spark,
        [
            {"file_no": -1, "position": 4, "kind": "CORRUPT", "error": "e1"},
            {"file_no": 0, "position": 8, "kind": "CORRUPT", "error": "e2"},
            {"file_no": 1, "position": 12, "kind": "CORRUPT", "error": "e3"},
            {"file_no": 1, "position": 0, "kind": "COMMIT", "tx_key": "k", "error": "short"},
        ],
    )
    made = txlog_findings(T, "/t", 1, txlog_conditions()["txlog_undecodable"], 3, 1)
    got = sorted((r["check"], r["file"], r["position"]) for r in _union_rows(made))
    assert got == [
        ("checkpoint_damaged", "/t/checkpoint", 4),
        ("txlog_corrupt", "/t/redo.0", 8),
        ("txlog_torn_tail", "/t/redo.1", 12),
        ("txlog_undecodable", "/t/redo.1", 0),
    ]


def _union_rows(dfs: list[DataFrame]) -> list[Any]:
    from notify.audit.checks import _union

    return _union(dfs).collect()


def test_still_holding_drops_missing_below_the_partition(spark: SparkSession) -> None:
    """A carried ``committed_missing`` whose expected offset is now below its partition's
    oldest segment goes; the others are kept."""
    from notify.audit.checks import partition_table
    from notify.audit.findings import FINDING_COLUMNS, still_holding

    schema = ", ".join(f"{n} {t.simpleString()}" for n, t in FINDING_COLUMNS)
    carried = spark.createDataFrame(
        [
            ("committed_missing", "violation", "k", "q", 1, 50, 1, None, None, None),
            ("committed_missing", "violation", "k", "q", 1, 300, 2, None, None, None),
            ("checksum_mismatch", "violation", None, "q", 1, 20, 3, None, None, None),
        ],
        schema,
    )
    kept = still_holding(carried, partition_table(spark, _segments()))
    assert sorted(r["msg_id"] for r in kept.collect()) == [2, 3]
    assert kept.columns == [n for n, _t in FINDING_COLUMNS]


def test_count_rows_reads_and_reach(spark: SparkSession) -> None:
    """The partitions' pass counts checksum mismatches and errors among the rows parsed
    now, what was read and taken from the state, and per segment the first broken record
    or the end of the last whole one."""
    from notify.audit.checks import count_rows, log_conditions

    rows = [
        ("q", 0, 0, 0, 1, 1, True, 30, 1, None, False),  # from the state
        ("q", 0, 0, 30, 2, 1, False, 30, 1, None, True),
        ("q", 0, 0, 60, 3, 1, True, 30, 1, None, True),
        ("q", 1, 0, 0, 4, 1, True, 30, 1, None, True),
        ("q", 1, 0, 30, None, None, None, None, None, "torn", True),
    ]
    M = spark.createDataFrame(rows, M_DDL)
    keys = ["topic", "partition", "segment_start"]
    found, read, per_file = count_rows("log", M, log_conditions(), keys, "offset")
    assert found == {"checksum_mismatch": 1, "segment_error": 1}
    assert read == {"log_rows_read": 4, "log_bytes_read": 90, "log_rows_from_state": 1}
    reach = {r["partition"]: (r["_bad"], r["_end"]) for r in per_file}
    assert reach == {0: (None, 90), 1: (30, 30)}


def test_read_reach() -> None:
    """How far each file was read (a broken record wins over the end of the whole ones;
    segments relative to their start), and the redo records by kind, per file with the
    carried files' (CORRUPT and checkpoint rows only in the totals)."""
    from notify.audit.checks import AuditInputs, read_reach

    inputs = AuditInputs(
        Path("/t"),
        "/d",
        [formats.TxlogFile(f"/t/redo.{n}", n, n == 1, 100) for n in (0, 1)],
        _segments(),
        None,
        False,
        {},
    )
    txlog_rows = [
        {"file_no": 0, "kind": "APPEND_MSG", "_rows_read": 3, "_bad": None, "_end": 60},
        {"file_no": 0, "kind": "CORRUPT", "_rows_read": 1, "_bad": 60, "_end": None},
        {"file_no": 1, "kind": "COMMIT", "_rows_read": 2, "_bad": None, "_end": 50},
        {"file_no": -1, "kind": "CHECKPOINT", "_rows_read": 1, "_bad": None, "_end": 9},
    ]
    log_rows = [
        {"topic": "q", "partition": 0, "segment_start": 100, "_bad": None, "_end": 180},
        {"topic": "q", "partition": 1, "segment_start": 200, "_bad": 230, "_end": 260},
    ]
    reach = read_reach(txlog_rows, log_rows, inputs, {7: {"APPEND_MSG": 4}})
    assert reach.read_to == {
        "redo.0": 60,
        "redo.1": 50,
        "q-0/00000000000000000100": 80,
        "q-1/00000000000000000200": 30,
    }
    assert reach.kinds == {"APPEND_MSG": 7, "CORRUPT": 1, "COMMIT": 2, "CHECKPOINT": 1}
    assert reach.file_kinds == {0: {"APPEND_MSG": 3}, 1: {"COMMIT": 2}, 7: {"APPEND_MSG": 4}}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    txdir = tmp_path / "transactions"
    txdir.mkdir()
    (txdir / "redo.0").write_bytes(b"x" * 100)
    (txdir / "redo.1").write_bytes(b"x" * 40)
    (tmp_path / "q-0").mkdir()
    (tmp_path / "q-0" / f"{0:020d}.meta").write_bytes(b"y" * 70)
    return txdir, tmp_path


def _inputs(txdir: Path, data: Path, state: Path | None, full: bool = False) -> AuditInputs:
    from notify.audit.checks import list_inputs

    return list_inputs(txdir, data, state, full)


def test_list_inputs_decides_full_or_incremental(tmp_path: Path) -> None:
    """Without a state, or with one for other inputs, ``full``, or a file now shorter than
    an earlier run read, everything is read; else each file from where the state says."""
    txdir, data = _files(tmp_path)
    first = _inputs(txdir, data, None)
    assert not first.incremental and first.starts == {} and first.newest_redo == 1
    assert first.redo_paths == {0: "redo.0", 1: "redo.1"} and first.redo_nos == {0, 1}
    assert first.segment_paths == {("q", 0, 0): "q-0/00000000000000000000"}
    state = tmp_path / "state"
    consumed = {"redo.0": 100, "redo.1": 30, "q-0/00000000000000000000": 70, "redo.9": 5}
    save_files(AuditState(state), str(txdir), str(data), consumed, {})
    inc = _inputs(txdir, data, state)
    assert inc.incremental and inc.state is not None and inc.state.runs == 1
    assert inc.starts == {k: v for k, v in consumed.items() if k != "redo.9"}  # gone
    assert not _inputs(txdir, data, state, full=True).incremental
    assert not _inputs(txdir, txdir, state).incremental  # another data directory
    (txdir / "redo.0").write_bytes(b"x" * 10)  # rewritten since
    shrunk = _inputs(txdir, data, state)
    assert not shrunk.incremental and shrunk.starts == {}
    assert shrunk.state is not None and shrunk.state.why_full == (
        "redo.0 is shorter than what an earlier run read"
    )


def test_hours_and_state_tables(spark: SparkSession, stages: Stages) -> None:
    """Messages per segment, hour and block and per topic and hour; transactions per hour
    and outcome; and the state's tables (the redo rows parsed now, the records and keys by
    block)."""
    from notify.audit.checks import segment_hours, state_tables, topic_hours, tx_hours
    from notify.audit.findings import empty_findings

    seg = segment_hours(stages.M)
    assert sorted(
        (r["partition"], r["hour_ms"], r["messages"], r["bytes"]) for r in seg.collect()
    ) == [
        (0, 0, 2, 60),
        (0, HOUR, 2, 60),
        (1, 0, 3, 90),
    ]
    assert sorted((r["hour_ms"], r["messages"]) for r in topic_hours(seg).collect()) == [
        (0, 5),
        (HOUR, 2),
    ]
    tx = stages.tx.drop("_last_file_no")
    by_outcome = {r["outcome"]: (r["transactions"], r["messages"]) for r in tx_hours(tx).collect()}
    assert by_outcome["committed"] == (5, 7) and by_outcome["active"] == (2, 2)
    tables = state_tables(stages.T, stages.M, stages.tx, seg, empty_findings(spark), [0])
    assert {n: (by, files) for n, (_df, by, files) in tables.items()} == {
        "txlog": ("file_no", 0),
        "log": ("blk", 0),
        "keys": ("blk", 0),
        "tx": (None, 4),
        "hours": (None, 1),
        "findings": (None, 1),
    }
    assert tables["txlog"][0].count() == 22 and "_new" not in tables["txlog"][0].columns
    assert tables["keys"][0].count() == 10  # every key with a message, in block 0
    assert (
        state_tables(stages.T, stages.M, stages.tx, seg, empty_findings(spark), [])["keys"][
            0
        ].count()
        == 0
    )
