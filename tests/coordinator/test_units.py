"""Coordinator units without a network: state machine, ids, record codec, decision log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import notify.xa
from notify.errors import ConfigError, TransactionError, TxLogCorruptError
from notify.protocol.keys import Xid
from notify.xa import records as rec
from notify.xa.decisionlog import DecisionLog, peek
from notify.xa.errors import (
    DecisionLogError,
    HeuristicHazardError,
    HeuristicKind,
    HeuristicMixedError,
    HeuristicRollbackError,
    LogLockedError,
    OutcomeUnknownError,
    UnknownXidError,
    VoteRollbackError,
    from_xa_code,
)
from notify.xa.ids import Scope, XidFactory, deadline_of, qualifier_of, xid_from_text, xid_to_text
from notify.xa.states import TERMINAL, TRANSITIONS, TxEvent, TxState, allowed, next_state
from notify.xa.transaction import heuristic_error

# ---------------------------------------------------------------------------- state machine


def test_happy_paths_through_the_table() -> None:
    two_pc = [TxEvent.ENLIST, TxEvent.PREPARE, TxEvent.PREPARED, TxEvent.DECIDE_COMMIT]
    s = TxState.ACTIVE
    for ev in [*two_pc, TxEvent.COMPLETED]:
        s = next_state(s, ev)
    assert s is TxState.COMMITTED
    s = TxState.ACTIVE
    for ev in (TxEvent.COMMIT_ONE_PHASE, TxEvent.ROLLED_BACK):
        s = next_state(s, ev)
    assert s is TxState.ROLLED_BACK
    s = TxState.ACTIVE
    for ev in [*two_pc, TxEvent.INCOMPLETE]:
        s = next_state(s, ev)
    assert s is TxState.COMMIT_PENDING


def test_no_way_out_of_terminal_states_and_no_commit_after_rollback() -> None:
    for state in TERMINAL:
        assert not any(allowed(state, ev) for ev in TxEvent), state
    assert not allowed(TxState.ROLLING_BACK, TxEvent.DECIDE_COMMIT)
    assert not allowed(TxState.ACTIVE, TxEvent.DECIDE_COMMIT)  # never without phase 1
    with pytest.raises(TransactionError, match="not allowed in state PREPARING"):
        next_state(TxState.PREPARING, TxEvent.DECIDE_COMMIT)


def test_every_state_is_reachable_and_every_nonterminal_can_end() -> None:
    reach = {TxState.ACTIVE}
    changed = True
    while changed:
        changed = False
        for (src, _), dst in TRANSITIONS.items():
            if src in reach and dst not in reach:
                reach.add(dst)
                changed = True
    assert reach == set(TxState)
    for state in set(TxState) - TERMINAL:
        assert any(src is state for src, _ in TRANSITIONS), state


def test_heuristic_classification() -> None:
    def r(kind: HeuristicKind) -> rec.HeuristicRecord:
        return rec.HeuristicRecord(
            b"g", "pg", b"pg", kind, rec.Outcome.COMMIT, rec.Source.COORDINATOR, 0, "m"
        )

    C = rec.Outcome.COMMIT
    assert heuristic_error(b"g", C, [r(HeuristicKind.COMMIT)], 1) is None
    assert isinstance(
        heuristic_error(b"g", C, [r(HeuristicKind.ROLLBACK)], 0), HeuristicRollbackError
    )
    assert isinstance(heuristic_error(b"g", C, [r(HeuristicKind.ROLLBACK)], 1), HeuristicMixedError)
    assert isinstance(heuristic_error(b"g", C, [r(HeuristicKind.HAZARD)], 1), HeuristicHazardError)
    assert isinstance(heuristic_error(b"g", C, [r(HeuristicKind.MIXED)], 0), HeuristicMixedError)


# ---------------------------------------------------------------------------- ids and errors


def test_gtrids_carry_owner_and_deadline() -> None:
    scope = Scope("shop")
    f = XidFactory(scope)
    g1, g2 = f.new_gtrid(1_700_000_000.2), f.new_gtrid(1_700_000_000.2)
    assert g1 != g2 and g1.startswith(b"shop-")
    assert deadline_of(g1) == 1_700_000_001 and qualifier_of(g1) == "shop"
    x = f.branch(g1, "orders_db")
    assert scope.owns(x) and not Scope("shop2").owns(x) and not Scope("shop", 7).owns(x)
    assert not scope.owns(Xid(scope.format_id, b"shop-not-ours", b"x"))
    assert x.key(scope.unique_qualifier).startswith(f"XID:{scope.format_id}:")
    text = xid_to_text(x)
    assert len(text) <= 64 and xid_from_text(text, scope.format_id) == x
    assert xid_from_text("plain-gid", 1) is None
    long = XidFactory(Scope("a" * 16)).branch(XidFactory(Scope("a" * 16)).new_gtrid(4e9), "n" * 24)
    assert len(xid_to_text(long)) <= 64


def test_bad_names_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        Scope("x")  # fine
        notify.xa.CoordinatorConfig("/tmp/x", default_timeout_s=0)
    from notify.xa.ids import validate_coordinator_id, validate_name

    for bad in ("has-dash", "", "x" * 17, "sp ace"):
        with pytest.raises(ConfigError):
            validate_coordinator_id(bad)
    with pytest.raises(ConfigError):
        validate_name("no/slash")


def test_xa_codes_map_to_behaviour() -> None:
    assert isinstance(from_xa_code(-4, "m"), UnknownXidError)
    assert isinstance(from_xa_code(106, "m"), VoteRollbackError)
    e = from_xa_code(6, "m")
    assert getattr(e, "kind", None) is HeuristicKind.ROLLBACK
    assert from_xa_code(-7, "m").retriable and not from_xa_code(-6, "m").retriable


PUBLIC = {
    # the coordinator
    "TransactionManager", "CoordinatorConfig", "Transaction", "TxState", "BranchStatus",
    "RecoveryReport", "InDoubt", "Resolution", "DecisionLog", "HeuristicRecord",
    # participants
    "Participant", "ParticipantFactory", "Vote", "Xid", "Scope", "DEFAULT_FORMAT_ID",
    "BrokerParticipant", "BrokerProducer", "SendResult", "PostgresParticipant",
    "MySQLParticipant", "SQLAlchemyParticipant",
    # errors
    "XAError", "RollbackError", "TransactionTimeoutError", "OutcomeUnknownError",
    "HeuristicError", "HeuristicMixedError", "HeuristicRollbackError", "HeuristicCommitError",
    "HeuristicHazardError", "HeuristicKind", "ParticipantError", "ParticipantUnavailableError",
    "UnknownXidError", "VoteRollbackError", "BranchHeuristicError", "NotRegisteredError",
    "DecisionLogError", "LogLockedError", "InDoubtError",
}  # fmt: skip


def test_public_surface() -> None:
    assert set(notify.xa.__all__) == PUBLIC
    for name in PUBLIC - {"ParticipantFactory", "DEFAULT_FORMAT_ID"}:
        assert getattr(notify.xa, name).__doc__, name
    for name in PUBLIC:
        obj = getattr(notify.xa, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, notify.xa.XAError) or obj is notify.xa.XAError, name
    assert issubclass(notify.xa.XAError, TransactionError)


# ---------------------------------------------------------------------------- record codec


def _decision(
    g: bytes = b"t1-6553f100-00000a000001", outcome: rec.Outcome = rec.Outcome.COMMIT
) -> rec.Decision:
    return rec.Decision(
        gtrid=g,
        outcome=outcome,
        source=rec.Source.COORDINATOR,
        decided_at_ms=1_700_000_000_123,
        deadline_s=1_700_000_030,
        format_id=0x4E545841,
        branches=(rec.Branch("pg", b"pg"), rec.Branch("broker", b"broker")),
        by="",
    )


def test_records_round_trip() -> None:
    items: list[rec.Record] = [
        _decision(),
        rec.EndRecord(b"g", 5),
        rec.HeuristicRecord(
            b"g", "pg", b"pg", HeuristicKind.MIXED, rec.Outcome.COMMIT, rec.Source.ADMIN, 9, "é"
        ),
        rec.AckRecord(b"g", 10, "ops"),
    ]
    for item in items:
        t, body = rec.encode(item)
        assert rec.decode(t, body) == item


def test_record_byte_layout_of_end() -> None:
    t, body = rec.encode(rec.EndRecord(b"ab", 0x0102))
    assert t == rec.END == 8
    assert body == b"\x01" + b"\x00\x02ab" + (0x0102).to_bytes(8, "big")


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_damaged_bodies_are_rejected(cut: int) -> None:
    t, body = rec.encode(_decision())
    with pytest.raises(TxLogCorruptError):
        rec.decode(t, body[:-cut])
    with pytest.raises(TxLogCorruptError):
        rec.decode(t, body + b"x")
    with pytest.raises(TxLogCorruptError):
        rec.decode(99, body)
    with pytest.raises(TxLogCorruptError):
        rec.decode(t, b"\x02" + body[1:])  # unknown version


def test_table_and_snapshot() -> None:
    table = rec.DecisionTable("t1", 7)
    d1, d2 = _decision(b"a"), _decision(b"b")
    h = rec.HeuristicRecord(
        b"a", "pg", b"pg", HeuristicKind.HAZARD, rec.Outcome.COMMIT, rec.Source.COORDINATOR, 1, ""
    )
    for r in (d1, d2, h, rec.EndRecord(b"a", 2), rec.EndRecord(b"zz", 3)):
        table.apply(r)
    assert set(table.decisions) == {b"b"} and table.heuristics[b"a"] == [h]
    again = rec.DecisionTable.from_snapshot(table.snapshot())
    assert again == table
    table.apply(rec.AckRecord(b"a", 4, "ops"))
    assert not table.heuristics
    with pytest.raises(TxLogCorruptError):
        rec.DecisionTable.from_snapshot(b"nope")
    with pytest.raises(TxLogCorruptError):
        rec.DecisionTable.from_snapshot(table.snapshot()[:-3] if table.decisions else b"NXAS")


# ---------------------------------------------------------------------------- decision log


def test_log_replays_decisions_and_keeps_identity(tmp_path: Path) -> None:
    path = tmp_path / "xa"
    with DecisionLog.open(path) as log:
        cid = log.scope.coordinator_id
        assert cid.startswith("tm")
        log.decide(_decision(b"a"))
        log.decide(_decision(b"b"))
        log.end(b"a")
    with DecisionLog.open(path) as log:
        assert log.scope.coordinator_id == cid
        assert [d.gtrid for d in log.decisions()] == [b"b"]
    with pytest.raises(ConfigError, match="belongs to coordinator"):
        DecisionLog.open(path, coordinator_id="other")
    with pytest.raises(ConfigError, match="formatId"):
        DecisionLog.open(path, format_id=12)


def test_checkpoint_snapshots_and_drops_old_segments(tmp_path: Path) -> None:
    from notify.txlog import TxLogConfig

    path = tmp_path / "xa"
    cfg = TxLogConfig(flush_at_commit=1, segment_bytes=4096, max_checkpoints=2)
    with DecisionLog.open(path, "t1", config=cfg, checkpoint_bytes=1) as log:
        for i in range(200):
            g = b"t1-%08x-%012x" % (0, i)
            log.decide(_decision(g))
            if i % 3:
                log.end(g)
            if i % 50 == 0:
                assert log.checkpoint()
        live = {d.gtrid for d in log.decisions()}
        assert len(live) == 67
    assert len(list(path.glob("redo.*"))) < 5  # old segments deleted
    with DecisionLog.open(path, "t1", config=cfg) as log:
        assert {d.gtrid for d in log.decisions()} == live


def test_lock_and_peek(tmp_path: Path) -> None:
    path = tmp_path / "xa"
    assert peek(path) is None
    with DecisionLog.open(path, "t1") as log:
        log.decide(_decision(b"a"))
        with pytest.raises(LogLockedError, match=str(os.getpid())):
            DecisionLog.open(path)
        seen = peek(path)
        assert seen is not None and set(seen.decisions) == {b"a"}
    with DecisionLog.open(path):  # released on close
        pass


def test_end_records_go_out_with_the_next_write(tmp_path: Path) -> None:
    """END is applied at once but written with the next record (one write syscall), at a
    checkpoint, on close or once END_BATCH are queued; never lost from the table."""
    from notify.xa.decisionlog import END_BATCH

    path = tmp_path / "xa"
    with DecisionLog.open(path, "t1", checkpoint_bytes=1 << 30) as log:
        log.decide(_decision(b"a"))
        log.decide(_decision(b"b"))
        before = log.end_position
        log.end(b"a")
        assert [d.gtrid for d in log.decisions()] == [b"b"]  # gone from the table now
        assert log.end_position == before  # nothing written yet
        seen = peek(path)  # what a crash now would leave: "a" looked at once more
        assert seen is not None and set(seen.decisions) == {b"a", b"b"}
        writes = 0
        real = log.txlog._pwrite

        def counting(fd: int, data: memoryview, offset: int) -> int:
            nonlocal writes
            writes += 1
            return real(fd, data, offset)

        log.txlog._pwrite = counting  # type: ignore[method-assign]
        log.decide(_decision(b"c"))
        assert writes == 1  # END of "a" and the decision of "c": one write
        seen = peek(path)
        assert seen is not None and set(seen.decisions) == {b"b", b"c"}
        for i in range(END_BATCH):
            log.end(b"x%d" % i)  # unknown gtrids are harmless
        assert writes == 2  # the batch went out on its own
        log.end(b"b")
        assert log.checkpoint(force=True)
        seen = peek(path)
        assert seen is not None and set(seen.decisions) == {b"c"}
        log.end(b"c")
    with DecisionLog.open(path, "t1") as log:  # the END queued at close was written
        assert log.decisions() == []


def test_torn_tail_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "xa"
    with DecisionLog.open(path, "t1") as log:
        log.decide(_decision(b"a"))
        end = log.end_position
    seg = path / f"redo.{end.file_no}"
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")
    with DecisionLog.open(path, "t1") as log:
        assert [d.gtrid for d in log.decisions()] == [b"a"]
        assert log.txlog.recovery.truncated_bytes == 11


def test_failed_fsync_makes_the_outcome_unknown_and_failed_write_is_clean(tmp_path: Path) -> None:
    with DecisionLog.open(tmp_path / "xa", "t1") as log:

        def bad_fsync(fd: int) -> None:
            raise OSError(5, "EIO")

        real = log.txlog._fsync
        log.txlog._fsync = bad_fsync  # type: ignore[method-assign]
        with pytest.raises(OutcomeUnknownError):
            log.decide(_decision(b"a"))
        assert log.decision(b"a") is not None  # recovery will act on it
        log.txlog._fsync = real  # type: ignore[method-assign]

        def bad_write(fd: int, data: memoryview, offset: int) -> int:
            raise OSError(28, "ENOSPC")

        log.txlog._pwrite = bad_write  # type: ignore[method-assign]
        with pytest.raises(DecisionLogError, match="not written"):
            log.decide(_decision(b"b"))
        assert log.decision(b"b") is None  # nothing appended: the caller rolls back
