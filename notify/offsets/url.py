"""Open an offset store from a URL.

==========================================  =============================================
``file:///var/lib/app/offsets``             :class:`~notify.offsets.files.FileOffsets`
                                            (the client's JSON files in that directory)
``postgresql+psycopg://user@host/db``       :class:`~notify.offsets.sql.SqlOffsetStore`
``mysql+pymysql://user@host/db``            (also ``mariadb+pymysql://``)
``sqlite:///relative.db``,                  SQLite file (four slashes: absolute path)
``sqlite:////abs/path.db``
``zookeeper://h1:2181,h2:2181/meta``        :class:`~notify.offsets.zookeeper.ZooKeeperOffsetStore`
                                            (path = ZooKeeper root, default ``/meta``)
``memory://``                               the client's ``MemoryOffsetStore`` (tests)
==========================================  =============================================

SQL URLs accept ``?table=NAME`` (another table with MetaQ's columns); ZooKeeper URLs accept
``?session_timeout=S&timeout=S&connect_timeout=S`` (seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from sqlalchemy.engine import make_url

from notify.client.offsets import MemoryOffsetStore, TopicPartitionOffset

from .base import ManagedOffsetStore, OffsetStoreError, StoredOffset, sort_key
from .files import FileOffsets
from .schema import OFFSET_TABLE
from .sql import SqlOffsetStore, safe_url
from .zookeeper import DEFAULT_ROOT, ZooKeeperOffsetStore

__all__ = ["MemoryOffsets", "display_url", "open_offset_store", "store_kind"]

_SQL_SCHEMES = ("postgresql", "mysql", "mariadb", "sqlite")


class MemoryOffsets(MemoryOffsetStore):
    """The client's :class:`MemoryOffsetStore` with listing and deletion."""

    def list_offsets(
        self, group: str | None = None, topic: str | None = None
    ) -> list[StoredOffset]:
        """All offsets held (optionally one group/topic)."""
        with self._lock:
            items = list(self._data.items())
        return sorted(
            (
                StoredOffset(g, t, p, o.offset, o.msg_id)
                for (g, t, p), o in items
                if (group is None or g == group) and (topic is None or t == topic)
            ),
            key=sort_key,
        )

    def delete(
        self, group: str, topic: str | None = None, partitions: Sequence[str] | None = None
    ) -> int:
        """Forget offsets of ``group`` (optionally one topic / some partitions)."""
        with self._lock:
            keys = [
                k
                for k in self._data
                if k[0] == group
                and (topic is None or k[1] == topic)
                and (partitions is None or k[2] in partitions)
            ]
            for k in keys:
                del self._data[k]
        return len(keys)

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """See :meth:`MemoryOffsetStore.load`."""
        return super().load(group, topic, partition)


def display_url(url: str) -> str:
    """``url`` for messages: any password masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def store_kind(url: str) -> str:
    """``file``, ``sql``, ``zookeeper`` or ``memory`` for a store URL (ValueError otherwise)."""
    scheme = urlsplit(url).scheme.lower()
    base = scheme.split("+", 1)[0]
    if scheme == "file":
        return "file"
    if scheme in ("zookeeper", "zk"):
        return "zookeeper"
    if scheme == "memory":
        return "memory"
    if base in _SQL_SCHEMES:
        return "sql"
    raise ValueError(
        f"unknown offset store URL {url!r}: use file:///dir, postgresql+psycopg://..., "
        "mysql+pymysql://..., sqlite:///path or zookeeper://host:port/meta"
    )


def open_offset_store(url: str, *, connect_timeout_s: float = 5.0) -> ManagedOffsetStore:
    """The offset store a URL names (see the module doc). Close it when done.

    Raises :class:`~notify.offsets.base.OffsetStoreError` for an unusable URL. Opening
    does not contact the server: the first call does (and raises the retriable
    :class:`~notify.offsets.base.OffsetStoreUnavailableError` when it is down).
    """
    try:
        kind = store_kind(url)
    except ValueError as e:
        raise OffsetStoreError(str(e)) from None
    if kind == "memory":
        return MemoryOffsets()
    if kind == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise OffsetStoreError(f"file URL must be local (file:///dir): {url!r}")
        path = unquote(parts.path)
        if not path:
            raise OffsetStoreError(f"file URL without a directory: {url!r}")
        return FileOffsets(Path(path))
    if kind == "zookeeper":
        parts = urlsplit(url)
        if not parts.netloc:
            raise OffsetStoreError(f"zookeeper URL without hosts: {url!r}")
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            session_timeout = float(q.pop("session_timeout", "10"))
            op_timeout = float(q.pop("timeout", "5"))
            connect_timeout_s = float(q.pop("connect_timeout", connect_timeout_s))
        except ValueError as e:
            raise OffsetStoreError(f"bad timeout in {url!r}: {e}") from None
        if q:
            raise OffsetStoreError(f"unknown zookeeper URL options {sorted(q)} in {url!r}")
        root = unquote(parts.path) or DEFAULT_ROOT
        return ZooKeeperOffsetStore(
            parts.netloc,
            root,
            session_timeout_s=session_timeout,
            connect_timeout_s=connect_timeout_s,
            op_timeout_s=op_timeout,
        )
    try:
        u = make_url(url)
    except Exception as e:
        raise OffsetStoreError(f"invalid database URL {safe_url(url)}: {e}") from None
    query = dict(u.query)
    table = query.pop("table", OFFSET_TABLE)
    if not isinstance(table, str):
        raise OffsetStoreError(f"give one table= in {safe_url(url)}")
    return SqlOffsetStore(u.set(query=query), table=table, connect_timeout_s=connect_timeout_s)
