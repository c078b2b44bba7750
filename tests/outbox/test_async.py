"""The outbox from asyncio applications, on SQLite (aiosqlite), PostgreSQL (psycopg's async
driver) and MariaDB (asyncmy): ``Outbox.send_async`` on a SQLAlchemy ``AsyncConnection`` or
``AsyncSession`` or a psycopg ``AsyncConnection``, and an ``AsyncProducer``'s
``transaction(db=conn)`` on them. Committed rows are published exactly once by a relay (read
back from the broker), rolled-back ones (transaction, savepoint, producer block) never; a
key's messages keep their order; bad arguments and asyncio connections handed to the
blocking API raise clear errors with nothing written."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pymysql.converters
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from notify.client import (
    AsyncMessageSessionFactory,
    ClientTransactionError,
    ProducerConfig,
    TransactionAbortedError,
    connect,
)
from notify.outbox import HalfMarkers, HalfState, Outbox, OutboxArgumentError
from notify.testing import BrokerProcess
from tests.outbox.conftest import (
    FAST,
    assert_exactly_once,
    backlog,
    bodies,
    published,
    wait_published,
)
from tests.outbox.test_producer_db import _orders

ASYNC_DRIVER = {
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+asyncmy",
    "sqlite": "sqlite+aiosqlite",
}


def async_url(engine: Engine) -> URL:
    """``engine``'s database through the async driver of its dialect."""
    return engine.url.set(drivername=ASYNC_DRIVER[engine.dialect.name])


@asynccontextmanager
async def async_engine(engine: Engine) -> AsyncIterator[AsyncEngine]:
    ae = create_async_engine(async_url(engine))
    try:
        yield ae
    finally:
        await ae.dispose()


def run(main: Callable[[AsyncEngine], Coroutine[Any, Any, None]], engine: Engine) -> None:
    async def with_engine() -> None:
        async with async_engine(engine) as ae:
            await main(ae)

    asyncio.run(with_engine())


def test_send_async_commits_rolls_back_and_publishes_once(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    outbox_of_app: list[Outbox] = []

    async def main(ae: AsyncEngine) -> None:
        outbox = Outbox(ae)  # the AsyncEngine itself
        outbox_of_app.append(outbox)
        async with ae.begin() as conn:  # the application's transaction
            await conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
            await outbox.send_async(conn, topic, b"a", key="k")
            await outbox.send_async(conn, topic, b"b", key="k", headers={"n": 2})
        with pytest.raises(RuntimeError):
            async with ae.begin() as conn:
                await conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
                await outbox.send_async(conn, topic, b"rolled back")
                raise RuntimeError("the application fails")
        async with ae.begin() as conn:  # savepoints: a rolled-back one drops only its rows
            await outbox.send_async(conn, topic, b"c", key="k")
            sp = await conn.begin_nested()
            await outbox.send_async(conn, topic, b"savepoint rolled back", key="k")
            await sp.rollback()
            async with conn.begin_nested():
                await outbox.send_async(conn, topic, b"d", key="k")
        async with AsyncSession(ae) as s, s.begin():  # an AsyncSession
            await s.execute(sa.text("INSERT INTO orders (id) VALUES (3)"))
            await outbox.send_async(s, topic, b"e")
        async with ae.connect() as conn:  # commit as you go
            await outbox.send_async(conn, topic, b"f", key="k")
            await conn.commit()
            await outbox.send_async(conn, topic, b"never committed")
        async with ae.connect() as conn:  # an autocommit connection: a row of its own
            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await outbox.send_async(auto, topic, b"g")
        # bad arguments: nothing written, the transaction goes on
        async with ae.begin() as conn:
            with pytest.raises(OutboxArgumentError, match="invalid topic"):
                await outbox.send_async(conn, "bad topic!", b"x")
            with pytest.raises(OutboxArgumentError, match="must be bytes"):
                await outbox.send_async(conn, topic, "not bytes")  # type: ignore[arg-type]
            with pytest.raises(OutboxArgumentError, match="not an AsyncEngine"):
                await outbox.send_async(ae, topic, b"x")  # type: ignore[arg-type]
            with pytest.raises(OutboxArgumentError, match=r"send_async\(conn"):
                outbox.send(conn, topic, b"x")  # type: ignore[arg-type]
            await conn.execute(sa.text("INSERT INTO orders (id) VALUES (4)"))

    run(main, engine)
    expected = [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    assert _orders(engine) == [1, 3, 4] and backlog(engine) == len(expected)
    addr = ob_broker.addr
    with connect([addr]) as session, outbox_of_app[0].relay(session, FAST):  # its own engine
        wait_published(addr, topic, len(expected))
    got = published(addr, topic)
    assert_exactly_once([m.body for m in got], expected)
    keyed = [m for m in got if m.key == "k"]
    assert [m.body for m in keyed] == [b"a", b"b", b"c", b"d", b"f"]
    assert len({m.partition for m in keyed}) == 1 and keyed[1].headers == {"n": 2}
    assert backlog(engine) == 0


def test_async_producer_transaction_with_db(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    async def main(ae: AsyncEngine) -> None:
        async with AsyncMessageSessionFactory([ob_broker.addr]) as s:
            p = s.create_producer()
            async with ae.begin() as conn:
                await conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
                async with p.transaction(db=conn) as tx:
                    # queued before the outbox read its shard count: rows in call order
                    futs = [p.send_nowait(topic, b"k%d" % i, key="k") for i in range(3)]
                    await tx.send(topic, b"k3", key="k")
                    assert (await p.send(topic, b"later", delay=3600)).success
                    assert [(await f).success for f in futs] == [True] * 3
                assert tx.status == "committed"
            # the block fails: its rows dropped; the database's transaction goes on
            async with ae.begin() as conn:
                await conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
                with pytest.raises(RuntimeError):
                    async with p.transaction(db=conn):
                        await p.send(topic, b"dropped")
                        raise RuntimeError("the block fails")
            # the database's transaction rolls back: the rows with it
            with pytest.raises(RuntimeError):
                async with ae.begin() as conn, p.transaction(db=conn):
                    await p.send(topic, b"never")
                    raise RuntimeError("the application fails")
            async with AsyncSession(ae) as session, session.begin(), p.transaction(db=session):
                await p.send(topic, b"session", key="k")
            # a bad send: a clear error, nothing written, the transaction rolled back
            async with ae.begin() as conn:
                with pytest.raises(OutboxArgumentError, match="invalid topic"):
                    async with p.transaction(db=conn):
                        await p.send(topic, b"not written")
                        await p.send("bad topic!", b"x")
                with pytest.raises(ClientTransactionError, match="not an AsyncEngine"):
                    p.transaction(db=ae)
            lax = s.create_producer(ProducerConfig(raise_on_error=False))
            async with ae.begin() as conn:
                tx = lax.begin_transaction(db=conn)
                assert not (await lax.send("bad topic!", b"x")).success
                await lax.send(topic, b"not written either")
                with pytest.raises(TransactionAbortedError):
                    await tx.commit()
        with connect([ob_broker.addr]) as session:  # the blocking producer refuses it
            async with ae.begin() as conn:
                with pytest.raises(ClientTransactionError, match="AsyncProducer"):
                    session.create_producer().transaction(db=conn)
                with pytest.raises(ClientTransactionError, match="not an AsyncEngine"):
                    session.create_transactional_producer("shop", db=ae)  # type: ignore[arg-type]

    run(main, engine)
    assert _orders(engine) == [1, 2]
    with engine.connect() as c:
        delayed = c.execute(sa.text("SELECT count(*) FROM notify_outbox_delayed")).scalar()
    assert delayed == 1 and backlog(engine) == 5
    addr = ob_broker.addr
    with connect([addr]) as session, Outbox(engine).relay(session, FAST):
        wait_published(addr, topic, 5)
    got = published(addr, topic)
    assert [m.body for m in got if m.key == "k"] == [b"k0", b"k1", b"k2", b"k3", b"session"]
    assert len(got) == 5


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_postgres_commit_is_one_query_and_psycopg_async(
    engine: Engine, ob_broker: BrokerProcess
) -> None:
    """On PostgreSQL an AsyncConnection's commit carries its rows (no statement of the
    outbox through SQLAlchemy, as with a blocking connection); a failed one leaves the
    pooled connection clean. A bare psycopg AsyncConnection inserts at once."""
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    statements: list[str] = []

    async def main(ae: AsyncEngine) -> None:
        outbox = Outbox(ae)
        event.listen(ae.sync_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        async with ae.begin() as conn:
            await conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
            await outbox.send_async(conn, "t", b"one query", key="k")
            statements.clear()  # the shard count was read by the first send
        assert statements == []  # the rows went with the COMMIT, not as statements
        # psycopg's own AsyncConnection: the row inserted at once, in its transaction
        plain = Outbox()
        async with await psycopg.AsyncConnection.connect(dsn) as pc:
            await plain.send_async(pc, "t", b"psycopg rolled back", key="k")
            await pc.rollback()
            async with pc.transaction():
                await plain.send_async(pc, "t", b"psycopg", key="k")
            with pytest.raises(OutboxArgumentError, match="invalid topic"):
                await plain.send_async(pc, "bad topic!", b"x")
            with pytest.raises(OutboxArgumentError, match="send_async"):
                plain.send(pc, "t", b"x")  # type: ignore[arg-type]
        async with AsyncMessageSessionFactory([ob_broker.addr]) as s:
            p = s.create_producer()
            async with await psycopg.AsyncConnection.connect(dsn) as pc, p.transaction(db=pc):
                await p.send("t", b"psycopg producer", key="k")

    run(main, engine)
    with engine.connect() as c:
        rows = [
            bytes(r[0]) for r in c.execute(sa.text("SELECT payload FROM notify_outbox ORDER BY id"))
        ]
    assert [r.rsplit(b"}", 1)[-1] for r in rows] == [
        b"one query",
        b"psycopg",
        b"psycopg producer",
    ]
    assert _orders(engine) == [1]


def test_half_message_on_an_async_engine(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    """``create_transactional_producer(group, db=async_engine)``: ``half_message`` yields an
    AsyncConnection whose transaction commits with the marker, then the message is
    committed; an exception rolls back both; the check-back's answer comes from the marker
    table (a blocking engine of the markers' own)."""
    keys: list[str] = []

    async def main(ae: AsyncEngine) -> None:
        async with AsyncMessageSessionFactory([ob_broker.addr]) as s:
            p = s.create_transactional_producer("shop", db=ae)
            async with p.half_message(topic, b"paid 1", key="1") as conn:
                assert isinstance(conn, AsyncConnection)
                await conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
            with pytest.raises(RuntimeError):
                async with p.half_message(topic, b"never") as conn:
                    await conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
                    raise RuntimeError("the application fails")
            await p.flush()
            markers = HalfMarkers(ae, "shop")
            with pytest.raises(OutboxArgumentError, match="begin_async"):
                markers.begin("TX:x:1")
            async with ae.connect() as c:
                keys.extend(
                    (await c.execute(sa.text("SELECT tx_key FROM notify_outbox_half"))).scalars()
                )
            assert len(keys) == 1
            assert await asyncio.to_thread(markers.check, keys[0]) is HalfState.COMMIT
            assert await asyncio.to_thread(markers.check, "TX:x:2") is HalfState.ROLLBACK

    run(main, engine)
    assert _orders(engine) == [1]
    assert bodies(ob_broker.addr, topic) == [b"paid 1"]


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_aiomysql_writes_or_is_refused_clearly(engine: Engine) -> None:
    """aiomysql 0.3 imports a PyMySQL function that PyMySQL 1.2 replaced by a string: with
    such a PyMySQL it cannot send bytes, and the outbox says so (naming asyncmy) instead of
    failing at the first commit; with an older PyMySQL it writes as asyncmy does."""
    works = callable(getattr(pymysql.converters, "escape_bytes_prefixed", None))

    async def main() -> None:
        ae = create_async_engine(engine.url.set(drivername="mysql+aiomysql"))
        try:
            if not works:
                with pytest.raises(OutboxArgumentError, match=r"mysql\+asyncmy"):
                    Outbox(ae)
                return
            outbox = Outbox(ae)
            async with ae.begin() as conn:
                await outbox.send_async(conn, "t", b"\x00\xff", key="k")
        finally:
            await ae.dispose()

    asyncio.run(main())
    assert backlog(engine) == (1 if works else 0)


def test_a_failed_commit_leaves_the_pooled_connection_clean(engine: Engine) -> None:
    """An AsyncConnection's commit that fails on its outbox rows (here a half message's
    marker already there) rolls the transaction back: the application's statements are
    gone and the pool's only connection is clean for the next transaction."""

    async def main(ae: AsyncEngine) -> None:
        outbox, markers = Outbox(ae), HalfMarkers(ae.sync_engine, "shop")
        async with ae.begin() as conn:
            await conn.run_sync(markers.mark, "TX:x:1")
        with pytest.raises(sa_exc.IntegrityError):
            async with ae.begin() as conn:
                await conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
                await outbox.send_async(conn, "t", b"never")
                await conn.run_sync(markers.mark, "TX:x:1")
        async with ae.begin() as conn:  # the same (only) connection
            await outbox.send_async(conn, "t", b"next")

    async def with_small_pool() -> None:
        ae = create_async_engine(async_url(engine), pool_size=1, max_overflow=0)
        try:
            await main(ae)
        finally:
            await ae.dispose()

    asyncio.run(with_small_pool())
    assert _orders(engine) == [] and backlog(engine) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_missing_greenlet_is_named(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy's asyncio objects without greenlet: the error names the extra."""

    async def main(ae: AsyncEngine) -> None:
        monkeypatch.setitem(sys.modules, "greenlet", None)
        with pytest.raises(OutboxArgumentError, match=r"notify\[asyncio\]"):
            Outbox(ae)

    run(main, engine)
