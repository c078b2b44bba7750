"""SQL offset store specifics: one upsert statement, errors, MetaQ's table, outages."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from notify.client import TopicPartitionOffset
from notify.errors import ClientError
from notify.migrations import upgrade
from notify.offsets import (
    OffsetStoreError,
    OffsetStoreUnavailableError,
    OffsetTableMissingError,
    SqlOffsetStore,
)
from notify.offsets.schema import OFFSET_TABLE
from tests.helpers import timing
from tests.services import MariaDBServer, PostgresServer, fresh_database

from .conftest import Backend

T = TopicPartitionOffset


def _statements(engine: sa.Engine) -> list[str]:
    seen: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    return seen


def test_commit_is_one_upsert_statement(sql_backend: Backend) -> None:
    store = sql_backend.open()
    assert isinstance(store, SqlOffsetStore)
    store.commit("g", [T("test", "0-0", 1, 1)])
    seen = _statements(store.engine)
    store.commit("g", [T("test", f"0-{p}", 100 + p, p) for p in range(10)])
    writes = [s for s in seen if not s.upper().startswith(("SELECT", "BEGIN", "COMMIT"))]
    assert len(writes) == 1, writes
    upsert = "ON DUPLICATE KEY UPDATE" if sql_backend.name == "mariadb" else "ON CONFLICT"
    assert writes[0].startswith(f"INSERT INTO {OFFSET_TABLE}") and upsert in writes[0]
    assert store.load("g", "test", "0-0") == T("test", "0-0", 100, 0)


def test_missing_table_says_what_to_run(empty_db: str) -> None:
    with SqlOffsetStore(empty_db) as store:
        for call in (
            lambda: store.load("g", "t", "0-0"),
            lambda: store.commit("g", [T("t", "0-0", 1, 1)]),
            lambda: store.list_offsets(),
        ):
            with pytest.raises(OffsetTableMissingError) as ei:
                call()
            msg = str(ei.value)
            assert msg.startswith("offset table missing: run `notify db upgrade --url ")
            assert "\n" not in msg and not ei.value.retriable
            assert isinstance(ei.value, ClientError)


def test_create_table_option_migrates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'dir' / 'offsets.db'}"
    with SqlOffsetStore(url, create_table=True) as store:
        store.commit("g", [T("t", "0-0", 5, 5)])
    with SqlOffsetStore(url, create_table=True) as store:  # idempotent
        assert store.load("g", "t", "0-0") == T("t", "0-0", 5, 5)


def test_unreachable_database_is_retriable() -> None:
    store = SqlOffsetStore("postgresql+psycopg://postgres@127.0.0.1:1/x", connect_timeout_s=1)
    with store:
        t0 = time.monotonic()
        with pytest.raises(OffsetStoreUnavailableError) as ei:
            store.commit("g", [T("t", "0-0", 1, 1)])
        took = time.monotonic() - t0
        assert ei.value.retriable
        timing(took < 5, f"an unreachable database failed after {took:.2f} s (timeout 1 s)")
        with pytest.raises(OffsetStoreUnavailableError):
            store.load("g", "t", "0-0")


@pytest.mark.parametrize(
    "url", ["oracle://u@h/db", "not a url", "postgresql+nosuchdriver://u@h/db"]
)
def test_unusable_urls(url: str) -> None:
    with pytest.raises(OffsetStoreError):
        SqlOffsetStore(url)


def test_closed_store_refuses(sql_backend: Backend) -> None:
    store = sql_backend.open()
    store.close()
    with pytest.raises(OffsetStoreError, match="closed"):
        store.commit("g", [T("t", "0-0", 1, 1)])


def test_shared_engine_is_not_disposed(sql_backend: Backend) -> None:
    engine = sa.create_engine(sql_backend.url)
    try:
        with SqlOffsetStore(engine) as store:
            store.commit("g", [T("t", "0-0", 1, 1)])
        with engine.connect() as conn:  # still usable
            assert conn.execute(sa.select(sa.literal(1))).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("server_name", ["postgres", "mariadb"])
def test_database_down_at_commit_raises_and_recovers(
    request: pytest.FixtureRequest, server_name: str
) -> None:
    server: PostgresServer | MariaDBServer = request.getfixturevalue(server_name)
    url = fresh_database(server)
    upgrade(url)
    with SqlOffsetStore(url, connect_timeout_s=2) as store:
        store.commit("g", [T("t", "0-0", 10, 1)])  # a pooled connection now exists
        server.stop()
        try:
            with pytest.raises(OffsetStoreUnavailableError) as ei:
                store.commit("g", [T("t", "0-0", 20, 2)])
            assert ei.value.retriable and "unavailable" in str(ei.value)
            with pytest.raises(OffsetStoreUnavailableError):
                store.load("g", "t", "0-0")
        finally:
            server.start()
        assert store.load("g", "t", "0-0") == T("t", "0-0", 10, 1)  # not pretended
        store.commit("g", [T("t", "0-0", 20, 2)])  # the retry works on a new connection
        assert store.load("g", "t", "0-0") == T("t", "0-0", 20, 2)


def _metaq_table(url: str) -> None:
    """MetaQ's own table (id, topic, partition, group_id, offset, msg_id; no unique key)."""
    md = sa.MetaData()
    t = sa.Table(
        OFFSET_TABLE,
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("partition", sa.String(255), nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("msg_id", sa.BigInteger, nullable=False),
        sa.Index("TOPIC_PART_GRP_IDX", "topic", "partition", "group_id"),
    )
    engine = sa.create_engine(url)
    try:
        md.create_all(engine)
        with engine.begin() as conn:
            conn.execute(
                t.insert().values(
                    topic="test", partition="0-1", group_id="meta", offset=512, msg_id=99
                )
            )
    finally:
        engine.dispose()


def test_upgrade_adopts_metaqs_existing_table(empty_db: str) -> None:
    _metaq_table(empty_db)
    upgrade(empty_db)
    upgrade(empty_db)
    with SqlOffsetStore(empty_db) as store:
        assert store.load("meta", "test", "0-1") == T("test", "0-1", 512, 99)
        store.commit("meta", [T("test", "0-1", 600, 100), T("test", "0-2", 5, 1)])
        assert [(r.partition, r.offset) for r in store.list_offsets("meta")] == [
            ("0-1", 600),
            ("0-2", 5),
        ]


def test_metaq_style_reader_sees_our_rows(sql_backend: Backend) -> None:
    """MetaQ's MysqlOffsetStorage query: ``select id, offset, msg_id ... where topic,
    partition, group_id``."""
    store = sql_backend.open()
    assert isinstance(store, SqlOffsetStore)
    store.commit("meta-group", [T("test", "0-2", 4096, 123456789)])
    md = sa.MetaData()
    t = sa.Table(OFFSET_TABLE, md, autoload_with=store.engine)
    with store.engine.connect() as conn:
        row = conn.execute(
            sa.select(t.c.id, t.c.offset, t.c.msg_id).where(
                t.c.topic == "test", t.c.partition == "0-2", t.c.group_id == "meta-group"
            )
        ).one()
    assert row.offset == 4096 and row.msg_id == 123456789 and row.id > 0
