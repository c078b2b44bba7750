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

Modules: ``_connection`` owns the sockets (pipelined, opaque-matched requests over the
sans-IO codec of :mod:`notify.codec.wire`); ``_routing`` the broker directory;
``_producer``/``_consumer`` the asyncio cores; ``_session`` the factories and the
synchronous wrappers; ``_offsets``, ``_recover``, ``_spool`` the local files.
"""

from ._config import ClientConfig, ConsumerConfig, ProducerConfig
from ._consumer import AsyncConsumer, ConsumerStats, MessageFilter, MessageListener
from ._dedup import DuplicateWindow
from ._errors import ListenerTimeoutError
from ._fetchsize import FetchSizer
from ._message import Message, SendResult
from ._offsets import FileOffsetStore, MemoryOffsetStore, OffsetStore, TopicPartitionOffset
from ._producer import AsyncProducer
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
    Partition,
    StaticBrokerDirectory,
    TopicRouter,
    parse_stats_topics,
)
from ._selectors import KeyHashSelector, PartitionSelector, RoundRobinSelector, key_hash
from ._session import (
    AsyncMessageSessionFactory,
    Consumer,
    MessageSessionFactory,
    Producer,
    connect,
)

__all__ = [
    "AsyncConsumer",
    "AsyncMessageSessionFactory",
    "AsyncProducer",
    "BrokerDirectory",
    "ClientConfig",
    "Consumer",
    "ConsumerConfig",
    "ConsumerStats",
    "DuplicateWindow",
    "FetchSizer",
    "FileOffsetStore",
    "KeyHashSelector",
    "ListenerTimeoutError",
    "MemoryOffsetStore",
    "Message",
    "MessageFilter",
    "MessageListener",
    "MessageSessionFactory",
    "OffsetStore",
    "Partition",
    "PartitionSelector",
    "Producer",
    "ProducerConfig",
    "RecoverStore",
    "RoundRobinSelector",
    "SendResult",
    "StaticBrokerDirectory",
    "StoredMessage",
    "TopicPartitionOffset",
    "TopicRouter",
    "connect",
    "key_hash",
    "list_dead_letters",
    "list_pending_recovery",
    "parse_stats_topics",
    "replay_dead_letters",
    "republish_dead_letters",
]
