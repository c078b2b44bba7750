"""open_offset_store: one URL per backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from notify.offsets import (
    FileOffsets,
    MemoryOffsets,
    OffsetStoreError,
    SqlOffsetStore,
    ZooKeeperOffsetStore,
    open_offset_store,
)
from notify.offsets.url import display_url, store_kind


def test_file_url(tmp_path: Path) -> None:
    store = open_offset_store(f"file://{tmp_path}/offs")
    assert isinstance(store, FileOffsets) and store.directory == tmp_path / "offs"
    store.close()


def test_sql_urls(tmp_path: Path) -> None:
    for url, dialect in [
        (f"sqlite:///{tmp_path}/o.db", "sqlite"),
        ("postgresql+psycopg://u:secret@127.0.0.1:1/db", "postgresql"),
        ("postgresql://u@127.0.0.1:1/db", "postgresql"),
        ("mysql+pymysql://root@127.0.0.1:1/db", "mysql"),
        ("mysql://root@127.0.0.1:1/db", "mysql"),
    ]:
        store = open_offset_store(url)
        assert isinstance(store, SqlOffsetStore) and store.dialect == dialect
        assert "secret" not in store.url and "secret" not in repr(store)
        store.close()
    custom = open_offset_store(f"sqlite:///{tmp_path}/o.db?table=my_offsets")
    assert isinstance(custom, SqlOffsetStore) and custom.table.name == "my_offsets"
    custom.close()


def test_zookeeper_url() -> None:
    store = open_offset_store("zookeeper://h1:2181,h2:2181/custom/root?timeout=2")
    assert isinstance(store, ZooKeeperOffsetStore)
    assert store.hosts == "h1:2181,h2:2181" and store.root == "/custom/root"
    assert store.op_timeout_s == 2.0
    store.close()
    default = open_offset_store("zookeeper://h1:2181")
    assert isinstance(default, ZooKeeperOffsetStore) and default.root == "/meta"
    default.close()


def test_memory_url() -> None:
    assert isinstance(open_offset_store("memory://"), MemoryOffsets)


@pytest.mark.parametrize(
    "url",
    [
        "redis://h/0",
        "/just/a/path",
        "file://otherhost/dir",
        "zookeeper:///meta",
        "zookeeper://h:1/meta?bogus=1",
        "oracle://u@h/db",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(OffsetStoreError):
        open_offset_store(url)


def test_kinds_and_display() -> None:
    assert store_kind("postgresql+psycopg://x/y") == "sql"
    assert store_kind("zk://h/meta") == "zookeeper"
    assert display_url("postgresql+psycopg://u:pw@h/db") == "postgresql+psycopg://u:***@h/db"
    assert display_url("zookeeper://h1:1,h2:2/meta") == "zookeeper://h1:1,h2:2/meta"
