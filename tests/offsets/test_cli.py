"""``notify db`` and ``notify offsets`` commands against real databases and ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from notify.cli import main
from notify.client import FileOffsetStore, TopicPartitionOffset
from notify.migrations import VERSION_TABLE, head, upgrade
from notify.offsets import SqlOffsetStore, ZooKeeperOffsetStore
from tests.services import PostgresServer, ZooKeeperServer, fresh_database

T = TopicPartitionOffset


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_db_upgrade_current_history_downgrade(empty_db: str) -> None:
    r = run("db", "current", "--url", empty_db, "--check")
    assert r.exit_code == 1 and "never migrated" in r.stdout
    r = run("db", "upgrade", "--url", empty_db)
    assert r.exit_code == 0, r.output
    assert f"(empty) -> {head()} (current)" in r.stdout
    r = run("db", "upgrade", env={"NOTIFY_DB_URL": empty_db})  # idempotent, URL from env
    assert r.exit_code == 0 and f"already at {head()}" in r.stdout
    r = run("db", "current", "--url", empty_db, "--check", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["state"] == "current" and doc["current"] == [head()]
    r = run("db", "history", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["revision"] == "0001"
    r = run("db", "history")
    assert r.exit_code == 0 and "0001" in r.stdout
    r = run("db", "downgrade", "base", "--url", empty_db, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["after"]["state"] == "empty"


def test_db_errors_are_one_line_exit_1(tmp_path: Path) -> None:
    r = run("db", "upgrade", "--url", "postgresql+psycopg://postgres:pw@127.0.0.1:1/x")
    assert r.exit_code == 1
    assert r.stderr.startswith("notify: cannot connect to postgresql+psycopg://postgres:***@")
    assert r.stderr.count("\n") == 1 and "pw@" not in r.stderr
    r = run("db", "current", "--url", "nosuch://x")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    r = run("db", "upgrade")
    assert r.exit_code == 2 and "--url" in r.stderr  # usage: no URL, no NOTIFY_DB_URL
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff'"))
    engine.dispose()
    r = run("db", "upgrade", "--url", url)
    assert r.exit_code == 1 and "newer than this notify" in r.stderr
    r = run("db", "current", "--url", url)
    assert r.exit_code == 0 and "AHEAD" in r.stdout


def test_offsets_show_reset(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    r = run("offsets", "show", "--url", url)
    assert r.exit_code == 1 and "notify db upgrade --url" in r.stderr
    upgrade(url)
    with SqlOffsetStore(url) as s:
        s.commit("g", [T("test", f"0-{p}", 100 * p, p) for p in range(3)])
        s.commit("h", [T("orders", "0-0", 7, 7)])
    r = run("offsets", "show", "--url", url, "--group", "g", "--json")
    assert r.exit_code == 0
    assert [(o["partition"], o["offset"]) for o in json.loads(r.stdout)] == [
        ("0-0", 0),
        ("0-1", 100),
        ("0-2", 200),
    ]
    r = run("offsets", "show", env={"NOTIFY_OFFSETS_URL": url})
    assert r.exit_code == 0 and "orders" in r.stdout and "0-2" in r.stdout
    r = run("offsets", "reset", "--url", url, "-g", "g", "-t", "test", "--to", "0")
    assert r.exit_code == 0 and "set 3 offset(s)" in r.stdout
    r = run("offsets", "reset", "--url", url, "-g", "g", "-t", "test", "-p", "0-1", "--delete")
    assert r.exit_code == 0 and "deleted 1" in r.stdout
    r = run("offsets", "reset", "--url", url, "-g", "g", "-t", "test", "-p", "0-9", "--to", "5")
    assert r.exit_code == 0
    with SqlOffsetStore(url) as s:
        assert [(o.partition, o.offset) for o in s.list_offsets("g")] == [
            ("0-0", 0),
            ("0-2", 0),
            ("0-9", 5),
        ]
    for bad in (
        ["--to", "1", "--delete"],
        [],
        ["--to", "-1"],
        ["--to", "1", "-p", "zero"],
    ):
        r = run("offsets", "reset", "--url", url, "-g", "g", "-t", "test", *bad)
        assert r.exit_code == 2, bad
    r = run("offsets", "reset", "--url", url, "-g", "nobody", "-t", "test", "--to", "1")
    assert r.exit_code == 1 and "give --partition" in r.stderr


def test_offsets_copy_file_and_zookeeper_to_postgres(
    tmp_path: Path, postgres: PostgresServer, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    pg = fresh_database(postgres)
    upgrade(pg)
    files = FileOffsetStore(tmp_path / "offsets")
    files.commit("g-file", [T("test", "0-0", 10, 1), T("test", "0-1", 20, 2)])
    with ZooKeeperOffsetStore(zookeeper.connect, zk_root) as zk:
        zk.commit("g-zk", [T("orders", "0-0", 30, 3)])
        zk.commit("g-zk2", [T("orders", "0-1", 40, 4)])

    r = run("offsets", "copy", "--from", f"file://{tmp_path}/offsets", "--to", pg)
    assert r.exit_code == 0, r.output
    assert "copied 2 offset(s) of 1 group(s)" in r.stdout
    zk_url = f"zookeeper://{zookeeper.connect}{zk_root}"
    r = run("offsets", "copy", "--from", zk_url, "--to", pg, "--group", "g-zk", "--dry-run")
    assert r.exit_code == 0 and "would copy 1 offset(s)" in r.stdout
    r = run("offsets", "copy", "--from", zk_url, "--to", pg, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["copied"] == 2
    with SqlOffsetStore(pg) as s:
        assert [(o.group, o.partition, o.offset, o.msg_id) for o in s.list_offsets()] == [
            ("g-file", "0-0", 10, 1),
            ("g-file", "0-1", 20, 2),
            ("g-zk", "0-0", 30, 3),
            ("g-zk2", "0-1", 40, 4),
        ]
    # and back: PostgreSQL -> ZooKeeper under another root, readable by MetaQ's layout
    back = f"zookeeper://{zookeeper.connect}{zk_root}2"
    r = run("offsets", "copy", "--from", pg, "--to", back, "--group", "g-file")
    assert r.exit_code == 0
    with ZooKeeperOffsetStore(zookeeper.connect, zk_root + "2") as zk2:
        assert zk2.load("g-file", "test", "0-1") == T("test", "0-1", 20, 2)


def test_unreachable_store_is_one_line(tmp_path: Path) -> None:
    r = run("offsets", "show", "--url", "zookeeper://127.0.0.1:1/meta?connect_timeout=1")
    assert r.exit_code == 1 and r.stderr.startswith("notify: cannot connect to ZooKeeper")
    r = run("offsets", "copy", "--from", f"file://{tmp_path}", "--to", "redis://x")
    assert r.exit_code == 1 and "unknown offset store URL" in r.stderr


def test_console_entry_point(tmp_path: Path) -> None:
    """The real process: ``python -m notify db upgrade`` (no CliRunner)."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    p = subprocess.run(
        [sys.executable, "-m", "notify", "db", "upgrade", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert f"-> {head()}" in p.stdout


@pytest.mark.parametrize("group", ["db", "offsets"])
def test_help(group: str) -> None:
    r = run(group, "--help")
    assert r.exit_code == 0 and "Usage" in r.stdout


def test_offsets_show_missing_directory_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    r = run("offsets", "show", "--url", f"file://{missing}")
    assert r.exit_code == 1 and "no such directory" in r.stderr
    r = run("offsets", "copy", "--from", f"file://{missing}", "--to", f"file://{tmp_path}")
    assert r.exit_code == 1 and "no such directory" in r.stderr
    assert not missing.exists()
    (tmp_path / "empty").mkdir()  # an existing directory without offsets: an empty table
    r = run("offsets", "show", "--url", f"file://{tmp_path / 'empty'}", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == []


def test_offsets_show_keeps_ids_whole_at_80_columns(tmp_path: Path) -> None:
    """At 80 columns long names and 19-digit ids are folded inside their cells; every row
    is then printed again whole, one per line, ready to paste; a wide terminal needs none."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    upgrade(url)
    row = ("billing-service-eu-west", "orders-by-customer", "1234-12", 123456789012,
           7326112233445566778)
    with SqlOffsetStore(url) as s:
        s.commit(row[0], [T(row[1], row[2], row[3], row[4])])
    r = run("offsets", "show", "--url", url, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    table = lines[: next(i for i, ln in enumerate(lines) if ln.endswith("(whole):"))]
    assert max(len(ln) for ln in table) <= 80
    assert " ".join(map(str, row)) in lines
    r = run("offsets", "show", "--url", url, env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "(whole)" not in r.stdout
    assert all(any(str(v) in ln for ln in r.stdout.splitlines()) for v in row)
