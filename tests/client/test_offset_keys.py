"""Offsets keyed by the brokers' own ids, migration of old files, the explicit default
data directory, against real broker processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from notify.client import ClientConfig, ConsumerConfig, FileOffsetStore, connect
from notify.client._config import default_data_dir
from tests.conftest import BrokerFactory

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def cconf(tmp_path: Path, **kw: Any) -> ConsumerConfig:
    return ConsumerConfig(group="g", data_dir=tmp_path / "consumer", commit_interval_s=0, **kw)


def test_partitions_and_offsets_do_not_depend_on_the_list_order(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    b7 = broker_factory({"t": 2}, brokerId=7)
    b3 = broker_factory({"t": 2}, brokerId=3)
    with connect([b7.addr, b3.addr], config=FAST) as s:
        parts = s.partitions("t")
        assert [str(p) for p in parts] == ["3-0", "3-1", "7-0", "7-1"]
        assert {p.address for p in parts if p.broker_id == 7} == {b7.addr}
        p = s.create_producer()
        for i in range(20):
            p.send("t", b"%d" % i).raise_for_error()
        c = s.create_consumer(cconf(tmp_path))
        first = {m.data for m in c.messages("t", idle_timeout_s=2.0)}
        assert len(first) == 20
        c.shutdown()
        p.send("t", b"new", key="k").raise_for_error()
    doc = json.loads((tmp_path / "consumer" / "offsets" / "g.offsets.json").read_text())
    assert doc["version"] == 2 and set(doc["offsets"]["t"]) == {"3-0", "3-1", "7-0", "7-1"}
    with connect([b3.addr, b7.addr], config=FAST) as s:  # the other order: same keys
        c = s.create_consumer(cconf(tmp_path))
        assert [m.data for m in c.messages("t", idle_timeout_s=2.0)] == [b"new"]


def test_old_position_keyed_file_is_migrated(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    b7 = broker_factory({"t": 1}, brokerId=7)
    b3 = broker_factory({"t": 1}, brokerId=3)
    with connect([b7.addr, b3.addr], config=FAST) as s:
        by_index = s.create_producer(selector=lambda t, parts, key, data: parts[int(str(key))])
        # sorted partitions: [3-0, 7-0]; three messages on both
        on3 = [by_index.send("t", b"b%d" % i, key="0").raise_for_error() for i in range(3)]
        on7 = [by_index.send("t", b"a%d" % i, key="1").raise_for_error() for i in range(3)]
        assert {str(on3[0].partition), str(on7[0].partition)} == {"3-0", "7-0"}
        # what an older client wrote with this list: position 0 = broker 7, 1 = broker 3,
        # both consumed up to the end of their second message
        old = {
            "version": 1,
            "group": "g",
            "offsets": {"t": {"0-0": [on7[2].offset, 1], "1-0": [on3[2].offset, 2]}},
        }
        path = tmp_path / "consumer" / "offsets" / "g.offsets.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(old))
        c = s.create_consumer(cconf(tmp_path))
        rest = sorted(m.data for m in c.messages("t", idle_timeout_s=2.0))
        assert rest == [b"a2", b"b2"]
        c.shutdown()
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and set(doc["offsets"]["t"]) == {"7-0", "3-0"}
    store = FileOffsetStore(path.parent)
    assert not store.migrate_keys("g", {0: 7, 1: 3})  # once only


def test_default_data_dir_is_explicit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_CLIENT_DIR", str(tmp_path / "state"))
    assert ConsumerConfig(group="g").data_dir == tmp_path / "state"
    monkeypatch.delenv("NOTIFY_CLIENT_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == tmp_path / "xdg" / "notify-client"
    legacy = tmp_path / ".notify-client" / "offsets" / "g.offsets.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"version": 1, "group": "g", "offsets": {"t": {"0-0": [5, 1]}}}))
    with connect(["127.0.0.1:1"], config=FAST) as s, caplog.at_level("INFO", "notify.client"):
        s.create_consumer("g")
    adopted = tmp_path / "xdg" / "notify-client" / "offsets" / "g.offsets.json"
    assert json.loads(adopted.read_text())["offsets"] == {"t": {"0-0": [5, 1]}}
    assert f"offsets in {adopted}" in caplog.text and "copied from the old default" in caplog.text
