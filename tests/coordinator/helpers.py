"""Helpers for coordinator tests: what each real service holds, read directly."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pymysql

from notify.protocol import records
from notify.protocol.frames import encode_get, encode_line
from notify.xa.resources.mysql import connect_args
from notify.xa.resources.postgres import conninfo_of
from tests.helpers import WireClient

TABLE_DDL = "CREATE TABLE orders (id INT PRIMARY KEY, note VARCHAR(100))"


def create_pg_table(url: str) -> str:
    """Create ``orders`` in the PostgreSQL database of ``url``; returns its conninfo."""
    dsn = conninfo_of(url)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(TABLE_DDL)
    return dsn


def create_my_table(url: str) -> None:
    c = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        with c.cursor() as cur:
            cur.execute(TABLE_DDL)
    finally:
        c.close()


def pg_rows(dsn: str) -> set[int]:
    with psycopg.connect(dsn) as c:
        return {r[0] for r in c.execute("SELECT id FROM orders").fetchall()}


def pg_prepared(dsn: str) -> list[str]:
    """Prepared transactions of this database (any coordinator)."""
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
        return [r[0] for r in rows]


def my_rows(url: str) -> set[int]:
    c = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        with c.cursor() as cur:
            cur.execute("SELECT id FROM orders")
            return {int(r[0]) for r in cur.fetchall()}
    finally:
        c.close()


def my_prepared(url: str) -> list[Any]:
    c = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        with c.cursor() as cur:
            cur.execute("XA RECOVER")
            return list(cur.fetchall())
    finally:
        c.close()


def messages(addr: str, topic: str, partitions: int) -> list[bytes]:
    """Every visible message body of ``topic`` (all partitions)."""
    out: list[bytes] = []
    with WireClient(addr, ignore_checks=True) as w:
        for p in range(partitions):
            off = 0
            while True:
                r = w.call(encode_get(topic, "xa-test", p, off, 1 << 20, 1))
                if r.code != 200:
                    break
                recs, used = records.decode_all(r.body, off)
                if not recs:
                    break
                out += [rec.body for rec in recs]
                off += used
    return out


def message_ids(addr: str, topic: str = "orders", partitions: int = 2) -> list[int]:
    """Transaction numbers carried by messages (body ``b"<k>"`` or ``b"<k>:<anything>"``)."""
    return [int(b.split(b":", 1)[0]) for b in messages(addr, topic, partitions)]


def broker_prepared(addr: str, uq: str = "null") -> list[str]:
    with WireClient(addr, ignore_checks=True) as w:
        r = w.call(encode_line("transaction", "null", "probe", "RECOVER", uq, 1))
        assert r.code == 200, r.body
        return [k for k in r.body.decode().split("\r\n") if k]


#: application child processes started by the tests (killed at teardown if still running)
APPS: list[subprocess.Popen[bytes]] = []


def kill_apps() -> None:
    while APPS:
        app = APPS.pop()
        if app.poll() is None:
            app.kill()
            app.wait()
