"""Consumer offsets in ZooKeeper, at MetaQ's path and in MetaQ's format (kazoo).

Node ``<root>/consumers/<group>/offsets/<topic>/<brokerId>-<part>`` holds
``<msgId>-<offset>`` (UTF-8), so MetaQ's ZooKeeper offset storage and tools read it; on load
the old MetaQ form (just ``<offset>``) is accepted too. ``root`` defaults to ``/meta``.

A commit is one ZooKeeper multi-op transaction (``create`` for new nodes, ``setData`` for
the others): all partitions or none. When ZooKeeper is unreachable, or the connection is
suspended, calls fail fast with the retriable
:class:`~notify.offsets.base.OffsetStoreUnavailableError`; kazoo keeps reconnecting in the
background and the next call succeeds once it is back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError

from notify.client.offsets import TopicPartitionOffset

from .base import (
    OffsetStoreError,
    OffsetStoreUnavailableError,
    StoredOffset,
    dedupe_offsets,
    sort_key,
)

__all__ = ["DEFAULT_ROOT", "ZooKeeperOffsetStore", "format_value", "parse_value"]

log = logging.getLogger("notify.offsets")

DEFAULT_ROOT = "/meta"
DEFAULT_SESSION_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_OP_TIMEOUT_S = 5.0
_COMMIT_ATTEMPTS = 5

_UNAVAILABLE = (
    ConnectionLoss,
    ConnectionClosedError,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)


def format_value(offset: int, msg_id: int) -> bytes:
    """MetaQ's node value ``<msgId>-<offset>``."""
    return f"{msg_id}-{offset}".encode()


def parse_value(raw: bytes) -> tuple[int, int]:
    """``(offset, msg_id)`` of a node value: ``<msgId>-<offset>`` or the old ``<offset>``."""
    text = raw.decode("utf-8").strip()
    head, sep, tail = text.rpartition("-")
    if sep and head not in ("", "-"):
        return int(tail), int(head)
    return int(text), -1


def _check_name(kind: str, name: str) -> str:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise OffsetStoreError(f"invalid {kind} for a ZooKeeper path: {name!r}")
    return name


class ZooKeeperOffsetStore:
    """Offsets under ``<root>/consumers`` in ZooKeeper; implements ``OffsetStore``.

    ``hosts``: kazoo hosts (``"127.0.0.1:2181,h2:2181"``) or a started
    :class:`~kazoo.client.KazooClient` that stays the caller's (not stopped by
    :meth:`close`). The store's own client is started on first use, so creating the store
    never blocks; ``op_timeout_s`` bounds every call.
    """

    def __init__(
        self,
        hosts: str | KazooClient,
        root: str = DEFAULT_ROOT,
        *,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
    ) -> None:
        self.root = "/" + root.strip("/") if root.strip("/") else ""
        self.session_timeout_s = session_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.op_timeout_s = op_timeout_s
        self._lock = threading.Lock()
        self._closed = False
        if isinstance(hosts, KazooClient):
            self._client: KazooClient | None = hosts
            self._own_client = False
            self.hosts = str(getattr(hosts, "hosts", ""))
        else:
            self._client = None
            self._own_client = True
            self.hosts = hosts

    # -- paths

    def consumers_path(self) -> str:
        """``<root>/consumers``."""
        return f"{self.root}/consumers"

    def topic_path(self, group: str, topic: str) -> str:
        """``<root>/consumers/<group>/offsets/<topic>``."""
        g, t = _check_name("group", group), _check_name("topic", topic)
        return f"{self.consumers_path()}/{g}/offsets/{t}"

    def path(self, group: str, topic: str, partition: str) -> str:
        """The node of one partition's offset."""
        return f"{self.topic_path(group, topic)}/{_check_name('partition', partition)}"

    # -- OffsetStore

    def load(self, group: str, topic: str, partition: str) -> TopicPartitionOffset | None:
        """The committed offset, or None when there is no node."""
        path = self.path(group, topic, partition)
        client = self._connected()
        try:
            raw, _ = client.get_async(path).get(timeout=self.op_timeout_s)
        except NoNodeError:
            return None
        except (KazooException, KazooTimeoutError) as e:
            raise self._translate(e, "load") from e
        return TopicPartitionOffset(topic, partition, *self._parse(path, raw))

    def commit(self, group: str, offsets: Sequence[TopicPartitionOffset]) -> None:
        """Write ``offsets`` in one multi-op transaction (all partitions or none)."""
        offs = dedupe_offsets(offsets)
        if not offs:
            return
        paths = [(self.path(group, o.topic, o.partition), o) for o in offs]
        client = self._connected()
        try:
            for topic in sorted({o.topic for o in offs}):
                client.ensure_path_async(self.topic_path(group, topic)).get(
                    timeout=self.op_timeout_s
                )
            for _attempt in range(_COMMIT_ATTEMPTS):
                checks = [client.exists_async(p) for p, _ in paths]
                exists = [c.get(timeout=self.op_timeout_s) is not None for c in checks]
                tx = client.transaction()
                for (p, o), there in zip(paths, exists, strict=True):
                    value = format_value(o.offset, o.msg_id)
                    if there:
                        tx.set_data(p, value)
                    else:
                        tx.create(p, value)
                results = tx.commit_async().get(timeout=self.op_timeout_s)
                errors = [r for r in results if isinstance(r, Exception)]
                if not errors:
                    return
                real = [e for e in errors if type(e).__name__ != "RolledBackError"]
                if all(isinstance(e, NodeExistsError | NoNodeError) for e in real):
                    continue  # raced with another writer creating/deleting a node: redo
                raise self._translate(real[0] if real else errors[0], "commit")
            raise OffsetStoreUnavailableError(
                f"offset commit to ZooKeeper {self.hosts} kept racing with other writers"
            )
        except (KazooException, KazooTimeoutError) as e:
            raise self._translate(e, "commit") from e

    def close(self) -> None:
        """Stop and close the store's own kazoo client. Idempotent."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None and self._own_client:
            _stop(client)

    # -- tooling (ManagedOffsetStore)

    def list_offsets(
        self, group: str | None = None, topic: str | None = None
    ) -> list[StoredOffset]:
        """Every offset node under ``<root>/consumers`` (optionally one group/topic)."""
        client = self._connected()
        out: list[StoredOffset] = []
        try:
            groups = [group] if group is not None else self._children(client, self.consumers_path())
            for g in groups:
                base = f"{self.consumers_path()}/{_check_name('group', g)}/offsets"
                topics = [topic] if topic is not None else self._children(client, base)
                for t in topics:
                    tpath = f"{base}/{_check_name('topic', t)}"
                    for p in self._children(client, tpath):
                        try:
                            raw, stat = client.get_async(f"{tpath}/{p}").get(
                                timeout=self.op_timeout_s
                            )
                        except NoNodeError:
                            continue
                        offset, msg_id = self._parse(f"{tpath}/{p}", raw)
                        out.append(StoredOffset(g, t, p, offset, msg_id, _mtime(stat)))
        except (KazooException, KazooTimeoutError) as e:
            raise self._translate(e, "list") from e
        return sorted(out, key=sort_key)

    def delete(
        self, group: str, topic: str | None = None, partitions: Sequence[str] | None = None
    ) -> int:
        """Delete offset nodes of ``group`` (optionally one topic / some partitions)."""
        client = self._connected()
        n = 0
        try:
            base = f"{self.consumers_path()}/{_check_name('group', group)}/offsets"
            topics = [topic] if topic is not None else self._children(client, base)
            for t in topics:
                tpath = f"{base}/{_check_name('topic', t)}"
                parts = self._children(client, tpath) if partitions is None else list(partitions)
                for p in parts:
                    try:
                        client.delete_async(f"{tpath}/{_check_name('partition', p)}").get(
                            timeout=self.op_timeout_s
                        )
                        n += 1
                    except NoNodeError:
                        pass
                if partitions is None:
                    with contextlib.suppress(NoNodeError, NotEmptyError):
                        client.delete_async(tpath).get(timeout=self.op_timeout_s)
        except (KazooException, KazooTimeoutError) as e:
            raise self._translate(e, "delete") from e
        return n

    # -- internals

    def _children(self, client: KazooClient, path: str) -> list[str]:
        try:
            return sorted(client.get_children_async(path).get(timeout=self.op_timeout_s))
        except NoNodeError:
            return []

    @staticmethod
    def _parse(path: str, raw: bytes) -> tuple[int, int]:
        try:
            return parse_value(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise OffsetStoreError(f"unreadable offset node {path}: {raw[:60]!r}") from e

    def _translate(self, e: BaseException, what: str) -> OffsetStoreError:
        if isinstance(e, OffsetStoreError):
            return e
        text = str(e) or type(e).__name__
        if isinstance(e, _UNAVAILABLE):
            return OffsetStoreUnavailableError(
                f"ZooKeeper {self.hosts} unavailable during offset {what}: {text}"
            )
        if isinstance(e, ZookeeperError):
            return OffsetStoreError(f"ZooKeeper offset {what} failed: {type(e).__name__} {text}")
        return OffsetStoreUnavailableError(f"ZooKeeper offset {what} failed: {text}")

    def _connected(self) -> KazooClient:
        """The client, started if needed; fail fast unless connected."""
        with self._lock:
            if self._closed:
                raise OffsetStoreError("offset store is closed")
            if self._client is None:
                client = KazooClient(
                    hosts=self.hosts,
                    timeout=self.session_timeout_s,
                    connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
                    command_retry={"max_tries": 0},
                )
                try:
                    client.start(timeout=self.connect_timeout_s)
                except (KazooTimeoutError, KazooException, OSError) as e:
                    _stop(client)
                    raise OffsetStoreUnavailableError(
                        f"cannot connect to ZooKeeper {self.hosts}: {e or 'timed out'}"
                    ) from e
                self._client = client
            client = self._client
        if client.state != KazooState.CONNECTED:
            raise OffsetStoreUnavailableError(
                f"ZooKeeper {self.hosts} connection is {str(client.state).lower()}"
            )
        return client

    def __enter__(self) -> ZooKeeperOffsetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ZooKeeperOffsetStore({self.hosts!r}, root={self.root or '/'!r})"


def _mtime(stat: Any) -> datetime | None:
    mtime = getattr(stat, "mtime", None)
    return None if not mtime else datetime.fromtimestamp(mtime / 1000, UTC)


def _stop(client: KazooClient) -> None:
    try:
        client.stop()
    except Exception as e:  # pragma: no cover - best effort
        log.debug("kazoo stop: %s", e)
    try:
        client.close()
    except Exception as e:  # pragma: no cover - best effort
        log.debug("kazoo close: %s", e)
