"""The coordinator end to end on real PostgreSQL, MariaDB and a broker."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from notify.errors import TransactionError
from notify.protocol.keys import Xid
from notify.txlog import TxLog
from notify.xa import (
    BranchHeuristicError,
    BranchStatus,
    HeuristicError,
    HeuristicHazardError,
    HeuristicKind,
    HeuristicMixedError,
    NotRegisteredError,
    OutcomeUnknownError,
    PostgresParticipant,
    RollbackError,
    TransactionTimeoutError,
    TxState,
)
from notify.xa.admin import forget
from tests.coordinator.conftest import Env, MakeTM
from tests.coordinator.helpers import (
    broker_prepared,
    message_ids,
    my_prepared,
    my_rows,
    pg_prepared,
    pg_rows,
)


def order(tx: Any, k: int, mysql: bool = False) -> None:
    tx.enlist("pg").execute("INSERT INTO orders (id) VALUES (%s)", (k,))
    if mysql:
        with tx.enlist("my").cursor() as cur:
            cur.execute("INSERT INTO orders (id) VALUES (%s)", (k,))
    tx.enlist("broker").send("orders", b"%d" % k)


def nothing_prepared(e: Env) -> bool:
    return (
        not pg_prepared(e.pg_dsn)
        and not broker_prepared(e.broker.addr)
        and (e.my_url is None or not my_prepared(e.my_url))
    )


def test_commit_and_rollback_across_three_resources(env3: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env3)
    for k in range(3):
        with tm.transaction(timeout=10) as tx:
            order(tx, k, mysql=True)
        assert tx.state is TxState.COMMITTED
        assert [s for _, s in tx.branches] == [BranchStatus.COMMITTED] * 3
    with pytest.raises(RuntimeError), tm.transaction() as tx:
        order(tx, 99, mysql=True)
        raise RuntimeError("the application changed its mind")
    assert tx.state is TxState.ROLLED_BACK
    assert pg_rows(env3.pg_dsn) == my_rows(env3.my_url or "") == {0, 1, 2}
    assert sorted(message_ids(env3.broker.addr)) == [0, 1, 2]
    assert nothing_prepared(env3)
    assert tm.decisions.decisions() == []  # every decision ENDed
    assert tm.active_count == 0


def test_one_phase_and_read_only_write_no_decision(env: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env)
    dsn = env.pg_dsn
    tm.register("pg", lambda: PostgresParticipant(dsn, detect_read_only=True))
    before = tm.decisions.end_position
    with tm.transaction() as tx:  # one participant: one-phase commit
        tx.enlist("pg").execute("INSERT INTO orders (id) VALUES (1)")
    assert tx.branches == [("pg", BranchStatus.COMMITTED)]
    with tm.transaction() as tx:  # pg reads only: the broker is the single voter left
        tx.enlist("pg").execute("SELECT count(*) FROM orders")
        tx.enlist("broker").send("orders", b"2")
    assert tx.branches == [("pg", BranchStatus.READ_ONLY), ("broker", BranchStatus.COMMITTED)]
    with tm.transaction() as tx:  # nothing written anywhere
        tx.enlist("pg").execute("SELECT 1")
        tx.enlist("broker")
    assert tx.state is TxState.COMMITTED
    with tm.transaction():  # no participant at all
        pass
    assert tm.decisions.end_position == before
    assert pg_rows(env.pg_dsn) == {1} and message_ids(env.broker.addr) == [2]


def test_a_failed_branch_rolls_everything_back(env: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env)
    with tm.transaction() as tx:
        order(tx, 1)
    with pytest.raises(RollbackError, match="pg voted rollback"), tm.transaction() as tx:
        tx.enlist("broker").send("orders", b"2")
        conn = tx.enlist("pg")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO orders (id) VALUES (1)")  # the app swallows it
    assert tx.branches == [("broker", BranchStatus.ROLLED_BACK), ("pg", BranchStatus.ROLLED_BACK)]
    assert RollbackError.retriable
    assert message_ids(env.broker.addr) == [1] and nothing_prepared(env)


def test_deadline(env: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env)
    with pytest.raises(TransactionTimeoutError), tm.transaction(timeout=0.3) as tx:
        order(tx, 1)
        time.sleep(0.5)
    assert tx.state is TxState.ROLLED_BACK
    with pytest.raises(TransactionTimeoutError), tm.transaction(timeout=0.2) as tx:
        time.sleep(0.3)
        tx.enlist("pg")
    assert pg_rows(env.pg_dsn) == set() and message_ids(env.broker.addr) == []
    assert nothing_prepared(env)


def test_misuse(env: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env)
    with pytest.raises(NotRegisteredError), tm.transaction() as tx:
        tx.enlist("nope")
    with tm.transaction() as tx:
        tx.enlist("pg")
        h1, h2 = tx.enlist("broker"), tx.enlist("broker")
        assert h1 is h2
    with pytest.raises(TransactionError):
        tx.enlist("pg")
    with pytest.raises(TransactionError):
        tx.commit()
    with tm.transaction() as tx:
        order(tx, 5)
        tx.rollback()  # explicit, inside the block
    assert pg_rows(env.pg_dsn) == set()


def test_concurrent_transactions_share_fsyncs(env: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env)
    flushes0 = tm.decisions.txlog._coord.flushes
    errors: list[BaseException] = []

    def worker(base: int) -> None:
        try:
            for k in range(base, base + 15):
                with tm.transaction(timeout=20) as tx:
                    order(tx, k)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i * 100,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    want = {i * 100 + j for i in range(8) for j in range(15)}
    assert pg_rows(env.pg_dsn) == want and sorted(message_ids(env.broker.addr)) == sorted(want)
    assert tm.decisions.txlog._coord.flushes - flushes0 < 120  # group commit


class AdminRollsBackFirst:
    """A real PostgreSQL participant whose prepared branch an operator rolls back by hand
    (``ROLLBACK PREPARED`` on another connection) just before the coordinator commits.
    With ``reports``, it then answers like an XA resource manager that knows it: XA_HEURRB
    (and remembers the branch until ``forget``)."""

    def __init__(self, dsn: str, reports: bool):
        self.inner = PostgresParticipant(dsn)
        self.dsn = dsn
        self.reports = reports
        self.forgotten: list[Xid] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def handle(self) -> Any:
        return self.inner.handle

    def commit(self, xid: Xid, one_phase: bool) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            for x in c.tpc_recover():
                if x.gtrid == xid.gtrid.decode():
                    c.tpc_rollback(x)
        if self.reports:
            raise BranchHeuristicError(
                "XA_HEURRB: rolled back by an operator", HeuristicKind.ROLLBACK
            )
        self.inner.commit(xid, one_phase)

    def forget(self, xid: Xid) -> None:
        forgotten_xids.append(xid)


forgotten_xids: list[Xid] = []


@pytest.mark.parametrize(
    "reports,kind,error",
    [
        (False, HeuristicKind.HAZARD, HeuristicHazardError),  # the branch just vanished
        (True, HeuristicKind.ROLLBACK, HeuristicMixedError),  # XA_HEURRB; the broker committed
    ],
)
def test_heuristic_outcome_is_logged_raised_and_listed(
    env: Env, make_tm: MakeTM, reports: bool, kind: HeuristicKind, error: type[HeuristicError]
) -> None:
    tm = make_tm(env)
    dsn = env.pg_dsn
    forgotten_xids.clear()
    tm.register("pg", lambda: AdminRollsBackFirst(dsn, reports))
    with pytest.raises(error) as ei, tm.transaction() as tx:
        order(tx, 1)
    assert tx.state is TxState.HEURISTIC
    (report,) = ei.value.reports
    assert report.name == "pg" and report.kind is kind
    assert forgotten_xids == ([tx.xid_of("pg")] if reports else [])
    assert message_ids(env.broker.addr) == [1] and pg_rows(env.pg_dsn) == set()
    assert tm.heuristics() == [report]
    (item,) = tm.in_doubt()
    assert item.gtrid == tx.gtrid and "heuristic" in item.status
    tm.close()
    tm2 = make_tm(env)  # survives a restart until acknowledged
    assert tm2.heuristics() == [report]
    assert forget(tm2.decisions, tx.gtrid.decode(), "ops") == 1
    assert tm2.heuristics() == [] and tm2.in_doubt() == []


def test_unknown_decision_durability_is_settled_by_recovery(
    env: Env, make_tm: MakeTM, monkeypatch: pytest.MonkeyPatch
) -> None:
    tm = make_tm(env)

    def eio(self: TxLog, fd: int) -> None:
        raise OSError(5, "EIO")

    # the disk fails every fsync (also of the log reopened after the first failure)
    monkeypatch.setattr(TxLog, "_fsync", eio)
    with pytest.raises(OutcomeUnknownError), tm.transaction() as tx:
        order(tx, 1)
    assert tx.state is TxState.IN_DOUBT
    report = tm.recover()  # not acted upon while the decision cannot be made durable
    assert len(report.failed) == 2 and not report.committed and not report.rolled_back
    monkeypatch.undo()
    assert len(pg_prepared(env.pg_dsn)) == 1 and len(broker_prepared(env.broker.addr)) == 1
    # the log refused writes since the failed fsync; recovery reopens it (rewriting its tail)
    # and writes the decision again, durable this time: commit
    report = tm.recover()
    assert len(report.committed) == 2 and report.completed == [tx.gtrid]
    assert pg_rows(env.pg_dsn) == {1} and message_ids(env.broker.addr) == [1]
    assert nothing_prepared(env)

    def enospc(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(28, "ENOSPC")

    tm.decisions.txlog._pwrite = enospc  # type: ignore[method-assign]
    with pytest.raises(RollbackError, match="decision not written"), tm.transaction() as tx:
        order(tx, 2)
    assert pg_rows(env.pg_dsn) == {1} and nothing_prepared(env)


def test_two_coordinators_do_not_fight(env: Env, make_tm: MakeTM) -> None:
    """Coordinator b's in-doubt branches are invisible to coordinator a's recovery."""
    b = make_tm(env, log="xa-b", coordinator_id="b")
    real = b.decisions.txlog._fsync

    def eio(fd: int) -> None:
        raise OSError(5, "EIO")

    b.decisions.txlog._fsync = eio  # type: ignore[method-assign]
    with pytest.raises(OutcomeUnknownError), b.transaction() as tx:
        order(tx, 1)  # b's decision is in its table: b would commit it
    b.decisions.txlog._fsync = real  # type: ignore[method-assign]
    a = make_tm(env, log="xa-a", coordinator_id="a")  # startup pass: rolls back a's orphans
    assert a.last_recovery is not None and a.last_recovery.clean
    assert not a.last_recovery.rolled_back and a.in_doubt() == []
    assert len(pg_prepared(env.pg_dsn)) == 1 and len(broker_prepared(env.broker.addr)) == 1
    with a.transaction() as tx:
        order(tx, 2)
    assert len(b.recover().committed) == 2
    assert pg_rows(env.pg_dsn) == {1, 2} and sorted(message_ids(env.broker.addr)) == [1, 2]


def test_pooled_connections_survive_server_restarts(
    env: Env, make_tm: MakeTM, postgres: Any
) -> None:
    tm = make_tm(env)
    with tm.transaction() as tx:
        order(tx, 1)
    env.broker.restart()
    postgres.restart()
    with tm.transaction() as tx:  # the idle connections are found closed and replaced
        order(tx, 2)
    assert pg_rows(env.pg_dsn) == {1, 2} and sorted(message_ids(env.broker.addr)) == [1, 2]
