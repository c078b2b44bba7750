"""``Outbox.send`` in the application's transaction, on SQLite, PostgreSQL and MariaDB:
committed with it, rolled back with it (savepoints too), through a Connection, a Session
or a psycopg connection; bad input and missing tables refused with a clear error."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from notify.outbox import (
    HalfMarkers,
    HalfState,
    Outbox,
    OutboxArgumentError,
    OutboxTablesMissingError,
)
from tests.outbox.conftest import backlog
from tests.services import PostgresServer, fresh_database
from tests.services_conftest import running


def _rows(engine: Engine, table: str = "notify_outbox") -> list[tuple[object, ...]]:
    sql = f"SELECT topic, khash, flag, payload FROM {table} ORDER BY id"
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(sa.text(sql))]


def test_rows_commit_and_roll_back_with_the_transaction(engine: Engine) -> None:
    outbox = Outbox(engine)
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
        outbox.send(c, "orders", b"o-1", key="1")
        outbox.send(c, "orders", b"o-1b", headers={"h": 1})
    with pytest.raises(RuntimeError), engine.begin() as c:
        c.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
        outbox.send(c, "orders", b"o-2")
        raise RuntimeError("the application fails")
    with engine.connect() as c:  # commit as you go; nothing sent before the first statement
        outbox.send(c, "orders", b"o-3")
        c.commit()
        outbox.send(c, "orders", b"o-4")
        c.rollback()
    got = [bytes(r[3]) for r in _rows(engine)]
    assert len(got) == 3 and got[0].endswith(b"}o-1") and got[1].endswith(b"}o-1b")
    assert got[2] == b"o-3"
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT id FROM orders")).scalars().all() == [1]
    # a send with bad arguments writes nothing and leaves the transaction usable
    with engine.begin() as c:
        with pytest.raises(OutboxArgumentError, match="invalid topic"):
            outbox.send(c, "no such topic!", b"x")
        with pytest.raises(OutboxArgumentError, match="not an Engine"):
            outbox.send(engine, "orders", b"x")  # type: ignore[arg-type]
        with pytest.raises(OutboxArgumentError, match=r"not str$"):
            outbox.send("conn", "orders", b"x")  # type: ignore[arg-type]
        c.execute(sa.text("INSERT INTO orders (id) VALUES (5)"))
    assert backlog(engine) == 3


def test_savepoints_sessions_and_keys(engine: Engine) -> None:
    outbox = Outbox(engine)
    with engine.begin() as c:
        outbox.send(c, "t", b"outer-1")
        sp = c.begin_nested()
        outbox.send(c, "t", b"inner-rolled-back")
        sp.rollback()
        with c.begin_nested():
            outbox.send(c, "t", b"inner-kept")
            inner = c.begin_nested()
            outbox.send(c, "t", b"inner-inner-rolled-back")
            inner.rollback()
        outbox.send(c, "t", b"outer-2")
    with Session(engine) as s:
        outbox.send(s, "t", b"session-1", key=b"\x00k")
        s.commit()
        outbox.send(s, "t", b"session-2")
        s.rollback()
    got = [bytes(r[3]) for r in _rows(engine)]
    assert got[:3] == [b"outer-1", b"inner-kept", b"outer-2"]
    assert len(got) == 4 and got[3].endswith(b"session-1")
    # shards follow the key hash: the same key, the same shard
    with engine.begin() as c:
        for i in range(20):
            outbox.send(c, "t", b"k", key=f"user-{i % 3}")
    with engine.connect() as c:
        pairs = set(
            c.execute(sa.text("SELECT khash, shard FROM notify_outbox WHERE khash IS NOT NULL"))
        )
    assert len({k for k, _s in pairs}) == len(pairs) == 4  # 3 users + the bytes key


def test_delayed_rows_wait_in_their_table(engine: Engine) -> None:
    outbox = Outbox(engine)
    with engine.begin() as c:
        outbox.send(c, "t", b"later", delay=60)
        outbox.send(c, "t", b"now")
    assert [bytes(r[3]) for r in _rows(engine)] == [b"now"]
    with engine.connect() as c:
        due = c.execute(sa.text("SELECT due_ms - created_ms FROM notify_outbox_delayed")).scalar()
    assert due is not None and 55_000 < int(due) < 65_000


def test_missing_tables_are_named(tmp_path: Path) -> None:
    e = sa.create_engine(f"sqlite:///{tmp_path / 'bare.db'}")
    try:
        with pytest.raises(OutboxTablesMissingError, match="notify db upgrade"), e.begin() as c:
            Outbox(e).send(c, "t", b"x")
        with pytest.raises(OutboxTablesMissingError):
            Outbox(e).status()
    finally:
        e.dispose()


def test_half_markers_answer_check_backs(engine: Engine) -> None:
    markers = HalfMarkers(engine, "shop")
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO orders (id) VALUES (7)"))
        markers.mark(c, "TX:abc:1")
    with pytest.raises(RuntimeError), engine.begin() as c:
        markers.mark(c, "TX:abc:2")
        raise RuntimeError("rolled back")
    assert markers.check("TX:abc:1") is HalfState.COMMIT
    assert markers.check("TX:abc:2") is HalfState.ROLLBACK
    # the tombstone holds: a late commit of that transaction fails instead of deciding twice
    with pytest.raises(sa_exc.IntegrityError), engine.begin() as c:
        markers.mark(c, "TX:abc:2")
    assert markers.check("TX:abc:2") is HalfState.ROLLBACK
    assert HalfMarkers(engine, "other").check("TX:abc:1") is HalfState.ROLLBACK
    assert markers.forget(older_than_s=3600) == 0 and markers.forget(older_than_s=-1) == 2


@pytest.fixture
def pg_engine(postgres: PostgresServer) -> tuple[str, Engine]:
    from notify.migrations import upgrade

    url = fresh_database(running(postgres))
    upgrade(url)
    e = sa.create_engine(url)
    yield url, e
    e.dispose()


def test_postgres_psycopg_connection_and_rollbacks(pg_engine: tuple[str, Engine]) -> None:
    url, engine = pg_engine
    outbox = Outbox(engine)
    dsn = "postgresql://" + url.split("://", 1)[1]
    with psycopg.connect(dsn) as conn:
        outbox.send(conn, "t", b"psycopg-1", key="k")  # begins the transaction psycopg's way
        conn.rollback()
        with conn.transaction():
            outbox.send(conn, "t", b"psycopg-2", key="k")
        auto = psycopg.connect(dsn, autocommit=True)
        outbox.send(auto, "t", b"psycopg-3")  # no transaction: a row of its own
        auto.close()
        with pytest.raises(OutboxArgumentError):
            outbox.send(conn, "t", "not bytes")  # type: ignore[arg-type]
    got = [bytes(r[3]) for r in _rows(engine)]
    assert got[0].endswith(b"psycopg-2") and got[1] == b"psycopg-3" and len(got) == 2
    # whatever the session went through (psycopg's own DEALLOCATE ALL after a rollback,
    # DISCARD ALL), the next commit writes its rows: nothing is kept in the session
    with engine.connect() as c:
        for i in range(8):  # psycopg prepares statements it sees often ...
            c.execute(sa.text("SELECT :i"), {"i": i})
        c.rollback()  # ... and deallocates them all on rollback
        outbox.send(c, "t", b"after-rollback")
        c.commit()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql("DISCARD ALL")
    with engine.begin() as c:
        outbox.send(c, "t", b"after-discard")
    assert [bytes(r[3]) for r in _rows(engine)][-2:] == [b"after-rollback", b"after-discard"]


def test_a_failed_commit_leaves_the_pooled_connection_clean(db_url: str) -> None:
    """The rows are written at the commit (on PostgreSQL in the COMMIT's own query): when
    one of them fails (here a half message's marker already there), the COMMIT never runs
    and the connection goes back to the pool out of its failed transaction, the
    application's statements of it rolled back."""
    e = sa.create_engine(db_url, pool_size=1, max_overflow=0)
    try:
        outbox, markers = Outbox(e), HalfMarkers(e, "shop")
        with e.begin() as c:
            markers.mark(c, "TX:x:1")
        with e.begin() as c:
            c.execute(sa.text("CREATE TABLE t (id INT)"))
        with pytest.raises(sa_exc.IntegrityError), e.connect() as c:
            c.execute(sa.text("INSERT INTO t VALUES (1)"))
            outbox.send(c, "orders", b"never")
            markers.mark(c, "TX:x:1")
            c.commit()
        with e.begin() as c:  # the same (only) connection
            outbox.send(c, "orders", b"next")
        assert [bytes(r[3]) for r in _rows(e)] == [b"next"]
        with e.connect() as c:
            assert c.execute(sa.text("SELECT count(*) FROM t")).scalar_one() == 0
    finally:
        e.dispose()


def test_autocommit_connections_write_their_rows_at_once(db_url: str) -> None:
    """A connection in autocommit mode (the engine's isolation level or the connection's
    execution option) has no transaction to wait for: each send is a row of its own at
    once, on every database (no commit is ever called here; closing drops nothing)."""
    plain = sa.create_engine(db_url)
    auto_engine = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with auto_engine.connect() as c:  # the engine's level
            Outbox(auto_engine).send(c, "t", b"engine-level")
        with plain.connect() as c, c.execution_options(isolation_level="AUTOCOMMIT"):
            Outbox(plain).send(c, "t", b"connection-level")
        with plain.connect() as c:  # an ordinary connection: nothing until its commit
            Outbox(plain).send(c, "t", b"never committed")
        assert [bytes(r[3]) for r in _rows(plain)] == [b"engine-level", b"connection-level"]
    finally:
        plain.dispose()
        auto_engine.dispose()
