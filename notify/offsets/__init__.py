"""Consumer offset stores beyond the client's file: SQL, ZooKeeper; exactly-once consumption.

* :class:`SqlOffsetStore` - MetaQ's ``meta_topic_partition_group_offset`` table on
  PostgreSQL, MySQL/MariaDB or SQLite (create it with ``notify db upgrade --url URL``);
* :class:`ZooKeeperOffsetStore` - MetaQ's ``/meta/consumers/<group>/offsets/...`` nodes;
* :class:`FileOffsets` - the client's JSON files, plus listing/deleting for tooling;
* :func:`open_offset_store` - any of them from a URL;
* :func:`offsets_tx` and :class:`TransactionalConsumer` - commit the application's writes
  and the consumed offsets in one database transaction (exactly-once effects);
* :class:`QueueInbox` - the same for queue messages (transactional acknowledgement).

All stores implement the client's :class:`~notify.client.OffsetStore` Protocol and
:class:`ManagedOffsetStore` (``list_offsets``, ``delete``).
"""

from .base import (
    ManagedOffsetStore,
    OffsetConflictError,
    OffsetStoreError,
    OffsetStoreUnavailableError,
    OffsetTableMissingError,
    StoredOffset,
)
from .files import FileOffsets
from .queue_tx import QueueInbox, QueueTransaction
from .schema import OFFSET_TABLE, QUEUE_DONE_TABLE
from .sql import SqlOffsetStore, create_offset_engine
from .tx import CommittedOffsets, OffsetBatch, TransactionalConsumer, offsets_tx
from .url import MemoryOffsets, open_offset_store
from .zookeeper import ZooKeeperOffsetStore

__all__ = [
    "OFFSET_TABLE",
    "QUEUE_DONE_TABLE",
    "CommittedOffsets",
    "FileOffsets",
    "ManagedOffsetStore",
    "MemoryOffsets",
    "OffsetBatch",
    "OffsetConflictError",
    "OffsetStoreError",
    "OffsetStoreUnavailableError",
    "OffsetTableMissingError",
    "QueueInbox",
    "QueueTransaction",
    "SqlOffsetStore",
    "StoredOffset",
    "TransactionalConsumer",
    "ZooKeeperOffsetStore",
    "create_offset_engine",
    "offsets_tx",
    "open_offset_store",
]
