"""The audit on a real Spark standalone cluster (a master and two workers on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.audit.conftest import TEST_CONF, BrokerLogs, SparkCluster

pytestmark = pytest.mark.slow


def test_audit_on_standalone_cluster(
    spark_cluster: SparkCluster, broker_logs: BrokerLogs, tmp_path: Path
) -> None:
    """``notify audit --master spark://...`` in its own process: the executors (two worker
    JVMs, their Python workers) read the broker's files and find the same five violations."""
    time.sleep(max(0.0, broker_logs.prepared_at + 1.2 - time.time()))
    out = tmp_path / "report"
    cmd = [
        sys.executable,
        "-m",
        "notify",
        "audit",
        "--master",
        spark_cluster.url,
        "--driver-memory",
        "1g",
        "--txlog",
        str(broker_logs.corrupt / "transactions"),
        "--data",
        str(broker_logs.corrupt),
        "--coordinator-log",
        str(broker_logs.coord_mismatch),
        "--tx-timeout",
        "1",
        "--out",
        str(out),
        "--quiet",
        # the tests' settings (tests/audit/conftest.py); the product's run in test_audit
        *[a for k, v in TEST_CONF.items() for a in ("--conf", f"{k}={v}")],
    ]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 1, p.stdout + p.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings_by_check"] == {
        "checksum_mismatch": 1,
        "committed_missing": 1,
        "heuristic_mismatch": 1,
        "stuck_prepared": 1,
        "uncommitted_visible": 1,
    }
    assert summary["run"]["master"] == spark_cluster.url
    # the work ran on the cluster's executors, not in the driver
    assert summary["run"]["executors"] == 2
    with urllib.request.urlopen(f"{spark_cluster.web}/json/") as r:
        apps = json.load(r)
    assert any(a["name"] == "notify-audit" for a in apps["completedapps"] + apps["activeapps"])
