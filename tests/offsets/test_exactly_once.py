"""Exactly-once effects: a consumer PROCESS SIGKILLed at random points, real broker + PostgreSQL.

The worker (``tests/offsets/eo_worker.py``) writes one ``applied`` row per message and bumps
a counter, in the same PostgreSQL transaction as the offsets. It is killed again and again:
by itself at a chosen point (batch fetched; between two writes; writes done, transaction
open; just committed) after a random number of messages, and by this test at random times.
Messages keep arriving between rounds. At the end the table must hold every produced
message exactly once and the stored offsets must be the partitions' ends.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from notify.client import connect
from notify.migrations import upgrade
from notify.offsets import SqlOffsetStore
from notify.testing import BrokerProcess
from tests.services import PostgresServer, fresh_database

from .eo_worker import POINTS

ROOT = Path(__file__).resolve().parents[2]
GROUP = "eo"


def _schema(engine: sa.Engine) -> None:
    with engine.begin() as c:
        c.execute(
            sa.text(
                "CREATE TABLE applied (id BIGSERIAL PRIMARY KEY, part VARCHAR(16) NOT NULL, "
                "off BIGINT NOT NULL, msg_id BIGINT NOT NULL, body TEXT NOT NULL)"
            )
        )
        c.execute(sa.text("CREATE TABLE totals (id INT PRIMARY KEY, n BIGINT NOT NULL)"))
        c.execute(sa.text("INSERT INTO totals VALUES (1, 0)"))


def _count(engine: sa.Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.text("SELECT count(*) FROM applied")).scalar_one())


@pytest.mark.slow
@pytest.mark.crash
def test_sigkilled_consumer_applies_every_message_exactly_once(
    broker: BrokerProcess, postgres: PostgresServer, tmp_path: Path
) -> None:
    seed = int(os.environ.get("NOTIFY_EO_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    url = fresh_database(postgres)
    upgrade(url)
    engine = sa.create_engine(url)
    _schema(engine)
    sent: dict[tuple[str, int], bytes] = {}
    log = tmp_path / "worker.log"

    def worker(*extra: str, idle_exit: float = 1.0) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.offsets.eo_worker",
                    "--broker",
                    broker.addr,
                    "--url",
                    url,
                    "--group",
                    GROUP,
                    "--data-dir",
                    str(tmp_path / "consumer"),
                    "--idle-exit",
                    str(idle_exit),
                    *extra,
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def ctx() -> str:
        return f"seed={seed}\n{log.read_text(errors='replace')[-3000:]}"

    try:
        with connect([broker.addr]) as session:
            producer = session.create_producer()

            def produce(n: int) -> None:
                start = len(sent)
                futs = [
                    (i, producer.send_future("test", b"%d" % i)) for i in range(start, start + n)
                ]
                for i, f in futs:
                    r = f.result(30)
                    assert r.success and r.partition is not None, r.error
                    sent[(str(r.partition), r.offset)] = b"%d" % i

            produce(2000)
            killed = {p: 0 for p in POINTS}
            external = 0
            progress = [0]
            for rnd in range(11):
                if rnd in (4, 8):
                    produce(500)
                # every round starts with more pending than a worker's chosen death point, so
                # each point is reached whatever the earlier rounds consumed
                backlog = len(sent) - progress[-1]
                if backlog < 400:
                    produce(400 - backlog)
                if rnd % 3 == 2:  # killed from outside at a random moment
                    p = worker()
                    time.sleep(rng.uniform(0.4, 1.5))
                    if p.poll() is None:
                        os.kill(p.pid, signal.SIGKILL)
                        external += 1
                    p.wait(30)
                else:  # kills itself at a chosen point after a random number of messages
                    point = POINTS[rnd % len(POINTS)]
                    p = worker("--die-after", str(rng.randint(0, 250)), "--die-at", point)
                    rc = p.wait(60)
                    assert rc in (-signal.SIGKILL, 0), f"worker exit {rc}\n{ctx()}"
                    if rc == -signal.SIGKILL:
                        killed[point] += 1
                progress.append(_count(engine))
            assert all(n >= 1 for n in killed.values()), f"{killed}\n{ctx()}"
            assert external >= 1, ctx()
            assert progress[-1] > 0, ctx()
            final = worker(idle_exit=1.5)
            assert final.wait(120) == 0, ctx()

        with engine.connect() as c:
            rows = c.execute(sa.text("SELECT part, off, body FROM applied")).all()
            total = c.execute(sa.text("SELECT n FROM totals WHERE id = 1")).scalar_one()
        got = [(r.part, r.off) for r in rows]
        dupes = len(got) - len(set(got))
        assert dupes == 0, f"{dupes} messages applied twice\n{ctx()}"
        assert set(got) == set(sent), (
            f"lost {len(set(sent) - set(got))}, unexpected {len(set(got) - set(sent))}\n{ctx()}"
        )
        assert all(sent[(r.part, r.off)] == r.body.encode() for r in rows)
        assert total == len(sent) >= 3000
        ends: dict[str, int] = {}
        for (part, off), body in sent.items():
            ends[part] = max(ends.get(part, 0), off + 20 + len(body))
        with SqlOffsetStore(url) as store:
            assert {o.partition: o.offset for o in store.list_offsets(GROUP, "test")} == ends
    finally:
        engine.dispose()
