"""``notify outbox status|shards`` (``relay`` runs as a process in test_crash.py)."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from click.testing import CliRunner

from notify.cli import main
from notify.migrations import upgrade
from notify.outbox import Outbox


def test_status_and_shards(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    runner = CliRunner()
    r = runner.invoke(main, ["outbox", "status", "--db", url, "--interval", "0"])
    assert r.exit_code == 1 and "notify db upgrade" in r.output
    upgrade(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as c:
            for i in range(5):
                Outbox(engine).send(c, "orders", b"o", key=f"k{i}")
            Outbox(engine).send(c, "orders", b"later", delay=60)
    finally:
        engine.dispose()
    r = runner.invoke(main, ["outbox", "status", "--db", url, "--interval", "0", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["backlog"] == 5 and doc["oldest_age_s"] is not None and doc["rate"] is None
    assert sum(s["delayed"] for s in doc["shards"]) == 1 and len(doc["shards"]) == 4
    r = runner.invoke(main, ["outbox", "status", "--db", url, "--interval", "0.1"])
    assert r.exit_code == 0 and "backlog 5 rows" in r.output and "0 rows/s" in r.output
    assert runner.invoke(main, ["outbox", "shards", "--db", url]).output.strip() == "4 shard(s)"
    r = runner.invoke(main, ["outbox", "shards", "--db", url, "2"])
    assert r.exit_code == 1 and "still hold" in r.output  # rows in shards 2 and 3
    r = runner.invoke(main, ["outbox", "shards", "--db", url, "6"])
    assert r.exit_code == 0 and "4 -> 6" in r.output
    r = runner.invoke(main, ["outbox", "shards", "--db", url, "0"])
    assert r.exit_code == 2
    r = runner.invoke(main, ["outbox", "status", "--db", url, "--interval", "-1"])
    assert r.exit_code == 2
    r = runner.invoke(main, ["outbox", "status", "--db", "nosuch://x"])
    assert r.exit_code == 2 and "unsupported database" in r.output
    r = runner.invoke(main, ["outbox", "relay", "--db", url, "--max-rows", "0"])
    assert r.exit_code == 2 and "max_rows" in r.output
