"""Retention: deletePolicy / deleteWhen on real segment files, and the Quartz conversion."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from notify.config import DeletePolicy, parse_config
from notify.errors import ConfigError
from notify.store.retention import quartz_trigger
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, wait_until


def test_quartz_conversion() -> None:
    utc = dt.UTC
    start = dt.datetime(2026, 11, 22, 7, 0, 0, tzinfo=utc)  # a Sunday
    t = quartz_trigger("0 0 6,18 * * ?", "UTC")
    assert t.get_next_fire_time(None, start) == dt.datetime(2026, 11, 22, 18, 0, tzinfo=utc)
    # Quartz day-of-week 2 is Monday
    t2 = quartz_trigger("0 30 1 ? * 2", "UTC")
    assert t2.get_next_fire_time(None, start) == dt.datetime(2026, 11, 23, 1, 30, tzinfo=utc)
    t3 = quartz_trigger("0 0 0 L * ?", "UTC")
    assert t3.get_next_fire_time(None, start) == dt.datetime(2026, 11, 30, 0, 0, tzinfo=utc)
    for bad in ("0 0 6 * *", "0 0 6 15W * ?", "0 0 6 ? * 6#3", "x 0 0 * * ?"):
        with pytest.raises(ConfigError, match="deleteWhen"):
            quartz_trigger(bad)
    with pytest.raises(ConfigError, match=r"\[topic=t\] deleteWhen"):
        parse_config("[topic=t]\ndeleteWhen=0 0 6 15W * ?\n")


def test_delete_policy_parse() -> None:
    assert DeletePolicy.parse("delete,168") == DeletePolicy("delete", 168 * 3600.0, False)
    assert DeletePolicy.parse("archive,30m,zip") == DeletePolicy("archive", 1800.0, True)
    assert DeletePolicy.parse("delete,10s").max_age_s == 10.0
    with pytest.raises(ValueError):
        DeletePolicy.parse("delete,10x")
    with pytest.raises(ConfigError, match="deletePolicy"):
        parse_config("[system]\ndeletePolicy=purge,1\n")


def _fill(addr: str, topic: str, n: int) -> None:
    with WireClient(addr) as c:
        for i in range(n):
            assert c.put(topic, 0, b"x" * 200, opaque=i).code == 200


def _min_offset(addr: str, topic: str) -> int:
    with WireClient(addr) as c:
        return int(c.call(b"offset %s g 0 0 1\r\n" % topic.encode()).body)


def _segments(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_expired_segments_deleted_archived_and_consumers_protected(
    broker_factory: BrokerFactory,
) -> None:
    every = "* * * * * ?"
    b = broker_factory(
        topics={
            "del": {"deletePolicy": "delete,1s", "deleteWhen": every},
            "arc": {"deletePolicy": "archive,1s", "deleteWhen": every},
            "zip": {"deletePolicy": "archive,1s,zip", "deleteWhen": every},
            "held": {"deletePolicy": "delete,1s", "deleteWhen": every},
            "forced": {
                "deletePolicy": "delete,1s",
                "deleteWhen": every,
                "retentionIgnoresConsumers": "true",
            },
            "young": {"deletePolicy": "delete,1h", "deleteWhen": every},
        },
        maxSegmentSize=4096,
    )
    for t in ("del", "arc", "zip", "held", "forced", "young"):
        _fill(b.addr, t, 60)  # 60 x 220 B = 13,200 B: 4 segments
    with WireClient(b.addr) as c:
        # a live consumer still at offset 0 of "held" and of "forced"
        assert c.call(b"get held g 0 0 100 1\r\n").kind == "value"
        assert c.call(b"get forced g 0 0 100 1\r\n").kind == "value"
    data = b.data_dir

    def retained() -> bool:  # what retention rounds (every second) do to the expired topics
        live = [n for n in _segments(data / "del-0") if n.endswith(".meta")]
        return (
            _min_offset(b.addr, "del") > 0
            and live == [f"{_min_offset(b.addr, 'del'):020d}.meta"]
            and _min_offset(b.addr, "arc") > 0
            and any(n.endswith(".meta.zip") for n in _segments(data / "zip-0"))
            and _min_offset(b.addr, "forced") > 0
        )

    wait_until(retained, timeout=15, what="retention of del, arc, zip and forced")
    assert _min_offset(b.addr, "del") > 0
    assert [n for n in _segments(data / "del-0") if n.endswith(".meta")] == [
        f"{_min_offset(b.addr, 'del'):020d}.meta"
    ]
    arc = _segments(data / "arc-0")
    assert any(n.endswith(".meta.arc") for n in arc) and _min_offset(b.addr, "arc") > 0
    assert any(n.endswith(".meta.zip") for n in _segments(data / "zip-0"))
    assert _min_offset(b.addr, "held") == 0  # the consumer has not read past it
    assert _min_offset(b.addr, "forced") > 0
    assert _min_offset(b.addr, "young") == 0
    with WireClient(b.addr) as c:
        r = c.call(b"get del g 0 0 100 2\r\n")
        assert r.code == 301 and int(r.body) == _min_offset(b.addr, "del")
    # still serving and writing after deletions; data survives a restart
    _fill(b.addr, "del", 5)
    b.restart()
    assert _min_offset(b.addr, "del") > 0
    _fill(b.addr, "del", 1)
