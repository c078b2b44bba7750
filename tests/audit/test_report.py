"""The HTML report, section by section, from a summary made by hand (no Spark)."""

from __future__ import annotations

from typing import Any

from notify.audit import report


def _summary(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "ok": False,
        "violations": 2,
        "warnings": 1,
        "findings_by_check": {"committed_missing": 2, "segment_torn_tail": 1},
        "audited_at": "2026-11-28T04:00:00Z",
        "inputs": {"txlog": "/t", "data": "/d", "coordinator_log": "/c"},
        "txlog_records": {"APPEND_MSG": 5, "COMMIT": 4},
        "partition_messages": 12,
        "partition_bytes": 360,
        "first_message_at": "2026-11-28T03:00:00Z",
        "last_message_at": "2026-11-28T03:59:00Z",
        "transactions": {
            "committed": {
                "transactions": 4,
                "messages": 5,
                "bytes": 150,
                "messages_p50_p90_p99": [1, 2, 2],
                "messages_max": 2,
                "duration_ms_p50_p90_p99": [3, 9, 9],
                "duration_ms_max": 9,
            }
        },
        "tx_size_histogram": [("1", 3), ("2", 1)],
        "tx_duration_histogram": [("1-10 ms", 4)],
        "topic_hours": [{"topic": "q", "hour": "2026-11-28T03:00:00Z", "messages": 12}],
        "tx_hours": [{"hour": "2026-11-28T03:00:00Z", "outcome": "committed", "transactions": 4}],
        "stuck_prepared": [
            {"tx_key": "XID:k", "age_s": 61.0, "prepared_at": "x", "timeout_s": 60.0, "messages": 1}
        ],
        "coordinator": {
            "coordinator_id": "tm1",
            "format_id": 1,
            "decisions": 3,
            "heuristics": 0,
            "complete": True,
        },
        "findings_shown": [
            {
                "check": "committed_missing",
                "severity": "violation",
                "tx_key": "TX:<1>",
                "topic": "q",
                "partition": 0,
                "offset": 7,
                "msg_id": 99,
                "file": "redo.0",
                "position": 12,
                "detail": "not there",
            }
        ],
        "run": {
            "incremental": True,
            "master": "local[2]",
            "executors": 0,
            "parallelism": 2,
            "rows": 21,
            "audit_s": 1.5,
            "rows_per_s": 14,
            "checks_s": 1.0,
            "outputs_s": 0.5,
            "txlog_rows_read": 3,
            "txlog_bytes_read": 90,
            "txlog_rows_from_state": 6,
            "log_rows_read": 4,
            "log_bytes_read": 120,
            "log_rows_from_state": 8,
            "keys_redone": 2,
            "keys_changed": 1,
            "blocks_redone": 1,
            "state_ignored": None,
        },
    }
    s.update(over)
    return s


def test_page_has_every_section_in_order() -> None:
    page = report.render_html(_summary())
    marks = [
        "coordinator log <code>/c</code>",
        "<b>2 violation(s)</b>",
        "1 warning(s)",
        "incremental run on <code>local[2]</code>",
        '<td>redo log</td><td class="n">3</td>',
        "checked again: 2 transactions (1 with records added or deleted) and 1 message-id",
        "<h2>Findings</h2>",
        "findings per check",
        '<tr class="violation"><td>committed_missing</td><td>violation</td>',
        "<td>TX:&lt;1&gt;</td><td>q-0</td><td>7</td><td>99</td><td>redo.0@12</td>",
        "<h2>Stuck in doubt</h2>",
        "<h2>Transactions</h2>",
        "<td>1/2/2</td>",
        "transactions per hour by outcome",
        "transaction size (messages)",
        "commit duration (first message to COMMIT)",
        "<h2>Messages per topic and hour</h2>",
        "12 messages, 360 bytes in the partitions",
        '<td>APPEND_MSG</td><td class="n">5</td>',
        "<h2>Coordinator</h2>",
        "<td>tm1</td>",
        "</body></html>",
    ]
    at = [page.find(m) for m in marks]
    assert -1 not in at, [m for m, i in zip(marks, at, strict=True) if i < 0]
    assert at == sorted(at)


def test_sections_left_out_or_short_when_empty() -> None:
    page = report.render_html(
        _summary(
            ok=True,
            violations=0,
            warnings=0,
            findings_by_check={},
            findings_shown=[],
            stuck_prepared=[],
            coordinator=None,
            run=None,
            inputs={"txlog": "/t", "data": "/d"},
        )
    )
    assert '<p class="ok"><b>OK</b>' in page and "warning(s)" not in page
    assert "<h2>Findings</h2><p>none.</p>" in page
    for gone in ("Stuck in doubt", "<h2>Coordinator</h2>", " run on ", "coordinator log"):
        assert gone not in page
    state = dict(_summary()["run"], incremental=False, keys_redone=None, state_ignored="old")
    run = "".join(report._run_html(state))
    assert run.startswith("<p>full run") and "<p>checked again" not in run
    assert "<p class=warn>state not used: old</p>" in run
