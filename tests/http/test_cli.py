"""The admin CLI (topics, tx, dlq, retention) against real brokers, through click's runner."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result

from notify.cli import main
from notify.client import Partition, RecoverStore, list_dead_letters, list_pending_recovery
from notify.client._message import Message
from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient
from tests.http.conftest import Http, prepare_xa, xid


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_topics_list_describe_create(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory({"alpha": 2, "beta": {"numPartitions": 1, "unflushThreshold": 0}})
    url, addr = b.http_url, b.addr
    Http(url).post("/api/topics/alpha/messages", json_body=[{"text": "hello"}] * 3)
    r = run("topics", "list", "-s", addr)
    assert r.exit_code == 0, r.output
    assert "alpha" in r.output and "beta" in r.output and "group-commit" in r.output
    r = run("topics", "list", "-s", addr, "--json")
    data = json.loads(r.output)
    assert {t["name"]: t["put_messages"] for t in data if not t["internal"]} == {
        "alpha": 3,
        "beta": 0,
    }
    r = run("topics", "describe", "alpha", "-s", addr)
    assert r.exit_code == 0 and "partitions" in r.output and "min offset" in r.output
    r = run("topics", "describe", "alpha", "-s", addr, "--json")
    assert json.loads(r.output)["num_partitions"] == 2
    # create, through the environment variable for the address
    r = run(
        "topics",
        "create",
        "gamma",
        "-p",
        "3",
        "--set",
        "unflushThreshold=0",
        env={"NOTIFY_HTTP": url},
    )
    assert r.exit_code == 0, r.output
    assert "created topic gamma with 3 partition(s)" in r.output
    assert Http(url).get("/api/topics/gamma").json()["config"]["unflush_threshold"] == 0
    # runtime failures: 1; usage errors: 2
    r = run("topics", "create", "gamma", "-s", addr)
    assert r.exit_code == 1 and "already exists" in r.output
    r = run("topics", "describe", "nosuch", "-s", addr)
    assert r.exit_code == 1 and "404" in r.output
    r = run("topics", "create", "bad/name", "-s", addr)
    assert r.exit_code == 2 and "invalid topic name" in r.output
    r = run("topics", "create", "ok", "--set", "bogus=1", "-s", addr)
    assert r.exit_code == 2 and "unknown topic key" in r.output
    r = run("topics", "create", "ok", "-p", "0", "-s", addr)
    assert r.exit_code == 2
    r = run("topics", "list", "-s", f"http://127.0.0.1:{free_port()}")
    assert r.exit_code == 1 and "cannot reach" in r.output
    r = run("topics", "list", "-s", f"127.0.0.1:{free_port()}")  # asking for the HTTP port
    assert r.exit_code == 1 and "notify:" in r.output


def test_tx_list_commit_rollback(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory({"t": 1}, authSecret="pw")
    env = {"NOTIFY_HTTP": b.http_url, "NOTIFY_SECRET": "pw"}
    r = run("tx", "list", env=env)
    assert r.exit_code == 0 and "no transactions in flight" in r.output
    keys = [xid(i) for i in (1, 2, 3)]
    for k in keys:
        prepare_xa(b.addr, k, "t", 0, [k.encode()], secret="pw")
    r = run("tx", "list", "--in-doubt", env=env)
    assert r.exit_code == 0 and "3 in doubt (PREPARED)" in r.output
    assert all(k in r.output for k in keys)  # whole, to copy
    listed = json.loads(run("tx", "list", "--json", env=env).output)
    assert {t["key"] for t in listed} == set(keys)
    r = run("tx", "commit", keys[0], env=env)
    assert r.exit_code == 0 and "committed" in r.output, r.output
    r = run("tx", "rollback", keys[1], "--json", env=env)
    assert json.loads(r.output)["outcome"] == "rolled_back"
    # over the wire instead of HTTP
    r = run("tx", "commit", keys[2], "--server", b.addr, "--secret", "pw")
    assert r.exit_code == 0, r.output
    page = Http(b.http_url, token="pw").get("/api/topics/t/partitions/0/messages").json()
    assert sorted(m["text"] for m in page["messages"]) == sorted([keys[0], keys[2]])
    # unknown key: 1; malformed key: 2; wrong secret: 1
    r = run("tx", "commit", keys[0], env=env)
    assert r.exit_code == 1 and "unknown transaction" in r.output
    r = run("tx", "rollback", keys[0], "--server", b.addr, "--secret", "pw")
    assert r.exit_code == 1 and "code=-4" in r.output
    assert run("tx", "commit", "nonsense", env=env).exit_code == 2
    r = run("tx", "list", env={**env, "NOTIFY_SECRET": "bad"})
    assert r.exit_code == 1 and "401" in r.output


def _dead_letter(store: RecoverStore, offset: int, body: bytes) -> None:
    msg = Message("orders", Partition(0, 1, "127.0.0.1:1"), offset, 1000 + offset, 0, body)
    sm = store.add(msg, "boom: listener failed")
    assert store.failed(sm, "boom again", max_attempts=1)


def test_dlq_show_and_replay(tmp_path: Path) -> None:
    a, b = RecoverStore(tmp_path, "billing"), RecoverStore(tmp_path, "audit")
    for i in range(60):
        _dead_letter(a, i * 100, b"order-%d" % i)
    _dead_letter(b, 7, b"\xff\xfe-raw")
    r = run("dlq", "show", "--data-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "dead letters (61)" in r.output and "order-0" in r.output and "binary" in r.output
    shown = json.loads(run("dlq", "show", "-d", str(tmp_path), "-g", "audit", "--json").output)
    assert len(shown) == 1 and shown[0]["text"] is None and shown[0]["group"] == "audit"
    assert shown[0]["last_error"] == "boom again"
    # one by id
    one = next(m.id for m in list_dead_letters(tmp_path, "audit"))
    r = run("dlq", "replay", "-d", str(tmp_path), "--id", one, "--json")
    assert json.loads(r.output) == {"replayed": 1}
    assert [m.id for m in list_pending_recovery(tmp_path, "audit")] == [one]
    r = run("dlq", "replay", "-d", str(tmp_path), "--id", "nope")
    assert r.exit_code == 1 and "no dead letter with id nope" in r.output
    # all of a group, with a progress bar on stderr
    r = CliRunner().invoke(main, ["dlq", "replay", "-d", str(tmp_path), "-g", "billing"])
    assert r.exit_code == 0, r.output
    assert "replayed 60 dead letter(s)" in r.stdout
    assert "60/60" in r.stderr
    assert list_dead_letters(tmp_path) == []
    assert len(list_pending_recovery(tmp_path, "billing")) == 60
    r = run("dlq", "replay", "-d", str(tmp_path))
    assert r.exit_code == 0 and "no dead letters to replay" in r.output
    r = run("dlq", "show", "-d", str(tmp_path / "empty"))
    assert r.exit_code == 0 and "no dead letters" in r.output


def test_one_dead_letter_family(tmp_path: Path) -> None:
    """``notify dlq list|replay`` serves both places dead letters are kept: ``--local`` (or
    ``-d``) for a consumer's recover store, defaulting to the consumers' own data_dir, and
    TOPIC GROUP for a queue group's on the broker; mixing or omitting them is a usage error."""
    home = tmp_path / "state"
    _dead_letter(RecoverStore(home, "billing"), 5, b"lost-order")
    env = {"NOTIFY_CLIENT_DIR": str(home)}
    r = run("dlq", "list", "--local", "--json", env=env)  # no --data-dir: the consumers' default
    assert r.exit_code == 0, r.output
    (letter,) = json.loads(r.output)
    assert letter["text"] == "lost-order" and letter["group"] == "billing"
    assert "lost-order" in run("dlq", "list", "-d", str(home)).output  # -d implies --local
    assert "lost-order" in run("dlq", "show", env=env).output  # the old spelling, hidden
    r = run("dlq", "list")
    assert r.exit_code == 2 and "TOPIC GROUP" in r.output and "--local" in r.output
    assert run("dlq", "list", "t", "g", "--local").exit_code == 2
    assert run("dlq", "replay", "--local", "-m", "0:1", env=env).exit_code == 2
    assert run("dlq", "replay", "t", "g", "--id", "x").exit_code == 2
    r = run("dlq", "replay", "--local", "--id", letter["id"], "--json", env=env)
    assert r.exit_code == 0 and json.loads(r.output) == {"replayed": 1}
    assert [m.id for m in list_pending_recovery(home, "billing")] == [letter["id"]]
    # help: one family, the old ones hidden
    assert "dlq" in run("--help").output
    assert "dlq" not in run("queue", "--help").output
    assert "show" not in run("dlq", "--help").output


def test_retention_run(http_broker_factory: Callable[..., BrokerProcess]) -> None:
    b = http_broker_factory(
        {"logs": {"numPartitions": 1, "deletePolicy": "delete,1s"}, "keep": 1},
        maxSegmentSize=4096,
    )
    h = Http(b.http_url)
    for _ in range(3):
        h.post("/api/topics/logs/messages", json_body=[{"text": "y" * 1000}] * 4)
    time.sleep(1.2)
    r = run("retention", "run", "logs", "-s", b.addr)
    assert r.exit_code == 0, r.output
    assert "logs-0: deleted 0000000000000000" in r.output and "segment(s) removed" in r.output
    r = run("retention", "run", "keep", "-s", b.addr, "--json")
    assert json.loads(r.output) == {"topic": "keep", "results": []}
    r = run("retention", "run", "nosuch", "-s", b.addr)
    assert r.exit_code == 1
    assert run("retention", "run", "..", "-s", b.addr).exit_code == 2


def test_tables_keep_keys_whole_at_80_columns(
    http_broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """At 80 columns a key longer than its cell is folded, never cut with an ellipsis, and
    printed whole under the table so it can be pasted."""
    b = http_broker_factory({"t": 1})
    env = {"NOTIFY_HTTP": b.http_url, "COLUMNS": "80"}
    long_keys = [f"XID:1:{'ab' * 30}{i:02x}:beef:q1" for i in range(2)]  # 80+ characters
    for k in long_keys:
        prepare_xa(b.addr, k, "t", 0, [b"x"])
    r = run("tx", "list", env=env)
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    lines = r.output.splitlines()
    assert all(k in lines for k in long_keys)  # whole, one per line
    r = run("tx", "commit", long_keys[0], env=env)
    assert r.exit_code == 0 and "committed" in r.output
    # short keys fit in the table: not repeated
    short = xid(7)
    prepare_xa(b.addr, short, "t", 0, [b"y"])
    r = run("tx", "rollback", long_keys[1], env=env)
    assert r.exit_code == 0
    r = run("tx", "list", env=env)
    assert short in r.output and "keys (whole)" not in r.output
    # dead letters: ids with a long topic name; --dir is --data-dir's alias (README)
    store = RecoverStore(tmp_path, "billing")
    part = Partition(0, 1, "127.0.0.1:1")
    msg = Message("orders-" + "x" * 60, part, 12345678, 987654321, 0, b"m")
    assert store.failed(store.add(msg, "boom"), "boom", max_attempts=1)
    (letter,) = list_dead_letters(tmp_path)
    r = run("dlq", "show", "--dir", str(tmp_path), env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert letter.id in r.output.splitlines() and "ids (whole):" in r.output


def test_lag_in_messages_and_live_within_session_timeout(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """``/api/groups`` and ``topics describe`` give the lag in messages as well as bytes;
    a group that stopped fetching is no longer live after ``consumerSessionTimeout``."""
    b = http_broker_factory({"t": 1}, consumerSessionTimeout=1500)
    http = Http(b.http_url)
    bodies = [{"text": "m" * (i % 7 + 1)} for i in range(25)]
    http.post("/api/topics/t/messages", json_body=bodies)
    # the group read 10 messages, then stopped: 15 behind
    msgs = http.get("/api/topics/t/partitions/0/messages").json()["messages"]
    assert len(msgs) == 25
    at = msgs[10]["offset"]
    with WireClient(b.addr) as c:
        assert c.call(f"get t billing 0 {at} 16 5\r\n".encode()).code == 200
    (row,) = [g for g in http.get("/api/groups").json()["groups"] if g["group"] == "billing"]
    assert row["lag_messages"] == 15 and row["lag_messages_exact"] is True
    assert row["live"] is True
    r = run("topics", "describe", "t", env={"NOTIFY_HTTP": b.http_url, "COLUMNS": "120"})
    assert r.exit_code == 0 and "lag (messages)" in r.output and " 15 " in r.output
    time.sleep(2.0)
    (row,) = [g for g in http.get("/api/groups").json()["groups"] if g["group"] == "billing"]
    assert row["live"] is False
    assert "(gone)" in run("topics", "describe", "t", "-s", b.addr).output


def test_stats_json_and_addresses_from_the_environment(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = http_broker_factory({"t": 2})
    Http(b.http_url).post("/api/topics/t/messages", json_body=[{"text": "hello"}])
    env = {"NOTIFY_SERVER": b.addr}
    stats = json.loads(run("stats", "--json", env=env).output)
    assert isinstance(stats["pid"], int) and isinstance(stats["rusage_user"], float)
    assert stats["txlog_end"] == {"file_no": 0, "offset": stats["txlog_end"]["offset"]}
    assert isinstance(stats["txlog_end"]["offset"], int)
    offsets = json.loads(run("stats", "offsets", "--json", env=env).output)
    assert offsets["t-0"]["min_offset"] == 0 and isinstance(offsets["t-0"]["max_offset"], int)
    topics = json.loads(run("stats", "topics", "--json", env=env).output)
    assert topics["t"]["partitions"] == 2 and topics["t"]["accept_publish"] is True
    # one way per port, each with its environment variable, shown in --help
    assert "NOTIFY_SERVER" in run("stats", "--help").output
    assert "NOTIFY_SERVER" in run("config", "reload", "--help").output
    assert "NOTIFY_SERVER" in run("topics", "list", "--help").output
    assert "NOTIFY_SERVER" in run("tx", "list", "--help").output
    assert "--http" not in run("topics", "list", "--help").output  # the deprecated alias
    r = run("topics", "list", "--json", env={"NOTIFY_HTTP": b.http_url})
    assert r.exit_code == 0 and "t" in {t["name"] for t in json.loads(r.output)}


def test_one_address_option_for_every_command(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """``-s/--server`` names the broker in every command that talks to one; the HTTP admin
    commands ask the broker for its HTTP port, or take the URL; ``-H`` still works."""
    b = http_broker_factory({"t": 1})
    for args in (("topics", "list"), ("tx", "list"), ("stats",), ("topics", "describe", "t")):
        r = run(*args, "-s", b.addr)
        assert r.exit_code == 0, (args, r.output)
    assert "t" in {t["name"] for t in json.loads(run("topics", "list", "--json",
                                                     env={"NOTIFY_SERVER": b.addr}).output)}
    assert run("topics", "list", "--server", b.http_url).exit_code == 0
    r = run("topics", "list", "-H", b.http_url)  # the old spelling: works, and says so
    assert r.exit_code == 0 and "-H/--http is deprecated, use -s/--server" in r.output
    r = run("topics", "list", "-s", b.addr, "-H", "http://127.0.0.1:1")  # explicit -s wins
    assert r.exit_code == 0, r.output
    # every command's help shows the one option (the docs' CLI reference is made from it)
    for args in (("topics", "create"), ("tx", "commit"), ("retention", "run"), ("stats",),
                 ("config", "reload"), ("queue", "delete"), ("outbox", "relay"),
                 ("dlq", "list"), ("xa", "list")):
        out = run(*args, "--help").output
        assert "-s, --server" in out and "-H," not in out and "--broker" not in out, args


def test_commands_exit_non_zero_on_an_error_answer(
    http_broker_factory: Callable[..., BrokerProcess],
) -> None:
    """MetaQ answers ``stats <unknown>`` with 200 and ``resultCode 1``: the CLI says so and
    exits 1, in both output forms; a known topic exits 0."""
    b = http_broker_factory({"t": 1})
    r = run("stats", "nosuch", "-s", b.addr)
    assert r.exit_code == 1 and "no such topic" in r.output, r.output
    r = run("stats", "nosuch", "-s", b.addr, "--json")
    assert r.exit_code == 1 and '"resultCode": 1' in r.output
    assert run("stats", "t", "-s", b.addr).exit_code == 0
    assert run("stats", "help", "-s", b.addr).exit_code == 0
