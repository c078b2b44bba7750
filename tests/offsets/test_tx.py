"""offsets_tx and TransactionalConsumer: the app's writes and the offsets commit together."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from notify.client import ConsumerConfig, Message, Partition, TopicPartitionOffset, connect
from notify.errors import ClientError
from notify.migrations import upgrade
from notify.offsets import (
    OffsetConflictError,
    OffsetStoreUnavailableError,
    SqlOffsetStore,
    TransactionalConsumer,
    offsets_tx,
)
from notify.offsets.tx import CommittedOffsets, OffsetBatch
from notify.testing import BrokerProcess
from tests.services import PostgresServer, fresh_database

from .conftest import Backend

T = TopicPartitionOffset
P0 = Partition(0, 0, "127.0.0.1:0")
P1 = Partition(0, 1, "127.0.0.1:0")

app_md = sa.MetaData()
applied = sa.Table(
    "applied",
    app_md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("part", sa.String(16), nullable=False),
    sa.Column("off", sa.BigInteger, nullable=False),
    sa.Column("body", sa.String(64), nullable=False),
)


def msg(part: Partition, offset: int, body: bytes = b"x" * 10, topic: str = "test") -> Message:
    return Message(topic, part, offset, 1000 + offset, 0, body)


def app_rows(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [(r.part, r.off) for r in conn.execute(sa.select(applied).order_by(applied.c.id))]


def apply(batch: OffsetBatch) -> None:
    for m in batch:
        batch.connection.execute(
            applied.insert().values(part=str(m.partition), off=m.offset, body=m.data.decode())
        )


@pytest.fixture
def app(sql_backend: Backend) -> Iterator[tuple[sa.Engine, SqlOffsetStore]]:
    engine = sa.create_engine(sql_backend.url)
    app_md.create_all(engine)
    store = sql_backend.open()
    assert isinstance(store, SqlOffsetStore)
    yield engine, store
    engine.dispose()


def test_batch_offsets_and_starts() -> None:
    b = OffsetBatch("g", None, [msg(P0, 30), msg(P0, 0), msg(P1, 60)])  # type: ignore[arg-type]
    b.add(msg(P0, 90))
    assert sorted(b.offsets(), key=lambda o: o.partition) == [
        T("test", "0-0", 120, 1090),
        T("test", "0-1", 90, 1060),
    ]
    assert b.starts() == {("test", "0-0"): 0, ("test", "0-1"): 60}
    assert len(b) == 4


def test_commit_applies_and_stores_together(app: tuple[sa.Engine, SqlOffsetStore]) -> None:
    engine, store = app
    with offsets_tx(store, engine, "g", messages=[msg(P0, 0), msg(P0, 30)]) as batch:
        apply(batch)
    assert app_rows(engine) == [("0-0", 0), ("0-0", 30)]
    assert store.load("g", "test", "0-0") == T("test", "0-0", 60, 1030)
    with engine.connect() as conn, offsets_tx(store, conn, "g") as batch:  # a Connection
        batch.add(msg(P0, 60))
        apply(batch)
    assert store.load("g", "test", "0-0") == T("test", "0-0", 90, 1060)


def test_error_rolls_back_both(app: tuple[sa.Engine, SqlOffsetStore]) -> None:
    engine, store = app
    with (
        pytest.raises(RuntimeError, match="boom"),
        offsets_tx(store, engine, "g", messages=[msg(P0, 0)]) as batch,
    ):
        apply(batch)
        raise RuntimeError("boom")
    assert app_rows(engine) == [] and store.load("g", "test", "0-0") is None


def test_stale_batch_is_fenced(app: tuple[sa.Engine, SqlOffsetStore]) -> None:
    engine, store = app
    store.commit("g", [T("test", "0-0", 60, 1)])  # someone already consumed up to 60
    with (
        pytest.raises(OffsetConflictError) as ei,
        offsets_tx(store, engine, "g", messages=[msg(P0, 30)]) as batch,
    ):
        apply(batch)
    assert ei.value.retriable
    assert app_rows(engine) == [] and store.load("g", "test", "0-0") == T("test", "0-0", 60, 1)
    with offsets_tx(store, engine, "g", messages=[msg(P0, 90)]) as batch:  # a gap is fine
        apply(batch)
    assert store.load("g", "test", "0-0") == T("test", "0-0", 120, 1090)


def test_concurrent_first_commits_one_wins(app: tuple[sa.Engine, SqlOffsetStore]) -> None:
    """Two consumers both find no row; the second insert must fail, not double-apply."""
    engine, store = app
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite serializes writers: no concurrent first insert")
    offs, start = [T("test", "0-0", 30, 1000)], {("test", "0-0"): 0}
    a, b = engine.connect(), engine.connect()
    try:
        a.begin()
        store.commit_in(a, "g", offs, expected=start)  # row inserted, not committed
        b.begin()
        result: list[BaseException | None] = []

        def second() -> None:
            try:
                store.commit_in(b, "g", offs, expected=start)
                result.append(None)
            except BaseException as e:
                result.append(e)

        t = threading.Thread(target=second)
        t.start()
        t.join(0.5)
        assert t.is_alive()  # waits for a's row lock
        a.commit()
        t.join(10)
        assert len(result) == 1 and isinstance(result[0], OffsetConflictError)
        b.rollback()
    finally:
        a.close()
        b.close()
    assert store.load("g", "test", "0-0") == T("test", "0-0", 30, 1000)


def test_binds(app: tuple[sa.Engine, SqlOffsetStore]) -> None:
    engine, store = app
    with Session(engine) as session:
        with offsets_tx(store, session, "g", messages=[msg(P1, 0)]) as batch:
            session.execute(applied.insert().values(part="0-1", off=0, body="orm"))
            assert batch.connection is session.connection()
        assert store.load("g", "test", "0-1") == T("test", "0-1", 30, 1000)
        session.execute(sa.select(1))  # autobegins
        with (
            pytest.raises(ClientError, match="already in a transaction"),
            offsets_tx(store, session, "g"),
        ):
            pass
    with engine.connect() as conn:
        conn.execute(sa.select(1))
        with (
            pytest.raises(ClientError, match="already in a transaction"),
            offsets_tx(store, conn, "g"),
        ):
            pass
    with pytest.raises(ClientError, match="group"), offsets_tx(store, engine):
        pass
    with pytest.raises(TypeError), offsets_tx(store, "not a bind", "g"):  # type: ignore[arg-type]
        pass


def test_unreachable_app_database_is_retriable(tmp_path: Path) -> None:
    down = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:1/x")
    try:
        with SqlOffsetStore(f"sqlite:///{tmp_path / 's.db'}", create_table=True) as store:
            with pytest.raises(OffsetStoreUnavailableError) as ei, offsets_tx(store, down, "g"):
                pass
            assert ei.value.retriable
    finally:
        down.dispose()


def test_committed_offsets_view_ignores_consumer_commits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v.db'}"
    with SqlOffsetStore(url, create_table=True) as store:
        view = CommittedOffsets(store)
        view.commit("g", [T("test", "0-0", 99, 9)])
        assert view.load("g", "test", "0-0") is None
        store.commit("g", [T("test", "0-0", 5, 5)])
        assert view.load("g", "test", "0-0") == T("test", "0-0", 5, 5)
        view.close()
        assert store.load("g", "test", "0-0") is not None  # store left open


# -- with a real broker


def _produce(addr: str, n: int, start: int = 0) -> dict[tuple[str, int], bytes]:
    with connect([addr]) as s:
        p = s.create_producer()
        futs = [(i, p.send_future("test", b"%d" % i)) for i in range(start, start + n)]
        out = {}
        for i, f in futs:
            r = f.result(30)
            assert r.success and r.partition is not None
            out[(str(r.partition), r.offset)] = b"%d" % i
        return out


@pytest.mark.slow
def test_transactional_consumer_redelivers_rolled_back_batches(
    broker: BrokerProcess, postgres: PostgresServer, tmp_path: Path
) -> None:
    url = fresh_database(postgres)
    upgrade(url)
    engine = sa.create_engine(url)
    app_md.create_all(engine)
    sent = _produce(broker.addr, 400)
    cfg = ConsumerConfig(group="billing", data_dir=tmp_path / "c")
    failures = 0
    try:
        with connect([broker.addr]) as session:
            with TransactionalConsumer(session, cfg, engine, max_size=1024) as tc:
                n = 0
                while len(app_rows(engine)) < len(sent):
                    n += 1
                    try:
                        with tc.transaction(engine, "test", max_wait_s=0.5) as batch:
                            apply(batch)
                            if n % 4 == 0 and len(batch):
                                raise RuntimeError("app failure")
                    except RuntimeError:
                        failures += 1
                    assert n < 500
                assert tc.rewinds == failures > 0
            sent.update(_produce(broker.addr, 50, start=400))
            with TransactionalConsumer(session, cfg, engine, max_size=1024) as tc2:
                while len(app_rows(engine)) < len(sent):  # resumes from the table
                    with tc2.transaction(engine, "test", max_wait_s=0.5) as batch:
                        apply(batch)
                with tc2.transaction(engine, "test", max_wait_s=0.3) as batch:
                    assert len(batch) == 0
        rows = app_rows(engine)
        assert sorted(rows) == sorted(sent) and len(rows) == len(set(rows))
        with SqlOffsetStore(url) as store:
            ends: dict[str, int] = {}
            for (part, off), body in sent.items():
                ends[part] = max(ends.get(part, 0), off + 20 + len(body))
            assert {o.partition: o.offset for o in store.list_offsets("billing")} == ends
    finally:
        engine.dispose()
