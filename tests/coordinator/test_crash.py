"""Crash matrix: SIGKILL the coordinator (a child process at NOTIFY_CRASHPOINTS) or the
broker (its own crashpoints) at each step of 2PC, restart, recover, and check that every
resource agrees (row present iff message visible) and nothing stays prepared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from notify.protocol.keys import Xid
from notify.testing import BrokerProcess
from notify.xa import BranchStatus, PostgresParticipant, RollbackError, TxState, Vote
from notify.xa.ids import deadline_of
from tests.coordinator.conftest import XA_TOPICS, Env, MakeTM
from tests.coordinator.helpers import (
    APPS,
    broker_prepared,
    message_ids,
    my_prepared,
    my_rows,
    pg_prepared,
    pg_rows,
)
from tests.coordinator.test_coordinator import nothing_prepared

ROOT = Path(__file__).resolve().parents[2]


def run_app(
    e: Env,
    log: Path,
    ack: Path,
    first: int,
    count: int,
    crashpoint: str | None = None,
    threads: int = 1,
    names: str = "pg,broker",
) -> subprocess.Popen[bytes]:
    """Start :mod:`tests.coordinator.xa_app` (coordinator id ``app``)."""
    cmd = [
        sys.executable, "-m", "tests.coordinator.xa_app",
        "--log", str(log), "--broker", e.broker.addr, "--pg", e.pg_dsn,
        "--first", str(first), "--count", str(count), "--ack", str(ack),
        "--threads", str(threads), "--names", names,
    ]  # fmt: skip
    if e.my_url:
        cmd += ["--mysql", e.my_url]
    env = {**os.environ, "NOTIFY_CRASHPOINTS": crashpoint or ""}
    with open(ack.with_suffix(".err"), "ab") as err:  # the child keeps its own descriptor
        app = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    APPS.append(app)
    return app


def agree(e: Env) -> set[int]:
    """Assert every resource holds the same transactions; return their numbers."""
    rows = pg_rows(e.pg_dsn)
    msgs = message_ids(e.broker.addr)
    assert sorted(msgs) == sorted(k for k in rows for _ in range(2)), (rows, msgs)
    if e.my_url:
        assert my_rows(e.my_url) == rows
    assert nothing_prepared(e)
    return rows


# point, committed after recovery, branches prepared at the crash, branches already committed
COORDINATOR_POINTS = [
    ("xa_before_prepare", False, 0, 0),
    ("xa_between_prepares", False, 1, 0),
    ("xa_before_decision", False, 3, 0),
    ("xa_after_decision", True, 3, 0),
    ("xa_between_commits", True, 2, 1),
    ("xa_before_end", True, 0, 3),
]


@pytest.mark.crash
@pytest.mark.parametrize("point,committed,prepared,done", COORDINATOR_POINTS)
def test_coordinator_killed(
    env3: Env,
    make_tm: MakeTM,
    tmp_path: Path,
    point: str,
    committed: bool,
    prepared: int,
    done: int,
) -> None:
    ack = tmp_path / "ack"
    app = run_app(env3, tmp_path / "xa", ack, 0, 3, point)
    app.wait(60)
    err = ack.with_suffix(".err").read_text()
    assert app.returncode == -signal.SIGKILL, err
    assert f"crashpoint {point}" in err
    assert ack.read_text().split("\n")[:1] == ["b 0"]
    visible = [  # enlistment (and commit) order: pg, my, broker
        pg_rows(env3.pg_dsn) == {0},
        my_rows(env3.my_url or "") == {0},
        sorted(message_ids(env3.broker.addr)) == [0, 0],
    ]
    assert visible == [True] * done + [False] * (3 - done)
    held = (
        len(pg_prepared(env3.pg_dsn))
        + len(my_prepared(env3.my_url or ""))
        + len(broker_prepared(env3.broker.addr))
    )
    assert held == prepared  # what the crash left in doubt
    # restart the coordinator: recovery at start settles transaction 0
    tm = make_tm(env3, coordinator_id="app")
    assert tm.last_recovery is not None and tm.last_recovery.clean
    assert agree(env3) == ({0} if committed else set())
    assert tm.decisions.decisions() == []
    with tm.transaction() as tx:  # and it works on
        tx.enlist("pg").execute("INSERT INTO orders (id) VALUES (7)")
        tx.enlist("my").cursor().execute("INSERT INTO orders (id) VALUES (7)")
        for p in (0, 1):
            tx.enlist("broker").send("orders", b"7:%d" % p, partition=p)
    assert agree(env3) == ({0, 7} if committed else {7})


def _order(tx: object, k: int) -> None:
    tx.enlist("pg").execute("INSERT INTO orders (id) VALUES (%s)", (k,))  # type: ignore[attr-defined]
    producer = tx.enlist("broker")  # type: ignore[attr-defined]
    for p in (0, 1):  # two partitions: mid_apply falls between them
        producer.send("orders", b"%d:%d" % (k, p), partition=p)


@pytest.mark.crash
@pytest.mark.parametrize("point", ["after_prepare_record", "after_commit_record", "mid_apply"])
def test_broker_killed(env: Env, make_tm: MakeTM, tmp_path: Path, point: str) -> None:
    b = BrokerProcess(tmp_path / "crashy", topics=XA_TOPICS, env={"NOTIFY_CRASHPOINTS": point})
    b.start()
    try:
        e = replace(env, broker=b)
        tm = make_tm(e, recovery_grace_s=0.2)
        expect = pytest.raises(RollbackError) if point == "after_prepare_record" else _nothing()
        # a deadline that leaves the broker's restart seconds to spare on a loaded machine:
        # the first recovery pass below must come before the branch expires
        with expect, tm.transaction(timeout=6) as tx:
            _order(tx, 1)
        assert b.wait_exit(10) is not None, "crashpoint not reached"
        if point == "after_prepare_record":
            assert tx.state is TxState.ROLLED_BACK
            assert tx.branches == [
                ("pg", BranchStatus.ROLLED_BACK),
                ("broker", BranchStatus.PENDING),
            ]
        else:
            assert tx.state is TxState.COMMIT_PENDING and tx.pending == ["broker"]
            assert pg_rows(e.pg_dsn) == {1}  # committed; the broker follows at recovery
        b.env = {}
        b.start()
        if point == "after_prepare_record":
            assert len(broker_prepared(b.addr)) == 1  # its PREPARE record was durable
            report = tm.recover()  # not yet expired: a periodic pass waits
            assert len(report.waiting) == 1 and not report.rolled_back
            expires = (deadline_of(tx.gtrid) or 0) + 0.2  # the gtrid's deadline + grace
            time.sleep(max(0.0, expires + 0.1 - time.time()))
            report = tm.recover()
            assert len(report.rolled_back) == 1
            assert agree(e) == set()
        else:
            report = tm.recover()  # the broker re-applied its COMMIT: the decision is done
            assert report.completed == [tx.gtrid]
            assert agree(e) == {1}
        assert tm.decisions.decisions() == []
        with tm.transaction() as tx:
            _order(tx, 3)
        assert 3 in agree(e)
    finally:
        b.stop()


@pytest.mark.crash
def test_broker_killed_while_the_transaction_is_active(env: Env, make_tm: MakeTM) -> None:
    tm = make_tm(env)
    with pytest.raises(RollbackError), tm.transaction() as tx:
        _order(tx, 1)
        env.broker.kill()
    assert tx.state is TxState.ROLLED_BACK
    env.broker.start()  # the broker rolls back what was never prepared
    assert tm.recover().clean
    assert agree(env) == set()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class KillsBroker:
    """A real PostgreSQL participant that SIGKILLs the broker around one of its steps, so the
    broker dies at a precise point of the coordinator's protocol."""

    def __init__(self, dsn: str, broker: BrokerProcess, step: str, after: bool):
        self.inner = PostgresParticipant(dsn)
        self.broker, self.step, self.after = broker, step, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def handle(self) -> Any:
        return self.inner.handle

    def _maybe_kill(self, step: str, after: bool) -> None:
        if step == self.step and after == self.after:
            self.broker.kill()  # a no-op when it is already dead

    def prepare(self, xid: Xid) -> Vote:
        self._maybe_kill("prepare", False)
        vote = self.inner.prepare(xid)
        self._maybe_kill("prepare", True)
        return vote

    def commit(self, xid: Xid, one_phase: bool) -> None:
        self._maybe_kill("commit", False)
        self.inner.commit(xid, one_phase)
        self._maybe_kill("commit", True)


@pytest.mark.crash
@pytest.mark.parametrize(
    "step,after,committed",
    [
        ("prepare", False, False),  # before any prepare
        ("prepare", True, False),  # between prepares (pg prepared)
        ("commit", False, True),  # after the decision, before any commit
        ("commit", True, True),  # between commits (pg committed)
    ],
)
def test_broker_killed_at_coordinator_steps(
    env: Env, make_tm: MakeTM, step: str, after: bool, committed: bool
) -> None:
    tm = make_tm(env, recovery_grace_s=0.0)
    dsn, b = env.pg_dsn, env.broker
    tm.register("pg", lambda: KillsBroker(dsn, b, step, after))
    expect = _nothing() if committed else pytest.raises(RollbackError)
    with expect, tm.transaction(timeout=1) as tx:
        _order(tx, 1)
    assert tx.state is (TxState.COMMIT_PENDING if committed else TxState.ROLLED_BACK)
    b.start()
    if committed:
        assert len(broker_prepared(b.addr)) == 1
        assert tm.recover().committed == [("broker", tx.xid_of("broker"))]
    else:
        time.sleep(max(0.0, (deadline_of(tx.gtrid) or 0) + 0.1 - time.time()))
        tm.recover()
    assert agree(env) == ({1} if committed else set())
    assert tm.decisions.decisions() == []
