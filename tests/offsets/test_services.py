"""The real-server test infrastructure itself (tests/services.py, tests/services_conftest.py)."""

from __future__ import annotations

import psycopg
import pymysql
import pytest
from kazoo.client import KazooClient

from tests.services import (
    MariaDBServer,
    PostgresServer,
    ZooKeeperServer,
    fresh_database,
)
from tests.services_conftest import _need


def test_missing_server_skips_or_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ZooKeeperServer, "available", staticmethod(lambda: False))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"scripts/services\.sh install"):
        _need("zookeeper")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        _need("zookeeper")


def test_postgres_allows_two_phase_commit(postgres: PostgresServer) -> None:
    assert postgres.url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    assert postgres.url.endswith("/postgres")
    with psycopg.connect(postgres.dsn) as c:
        row = c.execute("SHOW max_prepared_transactions").fetchone()
        assert row is not None and row[0] == "64"
    url = fresh_database(postgres)
    assert url.rsplit("/", 1)[1].startswith("t_") and url != fresh_database(postgres)


def test_mariadb_has_test_database(mariadb: MariaDBServer) -> None:
    assert mariadb.url == f"mysql+pymysql://root@127.0.0.1:{mariadb.port}/test"
    conn = pymysql.connect(host="127.0.0.1", port=mariadb.port, user="root", database="test")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


@pytest.mark.slow
def test_zookeeper_kill_and_restart_keep_port_and_data(
    zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    port, pid = zookeeper.port, zookeeper.pid
    client = KazooClient(hosts=zookeeper.connect)
    client.start(timeout=10)
    try:
        client.create(f"{zk_root}/x", b"1", makepath=True)
    finally:
        client.stop()
        client.close()
    zookeeper.kill()
    assert not zookeeper.running
    zookeeper.start()
    zookeeper.restart()
    assert zookeeper.port == port and zookeeper.pid not in (None, pid)
    client = KazooClient(hosts=zookeeper.connect)
    client.start(timeout=10)
    try:
        assert client.get(f"{zk_root}/x")[0] == b"1"
    finally:
        client.stop()
        client.close()
