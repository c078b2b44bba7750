"""Commit order with real concurrent transactions that commit out of id order.

Transaction A takes a row id for key K and stays open; B (another key) takes a later id
and commits; the relay publishes B's message; then A commits. A's row must be published
(a relay reading ``id > last seen`` would skip it forever), and a third transaction C
sending to K meanwhile must wait for A (K's lock) so that K's messages reach their
partition in commit order: A, then C.

PostgreSQL: A and C on psycopg connections (the row and K's advisory lock are taken at
``send``). MariaDB and SQLite: SQLAlchemy connections, whose rows are written at commit;
a commit listener added after the outbox's holds A open between its insert and COMMIT.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from notify.client import connect
from notify.outbox import Outbox
from notify.testing import BrokerProcess
from tests.helpers import wait_until
from tests.outbox.conftest import FAST, assert_exactly_once, backlog, published

HOLD = "test.hold"


def _partition_order(addr: str, topic: str, key: str) -> list[bytes]:
    return [m.body for m in published(addr, topic) if m.key == key]


def _check(addr: str, topic: str) -> None:
    got = published(addr, topic)
    assert_exactly_once([m.body for m in got], [b"A", b"B", b"C"])
    assert _partition_order(addr, topic, "K") == [b"A", b"C"]
    bodies = [m.body for m in got]
    assert bodies  # B was published while A was still open (checked by the test itself)


Hold = tuple[threading.Event, threading.Event]


@pytest.fixture
def held(engine: Engine) -> Iterator[Callable[[Connection], Hold]]:
    """``held(conn)``: the commit of ``conn``'s transaction stops after the outbox wrote
    its rows, before COMMIT: it sets the first event returned and waits for the second."""

    def hold(conn: Connection) -> None:
        pair = conn.info.pop(HOLD, None)
        if pair is not None:
            pair[0].set()
            pair[1].wait(30)

    Outbox(engine)  # the outbox's listeners first
    event.listen(engine, "commit", hold)

    def make(conn: Connection) -> Hold:
        pair = (threading.Event(), threading.Event())
        conn.info[HOLD] = pair
        return pair

    yield make
    event.remove(engine, "commit", hold)


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # reported by the test
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def _b_published(addr: str, topic: str) -> bool:
    return any(m.body == b"B" for m in published(addr, topic))


@pytest.mark.parametrize("db_url", ["mariadb", "sqlite"], indirect=True)
def test_late_commit_is_neither_skipped_nor_reordered(
    engine: Engine,
    ob_broker: BrokerProcess,
    topic: str,
    held: Callable[[Connection], Hold],
    db_url: str,
) -> None:
    outbox = Outbox(engine)
    sqlite = db_url.startswith("sqlite")
    with connect([ob_broker.addr]) as session, outbox.relay(session, FAST):
        a_hold: list[Hold] = []

        def tx_a() -> None:
            with engine.begin() as c:
                outbox.send(c, topic, b"A", key="K")
                a_hold.append(held(c))

        ta, ea = _in_thread(tx_a)
        wait_until(
            lambda: bool(a_hold) and a_hold[0][0].is_set(), timeout=20, what="A's row inserted"
        )
        a_inserted, release_a = a_hold[0]
        assert a_inserted.is_set()

        def tx(body: bytes, key: str) -> Callable[[], None]:
            def run() -> None:
                with engine.begin() as c:
                    outbox.send(c, topic, body, key=key)

            return run

        tb, eb = _in_thread(tx(b"B", "J"))
        if not sqlite:  # MariaDB: B commits (a later id) and is published while A is open
            tb.join(20)
            assert not eb and not tb.is_alive()
            wait_until(lambda: _b_published(ob_broker.addr, topic), timeout=20, what="B published")
            assert b"A" not in [m.body for m in published(ob_broker.addr, topic)]
        tc, ec = _in_thread(tx(b"C", "K"))
        if not sqlite:
            # C waits for K's lock, held by A: seen as a lock wait in most runs; else C is
            # still running after a few seconds (the order check below holds either way, and
            # C ending while A holds the lock fails)
            with engine.connect() as c:
                t0 = time.monotonic()
                while _still_running(tc, ec, "C") and not _lock_waits(c):
                    if time.monotonic() - t0 > 5:
                        break
                    time.sleep(0.02)
        release_a.set()
        for t in (ta, tb, tc):
            t.join(30)
        assert not (ea or eb or ec), (ea, eb, ec)
        wait_until(
            lambda: len(published(ob_broker.addr, topic)) >= 3, timeout=20, what="A, B, C published"
        )
    _check(ob_broker.addr, topic)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_postgres_late_commit_is_neither_skipped_nor_reordered(
    engine: Engine, ob_broker: BrokerProcess, topic: str, db_url: str
) -> None:
    outbox = Outbox(engine)
    dsn = "postgresql://" + db_url.split("://", 1)[1]
    with (
        connect([ob_broker.addr]) as session,
        outbox.relay(session, FAST),
        psycopg.connect(dsn) as a,
        psycopg.connect(dsn) as b,
        psycopg.connect(dsn) as c,
    ):
        outbox.send(a, topic, b"A", key="K")  # A: id n, K's lock, open
        outbox.send(b, topic, b"B", key="J")  # B: id n+1
        b.commit()
        wait_until(lambda: _b_published(ob_broker.addr, topic), timeout=20, what="B published")
        # B's row goes once acknowledged; A's is not visible yet
        wait_until(lambda: backlog(engine) == 0, timeout=20, what="B's row removed")
        c_pid = c.info.backend_pid

        def tx_c() -> None:
            outbox.send(c, topic, b"C", key="K")
            c.commit()

        tc, ec = _in_thread(tx_c)
        with engine.connect() as s:
            wait_until(
                lambda: (
                    s.execute(
                        sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :p"),
                        {"p": c_pid},
                    ).scalar()
                    == "Lock"
                ),
                timeout=20,
                what="C waiting for K's lock",
            )
        assert b"A" not in [m.body for m in published(ob_broker.addr, topic)]
        a.commit()
        tc.join(20)
        assert not ec
        wait_until(
            lambda: len(published(ob_broker.addr, topic)) >= 3, timeout=20, what="A, B, C published"
        )
    _check(ob_broker.addr, topic)


def _lock_waits(c: Connection) -> bool:
    """A transaction of this database waits for a row lock (C's: B has ended, A holds
    the key's lock and waits for the test)."""
    return bool(
        c.execute(
            sa.text(
                "SELECT count(*) FROM information_schema.INNODB_TRX t "
                "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                "WHERE p.DB = DATABASE() AND t.trx_state = 'LOCK WAIT'"
            )
        ).scalar_one()
    )


def _still_running(t: threading.Thread, errors: list[BaseException], name: str) -> bool:
    """True while ``t`` runs; a transaction that ended while it should be waiting for a lock
    fails the test with its error (instead of a bare timeout)."""
    if not t.is_alive():
        raise AssertionError(
            f"{name} ended instead of waiting for the lock (the holder has not committed): "
            f"{errors!r}"
        )
    return True
