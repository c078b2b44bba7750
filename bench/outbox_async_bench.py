"""The outbox from asyncio on PostgreSQL: what ``await outbox.send_async(conn, ...)`` adds
to the application's transaction, and whether the one-query commit (the rows and COMMIT
awaited as one query through psycopg's AsyncConnection, from SQLAlchemy's greenlet) is worth
it over the statements-before-COMMIT path.

    .venv/bin/python bench/outbox_async_bench.py [--seconds 2] [--rounds 3] [--tasks 1,8]
        [--no-fsync]

Starts its own PostgreSQL (tests/services.py; fsync and synchronous_commit on unless
``--no-fsync``). Per transaction, through ``create_async_engine("postgresql+psycopg://...")``:
the application's INSERT and COMMIT (``async alone``), the same plus one keyed
``send_async`` (``async outbox, one query``), the same with the one-query commit switched
off (``async outbox, statements``: advisory lock, INSERT and wake-up sent before the
COMMIT, as on other drivers); and the blocking equivalents on one thread (``sync alone``,
``sync outbox``) for reference. ``--tasks``: concurrent coroutines, each its own pooled
connection. Rounds alternate the shapes in the same minutes; median transactions/s, ratio to
the alone of the same API, and the statements each commit sent (counted, not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bench.xa_bench import DurablePostgres
from notify.migrations import upgrade
from notify.outbox import Outbox, writer
from tests.services import PostgresServer, fresh_database

INSERT = sa.text("INSERT INTO orders (id) VALUES (:id)")
_ids = itertools.count(1)


def _reset(engine: Engine) -> None:
    with engine.begin() as c:
        c.execute(sa.text("TRUNCATE orders, notify_outbox"))


async def async_run(
    ae: AsyncEngine, outbox: Outbox | None, tasks: int, seconds: float
) -> float:
    """Transactions per second of ``tasks`` coroutines for ``seconds``."""
    done = 0
    deadline = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            i = next(_ids)
            async with ae.begin() as c:
                await c.execute(INSERT, {"id": i})
                if outbox is not None:
                    await outbox.send_async(c, "orders", b"order %d" % i, key=str(i % 64))
            done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(tasks)))
    return done / (time.monotonic() - t0)


def _async_shape(
    ae: AsyncEngine, ob: Outbox | None, n: int, one: bool, seconds: float
) -> Callable[[], float]:
    def go() -> float:
        with _one_query(one):
            return asyncio.run(async_run(ae, ob, n, seconds))

    return go


def sync_run(engine: Engine, outbox: Outbox | None, seconds: float) -> float:
    done = 0
    t0 = time.monotonic()
    deadline = t0 + seconds
    while time.monotonic() < deadline:
        i = next(_ids)
        with engine.begin() as c:
            c.execute(INSERT, {"id": i})
            if outbox is not None:
                outbox.send(c, "orders", b"order %d" % i, key=str(i % 64))
        done += 1
    return done / (time.monotonic() - t0)


def statements_per_commit(ae: AsyncEngine, outbox: Outbox, one_query: bool) -> int:
    """Statements SQLAlchemy sent for one transaction with one send (its own INSERT
    included): counted on the engine's cursor events."""
    seen: list[str] = []

    def count(*a: Any) -> None:
        seen.append(a[2])

    async def once() -> None:
        async with ae.begin() as c:
            await c.execute(INSERT, {"id": next(_ids)})
            await outbox.send_async(c, "orders", b"x", key="k")

    event.listen(ae.sync_engine, "before_cursor_execute", count)
    try:
        with _one_query(one_query):
            asyncio.run(once())
    finally:
        event.remove(ae.sync_engine, "before_cursor_execute", count)
    return len(seen)


class _one_query:
    """Switch the one-query commit of asyncio connections on or off (A/B): off, the
    writer finds no psycopg AsyncConnection under them (statements before COMMIT)."""

    def __init__(self, on: bool):
        self.on = on
        self.saved = writer._pg_driver

    def __enter__(self) -> None:
        if not self.on:
            saved = self.saved

            def blocking_only(conn: Connection) -> psycopg.Connection[Any] | None:
                dc = saved(conn)
                return dc if isinstance(dc, psycopg.Connection) else None

            writer._pg_driver = blocking_only

    def __exit__(self, *exc: object) -> None:
        writer._pg_driver = self.saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per run")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    ap.add_argument("--tasks", default="1,8", help="comma-separated coroutine counts")
    ap.add_argument("--no-fsync", action="store_true", help="PostgreSQL without fsync")
    a = ap.parse_args()
    tasks = [int(t) for t in a.tasks.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="outbox-async-bench-"))
    os.chmod(workdir, 0o755)
    pg = (PostgresServer if a.no_fsync else DurablePostgres)(workdir / "pg")
    pg.start()
    try:
        url = fresh_database(pg)
        upgrade(url)
        engine = sa.create_engine(url, pool_size=max(tasks) + 2)
        with engine.begin() as c:
            c.execute(sa.text("CREATE TABLE orders (id BIGINT PRIMARY KEY)"))
        ae = create_async_engine(url, pool_size=max(tasks) + 2)
        async_outbox, sync_outbox = Outbox(ae), Outbox(engine)
        shapes: list[tuple[str, int, bool, Callable[[], float]]] = []
        for n in tasks:
            for name, ob, one in (
                ("async alone", None, True),
                ("async outbox, one query", async_outbox, True),
                ("async outbox, statements", async_outbox, False),
            ):

                shapes.append((name, n, one, _async_shape(ae, ob, n, one, a.seconds)))
        shapes.append(("sync alone", 1, True, lambda: sync_run(engine, None, a.seconds)))
        shapes.append(("sync outbox", 1, True, lambda: sync_run(engine, sync_outbox, a.seconds)))
        rates: dict[tuple[str, int], list[float]] = {(s, n): [] for s, n, _o, _g in shapes}
        for _ in range(a.rounds):
            for name, n, _one, go in shapes:
                _reset(engine)
                rates[(name, n)].append(go())
        stmts = {
            True: statements_per_commit(ae, async_outbox, True),
            False: statements_per_commit(ae, async_outbox, False),
        }
        fsync = "off" if a.no_fsync else "on"
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"\noutbox from asyncio, PostgreSQL (fsync {fsync}), {time.strftime('%F %T %Z')}, "
              f"load {' '.join(load)}")  # fmt: skip
        print(f"{'shape':28} {'tasks':>5} {'tx/s':>9} {'vs alone':>8} {'stmts':>5}  rounds")
        for name, n, one, _go in shapes:
            med = statistics.median(rates[(name, n)])
            alone = statistics.median(rates[(name.split()[0] + " alone", n)])
            st = str(stmts[one]) if name.startswith("async outbox") else ""
            rounds = ", ".join(f"{r:,.0f}" for r in rates[(name, n)])
            print(f"{name:28} {n:>5} {med:>9,.0f} {med / alone:>8.0%} {st:>5}  [{rounds}]")
        asyncio.run(ae.dispose())
        engine.dispose()
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
