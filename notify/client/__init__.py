"""notify client: MetaQ-compatible producer and pull consumer.

Synchronous API::

    from notify.client import connect, ConsumerConfig

    with connect(["127.0.0.1:8123"]) as session:
        producer = session.create_producer()
        result = producer.send("test", b"hello", attribute="tag", key="order-1")
        consumer = session.create_consumer(ConsumerConfig(group="g", data_dir=path))
        consumer.subscribe("test", lambda msg: print(msg.data)).complete_subscribe()

asyncio API (same core, on your loop)::

    async with AsyncMessageSessionFactory(["127.0.0.1:8123"]) as session:
        producer = session.create_producer()
        result = await producer.send("test", b"hello")

Transactions (:mod:`._transaction`, :mod:`._halfmsg`)::

    with producer.transaction(timeout=10):          # local: all or nothing, one broker
        producer.send("orders", b"o-1")
        producer.send("audit", b"o-1 created")

    producer = session.create_transactional_producer("shop", checker)   # half messages
    with producer.half_message("orders", b"o-2") as half:
        half.prepared()
        save_order()                                 # committed after the block
    result = producer.send_in_transaction("orders", b"o-3", local_tx)

Messages carry a key, typed headers and a timestamp; consumers seek, pause and run::

    producer.send("orders", b"o-3", key="user-7", headers={"n": 1}, delay=30)
    consumer.seek("orders", timestamp=time.time() - 3600)
    consumer.pause("orders", "0-1"); consumer.resume("orders")
    consumer.run()              # listeners until SIGTERM/SIGINT, then commit and return

``ProducerConfig(idempotent=True)``: the broker drops retried puts it already stored.

Cluster (ZooKeeper, MetaQ's layout; see :mod:`configserver`)::

    with connect(zk="127.0.0.1:2181/meta") as session:   # brokers found and followed live
        producer = session.create_producer()             # a new broker is used within moments
        consumer = session.create_consumer(ConsumerConfig(group="g", data_dir=path))
        consumer.subscribe("test", handle).complete_subscribe()   # the group rebalances

A failed send raises its error; ``ProducerConfig(raise_on_error=False)`` returns
``SendResult(success=False, error=...)`` instead.

Modules: :mod:`.core` is the sans-IO client core (frames and replies, the transaction state
machine and :class:`~.core.transaction.TxCore`, selectors); :mod:`.transport` owns the
sockets and ``_connection`` the session's one pool of them; ``_routing`` the broker
directory. The producer is ``_producer`` (the asyncio API) over ``_accumulator`` (queues,
batching), ``_sender`` (sending, retries, results) and ``_spool`` (ordered mode), with
``_sync_producer`` its blocking facade and ``_direct`` its ``send()`` over the caller's
socket; transactions are ``_transaction`` (the handles), ``_txbackend`` (the backend chosen
at begin), ``_txloop`` / ``_directtx`` (the asyncio and blocking drivers of the core),
``_halfmsg`` and ``_checkback`` (half messages and the group's check-backs). The consumer is
``_consumer`` (the asyncio API) over ``_subscription`` (what it reads and where it stands),
``_fetcher`` (``get`` and its replies, duplicates, the pull API's polling), ``_delivery``
(listener mode), ``_commits`` (start offsets and commits) and ``_group`` (cluster mode);
``_queue``, ``offsets``, ``_recover`` are the rest of the consuming side, ``_publisher`` the
outbox relay's publisher; ``_session`` the factories.
"""

from notify.errors import ProducerFencedError
from notify.protocol.replies import parse_stats_topics

from ._config import ClientConfig, ConsumerConfig, ProducerConfig, default_data_dir
from ._consumer import AsyncConsumer, ConsumerStats, MessageFilter, MessageListener
from ._dedup import DuplicateWindow
from ._errors import (
    ClientTransactionError,
    ListenerTimeoutError,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    XAError,
)
from ._fetchsize import FetchSizer
from ._halfmsg import (
    HalfMessage,
    LocalTransaction,
    LocalTxState,
    SyncHalfMessage,
    TransactionChecker,
    TransactionSendResult,
)
from ._identity import ProducerIdentity, put_sequenced
from ._message import BatchSendResult, Headers, Message, PostFailure, SendResult
from ._producer import AsyncProducer
from ._queue import (
    AsyncQueueConsumer,
    QueueConsumer,
    QueueMessage,
    SyncQueueMessage,
    settle_all,
)
from ._recover import (
    RecoverStore,
    StoredMessage,
    list_dead_letters,
    list_pending_recovery,
    replay_dead_letters,
    republish_dead_letters,
)
from ._routing import (
    BrokerDirectory,
    LiveBrokerDirectory,
    Partition,
    StaticBrokerDirectory,
    TopicRouter,
    ZkBrokerDirectory,
)
from ._session import (
    AsyncMessageSessionFactory,
    Consumer,
    MessageSessionFactory,
    connect,
)
from ._sync_producer import Producer
from ._transaction import AsyncTransaction, Transaction
from .core.selectors import KeyHashSelector, PartitionSelector, RoundRobinSelector, key_hash
from .core.states import TxState
from .offsets import FileOffsetStore, MemoryOffsetStore, OffsetStore, TopicPartitionOffset

__all__ = [
    "AsyncConsumer",
    "AsyncMessageSessionFactory",
    "AsyncProducer",
    "AsyncQueueConsumer",
    "AsyncTransaction",
    "BatchSendResult",
    "BrokerDirectory",
    "ClientConfig",
    "ClientTransactionError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerStats",
    "DuplicateWindow",
    "FetchSizer",
    "FileOffsetStore",
    "HalfMessage",
    "Headers",
    "KeyHashSelector",
    "ListenerTimeoutError",
    "LiveBrokerDirectory",
    "LocalTransaction",
    "LocalTxState",
    "MemoryOffsetStore",
    "Message",
    "MessageFilter",
    "MessageListener",
    "MessageSessionFactory",
    "OffsetStore",
    "Partition",
    "PartitionSelector",
    "PostFailure",
    "Producer",
    "ProducerConfig",
    "ProducerFencedError",
    "ProducerIdentity",
    "QueueConsumer",
    "QueueMessage",
    "RecoverStore",
    "RoundRobinSelector",
    "SendResult",
    "StaticBrokerDirectory",
    "StoredMessage",
    "SyncHalfMessage",
    "SyncQueueMessage",
    "TopicPartitionOffset",
    "TopicRouter",
    "Transaction",
    "TransactionAbortedError",
    "TransactionChecker",
    "TransactionConnectionError",
    "TransactionOutcomeUnknownError",
    "TransactionSendResult",
    "TransactionTimeoutError",
    "TxState",
    "XAError",
    "ZkBrokerDirectory",
    "connect",
    "default_data_dir",
    "key_hash",
    "list_dead_letters",
    "list_pending_recovery",
    "parse_stats_topics",
    "put_sequenced",
    "replay_dead_letters",
    "republish_dead_letters",
    "settle_all",
]
