"""A transaction key used again after its transaction ended: two incarnations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.idgen import BROKER_BITS, EPOCH_MS, SEQ_BITS
from notify.store.segment import segment_name
from notify.txlog.records import encode as frame
from notify.txlog.segment import segment_path

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
    redo_file = segment_path(tmp_path / "transactions", 0)
    seg = tmp_path / "q-0" / segment_name(0)
    # a run with a state sees the first incarnation only; the key begins again after it
    redo_file.write_bytes(b"".join(redo[:3]))
    seg.write_bytes(m1)
    state = tmp_path / "state"
    first = audit(spark, txlog=tmp_path / "transactions", data=tmp_path, state=state)
    try:
        assert first.finding_counts() == {}
        first.save_state()
    finally:
        first.unpersist()
    redo_file.write_bytes(b"".join(redo))
    seg.write_bytes(m1 + m2)  # m2 should not be there
    result = audit(spark, txlog=tmp_path / "transactions", data=tmp_path)
    inc = audit(spark, txlog=tmp_path / "transactions", data=tmp_path, state=state)
    try:
        for res in (result, inc):
            incs = sorted(
                (r["inc"], r["outcome"], r["messages"])
                for r in res.transactions.select("inc", "outcome", "messages").collect()
            )
            assert incs == [(0, "committed", 1), (1, "rolled_back", 1)]
            found = [(f["check"], f["msg_id"]) for f in res.findings.collect()]
            assert found == [("uncommitted_visible", id0 + 1)]
        # the key's first incarnation, read back from the state, is aggregated with the rest
        assert inc.incremental and inc.stats["keys_changed"] == 1
    finally:
        result.unpersist()
        inc.unpersist()
