"""The database side of half messages and of ``producer.transaction(db=...)``, from the
outbox: a half message's transaction commits its marker with the application's rows (or
rolls both back); the check-back answers from the marker table alone, waits for a marker
being committed, says UNKNOWN when that wait is too long, and a tombstone it left makes a
late commit fail (never two outcomes); a batch of sends is checked as it is built and
written together."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from notify.outbox import (
    HalfMarkers,
    HalfMessageCheckedBackError,
    HalfState,
    Outbox,
    OutboxArgumentError,
    outbox_for,
)
from tests.helpers import wait_until
from tests.outbox.conftest import backlog


def _orders(engine: Engine) -> list[int]:
    with engine.connect() as c:
        return list(c.execute(sa.text("SELECT id FROM orders ORDER BY id")).scalars())


def test_marked_transaction_commits_and_rolls_back_with_its_marker(engine: Engine) -> None:
    markers = HalfMarkers(engine, "shop", lock_timeout_s=1.0)
    tx = markers.begin("TX:aa:1")
    tx.conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
    tx.commit()
    tx = markers.begin("TX:aa:2")
    tx.conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
    tx.rollback()
    assert _orders(engine) == [1]
    assert markers.check("TX:aa:1") is HalfState.COMMIT
    assert markers.check("TX:aa:2") is HalfState.ROLLBACK
    # the broker asks while the transaction is still open: ROLLBACK, and its commit fails
    # (SQLite: the open transaction holds the one write lock: UNKNOWN, then it commits)
    tx = markers.begin("TX:aa:3")
    tx.conn.execute(sa.text("INSERT INTO orders (id) VALUES (3)"))
    if engine.dialect.name == "sqlite":
        assert markers.check("TX:aa:3") is HalfState.UNKNOWN
        tx.commit()
        assert markers.check("TX:aa:3") is HalfState.COMMIT
        assert _orders(engine) == [1, 3]
    else:
        assert markers.check("TX:aa:3") is HalfState.ROLLBACK
        with pytest.raises(HalfMessageCheckedBackError, match="checked back") as err:
            tx.commit()
        assert isinstance(err.value.__cause__, sa_exc.IntegrityError)
        assert tx.conn.closed
        assert _orders(engine) == [1]
        assert markers.check("TX:aa:3") is HalfState.ROLLBACK
    # another group's markers are not this group's
    assert HalfMarkers(engine, "other").check("TX:aa:1") is HalfState.ROLLBACK
    with pytest.raises(OutboxArgumentError, match="transaction key"):
        markers.begin("TX:aa:1'; --")


@pytest.mark.parametrize("db_url", ["postgres", "mariadb"], indirect=True)
def test_check_waits_for_a_marker_being_committed(engine: Engine) -> None:
    """A marker inserted and not yet committed (its transaction is committing): the check
    waits for the outcome; a wait longer than its lock timeout answers UNKNOWN."""
    impatient = HalfMarkers(engine, "shop", lock_timeout_s=1.0)
    patient = HalfMarkers(engine, "shop", lock_timeout_s=30.0)
    for commit in (True, False):
        key = f"TX:bb:{int(commit)}"
        with engine.connect() as holder:
            holder.begin()
            holder.execute(
                sa.text(
                    "INSERT INTO notify_outbox_half (group_id, tx_key, state) "
                    "VALUES ('shop', :k, 1)"
                ),
                {"k": key},
            )
            assert impatient.check(key) is HalfState.UNKNOWN
            answers: list[HalfState] = []

            def ask(k: str = key, out: list[HalfState] = answers) -> None:
                out.append(patient.check(k))

            t = threading.Thread(target=ask)
            t.start()
            t.join(0.5)
            assert t.is_alive() and not answers  # waiting for the holder's outcome
            holder.commit() if commit else holder.rollback()
            t.join(30)
        assert answers == [HalfState.COMMIT if commit else HalfState.ROLLBACK]
    if engine.dialect.name == "mysql":  # the pool's connections keep their own lock wait
        with engine.connect() as c:
            waits = {c.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar()}
        assert waits == {50}


def test_a_batch_of_sends_is_checked_then_written_together(engine: Engine) -> None:
    outbox = Outbox(engine)
    assert outbox_for(engine) is outbox
    with engine.begin() as c:
        assert outbox_for(c) is outbox
        sends = outbox.sends(c)
        sends.add("orders", b"a", key="k")
        with pytest.raises(OutboxArgumentError, match="invalid topic"):
            sends.add("bad topic!", b"x")
        sends.add("orders", b"b", headers={"n": 1})
        assert len(sends) == 2 and backlog(engine) == 0
        assert sends.write() == 2 and len(sends) == 0
        dropped = outbox.sends(c)
        dropped.add("orders", b"never")
        assert dropped.discard() == 1
    with Session(engine) as s, s.begin():
        sends = outbox_for(s).sends(s)
        sends.add("orders", b"c")
        sends.write()
    with pytest.raises(RuntimeError), engine.begin() as c:
        sends = outbox.sends(c)
        sends.add("orders", b"rolled back")
        sends.write()
        raise RuntimeError("the application fails")
    assert backlog(engine) == 3
    with pytest.raises(OutboxArgumentError, match="not int"):
        outbox_for(7)  # type: ignore[arg-type]
    with pytest.raises(OutboxArgumentError, match="not an Engine"):
        outbox.sends(engine)  # type: ignore[arg-type]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_batch_on_a_psycopg_connection(engine: Engine, db_url: str) -> None:
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as pc:
        outbox = outbox_for(pc)
        assert outbox_for(pc) is outbox
        sends = outbox.sends(pc)
        for i in range(3):
            sends.add("orders", b"%d" % i, key=str(i))
        assert sends.write() == 3
        pc.rollback()
        sends.add("orders", b"kept")
        sends.write()
        pc.commit()
    assert backlog(engine) == 1


def test_markers_are_tidied_in_the_background(engine: Engine) -> None:
    markers = HalfMarkers(engine, "shop", retention_s=0.05, tidy_every_s=3600)
    with engine.begin() as c:
        markers.mark(c, "TX:cc:1")

    def count() -> int:
        with engine.connect() as c:
            return int(c.execute(sa.text("SELECT count(*) FROM notify_outbox_half")).scalar_one())

    time.sleep(0.1)
    markers.tidy()
    wait_until(lambda: count() == 0, what="the old marker removed")
    with engine.begin() as c:
        markers.mark(c, "TX:cc:2")
    time.sleep(0.1)
    markers.tidy()  # not due again for an hour
    time.sleep(0.2)
    assert count() == 1
    with pytest.raises(ValueError, match="must be > 0"):
        HalfMarkers(engine, "shop", retention_s=0)
    with engine.connect() as c, pytest.raises(OutboxArgumentError, match="not Connection"):
        HalfMarkers(c, "shop")  # type: ignore[arg-type]
