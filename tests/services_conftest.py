"""Pytest fixtures for real servers (loaded from tests/conftest.py via ``pytest_plugins``).

Session-scoped, started on first use, stopped by PID at session end:

* ``zookeeper`` -> :class:`~tests.services.ZooKeeperServer` (``.connect``, ``.stop()``,
  ``.start()``, ``.restart()``, ``.kill()``)
* ``postgres``  -> :class:`~tests.services.PostgresServer` (``.url``, ``.dsn``,
  ``max_prepared_transactions=64``)
* ``mariadb``   -> :class:`~tests.services.MariaDBServer` (``.url`` of database ``test``)

Per test: ``postgres_url`` / ``mariadb_url`` (a fresh, uniquely named database) and
``zk_root`` (a fresh root path such as ``/t_1a2b3c/meta``); these three first restart
their server if a previous test left it stopped.

A server whose binaries are missing skips the test, or fails it when ``CI`` is set (run
``bash scripts/services.sh install``). A test that stops a shared server must start it
again (``finally: server.start()``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TypeVar

import pytest

from tests.services import (
    MariaDBServer,
    PostgresServer,
    ServerMissing,
    ZooKeeperServer,
    fresh_database,
    require,
)

S = TypeVar("S", ZooKeeperServer, PostgresServer, MariaDBServer)


def _need(name: str) -> None:
    try:
        require(name)
    except ServerMissing as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e} (CI is set: missing servers are failures)", pytrace=False)
        pytest.skip(str(e))


def _serve(server: S) -> Iterator[S]:
    try:
        server.start()
        yield server
    finally:
        server.close()


def running(server: S) -> S:
    """``server``, started again first if a previous test left it stopped."""
    if not server.running:
        server.start()
    return server


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper for the session: ``.connect`` is ``127.0.0.1:<port>``."""
    _need("zookeeper")
    yield from _serve(ZooKeeperServer())


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL for the session: ``.url`` (SQLAlchemy), ``.dsn`` (psycopg)."""
    _need("postgres")
    yield from _serve(PostgresServer())


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """A MariaDB for the session: ``.url`` is database ``test`` as root."""
    _need("mariadb")
    yield from _serve(MariaDBServer())


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """SQLAlchemy URL of a new empty PostgreSQL database for this test."""
    return fresh_database(running(postgres))


@pytest.fixture
def mariadb_url(mariadb: MariaDBServer) -> str:
    """SQLAlchemy URL of a new empty MariaDB database for this test."""
    return fresh_database(running(mariadb))


@pytest.fixture
def zk_root(zookeeper: ZooKeeperServer) -> str:
    """A fresh ZooKeeper root path for this test (``/t_<hex>/meta``); ZooKeeper running."""
    running(zookeeper)
    return f"/t_{uuid.uuid4().hex[:12]}/meta"
