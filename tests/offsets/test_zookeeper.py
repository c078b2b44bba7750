"""ZooKeeper offset store: MetaQ's path and value format, outages."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from notify.client import TopicPartitionOffset
from notify.offsets import OffsetStoreError, OffsetStoreUnavailableError, ZooKeeperOffsetStore
from notify.offsets.zookeeper import format_value, parse_value
from tests.helpers import timing
from tests.services import ZooKeeperServer

T = TopicPartitionOffset


@pytest.fixture
def kazoo(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.connect)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def test_metaq_path_and_value(zk_root: str, zookeeper: ZooKeeperServer, kazoo: KazooClient) -> None:
    with ZooKeeperOffsetStore(zookeeper.connect, zk_root) as store:
        store.commit("grp", [T("test", "0-3", 4096, 7171), T("test", "1-0", 0, -1)])
    raw, _ = kazoo.get(f"{zk_root}/consumers/grp/offsets/test/0-3")
    assert raw == b"7171-4096"
    raw, _ = kazoo.get(f"{zk_root}/consumers/grp/offsets/test/1-0")
    assert raw == b"-1-0"


def test_reads_what_metaq_wrote(
    zk_root: str, zookeeper: ZooKeeperServer, kazoo: KazooClient
) -> None:
    base = f"{zk_root}/consumers/legacy/offsets/test"
    kazoo.create(f"{base}/0-0", b"123456", makepath=True)  # MetaQ before msgIds: just the offset
    kazoo.create(f"{base}/0-1", b"998877-2048", makepath=True)
    kazoo.create(f"{base}/0-2", b"garbage", makepath=True)
    with ZooKeeperOffsetStore(zookeeper.connect, zk_root) as store:
        assert store.load("legacy", "test", "0-0") == T("test", "0-0", 123456, -1)
        assert store.load("legacy", "test", "0-1") == T("test", "0-1", 2048, 998877)
        with pytest.raises(OffsetStoreError, match="unreadable offset node"):
            store.load("legacy", "test", "0-2")


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [(b"5-10", (10, 5)), (b"-1-10", (10, -1)), (b"10", (10, -1)), (b" 3-4\n", (4, 3))],
)
def test_value_format(raw: bytes, parsed: tuple[int, int]) -> None:
    assert parse_value(raw) == parsed
    assert parse_value(format_value(*parsed)) == parsed


def test_default_root_is_meta() -> None:
    store = ZooKeeperOffsetStore("127.0.0.1:1")
    assert store.path("g", "t", "0-1") == "/meta/consumers/g/offsets/t/0-1"
    assert ZooKeeperOffsetStore("h:1", "/").path("g", "t", "0-1") == "/consumers/g/offsets/t/0-1"
    with pytest.raises(OffsetStoreError, match="invalid group"):
        store.path("a/b", "t", "0-1")
    store.close()


def test_shared_client_stays_open(zk_root: str, kazoo: KazooClient) -> None:
    store = ZooKeeperOffsetStore(kazoo, zk_root)
    store.commit("g", [T("t", "0-0", 1, 1)])
    store.close()
    assert kazoo.connected and kazoo.exists(f"{zk_root}/consumers/g/offsets/t/0-0")


def test_unreachable_zookeeper_fails_fast() -> None:
    store = ZooKeeperOffsetStore("127.0.0.1:1", connect_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(OffsetStoreUnavailableError) as ei:
        store.commit("g", [T("t", "0-0", 1, 1)])
    took = time.monotonic() - t0
    assert ei.value.retriable
    timing(took < 5, f"an unreachable ZooKeeper failed after {took:.2f} s (timeout 1 s)")
    store.close()


@pytest.mark.slow
def test_zookeeper_down_at_commit_then_back(zookeeper: ZooKeeperServer, zk_root: str) -> None:
    with ZooKeeperOffsetStore(zookeeper.connect, zk_root, op_timeout_s=2.0) as store:
        store.commit("g", [T("t", "0-0", 10, 1)])
        zookeeper.stop()
        try:
            t0 = time.monotonic()
            deadline = t0 + 10
            while True:  # kazoo notices the loss within a moment
                try:
                    store.commit("g", [T("t", "0-0", 20, 2)])
                except OffsetStoreUnavailableError as e:
                    assert e.retriable
                    break
                assert time.monotonic() < deadline, "commit kept succeeding with ZooKeeper down"
                time.sleep(0.05)
            took = time.monotonic() - t0
            timing(took < 5, f"a commit failed {took:.2f} s after ZooKeeper stopped")
        finally:
            zookeeper.start()
        deadline = time.monotonic() + 15
        while True:  # kazoo reconnects in the background
            try:
                store.commit("g", [T("t", "0-0", 30, 3)])
                break
            except OffsetStoreUnavailableError:
                assert time.monotonic() < deadline, "no reconnect to ZooKeeper"
                time.sleep(0.1)
        assert store.load("g", "t", "0-0") == T("t", "0-0", 30, 3)
