"""kill -9 of an application between the steps of a half message whose local transaction
is the producer's own database transaction (``create_transactional_producer(group,
db=engine)``), on SQLite, PostgreSQL and MariaDB: killed before its database commit, the
check-back answered from the marker table (by another process of the group) rolls the
message back and the rows are not there; killed after the database commit and before the
message's COMMIT, the check-back commits it: visible exactly once, and still once after a
broker restart; killed right after the block (its COMMIT written, the reply not awaited),
the message is committed once, by that COMMIT or by the check-back. No checker was
written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from notify.client import connect
from notify.outbox import HalfMessageCheckedBackError
from notify.testing import BrokerProcess
from tests.helpers import stats, wait_until
from tests.outbox.conftest import bodies

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    import asyncio
    import os
    import signal
    import sys
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine
    from notify.client import AsyncMessageSessionFactory, connect

    url, addr, topic, n, after_block, api = sys.argv[1:7]
    insert = sa.text("INSERT INTO orders (id) VALUES (:n)")

    def killed_after_the_block():
        if after_block == "kill":  # COMMIT written, its reply not awaited: killed now
            print("killed after the block", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    async def main():  # the asyncio API on an AsyncEngine
        drivers = {"postgresql": "psycopg", "mysql": "asyncmy", "sqlite": "aiosqlite"}
        u = sa.make_url(url)
        backend = u.get_backend_name()
        engine = create_async_engine(u.set(drivername=f"{backend}+{drivers[backend]}"))
        async with AsyncMessageSessionFactory([addr]) as session:
            producer = session.create_transactional_producer("shop", db=engine)
            async with producer.half_message(topic, f"order {n}".encode(), key=n) as conn:
                await conn.execute(insert, {"n": int(n)})
            killed_after_the_block()

    if api == "asyncio":
        asyncio.run(main())
    else:
        engine = sa.create_engine(url)
        with connect([addr]) as session:
            producer = session.create_transactional_producer("shop", db=engine)
            with producer.half_message(topic, f"order {n}".encode(), key=n) as conn:
                conn.execute(insert, {"n": int(n)})
            killed_after_the_block()
    print("not killed")
    """
)


@pytest.fixture(scope="module")
def hc_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker that checks back on a prepared half message after 300 ms."""
    b = BrokerProcess(
        tmp_path_factory.mktemp("half-crash"),
        topics={"paid": 2},
        system={"txCheckBackDelay": 300},
    )
    b.start()
    yield b
    b.stop()


def _app_killed_at(point: str, url: str, addr: str, n: int, api: str) -> None:
    """Run the application, killed at crash point ``point`` ("after block": right after
    its ``with`` block, the message's COMMIT written but not answered)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if point != "after block":
        env["NOTIFY_CRASHPOINTS"] = point
    after = "kill" if point == "after block" else "-"
    r = subprocess.run(
        [sys.executable, "-c", APP, url, addr, "paid", str(n), after, api],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    said = "killed after the block" if point == "after block" else f"crashpoint {point}"
    assert said.encode() in r.stderr


def _orders(engine: Engine) -> list[int]:
    with engine.connect() as c:
        return list(c.execute(sa.text("SELECT id FROM orders ORDER BY id")).scalars())


def _settled(addr: str, rolled_back: int, committed: int) -> bool:
    s = stats(addr)
    return (
        int(s.get("tx_state_prepared", "0")) == 0
        and int(s.get("tx_rolled_back", "0")) >= rolled_back
        and int(s.get("tx_committed", "0")) >= committed
    )


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_application_killed_around_its_database_commit(
    engine: Engine, db_url: str, hc_broker: BrokerProcess, api: str
) -> None:
    """The blocking API, and the asyncio one (``AsyncMessageSessionFactory``, ``db=`` an
    ``AsyncEngine``, ``async with producer.half_message(...)``)."""
    addr = hc_broker.addr
    base = {"sqlite": 100, "postgresql": 200, "mysql": 300}[engine.dialect.name]
    base += 0 if api == "blocking" else 1000  # the module's broker serves both
    before, after, exited = base + 1, base + 2, base + 3
    s0 = stats(addr)
    rolled0, committed0 = int(s0.get("tx_rolled_back", "0")), int(s0.get("tx_committed", "0"))
    # the block ended (the rows and the marker committed, COMMIT written, its reply not
    # awaited) and the process died at once: committed by that COMMIT if it got through,
    # else by the check-back; once either way
    _app_killed_at("after block", db_url, addr, exited, api)
    _app_killed_at("half_before_db_commit", db_url, addr, before, api)
    _app_killed_at("half_after_db_commit", db_url, addr, after, api)  # the last of the group
    assert _orders(engine) == [after, exited]  # the first died before its commit
    assert f"order {after}".encode() not in bodies(addr, "paid", 2)  # prepared, not committed
    with connect([addr]) as session:  # another process of the group: it answers from the table
        session.create_transactional_producer("shop", db=engine)
        wait_until(
            lambda: _settled(addr, rolled0 + 1, committed0 + 2),
            timeout=30,
            what=lambda: f"the half messages settled by check-back: {stats(addr)}",
        )
    got = bodies(addr, "paid", 2)
    committed = [f"order {after}".encode(), f"order {exited}".encode()]
    assert [got.count(b) for b in committed] == [1, 1]
    assert f"order {before}".encode() not in got
    with engine.connect() as c:
        rows = c.execute(sa.text("SELECT tx_key, state FROM notify_outbox_half")).all()
    states = {str(k): int(v) for k, v in rows}
    assert sorted(states.values()) == [1, 1, 2]  # the committed markers and the tombstone
    hc_broker.restart(kill=True)
    got = bodies(addr, "paid", 2)
    assert [got.count(b) for b in committed] == [1, 1] and f"order {before}".encode() not in got


def test_a_block_outlasting_the_check_back_is_rolled_back(
    engine: Engine, hc_broker: BrokerProcess
) -> None:
    """The block's database work takes longer than txCheckBackDelay: the broker checks back
    while its transaction is open and the marker table answers ROLLBACK (a tombstone), so
    the block's commit fails with a clear error and neither its rows nor the message stay.
    SQLite has one writer: the check waits for the open transaction, which then commits."""
    addr = hc_broker.addr
    sent0 = int(stats(addr).get("tx_check_backs_sent", "0"))
    n = {"sqlite": 150, "postgresql": 250, "mysql": 350}[engine.dialect.name]
    body = f"order {n}".encode()
    with connect([addr]) as session:
        producer = session.create_transactional_producer("shop", db=engine)
        block = producer.half_message("paid", body, key=str(n))
        if engine.dialect.name == "sqlite":
            with block as conn:
                conn.execute(sa.text("INSERT INTO orders (id) VALUES (:n)"), {"n": n})
                time.sleep(1.0)
            assert _orders(engine) == [n] and bodies(addr, "paid", 2).count(body) == 1
            return
        with pytest.raises(HalfMessageCheckedBackError, match="checked back"), block as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (:n)"), {"n": n})
            wait_until(lambda: int(stats(addr).get("tx_check_backs_sent", "0")) > sent0, 10)
            time.sleep(0.5)  # the answer's tombstone is in
        wait_until(lambda: _settled(addr, 1, 0), timeout=10)
    assert n not in _orders(engine) and body not in bodies(addr, "paid", 2)
