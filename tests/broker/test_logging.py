"""The broker's log at the default level: start-up, shutdown, warnings and errors only.

A real broker (HTTP on, every periodic job on a short interval) serves puts, a transaction,
a consumer's long polls, delayed messages and HTTP requests; at the default level nothing
is logged between "listening" and "stopped". ``--log-level debug`` shows the scheduler.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from notify.cli import main
from notify.client import ConsumerConfig, connect
from notify.testing import BrokerProcess, free_port

BUSY = {
    "unflushInterval": 200,
    "checkpointInterval": 500,
    "configWatchInterval": 200,
    "txCheckBackDelay": 200,
}


def _exercise(b: BrokerProcess, tmp: Path) -> None:
    with connect([b.addr]) as session:
        producer = session.create_producer()
        for i in range(50):
            producer.send("t", b"m%d" % i).raise_for_error()
        with producer.transaction():
            producer.send("t", b"in a transaction")
        producer.send_delayed("t", b"later", delay=0.3).raise_for_error()
        consumer = session.create_consumer(
            ConsumerConfig(group="g", data_dir=tmp / "c", long_poll_ms=200)
        )
        got = list(consumer.messages("t", idle_timeout_s=1.5))
        assert len(got) >= 51
        consumer.shutdown()
    for path in ("/", "/api/topics", "/metrics", "/api/groups"):
        with urllib.request.urlopen(f"{b.http_url}{path}", timeout=10) as r:
            assert r.status == 200
    time.sleep(1.5)  # checkpoints, flushes, config watch, delay moves


def _between_start_and_stop(log: str) -> list[str]:
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if " listening on " in line)
    stop = next(i for i, line in enumerate(lines) if "stopping" in line or "stopped" in line)
    return lines[start + 1 : stop]


def test_default_level_logs_nothing_while_serving(tmp_path: Path) -> None:
    system = {**BUSY, "dashboardHttpPort": free_port()}
    b = BrokerProcess(tmp_path / "b", topics={"t": 2}, system=system).start()
    try:
        _exercise(b, tmp_path)
    finally:
        assert b.stop() == 0
    log = b.log_path.read_text()
    assert "INFO notify.broker: broker 0 listening on" in log  # start-up is logged
    assert "broker stopped" in log  # and shutdown
    assert _between_start_and_stop(log) == [], log
    assert "apscheduler" not in log


def test_debug_level_shows_the_scheduler(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", topics={"t": 1}, system=BUSY, log_level="debug").start()
    time.sleep(1.0)
    assert b.stop() == 0
    assert "apscheduler" in b.log_path.read_text()


def test_log_level_is_checked_and_documented() -> None:
    r = CliRunner().invoke(main, ["broker", "start", "--help"])
    assert "--log-level" in r.output and "warning" in r.output
    r = CliRunner().invoke(main, ["broker", "start", "--log-level", "loud"])
    assert r.exit_code == 2 and "loud" in r.output
    install = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "install.md"
    assert "--log-level" in install.read_text()
