"""Pure helpers behind ``stats --json`` and the lag in messages."""

from __future__ import annotations

from notify.protocol import records
from notify.protocol.replies import parse_stats_json, stats_json_value


def test_stats_values_are_parsed() -> None:
    assert stats_json_value("17") == 17
    assert stats_json_value("0.25") == 0.25
    assert stats_json_value("true") is True and stats_json_value("false") is False
    assert stats_json_value("min_offset=0 max_offset=13653") == {
        "min_offset": 0,
        "max_offset": 13653,
    }
    assert stats_json_value("state=ok lag_bytes=5 accept=true") == {
        "state": "ok",
        "lag_bytes": 5,
        "accept": True,
    }
    assert stats_json_value("0.1.0") == "0.1.0"
    assert stats_json_value("nan") == "nan" and stats_json_value("inf") == "inf"
    assert stats_json_value("a=1 loose") == "a=1 loose"  # not all fields: the text
    body = b"STATS\r\npid 12\r\ntxlog_end file_no=0 offset=40\r\nEND\r\n"
    assert parse_stats_json(body) == {"pid": 12, "txlog_end": {"file_no": 0, "offset": 40}}


def test_count_records_stops_at_a_partial_record() -> None:
    buf = b"".join(records.encode(i + 1, 0, b"x" * i) for i in range(5))
    assert records.count_records(buf) == (5, len(buf))
    assert records.count_records(buf[:-1]) == (4, len(buf) - records.HEADER_SIZE - 4)
    assert records.count_records(b"") == (0, 0)
