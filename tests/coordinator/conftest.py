"""Coordinator fixtures: a fresh PostgreSQL schema / MariaDB database with table ``orders``,
a broker, and ``make_tm`` building TransactionManagers that are closed at teardown.

PostgreSQL tests share one database and get a schema each (through ``search_path`` in the
connection options): creating (and finally deleting) a database per test costs seconds."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notify.testing import BrokerProcess
from notify.xa import (
    BrokerParticipant,
    CoordinatorConfig,
    MySQLParticipant,
    PostgresParticipant,
    TransactionManager,
)
from notify.xa.resources.postgres import conninfo_of
from tests.conftest import BrokerFactory
from tests.coordinator.helpers import create_my_table, create_pg_table, kill_apps
from tests.services import PostgresServer, fresh_database
from tests.services_conftest import running

XA_TOPICS = {"orders": 2, "single": 1}


@dataclass
class Env:
    """Real services of one test."""

    tmp: Path
    pg_url: str
    pg_dsn: str
    broker: BrokerProcess
    my_url: str | None = None


@pytest.fixture(autouse=True)
def _no_stray_apps() -> Iterator[None]:
    """Kill application child processes a failing test left running."""
    yield
    kill_apps()


@pytest.fixture(scope="session")
def xa_pg_database(postgres: PostgresServer) -> str:
    """SQLAlchemy URL of the database the coordinator tests share."""
    return fresh_database(postgres, "xa")


@pytest.fixture
def postgres_url(postgres: PostgresServer, xa_pg_database: str) -> str:
    """SQLAlchemy URL whose connections use a new schema of the shared database."""
    running(postgres)
    schema = f"s_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo_of(xa_pg_database), autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    return f"{xa_pg_database}?options=-csearch_path%3D{schema}"


@pytest.fixture
def pg_dsn(postgres_url: str) -> str:
    return create_pg_table(postgres_url)


@pytest.fixture
def my_url(mariadb_url: str) -> str:
    create_my_table(mariadb_url)
    return mariadb_url


@pytest.fixture
def xa_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(XA_TOPICS)


@pytest.fixture
def env(tmp_path: Path, postgres_url: str, pg_dsn: str, xa_broker: BrokerProcess) -> Env:
    return Env(tmp_path, postgres_url, pg_dsn, xa_broker)


@pytest.fixture
def env3(env: Env, my_url: str) -> Env:
    env.my_url = my_url
    return env


MakeTM = Callable[..., TransactionManager]


@pytest.fixture
def make_tm(tmp_path: Path) -> Iterator[MakeTM]:
    """``make_tm(env, log="xa", start=True, **config)``: a TM with pg/broker(/my) registered."""
    made: list[TransactionManager] = []

    def make(
        e: Env | None = None, log: str = "xa", start: bool = True, **config: Any
    ) -> TransactionManager:
        config.setdefault("coordinator_id", "t1")
        config.setdefault("recovery_interval_s", 0)
        tm = TransactionManager(CoordinatorConfig(tmp_path / log, **config))
        made.append(tm)
        if e is not None:
            dsn, addr, my = e.pg_dsn, e.broker.addr, e.my_url
            tm.register("pg", lambda: PostgresParticipant(dsn))
            tm.register("broker", lambda: BrokerParticipant(addr))
            if my is not None:
                tm.register("my", lambda: MySQLParticipant(my))
        if start:
            tm.start()
        return tm

    yield make
    for tm in made:
        tm.close()
