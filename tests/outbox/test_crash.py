"""Exactly once across SIGKILLs, with real processes: the relay killed at each step of a
batch (recorded but not sent, part of it acknowledged, all acknowledged but the rows
still there), the application killed before and after its commit, the broker killed and
down a while, the database killed and restarted. After each, every committed message is
in the topic exactly once, a key's messages in commit order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from notify.client import connect
from notify.migrations import upgrade
from notify.outbox import Outbox
from notify.testing import BrokerProcess
from tests.conftest import BrokerFactory
from tests.helpers import wait_until
from tests.outbox.conftest import (
    FAST,
    TOPICS,
    assert_exactly_once,
    backlog,
    bodies,
    published,
)
from tests.services import PostgresServer, fresh_database

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]


def _relay(url: str, addr: str, log: Path, crashpoint: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "NOTIFY_CRASHPOINTS": crashpoint, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "notify", "outbox", "relay", "--db", url, "-s", addr]
    cmd += ["--heartbeat", "0.2", "--instance-ttl", "1", "--log-level", "info"]
    with open(log, "ab") as err:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)


def _send_backlog(engine: Engine, topics: list[str], n: int, tag: str) -> list[bytes]:
    """``n`` messages over ``topics`` and 41 keys (a shard's cycles then span partitions of
    several topics: one sub-batch each)."""
    outbox = Outbox(engine)
    sent = []
    with engine.begin() as c:
        for i in range(n):
            body = f"{tag}-{i}".encode()
            outbox.send(c, topics[i % len(topics)], body, key=f"k{i % 41}", headers={"i": i})
            sent.append(body)
    return sent


def _bodies(addr: str, topics: list[str]) -> list[bytes]:
    return [b for t in topics for b in bodies(addr, t)]


def _check_order(addr: str, topic: str) -> None:
    per_key: dict[object, list[int]] = defaultdict(list)
    for m in published(addr, topic):
        if "i" in m.headers:
            per_key[(m.key, m.body.split(b"-")[0])].append(int(m.headers["i"]))
    for key, seq in per_key.items():
        assert seq == sorted(seq), f"{key}: {seq}"


def test_relay_killed_at_every_step_of_a_batch(
    engine: Engine, db_url: str, ob_broker: BrokerProcess, topic: str, tmp_path: Path
) -> None:
    topics = [topic, f"t{int(topic[1:]) + TOPICS // 2}"]  # a second topic no other test uses
    sent = _send_backlog(engine, topics, 240, "a")
    log = tmp_path / "relay.log"
    for point in ("outbox.recorded", "outbox.first_ack", "outbox.acked"):
        p = _relay(db_url, ob_broker.addr, log, point)
        try:
            assert p.wait(30) == -signal.SIGKILL, log.read_text()[-2000:]
        finally:
            if p.poll() is None:
                p.kill()
        assert f"crashpoint {point}" in log.read_text()
        sent += _send_backlog(engine, topics, 40, point.split(".")[1])
    with engine.connect() as c:
        pending = c.execute(
            sa.text("SELECT count(*) FROM notify_outbox_relay WHERE pending IS NOT NULL")
        ).scalar_one()
    assert pending >= 1  # the last relay died with a batch acknowledged and recorded
    p = _relay(db_url, ob_broker.addr, log)
    try:
        wait_until(lambda: backlog(engine) == 0, 30, what="the backlog drained")
        wait_until(
            lambda: len(_bodies(ob_broker.addr, topics)) >= len(sent), 30, what="all published"
        )
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-2000:]
    assert_exactly_once(_bodies(ob_broker.addr, topics), sent)
    for t in topics:
        _check_order(ob_broker.addr, t)
    assert "sending the pending batch again" in log.read_text()


APP = textwrap.dedent(
    """
    import asyncio, sys, threading
    import sqlalchemy as sa
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine
    from notify.client import AsyncMessageSessionFactory
    from notify.outbox import Outbox
    url, topic, mode, api, addr = sys.argv[1:6]
    blocking = api == "blocking"
    drivers = {"postgresql": "psycopg", "mysql": "asyncmy", "sqlite": "aiosqlite"}
    backend = sa.make_url(url).get_backend_name()
    aurl = sa.make_url(url).set(drivername=f"{backend}+{drivers[backend]}")
    engine = sa.create_engine(url) if blocking else create_async_engine(aurl)
    outbox = Outbox(engine)  # its commit hook first: hold() runs after the rows are written

    def hold(conn):  # after the outbox's rows, before COMMIT
        if conn.info.pop("hold", None):
            print("inserted", flush=True)
            threading.Event().wait()

    event.listen(engine if blocking else engine.sync_engine, "commit", hold)
    body = b"never" if mode == "before" else b"committed"
    order = 2 if mode == "after" else 1
    insert = sa.text("INSERT INTO orders (id) VALUES (:i)")
    if blocking and url.startswith("postgresql") and mode == "before":
        import psycopg  # the row and its lock at send time
        conn = psycopg.connect("postgresql://" + url.split("://", 1)[1])
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        outbox.send(conn, topic, body, key="x")
        print("inserted", flush=True)
        threading.Event().wait()
    if blocking:
        with engine.begin() as c:
            c.execute(insert, {"i": order})
            outbox.send(c, topic, body, key="x")
            c.info["hold"] = mode == "before"
        print("committed", flush=True)
        threading.Event().wait()

    async def send(producer, conn):  # send_async, then the producer's transaction
        await outbox.send_async(conn, topic, body, key="x")
        async with producer.transaction(db=conn):
            await producer.send(topic, body + b" (tx)", key="x")

    async def main(producer):
        if url.startswith("postgresql") and mode == "before":
            # the one-query commit writes the rows and COMMIT in one round trip: no point
            # between them; a psycopg AsyncConnection inserts at send time, killed there
            import psycopg
            conn = await psycopg.AsyncConnection.connect("postgresql://" + url.split("://")[1])
            await conn.execute("INSERT INTO orders (id) VALUES (1)")
            await send(producer, conn)
            print("inserted", flush=True)
            threading.Event().wait()
        async with engine.begin() as c:
            await c.execute(insert, {"i": order})
            await send(producer, c)
            c.sync_connection.info["hold"] = mode == "before"
        print("committed", flush=True)
        threading.Event().wait()

    async def run():
        async with AsyncMessageSessionFactory([addr]) as session:
            await main(session.create_producer())

    asyncio.run(run())
    """
)


# the blocking application, and the asyncio one: ``send_async`` and an AsyncProducer's
# ``transaction(db=conn)`` in one transaction of an AsyncEngine's connection (its commit
# hook runs in SQLAlchemy's greenlet, where the hold stops the whole process)
@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_application_killed_before_and_after_its_commit(
    engine: Engine, db_url: str, ob_broker: BrokerProcess, topic: str, api: str
) -> None:
    """Killed in its commit (the rows written, COMMIT not sent; on PostgreSQL, whose
    one-query commit sends both at once, killed with the rows inserted at send time by a
    psycopg connection), and right after its COMMIT: the relay publishes the committed
    messages once each and never the others."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for mode, line in (("before", b"inserted"), ("after", b"committed")):
        cmd = [sys.executable, "-c", APP, db_url, topic, mode, api, ob_broker.addr]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env) as p:
            try:
                assert p.stdout is not None
                assert p.stdout.readline().strip() == line
            finally:
                p.kill()
            assert p.wait() == -signal.SIGKILL
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT id FROM orders")).scalars().all() == [2]
    with connect([ob_broker.addr]) as session, Outbox(engine).relay(session, FAST):
        wait_until(lambda: backlog(engine) == 0, timeout=20, what="the committed rows published")
    want = [b"committed"] if api == "blocking" else [b"committed", b"committed (tx)"]
    assert bodies(ob_broker.addr, topic) == want


class _App:
    """The application: commits an order and its message per transaction until stopped,
    through database and broker outages (what committed is the orders table)."""

    def __init__(self, engine: Engine, topic: str):
        self.engine = engine
        self.topic = topic
        self.outbox = Outbox(engine)
        self.stop = threading.Event()
        self.commits = 0
        self.failures = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                with self.engine.begin() as c:
                    c.execute(sa.text("INSERT INTO orders (id) VALUES (:i)"), {"i": i})
                    body = f"o-{i}".encode()
                    self.outbox.send(c, self.topic, body, key=f"k{i % 13}", headers={"i": i})
                self.commits += 1
            except sa_exc.SQLAlchemyError as e:
                self.failures += 1
                self.errors.append(str(e).splitlines()[0])
                time.sleep(0.05)
            time.sleep(0.002)

    def committed(self) -> list[bytes]:
        with self.engine.connect() as c:
            ids = c.execute(sa.text("SELECT id FROM orders")).scalars().all()
        return [f"o-{i}".encode() for i in ids]

    def __enter__(self) -> _App:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.mark.parametrize("db_url", ["postgres", "mariadb"], indirect=True)
def test_broker_killed_and_down_while_the_application_commits(
    engine: Engine, broker_factory: BrokerFactory
) -> None:
    broker = broker_factory(topics={"orders": 4})
    with connect([broker.addr]) as session, Outbox(engine).relay(session, FAST) as relay:
        with _App(engine, "orders") as app:
            wait_until(lambda: relay.published >= 50, timeout=20, what="publishing")
            broker.kill()  # mid-publish, then down a while: the application goes on
            before = app.commits
            wait_until(
                lambda: app.commits >= before + 100, timeout=20, what="commits while it is down"
            )
            assert backlog(engine) > 0
            broker.start()
            time.sleep(0.2)
        wait_until(lambda: backlog(engine) == 0, 30, what="the backlog drained")
        assert app.failures == 0, app.errors
    assert_exactly_once(bodies(broker.addr, "orders"), app.committed())
    _check_order(broker.addr, "orders")


class _SyncCommitPostgres(PostgresServer):
    """PostgreSQL acknowledging a commit once its WAL is written (``synchronous_commit``
    on; fsync stays off: a killed server's writes survive in the page cache). The test
    servers' ``synchronous_commit=off`` would lose the last acknowledged commits with the
    server's memory, which no outbox can survive: the relay's own records go too."""

    def _command(self) -> list[str]:
        return [
            "synchronous_commit=on" if a == "synchronous_commit=off" else a
            for a in super()._command()
        ]


@pytest.fixture
def pg_kill_url() -> Iterator[tuple[_SyncCommitPostgres, str]]:
    server = _SyncCommitPostgres()
    server.start()
    try:
        url = fresh_database(server)
        upgrade(url)
        yield server, url
    finally:
        server.close()


def test_database_killed_and_restarted(
    pg_kill_url: tuple[_SyncCommitPostgres, str], broker_factory: BrokerFactory
) -> None:
    server, url = pg_kill_url
    broker = broker_factory(topics={"orders": 4})
    engine = sa.create_engine(url, pool_size=20, pool_pre_ping=True)
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE orders (id BIGINT PRIMARY KEY)"))
    try:
        with connect([broker.addr]) as session, Outbox(engine).relay(session, FAST) as relay:
            with _App(engine, "orders") as app:
                wait_until(lambda: relay.published >= 50, timeout=20, what="publishing")
                server.kill()  # SIGKILL: transactions in flight are lost, committed ones not
                time.sleep(0.5)
                server.start()
                before = app.commits
                wait_until(lambda: app.commits >= before + 50, 30, what="commits after the restart")
            wait_until(lambda: backlog(engine) == 0, 30, what="the backlog drained")
            assert app.failures >= 1 and sum(s.takeovers for s in relay.stats.values()) >= 8
        assert_exactly_once(bodies(broker.addr, "orders"), app.committed())
        _check_order(broker.addr, "orders")
    finally:
        engine.dispose()
