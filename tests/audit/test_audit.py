"""The Spark audit on real broker logs: the data sources, a clean run, a corrupted run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from notify.audit import formats
from notify.cli import main
from tests.audit.conftest import BrokerLogs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


def test_data_sources_one_partition_per_file(spark: SparkSession, logs: BrokerLogs) -> None:
    log = spark.read.format("notify-log").option("payload", "true").load(str(logs.clean))
    segs = formats.find_segments(logs.clean)
    assert log.rdd.getNumPartitions() == len(segs)
    rows = log.select("topic", "partition", "offset", "msg_id", "checksum_ok", "payload").collect()
    python = sum(len(c["offset"]) for s in segs for c in formats.read_segment(s))
    assert len(rows) == python and all(r["checksum_ok"] for r in rows)
    assert {r["payload"] for r in rows if r["topic"] == "drop"} == {b"c2-a", b"c2-b"}
    txlog = spark.read.format("notify-txlog").load(str(logs.clean / "transactions"))
    kinds = {r["kind"]: r["count"] for r in txlog.groupBy("kind").count().collect()}
    assert kinds["APPEND_MSG"] == 12 and kinds["COMMIT"] == 4 and kinds["APPLIED"] == 3
    assert kinds["ROLLBACK"] == 3 and kinds["PREPARE"] == 3
    # option columns: only those columns cross to the JVM, the same rows
    some = (
        spark.read.format("notify-log")
        .option("columns", "offset,msg_id,topic")
        .load(str(logs.clean))
    )
    assert some.columns == ["topic", "offset", "msg_id"]
    assert sorted(some.collect()) == sorted(log.select("topic", "offset", "msg_id").collect())
    narrow = (
        spark.read.format("notify-txlog")
        .option("columns", "kind,tx_key,msg_ids")
        .load(str(logs.clean / "transactions"))
    )
    assert narrow.columns == ["kind", "tx_key", "msg_ids"]
    assert sorted(narrow.collect()) == sorted(txlog.select("kind", "tx_key", "msg_ids").collect())
    with pytest.raises(Exception, match="no column nope"):
        spark.read.format("notify-log").option("columns", "offset,nope").load(
            str(logs.clean)
        ).collect()


def test_clean_logs_report_nothing(spark: SparkSession, logs: BrokerLogs) -> None:
    from notify.audit import audit

    result = audit(spark, txlog=logs.clean, data=logs.clean, coordinator_log=logs.coord_clean)
    try:
        assert result.findings.collect() == []
        outcomes = {
            r["tx_key"]: r["outcome"]
            for r in result.transactions.select("tx_key", "outcome").collect()
        }
        assert sorted(outcomes.values()) == ["committed"] * 4 + ["prepared"] + ["rolled_back"] * 3
        assert outcomes[logs.prepared_key] == "prepared"
        # the committed transaction without APPLIED was checked against its COMMIT hint
        assert result.messages is not None  # a run without a state matches every message
        hinted = result.messages.filter(f"tx_key = '{logs.hint_key}'").collect()
        assert len(hinted) == 4 and all(r["n_here"] == 1 and not r["has_applied"] for r in hinted)
        placed = result.messages.filter("tx_key = 'TX:s1:3'").collect()
        assert all(r["exp_start"] <= r["found_offset"] < r["exp_end"] for r in placed)
    finally:
        result.unpersist()


def test_corruptions_reported_exactly_once(
    spark: SparkSession, logs: BrokerLogs, tmp_path: Path
) -> None:
    time.sleep(max(0.0, logs.prepared_at + 1.2 - time.time()))
    out = tmp_path / "report"
    args = [
        "audit",
        "--txlog",
        str(logs.corrupt / "transactions"),
        "--data",
        str(logs.corrupt),
        "--coordinator-log",
        str(logs.coord_mismatch),
        "--tx-timeout",
        "1",
        "--out",
        str(out),
    ]
    # the product's settings for this run (the CLI sets them on the shared session; the
    # tests' expression evaluation is unset here)
    spark.conf.unset("spark.sql.codegen.factoryMode")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1, res.output
    found = sorted(
        (r["check"], r["tx_key"], r["msg_id"])
        for r in spark.read.parquet(str(out / "findings.parquet")).collect()
    )
    assert found == sorted(
        [
            ("checksum_mismatch", None, logs.flipped_id),
            ("committed_missing", "TX:s1:2", logs.dropped_id),
            ("heuristic_mismatch", logs.mismatch_key, None),
            ("stuck_prepared", logs.prepared_key, None),
            ("uncommitted_visible", "TX:s1:4", logs.visible_id),
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is False and summary["violations"] == 5
    assert summary["stuck_prepared"][0]["tx_key"] == logs.prepared_key
    assert summary["stuck_prepared"][0]["age_s"] >= 1
    page = (out / "report.html").read_text()
    assert page.count("<svg") >= 4 and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    for table in ("transactions", "stuck_prepared", "coordinator", "topic_hours", "tx_hours"):
        assert (out / f"{table}.parquet" / "_SUCCESS").exists()
    # the next run is incremental (the state under --out): nothing was added, the same
    # findings are carried or made again, and the report says what it checked again
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1, again.output
    assert found == sorted(
        (r["check"], r["tx_key"], r["msg_id"])
        for r in spark.read.parquet(str(out / "findings.parquet")).collect()
    )
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["incremental"] and run["state_runs"] == 2
    assert "checked again: " in (out / "report.html").read_text()


@pytest.fixture
def logs(broker_logs: BrokerLogs) -> BrokerLogs:
    return broker_logs
