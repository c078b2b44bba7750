"""What every verb handler of the broker shares: its state and the checks they all make.

:class:`BrokerContext` holds the broker-wide state the handlers of :mod:`notify.broker.handlers`
read and change (the store, the flusher, the topic table, counters, the replication role, the
failover epoch and fence, the subsystems the application wires in: transactions, delayed
messages, queues, the synchronous slave), and the answers and gates more than one verb uses:
error replies, topic and partition lookup, whether writes are taken now, and the release of
put replies once the flush policy and the synchronous slave confirmed them.

:class:`~notify.broker.service.BrokerService` is this context plus the dispatch; the handler
modules import only this module, never the service.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from notify.broker.connection import Connection, PendingReplies
from notify.broker.cuts import CutServer
from notify.broker.idempotence import ProducerStates
from notify.broker.stats import BrokerStats, ConsumerPositions
from notify.config import ServerConfig, check_user_topic, validate_topic
from notify.errors import InvalidTopicError
from notify.protocol.frames import encode_result
from notify.protocol.idgen import IdGenerator
from notify.replication.redo import ReplicaRedo
from notify.store.flusher import Flusher
from notify.store.manager import MessageStore
from notify.store.partition import Partition

if TYPE_CHECKING:
    from notify.broker.delay import DelayQueue
    from notify.broker.queues import QueueManager
    from notify.broker.transactions import TransactionManager
    from notify.replication.sync_master import SyncMaster

log = logging.getLogger("notify.broker")

#: ``put`` to this partition: the broker chooses one (MetaQ's ``Partition.RandomPartiton``).
RANDOM_PARTITION: Final = -1


class BrokerContext:
    """The broker's shared state and the checks every verb handler makes."""

    def __init__(
        self,
        config: ServerConfig,
        store: MessageStore,
        flusher: Flusher,
        loop: asyncio.AbstractEventLoop,
        reload: Callable[[], str] | None = None,
    ):
        self.config = config
        self.store = store
        self.flusher = flusher
        self.loop = loop
        self.reload = reload
        #: creates a topic with the defaults (``autoCreateTopics``; set by the broker)
        self.create_topic: Callable[[str], None] | None = None
        self.stats = BrokerStats()
        self.ids = IdGenerator(config.system.broker_id)
        self.max_message = config.system.max_message_size
        self.max_transfer = config.system.max_transfer_size
        self.connections: set[Connection] = set()
        #: topic -> its partitions, and topic -> (accepts publish, accepts subscribe)
        self.topic_parts: dict[str, list[Partition]] = {}
        self.accept: dict[str, tuple[bool, bool]] = {}
        #: the topics that accept publish -> their partitions (a put's one lookup)
        self.publish_parts: dict[str, list[Partition]] = {}
        #: "master", "slave" (refuses producers; appends what the master sends) or
        #: "promoting"
        self.role = "master"
        self.master_address = ""
        self.transactions: TransactionManager | None = None
        self.sync_master: SyncMaster | None = None
        self.delay: DelayQueue | None = None
        self.queues: QueueManager | None = None  # queue subscriptions (README "Queues")
        self.on_promote: Callable[[], str] | None = None
        self.replication_stats: Callable[[], list[tuple[str, object]]] | None = None
        #: a slave's copy of its master's redo log (None on a master)
        self.redo_replica: ReplicaRedo | None = None
        #: automatic failover (notify.replication.failover): the epoch this broker is in
        #: (0 = none) and the check that says why a master must not take writes now
        self.epoch = 0
        self.fence: Callable[[], str | None] | None = None
        self.saw_epoch: Callable[[int], None] | None = None  # a peer named a newer epoch
        #: a producer declared a newer epoch (``epoch`` extension): look at ZooKeeper now
        self.epoch_declared: Callable[[int], None] | None = None
        self.failover_stats: Callable[[], list[tuple[str, object]]] | None = None
        #: (topic, partition) -> group -> (last fetched offset, monotonic time), bounded
        self.consumer_positions = ConsumerPositions(
            config.system.max_consumer_groups, config.system.consumer_group_expiry_ms / 1000.0
        )
        #: idempotent producers: last batch per producer and partition
        sysc = config.system
        self.producers = ProducerStates(
            sysc.max_idempotent_producers,
            sysc.producer_state_max_bytes,
            sysc.max_producer_id_length,
            sysc.max_producer_ids_per_connection,
        )
        #: long-poll gets parked per partition (kept by notify.broker.handlers.fetch)
        self.waiting: dict[Partition, list[list[Any]]] = {}
        #: during a commit round: connections whose replies it made ready (see await_all)
        self.wake: dict[Connection, None] | None = None
        #: consistent cuts for this broker's slaves (notify.replication.cut)
        self.cuts = CutServer(
            store, loop, config.system.max_long_poll_wait_ms, lambda p: p in self.waiting
        )

    # ------------------------------------------------------------------ answers

    def error(self, conn: Connection, code: int, opaque: int, message: str) -> None:
        conn.send(encode_result(code, opaque, message.encode("utf-8", "replace")))

    def denied(self, conn: Connection, opaque: int, what: str, role: str) -> None:
        """403 for a verb the connection's role does not allow (README "Security")."""
        self.stats.denied += 1
        how = "auth with adminSecret" if role == "admin" else "auth with replicationSecret"
        log.warning("%s from %s refused: needs the %s role", what, conn.peer, role)
        self.error(conn, 403, opaque, f"{what} needs the {role} role ({how})")

    def lookup(
        self, conn: Connection, topic: str, partition: int, opaque: int
    ) -> Partition | None:
        """The partition a request names, or None after answering 400/404 with why."""
        parts = self.topic_parts.get(topic)
        if parts is None:
            try:
                validate_topic(topic)
            except InvalidTopicError as e:
                self.error(conn, 400, opaque, str(e))
                return None
            parts = self.auto_create(topic)
        if parts is None:
            self.error(conn, 404, opaque, f"topic {topic!r} does not exist on this broker")
            return None
        if not 0 <= partition < len(parts):
            self.error(
                conn,
                404,
                opaque,
                f"partition {partition} of topic {topic!r} does not exist "
                f"(partitions 0..{len(parts) - 1})",
            )
            return None
        return parts[partition]

    def auto_create(self, topic: str) -> list[Partition] | None:
        """``autoCreateTopics``: the partitions of ``topic`` created now with the defaults;
        None when the setting is off or the name is not one a client may create."""
        if not self.config.system.auto_create_topics or self.create_topic is None:
            return None
        try:
            check_user_topic(topic)  # "__..." belongs to the broker's internal topics
        except InvalidTopicError:
            return None
        self.create_topic(topic)
        return self.topic_parts.get(topic)

    def random_partition(self, topic: str) -> int:
        """MetaQ's ``getPartition``: a put to partition -1 goes to a random partition of the
        topic (-1 stays for an unknown topic, which then gets its 404)."""
        parts = self.topic_parts.get(topic)
        return random.randrange(len(parts)) if parts else RANDOM_PARTITION

    def count_put(self, topic: str, count: int, nbytes: int) -> None:
        st = self.stats
        st.put_messages += count
        st.put_bytes += nbytes
        tc = st.topic(topic)
        tc.put_messages += count
        tc.put_bytes += nbytes

    # ------------------------------------------------------------------ write gates

    def writes_refused(self, conn: Connection, transaction: bool = False) -> bool:
        """A slave, a fenced master (automatic failover), a master in an older epoch than
        the connection's producer has seen, or a master refusing for its synchronous slave
        does not take writes now."""
        if self.role != "master" or (self.fence is not None and self.fence() is not None):
            return True
        if conn.client_epoch > self.epoch and self.fence is not None:
            return True
        return not transaction and bool(self.sync_master and self.sync_master.refusing)

    def stale(self, conn: Connection) -> str | None:
        """Why ``conn``'s writes are refused by the epoch it declared (``epoch``
        extension), or None: its producer saw a newer failover epoch than this broker's."""
        if conn.client_epoch <= self.epoch or self.fence is None:
            return None
        return (
            f"stale master: this broker is in failover epoch {self.epoch} but the producer "
            f"has seen epoch {conn.client_epoch} of broker {self.config.system.broker_id}; "
            "find the current master and retry"
        )

    def refuse_write(self, conn: Connection, opaque: int) -> None:
        """Answer a write :meth:`writes_refused` turned away, with the reason."""
        stale = self.stale(conn) if self.role == "master" else None
        if stale is not None:  # the producer knows a newer master: it re-discovers
            self.stats.epoch_refused += 1
            return self.error(conn, 503, opaque, stale)
        fenced = self.fence() if self.fence is not None and self.role == "master" else None
        if fenced is not None:  # 503: the client retries, on the new master once registered
            return self.error(conn, 503, opaque, fenced)
        if self.role != "master":
            return self.error(
                conn,
                403,
                opaque,
                f"this broker is a slave of {self.master_address or 'its master'}: "
                "send messages to the master",
            )
        assert self.sync_master is not None
        return self.error(conn, 503, opaque, self.sync_master.refusal())

    def queue_fence(self, conn: Connection | None) -> str | None:
        """Why a master of an automatic-failover group takes no queue verb or
        acknowledgement from ``conn`` now (its producer saw a newer epoch: ``stale master``;
        its lease lapsed: ``fenced``), or None; ``conn`` None: whether it pushes at all."""
        if self.fence is None or self.role != "master":
            return None
        stale = self.stale(conn) if conn is not None else None
        if stale is not None:
            self.stats.epoch_refused += 1
            return stale
        return self.fence()

    @property
    def holds(self) -> bool:
        """Appends wait invisible for the synchronous slave (``refuse``: taken back if it
        does not confirm, so a put answered 503 is not stored)."""
        return self.sync_master is not None and self.sync_master.holds

    # ------------------------------------------------------------------ releasing put replies

    def await_all(
        self,
        groups: list[PendingReplies],
        flushed: asyncio.Future[int] | None,
        replicated: asyncio.Future[None] | None,
    ) -> None:
        """Release the replies once the local fsync (if the policy waits for one) and the
        synchronous slave (if any) have confirmed; fail them if either did not.

        Replies that wait for neither are released now: during a commit round (:attr:`wake`
        set) the connections not being read are written once at the end of the round, in
        the same loop turn, instead of at the next one."""
        if flushed is None and replicated is None:
            fenced = self.fence() if self.fence is not None else None
            wake = self.wake
            for g in groups:
                conn = g.conn
                stale = fenced or (self.stale(conn) if conn.client_epoch else None)
                if stale is not None:  # a master replaced meanwhile: not acknowledged
                    g.fail(503, stale)
                elif wake is not None and not conn.receiving:
                    g.done = True
                    wake[conn] = None
                else:
                    g.resolve()
            return
        futs = [f for f in (flushed, replicated) if f is not None]
        left = [len(futs)]

        def one_done(_f: asyncio.Future[Any]) -> None:
            left[0] -= 1
            if left[0]:
                return
            for f in futs:
                if f.cancelled() or f.exception() is not None:
                    exc = f.exception() if not f.cancelled() else "cancelled"
                    code = 503 if f is replicated else 500
                    for g in groups:
                        g.fail(code, f"not acknowledged: {exc}")
                    return
            fenced = self.fence() if self.fence is not None else None
            if fenced is not None:  # replaced while waiting (e.g. paused): not acknowledged
                for g in groups:
                    g.fail(503, fenced)
                return
            for g in groups:
                stale = self.stale(g.conn)  # its producer saw a newer epoch meanwhile
                if stale is None:
                    g.resolve()
                else:
                    g.fail(503, stale)

        for f in futs:
            f.add_done_callback(one_done)
