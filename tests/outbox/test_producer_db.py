"""The producer's hooks on the outbox, against a real broker and SQLite, PostgreSQL and
MariaDB: ``producer.transaction(db=conn)`` writes the block's sends as outbox rows in the
application's transaction (committed with it, dropped with it or with the block, nothing
sent to the broker until the relay publishes them), on the blocking and the asyncio API;
``create_transactional_producer(group, db=engine)`` + ``half_message(...) as conn`` commits
the application's rows with the half message's marker, then the message; an exception rolls
back both."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from notify.client import (
    AsyncMessageSessionFactory,
    ClientTransactionError,
    LocalTxState,
    ProducerConfig,
    TransactionAbortedError,
    connect,
)
from notify.errors import ClientError
from notify.outbox import HalfMarkers, HalfState, Outbox, OutboxArgumentError
from notify.testing import BrokerProcess
from tests.outbox.conftest import FAST, backlog, bodies, published, wait_published


def _orders(engine: Engine) -> list[int]:
    with engine.connect() as c:
        return list(c.execute(sa.text("SELECT id FROM orders ORDER BY id")).scalars())


def test_transaction_with_db_writes_outbox_rows(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    addr = ob_broker.addr
    with connect([addr]) as session:
        p = session.create_producer()
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
            with p.transaction(db=conn) as tx:
                r = p.send(topic, b"a", key="k1")
                tx.send(topic, b"b", key="k1", headers={"n": 2})
                assert r.success and r.partition is None and r.offset == -1
            assert tx.status == "committed"
        assert backlog(engine) == 2
        # an exception in the producer's block drops its rows; the database's goes on
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
            with pytest.raises(RuntimeError), p.transaction(db=conn) as tx:
                p.send(topic, b"dropped")
                raise RuntimeError("the block fails")
            assert tx.status == "rolled_back"
            with p.transaction(db=conn):
                p.send(topic, b"c", key="k2")
        # the database's transaction rolls back: the rows with it
        with pytest.raises(RuntimeError), engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (3)"))
            with p.transaction(db=conn):
                p.send(topic, b"never")
            raise RuntimeError("the application fails")
        assert backlog(engine) == 3 and _orders(engine) == [1, 2]
        # a Session works as a connection
        with Session(engine) as s, s.begin(), p.transaction(db=s):
            p.send(topic, b"d")
        # bad input: a clear error, nothing written, the transaction rolled back
        with engine.begin() as conn:
            with pytest.raises(OutboxArgumentError, match="invalid topic"), p.transaction(db=conn):
                p.send("bad topic!", b"x")
            with pytest.raises(ClientTransactionError, match="not an Engine"):
                p.transaction(db=engine)
        lax = session.create_producer(ProducerConfig(raise_on_error=False))
        with engine.begin() as conn:
            tx = lax.begin_transaction(db=conn)
            assert not lax.send("bad topic!", b"x").success
            lax.send(topic, b"not written either")
            with pytest.raises(TransactionAbortedError):
                tx.commit()
            assert tx.status == "rolled_back"
        assert backlog(engine) == 4
        # a delayed send joins the transaction too: a delayed row, not a broker's dput
        with engine.begin() as conn, p.transaction(db=conn):
            assert p.send(topic, b"in an hour", delay=3600).success
        with engine.connect() as c:
            delayed = c.execute(sa.text("SELECT count(*) FROM notify_outbox_delayed")).scalar()
        assert delayed == 1
        assert bodies(addr, topic) == []  # nothing went to the broker
        with Outbox(engine).relay(session, FAST):
            wait_published(addr, topic, 4)
    got = published(addr, topic)
    assert sorted(m.body for m in got) == [b"a", b"b", b"c", b"d"]
    k1 = [m for m in got if m.key == "k1"]
    assert [m.body for m in k1] == [b"a", b"b"] and k1[1].headers == {"n": 2}
    assert len({m.partition for m in k1}) == 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_transaction_with_db_on_psycopg_and_asyncio(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def main() -> None:
        async with AsyncMessageSessionFactory([ob_broker.addr]) as s:
            p = s.create_producer()
            with psycopg.connect(dsn) as pc:  # commits on leaving the block
                pc.execute("INSERT INTO orders (id) VALUES (1)")
                async with p.transaction(db=pc) as tx:
                    await p.send(topic, b"async-1", key="k")
                    await tx.send(topic, b"async-2", key="k")
            with psycopg.connect(dsn) as pc:
                with pytest.raises(RuntimeError):
                    async with p.transaction(db=pc):
                        await p.send(topic, b"dropped")
                        raise RuntimeError("the block fails")
                pc.rollback()

    asyncio.run(main())
    assert backlog(engine) == 2 and _orders(engine) == [1]


def test_half_message_with_db(engine: Engine, ob_broker: BrokerProcess, topic: str) -> None:
    addr = ob_broker.addr
    with connect([addr]) as session:
        p = session.create_transactional_producer("shop", db=engine)
        with p.half_message(topic, b"paid 1", key="1") as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
        p.flush()  # the block wrote COMMIT without waiting for it; flush waits: readable
        assert bodies(addr, topic) == [b"paid 1"]
        with pytest.raises(RuntimeError), p.half_message(topic, b"paid 2") as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
            raise RuntimeError("the application fails")
        # a message that cannot be sent fails the block's end: its database work is rolled
        # back (the block ran: PREPARE is not awaited before it)
        ran: list[bool] = []
        with pytest.raises(ClientError, match="unknown topic"):  # noqa: SIM117
            with p.half_message("nosuch", b"paid 3") as conn:
                conn.execute(sa.text("INSERT INTO orders (id) VALUES (3)"))
                ran.append(True)
        assert ran == [True]
        # bad arguments raise before anything is sent or begun
        checked_out = engine.pool.checkedout()  # type: ignore[attr-defined]
        with pytest.raises(ClientError, match="must be bytes"):  # noqa: SIM117
            with p.half_message(topic, "not bytes"):  # type: ignore[arg-type]
                ran.append(False)
        assert ran == [True] and engine.pool.checkedout() == checked_out  # type: ignore[attr-defined]
        with pytest.raises(ClientTransactionError, match="use half_message"):
            p.send_in_transaction(topic, b"x", lambda m: LocalTxState.COMMIT)
        with pytest.raises(ClientTransactionError, match="one of them"):
            session.create_transactional_producer("shop")
        with pytest.raises(ClientTransactionError, match="not 'shop'"):
            session.create_transactional_producer("shop", db=HalfMarkers(engine, "other"))
    assert _orders(engine) == [1]
    assert bodies(addr, topic) == [b"paid 1"]
    with engine.connect() as c:
        keys = c.execute(sa.text("SELECT tx_key, state FROM notify_outbox_half")).all()
    assert len(keys) == 1 and keys[0][1] == 1
    assert HalfMarkers(engine, "shop").check(keys[0][0]) is HalfState.COMMIT


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_asyncio_half_message_with_db(engine: Engine, ob_broker: BrokerProcess, topic: str) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([ob_broker.addr]) as s:
            p = s.create_transactional_producer("shop", db=engine)
            async with p.half_message(topic, b"async paid") as conn:
                conn.execute(sa.text("INSERT INTO orders (id) VALUES (5)"))
            with pytest.raises(RuntimeError):
                async with p.half_message(topic, b"never") as conn:
                    conn.execute(sa.text("INSERT INTO orders (id) VALUES (6)"))
                    raise RuntimeError("the application fails")

    asyncio.run(main())
    assert _orders(engine) == [5]
    assert bodies(ob_broker.addr, topic) == [b"async paid"]
