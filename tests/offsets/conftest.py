"""Offset store backends for the contract tests, each on its real server.

``backend`` is parametrized over file, memory, sqlite, postgres, mariadb and zookeeper; the
server fixtures are requested lazily, so ``-k file`` starts no server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from notify.migrations import upgrade
from notify.offsets import (
    FileOffsets,
    ManagedOffsetStore,
    MemoryOffsets,
    SqlOffsetStore,
    ZooKeeperOffsetStore,
)
from tests.services import fresh_database
from tests.services_conftest import running

BACKENDS = ["file", "memory", "sqlite", "postgres", "mariadb", "zookeeper"]
SQL_BACKENDS = ["sqlite", "postgres", "mariadb"]


@dataclass
class Backend:
    """Opens stores over one storage location (new instance each time, same data)."""

    name: str
    factory: Callable[[], ManagedOffsetStore]
    persistent: bool = True
    url: str = ""
    opened: list[ManagedOffsetStore] = field(default_factory=list)

    def open(self) -> ManagedOffsetStore:
        store = self.factory()
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for s in self.opened:
            s.close()


def sql_url(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> str:
    """A fresh, empty database of backend ``name`` (``sqlite``, ``postgres``, ``mariadb``)."""
    if name == "sqlite":
        return f"sqlite:///{tmp_path / f'{uuid.uuid4().hex[:8]}.db'}"
    server = running(request.getfixturevalue(name))
    return fresh_database(server)


def make_backend(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> Backend:
    if name == "file":
        return Backend(name, lambda: FileOffsets(tmp_path / "offsets"), url=f"file://{tmp_path}")
    if name == "memory":
        mem = MemoryOffsets()
        return Backend(name, lambda: mem, persistent=False, url="memory://")
    if name in SQL_BACKENDS:
        url = sql_url(request, name, tmp_path)
        upgrade(url)
        return Backend(name, lambda: SqlOffsetStore(url), url=url)
    if name == "zookeeper":
        zk = running(request.getfixturevalue("zookeeper"))
        root = f"/t_{uuid.uuid4().hex[:12]}/meta"
        return Backend(
            name,
            lambda: ZooKeeperOffsetStore(zk.connect, root, op_timeout_s=5.0),
            url=f"zookeeper://{zk.connect}{root}",
        )
    raise AssertionError(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request, request.param, tmp_path)
    yield b
    b.close_all()


@pytest.fixture
def store(backend: Backend) -> ManagedOffsetStore:
    return backend.open()


@pytest.fixture(params=SQL_BACKENDS)
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request, request.param, tmp_path)
    yield b
    b.close_all()


@pytest.fixture(params=SQL_BACKENDS)
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a fresh database without notify's tables (sqlite, postgres, mariadb)."""
    return sql_url(request, request.param, tmp_path)
