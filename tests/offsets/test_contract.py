"""One contract for every offset store: file, memory, SQLite, PostgreSQL, MariaDB, ZooKeeper."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from notify.client import OffsetStore, TopicPartitionOffset
from notify.offsets import ManagedOffsetStore

from .conftest import Backend

T = TopicPartitionOffset
BIG = 2**63 - 1


def test_is_an_offset_store(store: ManagedOffsetStore) -> None:
    assert isinstance(store, OffsetStore)
    assert isinstance(store, ManagedOffsetStore)


def test_load_of_nothing_is_none(store: ManagedOffsetStore) -> None:
    assert store.load("g", "test", "0-0") is None
    assert store.list_offsets() == []


def test_commit_then_load_roundtrip(store: ManagedOffsetStore) -> None:
    store.commit("g", [T("test", "0-0", 120, 77), T("test", "0-1", 0, -1)])
    assert store.load("g", "test", "0-0") == T("test", "0-0", 120, 77)
    assert store.load("g", "test", "0-1") == T("test", "0-1", 0, -1)
    assert store.load("g", "test", "0-2") is None


def test_extreme_values(store: ManagedOffsetStore) -> None:
    store.commit("g", [T("test", "0-0", 2**62, BIG), T("test", "1023-4095", 1, -1)])
    assert store.load("g", "test", "0-0") == T("test", "0-0", 2**62, BIG)
    assert store.load("g", "test", "1023-4095") == T("test", "1023-4095", 1, -1)


def test_last_commit_wins_even_backwards(store: ManagedOffsetStore) -> None:
    store.commit("g", [T("test", "0-0", 100, 1)])
    store.commit("g", [T("test", "0-0", 300, 3)])
    assert store.load("g", "test", "0-0") == T("test", "0-0", 300, 3)
    store.commit("g", [T("test", "0-0", 50, 2)])  # a reset moves back
    assert store.load("g", "test", "0-0") == T("test", "0-0", 50, 2)


def test_duplicate_partition_in_one_commit_last_wins(store: ManagedOffsetStore) -> None:
    store.commit("g", [T("test", "0-0", 10, 1), T("test", "0-0", 20, 2)])
    assert store.load("g", "test", "0-0") == T("test", "0-0", 20, 2)


def test_empty_commit_is_a_noop(store: ManagedOffsetStore) -> None:
    store.commit("g", [])
    assert store.list_offsets() == []


def test_groups_topics_partitions_are_isolated(store: ManagedOffsetStore) -> None:
    store.commit("g1", [T("test", "0-0", 1, 1)])
    store.commit("g2", [T("test", "0-0", 2, 2)])
    store.commit("g1", [T("orders", "0-0", 3, 3)])
    store.commit("g1", [T("test", "1-0", 4, 4)])
    assert store.load("g1", "test", "0-0") == T("test", "0-0", 1, 1)
    assert store.load("g2", "test", "0-0") == T("test", "0-0", 2, 2)
    assert store.load("g1", "orders", "0-0") == T("orders", "0-0", 3, 3)
    assert store.load("g1", "test", "1-0") == T("test", "1-0", 4, 4)
    assert store.load("g2", "orders", "0-0") is None


def test_unusual_but_valid_names(store: ManagedOffsetStore) -> None:
    group, topic = "grüppe-1.a_b", "Topic.with-dash_and.dots"
    store.commit(group, [T(topic, "0-0", 9, 9)])
    assert store.load(group, topic, "0-0") == T(topic, "0-0", 9, 9)
    assert [(o.group, o.topic) for o in store.list_offsets()] == [(group, topic)]


def test_many_partitions_in_one_commit(store: ManagedOffsetStore) -> None:
    offs = [
        T(f"t{t}", f"{b}-{p}", b * 1000 + p, p)
        for t in range(3)
        for b in range(4)
        for p in range(60)
    ]
    store.commit("g", offs)  # 720 rows: more than one SQL statement's worth
    assert len(store.list_offsets("g")) == 720
    assert store.load("g", "t2", "3-59") == T("t2", "3-59", 3059, 59)


def test_another_instance_sees_commits(backend: Backend) -> None:
    if not backend.persistent:
        pytest.skip("memory store")
    a = backend.open()
    a.commit("g", [T("test", "0-3", 42, 4)])
    a.close()
    b = backend.open()
    assert b.load("g", "test", "0-3") == T("test", "0-3", 42, 4)


def test_concurrent_commits_of_one_group_lose_nothing(backend: Backend) -> None:
    stores = [backend.open() for _ in range(4)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            s = stores[i % len(stores)]
            for n in range(10):
                s.commit("g", [T("test", f"0-{i}", n * 10, n)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    check = backend.open()
    assert [(o.partition, o.offset) for o in check.list_offsets("g")] == [
        (f"0-{i}", 90) for i in range(8)
    ]


def test_close_is_idempotent(backend: Backend) -> None:
    s = backend.open()
    s.commit("g", [T("test", "0-0", 1, 1)])
    s.close()
    s.close()


# -- ManagedOffsetStore


def test_list_filters_and_sorts_numerically(store: ManagedOffsetStore) -> None:
    store.commit("g", [T("test", f"0-{p}", p, p) for p in (10, 2, 1)])
    store.commit("g", [T("orders", "0-0", 5, 5)])
    store.commit("h", [T("test", "0-0", 7, 7)])
    rows = store.list_offsets()
    assert [(r.group, r.topic, r.partition) for r in rows] == [
        ("g", "orders", "0-0"),
        ("g", "test", "0-1"),
        ("g", "test", "0-2"),
        ("g", "test", "0-10"),
        ("h", "test", "0-0"),
    ]
    assert [r.partition for r in store.list_offsets("g", "test")] == ["0-1", "0-2", "0-10"]
    assert [r.group for r in store.list_offsets(topic="test")] == ["g", "g", "g", "h"]
    assert store.list_offsets("nobody") == []
    assert rows[0].tpo == T("orders", "0-0", 5, 5)


def test_updated_at_is_recent_utc(backend: Backend, store: ManagedOffsetStore) -> None:
    if backend.name == "memory":
        pytest.skip("memory keeps no timestamps")
    store.commit("g", [T("test", "0-0", 1, 1)])
    (row,) = store.list_offsets()
    assert row.updated_at is not None and row.updated_at.tzinfo is not None
    assert abs(row.updated_at - datetime.now(UTC)) < timedelta(minutes=5)


def test_delete_partitions_topic_group(store: ManagedOffsetStore) -> None:
    store.commit("g", [T("test", f"0-{p}", p, p) for p in range(4)])
    store.commit("g", [T("orders", "0-0", 1, 1)])
    store.commit("h", [T("test", "0-0", 1, 1)])
    assert store.delete("g", "test", ["0-1", "0-3", "0-9"]) == 2
    assert store.load("g", "test", "0-1") is None
    assert store.load("g", "test", "0-0") is not None
    assert store.delete("g", "test") == 2
    assert store.list_offsets("g") == [store.list_offsets("g")[0]]  # orders left
    assert store.delete("g") == 1
    assert store.delete("g") == 0
    assert [r.group for r in store.list_offsets()] == ["h"]
    store.commit("g", [T("test", "0-0", 5, 5)])  # usable again after a delete
    assert store.load("g", "test", "0-0") == T("test", "0-0", 5, 5)
