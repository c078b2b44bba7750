"""Alembic migrations on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from notify.migrations import (
    SCRIPT_LOCATION,
    VERSION_TABLE,
    DatabaseUnreachableError,
    SchemaAheadError,
    current,
    downgrade,
    head,
    history,
    status,
    upgrade,
)
from notify.offsets.schema import OFFSET_TABLE, QUEUE_DONE_TABLE


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_revisions_are_stable_and_linear() -> None:
    revs = history()
    assert revs[0].revision == "0001" and revs[0].down_revision is None
    assert [r.revision for r in revs if r.is_head] == [head()]
    assert (SCRIPT_LOCATION / "env.py").is_file()
    assert (SCRIPT_LOCATION / "script.py.mako").is_file()


def test_upgrade_is_idempotent_and_downgrade_removes(empty_db: str) -> None:
    assert status(empty_db).state == "empty"
    before, after = upgrade(empty_db)
    assert before.current == () and after.current == (head(),) and after.state == "current"
    assert {OFFSET_TABLE, VERSION_TABLE} <= _tables(empty_db)
    before, after = upgrade(empty_db)
    assert before == after and after.state == "current"
    assert current(empty_db) == (head(),)
    _, after = downgrade(empty_db, "base")
    assert after.state == "empty" and OFFSET_TABLE not in _tables(empty_db)
    upgrade(empty_db, "0001")
    assert status(empty_db).state == "behind"
    upgrade(empty_db)
    assert status(empty_db).state == "current" and QUEUE_DONE_TABLE in _tables(empty_db)


def test_version_table_does_not_touch_the_apps_alembic(empty_db: str) -> None:
    engine = sa.create_engine(empty_db)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
            conn.execute(sa.text("INSERT INTO alembic_version VALUES ('app_rev_42')"))
        upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).all() == [
                ("app_rev_42",)
            ]
    finally:
        engine.dispose()


def test_database_ahead_of_the_code(empty_db: str) -> None:
    upgrade(empty_db)
    engine = sa.create_engine(empty_db)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    finally:
        engine.dispose()
    st = status(empty_db)
    assert st.state == "ahead" and st.unknown == ("9999",)
    with pytest.raises(SchemaAheadError, match="newer than this notify"):
        upgrade(empty_db)
    with pytest.raises(SchemaAheadError):
        downgrade(empty_db, "base")


def test_unreachable_database() -> None:
    with pytest.raises(DatabaseUnreachableError) as ei:
        upgrade("mysql+pymysql://root@127.0.0.1:1/x")
    assert ei.value.retriable and "cannot connect to mysql+pymysql://root@127.0.0.1:1/x" in str(
        ei.value
    )
