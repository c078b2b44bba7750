"""``notify xa``: list and resolve in-doubt transactions by hand, on real services."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from notify.cli import main
from notify.xa import BrokerParticipant, PostgresParticipant
from tests.coordinator.conftest import Env, MakeTM
from tests.coordinator.helpers import broker_prepared, message_ids, pg_prepared, pg_rows
from tests.coordinator.test_crash import agree, run_app


def crash_app(e: Env, tmp: Path, point: str, k: int) -> None:
    app = run_app(e, tmp / "xa", tmp / f"ack{k}", k, 1, point)
    assert app.wait(60) == -signal.SIGKILL


def xa(e: Env, tmp: Path, *args: str) -> Any:
    base = ["--log", str(tmp / "xa"), "-s", e.broker.addr, "--pg", f"pg={e.pg_url}"]
    cmd, rest = args[0], list(args[1:])
    result = CliRunner().invoke(main, ["xa", cmd, *rest, *(base if cmd != "forget" else base[:2])])
    return result


def listing(e: Env, tmp: Path) -> dict[str, Any]:
    r = xa(e, tmp, "list", "--json")
    assert r.exit_code == 0, r.output
    out: dict[str, Any] = json.loads(r.output)
    return out


@pytest.mark.crash
def test_resolve_by_hand(env: Env, tmp_path: Path, make_tm: MakeTM) -> None:
    crash_app(env, tmp_path, "xa_before_decision", 1)  # both prepared, nothing decided
    (item,) = listing(env, tmp_path)["transactions"]
    assert item["status"].startswith("no decision: presumed abort")
    assert sorted(item["prepared"]) == ["broker:broker", "pg:pg"]
    gtrid = item["gtrid"]
    r = xa(env, tmp_path, "commit", gtrid, "--by", "alice")  # overrides presumed abort
    assert r.exit_code == 0, r.output
    assert "heuristic recorded: alice resolved it by hand: commit" in r.output
    assert agree(env) == {1}
    (item,) = listing(env, tmp_path)["transactions"]
    assert item["prepared"] == [] and item["heuristics"][0]["kind"] == "commit"
    r = xa(env, tmp_path, "forget", gtrid)
    assert r.exit_code == 0 and "1 heuristic report(s) acknowledged" in r.output
    assert listing(env, tmp_path)["transactions"] == []

    crash_app(env, tmp_path, "xa_after_decision", 2)  # decided commit, nothing committed
    (item,) = listing(env, tmp_path)["transactions"]
    assert item["status"].startswith("commit decided")
    r = xa(env, tmp_path, "rollback", item["gtrid"])
    assert r.exit_code == 1 and "--force" in r.output  # refused: the log says commit
    r = xa(env, tmp_path, "rollback", item["gtrid"], "--force", "--by", "bob")
    assert r.exit_code == 0, r.output
    assert "against a logged commit decision" in r.output
    assert agree(env) == {1} and not pg_prepared(env.pg_dsn)

    # the coordinator, restarted, has nothing left to do and still reports the heuristic
    tm = make_tm(env, coordinator_id="app")
    assert tm.last_recovery is not None and tm.last_recovery.clean
    assert [h.message for h in tm.heuristics()] == [
        "bob resolved it by hand: rollback against a logged commit decision"
    ]
    # while it runs, list still works (without the lock) and the others refuse politely
    r = xa(env, tmp_path, "list", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["in_use"] is True
    r = xa(env, tmp_path, "commit", item["gtrid"])
    assert r.exit_code == 1 and "in use by process" in r.output


@pytest.mark.crash
def test_recover_command_and_errors(env: Env, tmp_path: Path) -> None:
    crash_app(env, tmp_path, "xa_between_commits", 1)  # pg committed, broker prepared
    assert pg_rows(env.pg_dsn) == {1} and len(broker_prepared(env.broker.addr)) == 1
    r = xa(env, tmp_path, "recover")
    assert r.exit_code == 0, r.output
    assert "committed 1, rolled back 0, finished 1 decisions" in r.output
    assert message_ids(env.broker.addr) == [1, 1]
    r = xa(env, tmp_path, "commit", "app-1-000000000000")
    assert r.exit_code == 1 and "no prepared branch and no decision" in r.output
    r = xa(env, tmp_path, "commit", "other-1-000000000000")
    assert r.exit_code == 1 and "not a transaction of coordinator app" in r.output
    r = CliRunner().invoke(main, ["xa", "list", "--log", str(tmp_path / "xa"), "--mysql", "x"])
    assert r.exit_code == 2 and "mysql+pymysql://" in r.output
    env.broker.kill()
    r = xa(env, tmp_path, "list")
    assert r.exit_code == 1 and "broker:" in r.output


@pytest.mark.crash
def test_resolve_without_names_uses_the_applications(
    env: Env, tmp_path: Path, make_tm: MakeTM
) -> None:
    """The app registered ``orders_db`` and ``bus``; ``--pg URL --broker ADDR`` without
    ``NAME=`` still records the app's names, so the decision is finished (not listed
    forever) and the app's own recovery has nothing left."""
    bare = ["--log", str(tmp_path / "xa"), "--broker", env.broker.addr, "--pg", env.pg_url]

    def cli(*args: str) -> Any:
        return CliRunner().invoke(main, ["xa", *args, *bare])

    app = run_app(env, tmp_path / "xa", tmp_path / "ack", 1, 1, "xa_after_decision",
                  names="orders_db,bus")  # fmt: skip
    assert app.wait(60) == -signal.SIGKILL  # decided commit, nothing committed
    r = cli("list", "--json")
    assert r.exit_code == 0, r.output
    (item,) = json.loads(r.stdout)["transactions"]
    assert sorted(item["prepared"]) == ["bus:bus", "orders_db:orders_db"]
    r = CliRunner().invoke(main, ["xa", "list", *bare], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and item["gtrid"] in r.output  # whole, at 80 columns
    r = cli("commit", item["gtrid"])
    assert r.exit_code == 0, r.output
    assert "none of those given" not in r.output
    assert agree(env) == {1}
    r = cli("list", "--json")
    assert json.loads(r.stdout)["transactions"] == []  # the decision was finished

    # with a branch the CLI cannot match, it says so instead of leaving it silently open
    app = run_app(env, tmp_path / "xa", tmp_path / "ack2", 2, 1, "xa_between_commits",
                  names="orders_db,bus")  # fmt: skip
    assert app.wait(60) == -signal.SIGKILL  # orders_db committed, bus prepared
    r = CliRunner().invoke(main, ["xa", "list", *bare[:2], "--broker", env.broker.addr])
    assert r.exit_code == 0, r.output
    assert "participant 'orders_db', which is none of those given (bus)" in r.output
    r = cli("recover")
    assert r.exit_code == 0, r.output
    assert agree(env) == {1, 2}

    # a wrong NAME= still records the application's name (the branch's qualifier)
    app = run_app(env, tmp_path / "xa", tmp_path / "ack3", 3, 1, "xa_before_decision",
                  names="orders_db,bus")  # fmt: skip
    assert app.wait(60) == -signal.SIGKILL
    (item,) = [i for i in json.loads(cli("list", "--json").stdout)["transactions"]
               if i["prepared"]]  # fmt: skip
    r = CliRunner().invoke(main, ["xa", "commit", item["gtrid"], *bare[:4], "--pg",
                                  f"db={env.pg_url}"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert agree(env) == {1, 2, 3}

    tm = make_tm(coordinator_id="app", start=False)
    tm.register("orders_db", lambda: PostgresParticipant(env.pg_dsn))
    tm.register("bus", lambda: BrokerParticipant(env.broker.addr))
    report = tm.start()
    assert report is not None and report.clean
    left = tm.in_doubt()  # only the admin's heuristic report: no decision left open
    assert [(i.decision, i.prepared, len(i.heuristics)) for i in left] == [(None, [], 1)]
