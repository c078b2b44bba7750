"""A transaction key used again after its transaction ended: two incarnations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from notify.broker.idgen import BROKER_BITS, EPOCH_MS, SEQ_BITS
from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.store.segment import segment_name
from txlog.records import encode as frame
from txlog.segment import segment_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


def test_reused_key_has_two_incarnations(spark: SparkSession, tmp_path: Path) -> None:
    """``TX:r:1`` commits one message, then the key begins again and that incarnation is
    rolled back with its message left visible in the partition: the audit keeps them apart
    (committed and found; rolled back and visible), which one row per key could not."""
    from notify.audit import audit

    (tmp_path / "q-0").mkdir()
    (tmp_path / "transactions").mkdir()
    id0 = ((int(time.time() * 1000) - EPOCH_MS) << (BROKER_BITS + SEQ_BITS)) | 1
    m1, m2 = records.encode(id0, 0, b"first"), records.encode(id0 + 1, 0, b"second")
    key = "TX:r:1"
    redo = [
        frame(lr.APPEND_MSG, lr.AppendMsg(key, "q", 0, 1, m1).encode()),
        frame(lr.COMMIT, lr.Commit(key, 1, (("q", 0, 0),)).encode()),
        frame(lr.APPLIED, lr.Applied(key, (("q", 0, 0, 1, len(m1)),)).encode()),
        frame(lr.APPEND_MSG, lr.AppendMsg(key, "q", 0, 1, m2).encode()),
        frame(lr.ROLLBACK, lr.Rollback(key, "rollback").encode()),
    ]
    segment_path(tmp_path / "transactions", 0).write_bytes(b"".join(redo))
    (tmp_path / "q-0" / segment_name(0)).write_bytes(m1 + m2)  # m2 should not be there
    result = audit(spark, txlog=tmp_path / "transactions", data=tmp_path)
    try:
        incs = sorted(
            (r["inc"], r["outcome"], r["messages"])
            for r in result.transactions.select("inc", "outcome", "messages").collect()
        )
        assert incs == [(0, "committed", 1), (1, "rolled_back", 1)]
        found = [(r["check"], r["msg_id"]) for r in result.findings.collect()]
        assert found == [("uncommitted_visible", id0 + 1)]
    finally:
        result.unpersist()
