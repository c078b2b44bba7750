"""Dead letters carry the wall-clock time they died at: the wire (``qdlq list``), ``notify
queue dlq list`` (table and JSON), the REST route the dashboard reads, and after a restart.

Before, the time was the broker's event-loop clock (monotonic: seconds since the machine
booted), shown as a date: ``1970-01-01 00:27:30``."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner

from notify.cli import main
from notify.protocol.frames import encode_qdlq, parse_dead_letters
from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient
from tests.http.conftest import Http
from tests.queues.test_queues import _publish, _pushes


def _reject_all(addr: str, n: int) -> None:
    with WireClient(addr) as c:
        assert c.call(b"qsub work g 10 earliest 2\r\n").code == 200
        got = _pushes(c, n)
        items = b"".join(b"X %d %d\n" % (m.partition, m.offset) for m in got)
        assert c.call(b"qack work g %d 3\r\n" % len(items) + items).code == 200


def _near(at_ms: int, lo: float, hi: float) -> bool:
    return lo * 1000 - 2000 <= at_ms <= hi * 1000 + 2000


def _check(b: BrokerProcess, lo: float, hi: float) -> None:
    with WireClient(b.addr) as c:
        total, _dropped, letters = parse_dead_letters(
            c.call(encode_qdlq("work", "g", "list", b"", 1)).body
        )
    assert total == 3
    assert all(_near(d.at_ms, lo, hi) for d in letters), [d.at_ms for d in letters]

    runner = CliRunner()
    out = runner.invoke(main, ["queue", "dlq", "list", "work", "g", "-s", b.addr, "--json"])
    assert out.exit_code == 0, out.output
    for d in json.loads(out.output)["dead_letters"]:
        assert _near(d["at_ms"], lo, hi), d
        assert abs(datetime.fromisoformat(d["at"]).timestamp() * 1000 - d["at_ms"]) < 1, d
    out = runner.invoke(main, ["queue", "dlq", "list", "work", "g", "-s", b.addr])
    assert out.exit_code == 0, out.output
    day = time.strftime("%Y-%m-%d", time.localtime(hi))
    assert out.output.count(day) == 3 and "1970" not in out.output, out.output

    body = Http(b.http_url).get("/api/queues/work/g/dead-letters").json()
    for d in body["dead_letters"]:  # what the dashboard shows ("... ago", the date on hover)
        assert _near(d["at_ms"], lo, hi), d
        assert d["at"].endswith("Z") and d["at"].startswith(day[:4]), d


def test_dead_letters_show_when_they_died_everywhere_and_after_restarts(tmp_path: Path) -> None:
    with BrokerProcess(
        tmp_path, topics={"work": 2}, system={"dashboardHttpPort": free_port()}
    ) as b:
        _publish(b.addr, "work", 3, 2)
        lo = time.time()
        _reject_all(b.addr, 3)
        hi = time.time()
        _check(b, lo, hi)
        b.restart()  # from the queue log's checkpoint
        _check(b, lo, hi)
        b.restart(kill=True)  # from its records
        _check(b, lo, hi)
