"""Transactional acknowledgement (README "Queues"): the application's rows and the claims
of the messages commit together in PostgreSQL, the broker ack follows. The consumer
process is SIGKILLed before the DB commit, between the commit and the ack, and after the
ack, and the broker is SIGKILLed mid-stream; afterwards the app table holds every message
exactly once and the broker has nothing left to deliver."""

from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from notify.client import connect
from notify.migrations import upgrade
from notify.offsets import QueueInbox
from notify.offsets.base import OffsetStoreError
from notify.testing import BrokerProcess
from tests.helpers import queue_stats
from tests.offsets.conftest import sql_url
from tests.services import PostgresServer, fresh_database
from tests.services_conftest import running

from .test_queues import _publish

N = 120


def _schema(engine: sa.Engine) -> None:
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE applied (id BIGSERIAL PRIMARY KEY, part TEXT NOT NULL, "
                          "off BIGINT NOT NULL, body TEXT NOT NULL)"))
        c.execute(sa.text("CREATE TABLE totals (id INT PRIMARY KEY, n BIGINT NOT NULL)"))
        c.execute(sa.text("INSERT INTO totals VALUES (1, 0)"))


@pytest.mark.crash
def test_transactional_ack_survives_sigkill_at_each_step(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = fresh_database(running(postgres))
    upgrade(url)
    engine = sa.create_engine(url)
    _schema(engine)
    log = tmp_path / "worker.log"
    with BrokerProcess(tmp_path / "b", topics={"jobs": 2}) as b:
        _publish(b.addr, "jobs", N, 2, prefix=b"job")

        zyg = subprocess.Popen(
            [sys.executable, "-m", "tests.queues.qtx_worker", "--zygote", str(log)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert zyg.stdin is not None and zyg.stdout is not None
        zin, zout = zyg.stdin, zyg.stdout

        def start(*extra: str, crash: str = "") -> None:
            """A worker process (forked by the zygote, which imported everything once)."""
            args = ["--broker", b.addr, "--url", url, *extra]
            zin.write(json.dumps({"args": args, "crash": crash}) + "\n")
            zin.flush()

        def wait() -> int:
            line = zout.readline()
            assert line.startswith("exit "), (line, log.read_text()[-3000:])
            return int(line.split()[1])

        def applied() -> int:
            with engine.connect() as c:
                return int(c.execute(sa.text("SELECT count(*) FROM applied")).scalar_one())

        try:
            counts = []
            for extra, crash in (
                (["--die-after", "20"], ""),  # 1. killed with rows written, before the commit
                ([], "queue_tx_committed"),  # 2. after the DB commit, before the ack
                ([], "queue_tx_acked"),  # 3. right after the broker answered the ack
            ):
                start(*extra, crash=crash)
                assert wait() == -signal.SIGKILL, log.read_text()[-3000:]
                counts.append(applied())
            assert 0 < counts[0] < counts[1]  # the killed-after-commit transaction committed
            start("--delay", "0.01", "--idle-exit", "1")  # 4. the broker killed under it
            deadline = time.monotonic() + 10
            while applied() < counts[2] + 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            b.kill()  # mid-stream: a transaction open, its acks or pushes in flight
            b.start()
            assert wait() == 0, log.read_text()[-3000:]
            start("--idle-exit", "0.5")  # 5. drains what is left, if anything
            assert wait() == 0, log.read_text()[-3000:]
        finally:
            zin.close()
            zyg.wait(10)
            zout.close()
        tail = log.read_text()[-3000:]
        with engine.connect() as c:
            bodies = [r[0] for r in c.execute(sa.text("SELECT body FROM applied"))]
            total = c.execute(sa.text("SELECT n FROM totals")).scalar_one()
        assert sorted(bodies) == sorted(f"job{i}" for i in range(N)), tail  # once each
        assert total == N
        st = queue_stats(b.addr)["jobs/qtx"]
        assert st["tracked"] == "0", st  # every message accepted on the broker
        # the committed-but-unacknowledged batch came back and was only acknowledged
        assert " duplicates\n" in log.read_text(), tail
        inbox = QueueInbox(engine)
        inbox.check_table()
        assert inbox.prune(dt.timedelta(days=1)) == 0
        assert inbox.prune(dt.timedelta(seconds=-60), group="qtx") == N
    engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "mariadb"])
def test_inbox_claims_duplicates_rollback_and_prune(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The claim, the duplicate check and prune on SQLite and MariaDB (PostgreSQL above)."""
    url = sql_url(request, dialect, tmp_path)
    upgrade(url)
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE applied (body VARCHAR(32) NOT NULL)"))
    inbox = QueueInbox(engine)
    with BrokerProcess(tmp_path / "b", topics={"jobs": 2}) as b:
        _publish(b.addr, "jobs", 4, 2, prefix=b"job")
        with connect([b.addr]) as session:
            consumer = session.create_queue_consumer("jobs", "g", credit=10)
            msgs = [m for m in (consumer.get(5) for _ in range(4)) if m is not None]
            assert len(msgs) == 4
            with pytest.raises(RuntimeError), inbox.transaction(msgs[:2]) as tx:
                tx.connection.execute(sa.text("INSERT INTO applied VALUES ('x')"))
                raise RuntimeError("the app failed")  # rolled back, released
            again = [m for m in (consumer.get(5) for _ in range(2)) if m is not None]
            assert sorted(m.data for m in again) == sorted(m.data for m in msgs[:2])
            assert all(m.delivery_count == 2 for m in again)
            batch = again + msgs[2:]
            with inbox.transaction(batch) as tx:
                assert len(tx) == 4 and not tx.duplicates
                for m in tx:
                    tx.connection.execute(sa.text("INSERT INTO applied VALUES (:b)"),
                                          {"b": m.data.decode()})
            assert tx.acked == [True] * 4 and all(inbox.is_done(m) for m in batch)
            with inbox.transaction(batch[:1]) as tx:  # the same message once more
                assert not tx.messages and tx.duplicates == batch[:1]
            assert tx.acked == [False]  # accepted before: the broker no longer holds it
            consumer.close()
    with engine.connect() as c:
        rows = sorted(r[0] for r in c.execute(sa.text("SELECT body FROM applied")))
    assert rows == [f"job{i}" for i in range(4)]
    assert inbox.prune(dt.timedelta(days=1)) == 0
    assert inbox.prune(dt.timedelta(seconds=-60), group="other") == 0
    assert inbox.prune(dt.timedelta(seconds=-60)) == 4
    engine.dispose()


def test_two_consumers_holding_one_message_apply_it_once(
    tmp_path: Path, postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The first holder's connection drops while its transaction is open (as when its lock
    runs out), so the broker gives the message to a second consumer; the second holder's
    claim waits for the first transaction, fails on the primary key once it committed, and
    is tried again: the message is only acknowledged the second time, applied once."""
    url = fresh_database(running(postgres))
    upgrade(url)
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE applied (body TEXT NOT NULL)"))
    inbox = QueueInbox(engine)
    insert = sa.text("INSERT INTO applied VALUES (:b)")
    caplog.set_level(logging.INFO, "notify.offsets")
    with BrokerProcess(tmp_path / "b", topics={"jobs": 1}) as b:
        _publish(b.addr, "jobs", 1, 1, prefix=b"job")
        with connect([b.addr]) as session:
            first = session.create_queue_consumer("jobs", "g", credit=1)
            m1 = first.get(5)
            assert m1 is not None
            release_first = threading.Event()
            claimed_second = threading.Event()
            result: dict[str, object] = {}

            def second_holder() -> None:
                other = session.create_queue_consumer("jobs", "g", credit=1)
                m2 = other.get(5)
                assert m2 is not None and m2.delivery_count == 2
                release_first.set()  # the first commits while our claim waits for it
                with inbox.transaction([m2]) as tx:
                    claimed_second.set()
                    result["second"] = (len(tx.messages), len(tx.duplicates))
                    for m in tx:
                        tx.connection.execute(insert, {"b": m.data.decode()})
                result["second_acked"] = tx.acked
                other.close()

            with inbox.transaction([m1]) as tx:
                assert len(tx) == 1
                tx.connection.execute(insert, {"b": m1.data.decode()})
                first.close()  # gone: the broker gives the message to the next consumer
                t = threading.Thread(target=second_holder)
                t.start()
                assert release_first.wait(10)
                time.sleep(0.3)  # the second transaction's INSERT is waiting on our row
                assert not claimed_second.is_set()
            assert tx.acked == [False]  # our lock was lost: the broker gave it to the other
            t.join(10)
            assert result["second"] == (0, 1) and result["second_acked"] == [True]
            assert "queue claim raced with another transaction" in caplog.text
        assert queue_stats(b.addr)["jobs/g"]["tracked"] == "0"
    with engine.connect() as c:
        assert [r[0] for r in c.execute(sa.text("SELECT body FROM applied"))] == ["job0"]
    engine.dispose()


def test_inbox_prunes_claims_past_its_retention(tmp_path: Path) -> None:
    """Automatic pruning: claims younger than ``retention`` stay; older ones go after a
    transaction, at most once per ``prune_interval``."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    with pytest.raises(OffsetStoreError, match="retention must be positive"):
        QueueInbox(engine, retention=dt.timedelta(0))
    keep = QueueInbox(engine, retention=dt.timedelta(hours=1), prune_interval=dt.timedelta(0))
    short = QueueInbox(engine, retention=dt.timedelta(milliseconds=1),
                       prune_interval=dt.timedelta(hours=1))

    def claims() -> int:
        with engine.connect() as c:
            return int(c.execute(sa.text("SELECT COUNT(*) FROM notify_queue_done")).scalar_one())

    with BrokerProcess(tmp_path / "b", topics={"jobs": 1}) as b:
        _publish(b.addr, "jobs", 3, 1, prefix=b"job")
        with connect([b.addr]) as session:
            consumer = session.create_queue_consumer("jobs", "g", credit=10)
            msgs = [m for m in (consumer.get(5) for _ in range(3)) if m is not None]
            with keep.transaction(msgs[:1]):
                pass
            assert claims() == 1 and keep.pruned == 0  # younger than an hour: kept
            time.sleep(0.01)
            with short.transaction(msgs[1:2]):
                pass
            assert short.pruned >= 1 and not short.is_done(msgs[0])  # past 1 ms: pruned
            before = claims()
            with short.transaction(msgs[2:]):
                pass
            assert claims() == before + 1  # within prune_interval: no second pruning
            consumer.close()
    engine.dispose()
