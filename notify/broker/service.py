"""Request handling: what the broker does with each decoded command.

Puts are not written one by one. Every put accepted during one turn of the event loop,
from every connection, is collected per partition; a single callback scheduled with
``call_soon`` then encodes each partition's records into one buffer, writes it with one
``pwrite`` and hands the flush policy its chance to make the replies wait for an fsync
(group commit). Message ids are allocated in blocks.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from notify.broker.authlog import record_auth_failure
from notify.broker.connection import Connection, PendingReplies
from notify.broker.cuts import CutServer
from notify.broker.delay import DELAY_TOPIC, DelayQueue, encode_envelope
from notify.broker.idempotence import LastBatch, ProducerStates, batch_verdict
from notify.broker.stats import BrokerStats, ConsumerPositions
from notify.config import ServerConfig, served_config, validate_topic
from notify.core.effects import Applied
from notify.core.transactions import TxPut
from notify.errors import (
    InvalidTopicError,
    NotifyError,
    OffsetOutOfRangeError,
    ProtocolError,
    StoreFullError,
    TxLogError,
)
from notify.fdbudget import connection_budget
from notify.protocol import hotpath, records
from notify.protocol.frames import (
    Auth,
    DelayedPut,
    Epoch,
    Get,
    MultiPut,
    MultiSync,
    Offset,
    Promote,
    Put,
    QueueAck,
    QueueDeadLetters,
    QueueDelete,
    QueueSubscribe,
    QueueUnsubscribe,
    Quit,
    Register,
    Reload,
    Request,
    Stats,
    Sync,
    Transaction,
    Version,
    encode_error,
    encode_result,
    encode_stats_body,
    encode_value_header,
)
from notify.protocol.identity import Claim
from notify.protocol.idgen import MAX_BATCH, IdGenerator
from notify.protocol.properties import FLAG_PROPERTIES, record_producer
from notify.protocol.replies import (
    MultiPutAck,
    OffsetReply,
    PutAck,
    Redirect,
    encode_replica_ack,
)
from notify.replication.cut import CUT_STREAM
from notify.replication.redo import (
    DELAYLOG_STREAM,
    LOG_STREAMS,
    QUEUELOG_STREAM,
    RedoBehindError,
    ReplicaRedo,
)
from notify.store.flusher import Flusher
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.version import __version__
from txlog import Position, TxLog

if TYPE_CHECKING:
    from notify.broker.queues import QueueManager
    from notify.broker.transactions import TransactionManager
    from notify.replication.sync_master import SyncMaster

log = logging.getLogger("notify.broker")

_HEADER = records.HEADER
_CRC_MASK: Final = 0x7FFFFFFF
#: ``put`` to this partition: the broker chooses one (MetaQ's ``Partition.RandomPartiton``).
RANDOM_PARTITION: Final = -1
LONG_MAX: Final = 2**63 - 1
_NOT_IN_TX: Final = (
    "an idempotent producer's messages (producer members in their properties) cannot be "
    "sent in a transaction"
)
_NOT_DELAYED: Final = (
    "an idempotent producer's messages (producer members in their properties) cannot be "
    "delayed"
)
STATS_ITEMS: Final = (
    "", "topics", "offsets", "realtime", "config", "reset", "help", "queues", "producers"
)


class _Batch:
    """Puts for one partition collected during one event-loop turn."""

    __slots__ = ("count", "groups", "idempotent", "nbytes")

    def __init__(self) -> None:
        self.groups: list[PendingReplies] = []
        self.count = 0
        self.nbytes = 0
        #: (reply item, producer id, sequence) of idempotent puts (notify.broker.idempotence)
        self.idempotent: list[tuple[list[Any], str, int, int]] = []


class _IdStream:
    """Hands out message ids from blocks of up to 4096 consecutive ids."""

    __slots__ = ("_gen", "_left_total", "_next", "_remaining")

    def __init__(self, gen: IdGenerator, total: int):
        self._gen = gen
        self._left_total = total
        self._next = 0
        self._remaining = 0

    def take(self, n: int) -> int:
        if n > self._remaining:
            size = min(MAX_BATCH, max(n, self._left_total))
            self._next = self._gen.next_block(size)
            self._remaining = size
        first = self._next
        self._next += n
        self._remaining -= n
        self._left_total -= n
        return first


class BrokerService:
    """The broker's command handlers over a :class:`MessageStore`."""

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
        self.stats = BrokerStats()
        self.ids = IdGenerator(config.system.broker_id)
        self.max_message = config.system.max_message_size
        self.max_transfer = config.system.max_transfer_size
        self.connections: set[Connection] = set()
        #: TLS handshakes in progress (they count toward maxConnections: tlsaccept.py)
        self.handshaking = 0
        #: connections the file descriptors allow (see _fds_allow), and when worked out
        self._fd_budget = 0
        self._fd_budget_at = float("-inf")
        self._pending: dict[Partition, _Batch] = {}
        self._reload = reload
        self._topic_parts: dict[str, list[Partition]] = {}
        self._waiting: dict[Partition, list[list[Any]]] = {}
        self._accept: dict[str, tuple[bool, bool]] = {}
        self.transactions: TransactionManager | None = None
        #: "master", or "slave" (refuses producers; appends what the master sends)
        self.role = "master"
        self.master_address = ""
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
        self._redo_acks: list[tuple[PendingReplies, ReplicaRedo]] = []
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
        self._checked_flags = 0  # OR of the flags of the records _check_records validated
        #: and their producer members (hotpath.check_batch: verdict, id span, sequences)
        self._checked_producer: list[int] = [0, -1, -1, -1, -1]
        #: consistent cuts for this broker's slaves (notify.replication.cut)
        self.cuts = CutServer(
            store, loop, config.system.max_long_poll_wait_ms, lambda p: p in self._waiting
        )
        self.refresh_topics()

    def refresh_topics(self) -> None:
        """Re-read the topic table from the store (after a config reload)."""
        for part in self.store.all_partitions():
            part.on_visible = self.partition_visible
            if self.cuts.watching:
                part.waiting = True
        self._topic_parts = {t: self.store.topic_partitions(t) for t in self.store.topics}
        self._accept = {
            t: (c.accept_publish, c.accept_subscribe) for t, c in self.store.topics.items()
        }

    # ------------------------------------------------------------------ connections

    def _fds_allow(self, n: int) -> bool:
        """Whether the file descriptors allow ``n + 1`` connections: ``maxConnections`` may
        exceed what ``RLIMIT_NOFILE`` holds, and sockets that took every descriptor left the
        broker unable to open a segment or a checkpoint. The budget is worked out again (it
        lists the open descriptors) at most once a second, when it would refuse."""
        if n < self._fd_budget:
            return True
        now = self.loop.time()
        if now - self._fd_budget_at >= 1.0:
            sysc = self.config.system
            http = sysc.http_max_connections if sysc.dashboard_http_port else 0
            self._fd_budget = connection_budget(sysc.fd_reserve, http, n)
            self._fd_budget_at = now
        return n < self._fd_budget

    def connection_opened(self, conn: Connection) -> bool:
        n = len(self.connections)
        if n >= self.config.system.max_connections or not self._fds_allow(n + self.handshaking):
            self.stats.connections_refused += 1
            return False
        self.connections.add(conn)
        self.stats.connections_total += 1
        self.stats.connections_current = len(self.connections)
        return True

    def tls_handshake_started(self) -> bool:
        """Admit one more TLS handshake unless connections + handshakes fill maxConnections."""
        n = len(self.connections) + self.handshaking
        if n >= self.config.system.max_connections or not self._fds_allow(n):
            self.stats.connections_refused += 1
            return False
        self.handshaking += 1
        return True

    def tls_handshake_ended(self) -> None:
        self.handshaking -= 1

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.stats.connections_current = len(self.connections)
        for part, entry in list(conn.parked.values()):  # parked gets die with their connection
            entry[2].done = True
            self._unpark(part, entry, False)
        conn.parked.clear()
        if conn.producers:
            self.producers.release(conn.producers)
        self.cuts.closed(conn)
        if self.transactions is not None:
            self.transactions.connection_closed(conn)
        if self.queues is not None:
            self.queues.connection_closed(conn)

    # ------------------------------------------------------------------ dispatch

    def handle(self, conn: Connection, reqs: list[Request | ProtocolError]) -> None:
        i = 0
        n = len(reqs)
        while i < n:
            r = reqs[i]
            i += 1
            t = type(r)
            if not conn.authenticated and t is not Auth and t is not Quit:
                if isinstance(r, ProtocolError) and r.fatal:
                    conn.send(encode_error(r))  # framing lost: answer and close, auth or not
                    conn.close_after_replies()
                    break
                self._auth_required(conn, r)
                continue
            if t is Put:
                self._put(conn, r)  # type: ignore[arg-type]
                continue
            if self._pending:
                self.commit()
            if t is Get:
                self._get(conn, r)  # type: ignore[arg-type]
            elif t is MultiPut:
                self._mput(conn, r)  # type: ignore[arg-type]
            elif t is Offset:
                self._offset(conn, r)  # type: ignore[arg-type]
            elif isinstance(r, ProtocolError):
                self.stats.protocol_errors += 1
                conn.send(encode_error(r))
                if r.fatal:
                    conn.close_after_replies()
                    break
            else:
                self.stats.cmd_other += 1
                if t is Transaction and i < n - 1 and r.type == "BEGIN":  # type: ignore[union-attr]
                    end = self._oneshot(conn, reqs, i - 1)
                    if end:
                        i = end
                        continue
                self._other(conn, r)
            if conn.closing:
                break
        if self._pending:
            # written now, not at the next loop turn: a lone put is answered in the turn
            # that read it when the flush policy needs no fsync first (one chunk's puts
            # to a partition are still one append)
            self.commit()

    def _oneshot(self, conn: Connection, reqs: list[Request | ProtocolError], at: int) -> int:
        """``reqs[at]`` is a BEGIN: when it is followed, in this same read, by puts of its
        transaction and its COMMIT_ONE_PHASE, and every put would be accepted, hand the
        whole transaction to the engine as one unit (one redo write); returns the index
        after the COMMIT, or 0 to run the requests one by one (any error is theirs)."""
        txm = self.transactions
        begin = reqs[at]
        assert isinstance(begin, Transaction)
        key = begin.tx_key
        if txm is None or key is None or self._writes_refused(conn):
            return 0
        puts: list[TxPut] = []
        nput = nmput = 0
        j = at + 1
        n = len(reqs)
        while True:
            if j >= n:
                return 0
            r = reqs[j]
            t = type(r)
            if t is Put:
                if r.tx_key != key:  # type: ignore[union-attr]
                    return 0
                item = self._oneshot_put(r)  # type: ignore[arg-type]
                nput += 1
            elif t is MultiPut:
                if r.tx_key != key:  # type: ignore[union-attr]
                    return 0
                item = self._oneshot_mput(r)  # type: ignore[arg-type]
                nmput += 1
            elif t is Transaction and r.type == "COMMIT_ONE_PHASE":  # type: ignore[union-attr]
                break
            else:
                return 0
            if item is None:
                return 0
            puts.append(item)
            j += 1
        commit = reqs[j]
        assert isinstance(commit, Transaction)
        if not txm.oneshot(conn, begin, puts, commit):
            return 0
        st = self.stats
        st.cmd_put += nput
        st.cmd_mput += nmput
        st.cmd_other += 1  # the COMMIT (the BEGIN was counted)
        return j + 1

    def _oneshot_put(self, r: Put) -> TxPut | None:
        """A transactional put as :meth:`_put` would accept it, else None (no reply)."""
        if r.partition == RANDOM_PARTITION:
            r.partition = self._random_partition(r.topic)
        parts = self._topic_parts.get(r.topic)
        if parts is None or not 0 <= r.partition < len(parts) or not self._accept[r.topic][0]:
            return None
        body = r.body
        if len(body) > self.max_message:
            return None
        crc = zlib.crc32(body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            return None
        if r.flag & FLAG_PROPERTIES and record_producer(r.flag, body) is not None:
            return None
        return TxPut(r.topic, r.partition, r.opaque, body, 0, r.flag, crc)

    def _oneshot_mput(self, r: MultiPut) -> TxPut | None:
        """A transactional mput as :meth:`_mput` would accept it, else None (no reply)."""
        parts = self._topic_parts.get(r.topic)
        if parts is None or not 0 <= r.partition < len(parts) or not self._accept[r.topic][0]:
            return None
        if not 1 <= r.count <= MAX_BATCH:
            return None
        if self._check_records(r.records, r.count):
            return None
        if self._checked_producer[0] != hotpath.NO_PRODUCER:
            return None
        return TxPut(r.topic, r.partition, r.opaque, bytearray(r.records), r.count)

    def _auth_required(self, conn: Connection, r: Request | ProtocolError) -> None:
        opaque = getattr(r, "opaque", 0)
        conn.send(encode_result(403, opaque, b"authentication required: send auth first"))

    def _group_secret_ok(self, r: Register) -> bool:
        """A group with a ``[producerGroup=NAME] secret`` is joined only with that secret
        (else any app could register as it and answer its half messages' check-backs)."""
        expected = self.config.producer_groups.get(r.group)
        if expected is None:
            return True
        return hmac.compare_digest(r.secret.encode(), expected.encode())

    def _denied(self, conn: Connection, opaque: int, what: str, role: str) -> None:
        """403 for a verb the connection's role does not allow (README "Security")."""
        self.stats.denied += 1
        how = "auth with adminSecret" if role == "admin" else "auth with replicationSecret"
        log.warning("%s from %s refused: needs the %s role", what, conn.peer, role)
        self._error(conn, 403, opaque, f"{what} needs the {role} role ({how})")

    def _error(self, conn: Connection, code: int, opaque: int, message: str) -> None:
        conn.send(encode_result(code, opaque, message.encode("utf-8", "replace")))

    def _lookup(
        self, conn: Connection, topic: str, partition: int, opaque: int
    ) -> Partition | None:
        parts = self._topic_parts.get(topic)
        if parts is None:
            try:
                validate_topic(topic)
            except InvalidTopicError as e:
                self._error(conn, 400, opaque, str(e))
                return None
            self._error(conn, 404, opaque, f"topic {topic!r} does not exist on this broker")
            return None
        if not 0 <= partition < len(parts):
            self._error(
                conn,
                404,
                opaque,
                f"partition {partition} of topic {topic!r} does not exist "
                f"(partitions 0..{len(parts) - 1})",
            )
            return None
        return parts[partition]

    # ------------------------------------------------------------------ put

    def _put(self, conn: Connection, r: Put) -> None:
        self.stats.cmd_put += 1
        if r.partition == RANDOM_PARTITION:
            r.partition = self._random_partition(r.topic)
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            self.stats.put_failed += 1
            return
        body = r.body
        if not self._accept[r.topic][0]:
            self.stats.put_failed += 1
            return self._error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept publish")
        if len(body) > self.max_message:
            self.stats.put_failed += 1
            return self._error(
                conn,
                400,
                r.opaque,
                f"message of {len(body)} bytes exceeds maxMessageSize {self.max_message}",
            )
        crc = zlib.crc32(body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            self.stats.put_failed += 1
            return self._error(
                conn, 400, r.opaque, f"checksum mismatch: sent {r.checksum}, body has {crc}"
            )
        if self._writes_refused(conn):
            self.stats.put_failed += 1
            return self._refuse_write(conn, r.opaque)
        idem = record_producer(r.flag, body) if r.flag & FLAG_PROPERTIES else None
        if r.tx_key is not None:
            if idem is not None:
                self.stats.put_failed += 1
                return self._error(conn, 400, r.opaque, _NOT_IN_TX)
            return self._tx_put(conn, r, crc)
        if part.failed:
            self.stats.put_failed += 1
            return self._error(conn, 500, r.opaque, part.failed)
        if idem is not None:
            if not self._producer_may(conn, part, r.opaque, idem[0]):
                self.stats.put_failed += 1
                return
            if self._answer_duplicate(conn, part, r.opaque, idem[0], idem[1]):
                return
        key = (r.topic, r.partition)
        group = conn.open_groups.get(key)
        if group is None:
            group = conn.open_groups[key] = PendingReplies(conn, r.partition)
            conn.send(group)
            batch = self._pending.get(part)
            if batch is None:
                batch = self._pending[part] = _Batch()
            batch.groups.append(group)
        else:
            batch = self._pending[part]
            conn.queued += 1  # one more reply in a group already queued (read back-pressure)
        item = [r.opaque, body, crc, r.flag, 0, 0]
        group.items.append(item)
        batch.count += 1
        batch.nbytes += len(body)
        if idem is not None:
            batch.idempotent.append((item, idem[0], idem[1], len(body)))

    def _producer_may(self, conn: Connection, part: Partition, opaque: int, pid: str) -> bool:
        """Whether ``conn`` may put as idempotent producer ``pid`` in ``part`` (claimed on
        this connection, not fenced, room in the state); else answered with why."""
        states = self.producers
        why = states.refusal(conn.producers, pid)
        if why is not None:
            self._error(conn, why[0], opaque, why[1])
            return False
        full = states.room_for(part, pid)
        if full is not None:
            conn.send(encode_result(503, opaque, full))
            return False
        return True

    def _claim(self, conn: Connection, r: Claim) -> None:
        """``producer <id> <secret> <epoch> <instance> <opaque>`` (notify.protocol.identity)."""
        if self.role != "master":
            return self._refuse_write(conn, r.opaque)
        code, body = self.producers.claim(conn.producers, r)
        if code == 403:
            record_auth_failure(conn.peer)
        conn.send(encode_result(code, r.opaque, body))

    def _answer_duplicate(
        self, conn: Connection, part: Partition, opaque: int, pid: str, seq: int, count: int = 0
    ) -> bool:
        """A put of idempotent producer ``pid`` starting at ``seq`` that repeats its last
        stored batch is answered with that batch's ack (once what it covers is flushed as
        the partition's policy asks and, with a sync slave, the slave has it: the range is
        pushed again, a slave that has it says so) instead of being stored again; True when
        answered."""
        last = self.producers.duplicate_of(part, pid, seq)
        if last is None:
            return False
        found = None
        if last.first_seq <= seq and seq + max(count, 1) - 1 <= last.last_seq:
            found = self.producers.locate(part, last, seq)
        if found is None:
            self._error(
                conn,
                400,
                opaque,
                f"producer {pid}: sequence {seq} overlaps its last stored batch "
                f"{last.first_seq}..{last.last_seq} in {part.topic}-{part.index}",
            )
            return True
        log.info("producer %s: retry of seq %d in %s-%d dropped", pid, seq, part.topic, part.index)
        msg_id, offset = found
        if count:
            body = MultiPutAck(msg_id, part.index, offset, count).encode()
        else:
            body = PutAck(msg_id, part.index, offset).encode()
        group = PendingReplies(conn, part.index)
        group.items.append([opaque])
        group.body = encode_result(200, opaque, body)
        conn.send(group)
        replicated = None
        if self.sync_master is not None:  # acknowledged only once the sync slave has it
            data = part.read_raw(last.first_offset, last.end_offset - last.first_offset)
            replicated = self.sync_master.replicate(part, last.first_offset, data, last.count)
        self._await_all([group], self.flusher.after_append(part, 0), replicated)
        return True

    def _random_partition(self, topic: str) -> int:
        """MetaQ's ``getPartition``: a put to partition -1 goes to a random partition of the
        topic (-1 stays for an unknown topic, which then gets its 404)."""
        parts = self._topic_parts.get(topic)
        return random.randrange(len(parts)) if parts else RANDOM_PARTITION

    def _mput(self, conn: Connection, r: MultiPut) -> None:
        self.stats.cmd_mput += 1
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if not self._accept[r.topic][0]:
            return self._error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept publish")
        if not 1 <= r.count <= MAX_BATCH:
            return self._error(conn, 400, r.opaque, f"mput count {r.count} outside 1..{MAX_BATCH}")
        err = self._check_records(r.records, r.count)
        if err:
            return self._error(conn, 400, r.opaque, f"mput: {err}")
        if self._writes_refused(conn):
            return self._refuse_write(conn, r.opaque)
        idem = batch_verdict(r.records, *self._checked_producer)
        if isinstance(idem, str):
            return self._error(conn, 400, r.opaque, f"mput: {idem}")
        buf = bytearray(r.records)
        if r.tx_key is not None:
            if idem is not None:
                return self._error(conn, 400, r.opaque, _NOT_IN_TX)
            return self._tx_mput(conn, r, buf)
        if part.failed:
            return self._error(conn, 500, r.opaque, part.failed)
        if idem is not None:
            if not self._producer_may(conn, part, r.opaque, idem[0]):
                return
            if self._answer_duplicate(conn, part, r.opaque, idem[0], idem[1], r.count):
                return
        base = part.end
        first_id = self.ids.next_block(r.count)
        records.stamp_ids(buf, first_id)
        try:
            part.append(buf, hold=self._holds)
        except NotifyError as e:
            code = 503 if isinstance(e, StoreFullError) else 500
            return self._error(conn, code, r.opaque, str(e))
        if idem is not None:
            batch = LastBatch(idem[1], idem[2], first_id, base, base + len(buf))
            self.producers.record(part, idem[0], batch)
        self._count_put(r.topic, r.count, len(buf) - r.count * records.HEADER_SIZE)
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        group.body = encode_result(
            200, r.opaque, MultiPutAck(first_id, r.partition, base, r.count).encode()
        )
        conn.send(group)
        self._await_all(
            [group],
            self.flusher.after_append(part, r.count),
            self.sync_master.replicate(part, base, buf, r.count) if self.sync_master else None,
        )

    def _check_records(self, data: bytes, count: int) -> str | None:
        """Validate ``count`` whole records with correct checksums filling ``data`` (the
        loop is compiled with the client's hot paths: notify.protocol.hotpath)."""
        max_msg = self.max_message
        seen, flags, verdict, length, *producer = records.check_batch(data, max_msg)
        if verdict == hotpath.SHORT_HEADER:
            return f"record {seen}: incomplete header"
        if verdict == hotpath.BAD_LENGTH:
            return f"record {seen}: length {length} outside 0..{max_msg}"
        if verdict == hotpath.PAST_END:
            return f"record {seen}: length {length} runs past the body"
        if verdict == hotpath.BAD_CHECKSUM:
            return f"record {seen}: checksum mismatch"
        if seen != count:
            return f"body holds {seen} records, header says {count}"
        self._checked_flags = flags
        self._checked_producer = producer  # read by _mput (idempotent producers)
        return None

    def _count_put(self, topic: str, count: int, nbytes: int) -> None:
        st = self.stats
        st.put_messages += count
        st.put_bytes += nbytes
        tc = st.topic(topic)
        tc.put_messages += count
        tc.put_bytes += nbytes

    def transaction_applied(self, eff: Applied) -> None:
        """A committed transaction reached its partitions: count it; index delayed messages."""
        for pl in eff.placements:
            self._count_put(pl.topic, pl.count, pl.nbytes - pl.count * records.HEADER_SIZE)
        if self.delay is not None:
            for offset, data in eff.delayed:
                self.delay.index_appended(offset, data)

    def commit(self) -> None:
        """Write every pending batch: one buffer and one write per partition."""
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        pack = _HEADER.pack
        for part, batch in pending.items():
            groups = batch.groups
            offset = base = part.end
            if batch.count == 1:  # a lone put: no id stream, no list of chunks
                g = groups[0]
                g.conn.open_groups.clear()
                it = g.items[0]
                body = it[1]
                first = self.ids.next_block(1)
                data = pack(len(body), it[2], first, it[3]) + body
                it[1] = None
                it[4] = first
                it[5] = offset
                offset += 20 + len(body)
            else:
                for g in groups:
                    g.conn.open_groups.clear()
                ids = _IdStream(self.ids, batch.count)
                chunks: list[bytes] = []
                add = chunks.append
                for g in groups:
                    items = g.items
                    first = ids.take(len(items))
                    for it in items:
                        body = it[1]
                        add(pack(len(body), it[2], first, it[3]))
                        add(body)
                        it[1] = None  # the body is not needed for the reply
                        it[4] = first
                        it[5] = offset
                        first += 1
                        offset += 20 + len(body)
                data = b"".join(chunks)
            try:
                part.append(data, hold=self._holds)
            except NotifyError as e:
                code = 503 if isinstance(e, StoreFullError) else 500
                log.error("append to %s-%d failed: %s", part.topic, part.index, e)
                self.stats.put_failed += batch.count
                for g in groups:
                    g.fail(code, str(e))
                continue
            assert offset - base == batch.count * 20 + batch.nbytes
            for it, pid, seq, size in batch.idempotent:  # it[4], it[5]: id and offset given
                batch_end = it[5] + records.HEADER_SIZE + size
                self.producers.record(part, pid, LastBatch(seq, seq, it[4], it[5], batch_end))
            self._count_put(part.topic, batch.count, batch.nbytes)
            self._await_all(
                groups,
                self.flusher.after_append(part, batch.count),
                self.sync_master.replicate(part, base, data, batch.count)
                if self.sync_master
                else None,
            )

    def _await_all(
        self,
        groups: list[PendingReplies],
        flushed: asyncio.Future[int] | None,
        replicated: asyncio.Future[None] | None,
    ) -> None:
        """Release the replies once the local fsync (if the policy waits for one) and the
        synchronous slave (if any) have confirmed; fail them if either did not."""
        futs = [f for f in (flushed, replicated) if f is not None]
        if not futs:
            fenced = self.fence() if self.fence is not None else None
            for g in groups:
                stale = fenced or self._stale(g.conn)
                if stale is None:
                    g.resolve()
                else:  # a master replaced meanwhile (automatic failover): not acknowledged
                    g.fail(503, stale)
            return
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
                stale = self._stale(g.conn)  # its producer saw a newer epoch meanwhile
                if stale is None:
                    g.resolve()
                else:
                    g.fail(503, stale)

        for f in futs:
            f.add_done_callback(one_done)

    def _writes_refused(self, conn: Connection, transaction: bool = False) -> bool:
        """A slave, a fenced master (automatic failover), a master in an older epoch than
        the connection's producer has seen, or a master refusing for its synchronous slave
        does not take writes now."""
        if self.role != "master" or (self.fence is not None and self.fence() is not None):
            return True
        if conn.client_epoch > self.epoch and self.fence is not None:
            return True
        return not transaction and bool(self.sync_master and self.sync_master.refusing)

    def _stale(self, conn: Connection) -> str | None:
        """Why ``conn``'s writes are refused by the epoch it declared (``epoch``
        extension), or None: its producer saw a newer failover epoch than this broker's."""
        if conn.client_epoch <= self.epoch or self.fence is None:
            return None
        return (
            f"stale master: this broker is in failover epoch {self.epoch} but the producer "
            f"has seen epoch {conn.client_epoch} of broker {self.config.system.broker_id}; "
            "find the current master and retry"
        )

    def queue_fence(self, conn: Connection | None) -> str | None:
        """Why a master of an automatic-failover group takes no queue verb or
        acknowledgement from ``conn`` now (its producer saw a newer epoch: ``stale master``;
        its lease lapsed: ``fenced``), or None; ``conn`` None: whether it pushes at all."""
        if self.fence is None or self.role != "master":
            return None
        stale = self._stale(conn) if conn is not None else None
        if stale is not None:
            self.stats.epoch_refused += 1
            return stale
        return self.fence()

    def _epoch(self, conn: Connection, r: Epoch) -> None:
        """``epoch <brokerId> <epoch> <opaque>``: remember the newest epoch the producer saw
        for this broker's group; answer this broker's (503 when it is older: stale)."""
        self.stats.epoch_declared += 1
        bid = self.config.system.broker_id
        if r.broker_id == bid and r.epoch > conn.client_epoch:
            conn.client_epoch = r.epoch
        stale = self._stale(conn)
        if stale is not None:
            self.stats.epoch_refused += 1
            if self.epoch_declared is not None:
                self.epoch_declared(conn.client_epoch)
            return self._error(conn, 503, r.opaque, stale)
        conn.send(encode_result(200, r.opaque, b"%d %d" % (bid, self.epoch)))

    @property
    def _holds(self) -> bool:
        """Appends wait invisible for the synchronous slave (``refuse``: taken back if it
        does not confirm, so a put answered 503 is not stored)."""
        return self.sync_master is not None and self.sync_master.holds

    def taken_back(self, part: Partition, offset: int) -> None:
        """Refused puts from ``offset`` on were cut from ``part``: forget what indexed them."""
        self.producers.forget_from(part, offset)
        if part.topic == DELAY_TOPIC and self.delay is not None:
            self.delay.forget_from(offset)

    def _refuse_write(self, conn: Connection, opaque: int) -> None:
        stale = self._stale(conn) if self.role == "master" else None
        if stale is not None:  # the producer knows a newer master: it re-discovers
            self.stats.epoch_refused += 1
            return self._error(conn, 503, opaque, stale)
        fenced = self.fence() if self.fence is not None and self.role == "master" else None
        if fenced is not None:  # 503: the client retries, on the new master once registered
            return self._error(conn, 503, opaque, fenced)
        if self.role != "master":
            return self._error(
                conn,
                403,
                opaque,
                f"this broker is a slave of {self.master_address or 'its master'}: "
                "send messages to the master",
            )
        assert self.sync_master is not None
        return self._error(conn, 503, opaque, self.sync_master.refusal())

    # ------------------------------------------------------------------ get / offset

    def _get(self, conn: Connection, r: Get) -> None:
        st = self.stats
        st.cmd_get += 1
        if r.topic.startswith("__") and not conn.replica:
            return self._denied(conn, r.opaque, f"get on internal topic {r.topic!r}", "replica")
        if r.topic in LOG_STREAMS:
            return self._get_redo(conn, r)
        if r.topic == CUT_STREAM:
            return self.cuts.get(conn, r)
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if not self._accept[r.topic][1]:
            return self._error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept subscribe")
        if r.max_size <= 0:
            return self._error(conn, 400, r.opaque, f"Bad request,invalid max size {r.max_size}")
        tc = st.topic(r.topic)
        tc.get_requests += 1
        self.consumer_positions.record(r.topic, r.partition, r.group, r.offset)
        try:
            sl = part.slice(r.offset, min(self.max_transfer, r.max_size), r.max_size)
        except OffsetOutOfRangeError as e:
            if self._not_shown_yet(part, r.offset):
                if r.max_wait_ms > 0:
                    return self._park(conn, part, r)
                st.get_misses += 1
                tc.get_misses += 1
                return self._error(conn, 404, r.opaque, f"Nothing yet at position {r.offset}")
            if r.offset > e.nearest and r.max_wait_ms == 0 and not self._moved_past_end(r):
                # MetaQ: beyond the end is "not found" unless updateConsumerOffsets
                st.get_misses += 1
                tc.get_misses += 1
                return self._error(
                    conn, 404, r.opaque, f"Could not find message at position {r.offset}"
                )
            return conn.send(encode_result(301, r.opaque, Redirect(e.nearest).encode()))
        if sl is None:
            if r.max_wait_ms > 0:
                return self._park(conn, part, r)
            st.get_misses += 1
            tc.get_misses += 1
            return self._error(
                conn, 404, r.opaque, f"Could not find message at position {r.offset}"
            )
        st.get_bytes += sl.length
        tc.get_bytes += sl.length
        conn.send(encode_value_header(sl.length, r.opaque))
        conn.send(sl)

    @staticmethod
    def _not_shown_yet(part: Partition, offset: int) -> bool:
        """A get at an offset this broker wrote but does not show yet: a synchronous slave's
        own end, pushed to it before the slave's confirmation (or the group commit's fsync)
        made it visible here; a consumer that moved from a master to a slave still behind
        its cut, or read a slave before it restarted from an older cut. Nothing yet, not a
        divergence: the get waits (or finds nothing) instead of being sent back to the
        visible end."""
        return part.visible_end < offset <= part.end

    def _moved_past_end(self, r: Get) -> bool:
        """MetaQ answers a get beyond the end with 301 (to the end) only when
        ``updateConsumerOffsets`` is set or the offset is Long.MAX_VALUE; else 404."""
        return self.config.system.update_consumer_offsets or r.offset == LONG_MAX

    # ------------------------------------------------------------------ long poll

    def _park(self, conn: Connection, part: Partition, r: Get) -> None:
        """Hold a ``get`` (8-token form) until the partition has data or the wait ends.

        Its reply is queued only when it is ready, after whatever the connection was sent
        meanwhile: a parked fetch never holds back the replies to later requests on the same
        connection (a long-poll client matches replies by opaque, as the protocol allows).
        At most ``maxParkedGets`` per connection (503 beyond); released when it closes."""
        cap = self.config.system.max_parked_gets
        if len(conn.parked) >= cap:
            self.stats.parked_refused += 1
            return self._error(
                conn,
                503,
                r.opaque,
                f"too many parked gets on this connection (maxParkedGets={cap}): "
                "wait for their replies",
            )
        slot = PendingReplies(conn, r.partition)
        slot.items.append([r.opaque])
        wait_s = min(r.max_wait_ms, self.config.system.max_long_poll_wait_ms) / 1000.0
        entry: list[Any] = [conn, r, slot, None]
        entry[3] = self.loop.call_later(wait_s, self._unpark, part, entry, True)
        waiters = self._waiting.get(part)
        if waiters is None:
            waiters = self._waiting[part] = []
        waiters.append(entry)
        conn.parked[id(entry)] = (part, entry)
        part.waiting = True
        self.stats.parked_gets += 1

    def _unpark(self, part: Partition, entry: list[Any], expired: bool) -> None:
        conn, r, slot, timer = entry
        conn.parked.pop(id(entry), None)
        waiters = self._waiting.get(part)
        if waiters is not None and entry in waiters:
            waiters.remove(entry)
            if not waiters:
                del self._waiting[part]
                part.waiting = self.cuts.watching
        if not expired:
            timer.cancel()
        if slot.done:
            return
        try:
            sl = part.slice(r.offset, min(self.max_transfer, r.max_size), r.max_size)
        except OffsetOutOfRangeError as e:
            if self._not_shown_yet(part, r.offset):
                sl = None  # the wait ended before this master showed the slave's end
            else:
                slot.body = encode_result(301, r.opaque, Redirect(e.nearest).encode())
                return self._deliver(conn, slot)
        if sl is None:
            self.stats.get_misses += 1
            slot.body = encode_result(
                404,
                r.opaque,
                f"Could not find message at position {r.offset}".encode(),
            )
        else:
            # header now, bytes straight from the segment when the reply is written
            self.stats.get_bytes += sl.length
            slot.body = encode_value_header(sl.length, r.opaque)
            slot.tail = sl
        self._deliver(conn, slot)

    @staticmethod
    def _deliver(conn: Connection, slot: PendingReplies) -> None:
        slot.done = True
        if not conn.closed:
            conn.send(slot)

    def partition_visible(self, part: Partition) -> None:
        """Called when ``part``'s visible end advanced: answer the gets parked on it and the
        commits waiting until readers can see them."""
        waiting = self._waiting.get(part)
        if waiting:
            for entry in list(waiting):
                if entry[1].offset < part.visible_end:
                    self._unpark(part, entry, False)
        if self.transactions is not None:
            self.transactions.partition_visible(part)
        if self.queues is not None:
            self.queues.partition_visible(part.topic)
        self.cuts.visible()

    def _offset(self, conn: Connection, r: Offset) -> None:
        self.stats.cmd_offset += 1
        if r.topic.startswith("__") and not conn.replica:
            return self._denied(conn, r.opaque, f"offset on internal topic {r.topic!r}", "replica")
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if conn.replica and self.role == "slave" and r.offset >= part.visible_end:
            # the synchronous master's probe: where this copy ends, shown to readers or not
            # (they see the master's last consistent cut this slave reached)
            return conn.send(encode_result(200, r.opaque, OffsetReply(part.end).encode()))
        conn.send(encode_result(200, r.opaque, OffsetReply(part.nearest_offset(r.offset)).encode()))

    # ------------------------------------------------------------------ the rest

    def _other(self, conn: Connection, r: Request | ProtocolError) -> None:
        if isinstance(r, Version):
            conn.send(encode_result(200, r.opaque, __version__.encode()))
        elif isinstance(r, Stats):
            self._stats(conn, r)
        elif isinstance(r, Quit):
            conn.close_after_replies()
        elif isinstance(r, Auth):
            self._auth(conn, r)
        elif isinstance(r, Reload):
            if not conn.admin:
                return self._denied(conn, r.opaque, "reload", "admin")
            self._do_reload(conn, r)
        elif isinstance(r, Transaction) and self._writes_refused(conn, transaction=True):
            self._refuse_write(conn, r.opaque)
        elif isinstance(r, Transaction):
            if self.transactions is None:
                self._error(conn, 500, r.opaque, "transactions are not enabled on this broker")
            else:
                self.transactions.handle(conn, r)
        elif isinstance(r, Register):
            if self.transactions is None:
                self._error(conn, 500, r.opaque, "transactions are not enabled on this broker")
            elif not self._group_secret_ok(r):
                record_auth_failure(conn.peer)
                self._error(
                    conn, 403, r.opaque, f"register {r.group}: the group's secret is required"
                )
            else:
                self.transactions.register(conn, r)
        elif isinstance(r, DelayedPut):
            self._dput(conn, r)
        elif isinstance(
            r, QueueSubscribe | QueueAck | QueueUnsubscribe | QueueDeadLetters | QueueDelete
        ):
            if isinstance(r, QueueDeadLetters) and not conn.admin:
                return self._denied(conn, r.opaque, f"qdlq {r.action}", "admin")
            if isinstance(r, QueueDelete) and not conn.admin:
                return self._denied(conn, r.opaque, "qdel", "admin")
            if self.queues is None:
                self._error(conn, 500, r.opaque, "queues are not enabled on this broker")
            elif (fenced := self.queue_fence(conn)) is not None:  # automatic failover
                self._error(conn, 503, r.opaque, fenced)
            else:
                self.queues.handle(conn, r, self.role)
        elif isinstance(r, Claim):
            self._claim(conn, r)
        elif isinstance(r, MultiSync):
            self._msync(conn, r)
        elif isinstance(r, Sync):
            self._sync(conn, r)
        elif isinstance(r, Epoch):
            self._epoch(conn, r)
        elif isinstance(r, Promote):
            if not conn.admin:
                return self._denied(conn, r.opaque, "promote", "admin")
            if self.role == "master" or self.on_promote is None:
                self._error(conn, 400, r.opaque, "this broker is already a master")
            else:
                conn.send(encode_result(200, r.opaque, self.on_promote().encode()))

    # ------------------------------------------------------------------ delayed messages

    def _dput(self, conn: Connection, r: DelayedPut) -> None:

        self.stats.cmd_put += 1
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if not self._accept[r.topic][0]:
            return self._error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept publish")
        if len(r.body) > self.max_message:
            return self._error(
                conn, 400, r.opaque, f"message of {len(r.body)} bytes exceeds maxMessageSize"
            )
        crc = zlib.crc32(r.body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            return self._error(conn, 400, r.opaque, "checksum mismatch")
        if r.flag & FLAG_PROPERTIES and record_producer(r.flag, r.body) is not None:
            return self._error(conn, 400, r.opaque, _NOT_DELAYED)
        if self._writes_refused(conn):
            return self._refuse_write(conn, r.opaque)
        delay = self.delay
        dpart = self.store.get(DELAY_TOPIC, 0)
        if delay is None or dpart is None:
            return self._error(conn, 500, r.opaque, "delayed messages are not enabled")
        # deliverAt in the past (or 0) is due now: it neither skews the lateness figures nor
        # sits in the index; beyond maxDelay it is refused (it would pin __delay segments)
        now_ms = int(time.time() * 1000)
        max_delay = self.config.system.max_delay_ms
        if r.deliver_at_ms > now_ms + max_delay:
            return self._error(
                conn,
                400,
                r.opaque,
                f"deliverAt {r.deliver_at_ms} is more than maxDelay {max_delay} ms ahead",
            )
        env = encode_envelope(r.topic, r.partition, max(r.deliver_at_ms, now_ms), r.body)
        if r.tx_key is not None:
            if self.transactions is None:
                return self._error(conn, 500, r.opaque, "transactions are not enabled")
            put = Put(DELAY_TOPIC, 0, r.flag, -1, r.tx_key, r.opaque, env)
            return self.transactions.put(conn, put, zlib.crc32(env) & _CRC_MASK, r.partition)
        if self._pending:
            self.commit()
        msg_id = self.ids.next()
        rec = records.encode(msg_id, r.flag, env)
        try:
            off = dpart.append(rec, hold=self._holds)
        except NotifyError as e:
            code = 503 if isinstance(e, StoreFullError) else 500
            return self._error(conn, code, r.opaque, str(e))
        delay.add(off, r.deliver_at_ms)
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        group.body = encode_result(200, r.opaque, PutAck(msg_id, r.partition, -1).encode())
        conn.send(group)
        self._await_all(
            [group],
            self.flusher.after_append(dpart, 1),
            self.sync_master.replicate(dpart, off, rec, 1) if self.sync_master else None,
        )

    # ------------------------------------------------------------------ replication (slave side)

    def _msync(self, conn: Connection, r: MultiSync) -> None:
        if self.role != "slave":
            return self._error(conn, 403, r.opaque, "msync: this broker is not a slave")
        if not conn.replica:  # only the master, authenticated with replicationSecret
            return self._denied(conn, r.opaque, "msync", "replica")
        if r.topic in LOG_STREAMS:
            return self._msync_redo(conn, r)
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        err = self._check_records(r.records, r.count)
        buf = bytearray(r.records)
        if err:
            return self._error(conn, 400, r.opaque, f"msync: {err}")
        end = part.end
        if not buf and r.base_offset < end:  # the master took back puts it refused
            try:
                part.rollback_to(max(r.base_offset, part.min_offset))
                self.store.write_recovery_points()  # none may point past the cut
            except (NotifyError, OSError) as e:
                return self._error(conn, 500, r.opaque, f"msync: cutting back failed: {e}")
            self.taken_back(part, r.base_offset)
            log.warning("%s-%d cut back to the master's end %d", r.topic, r.partition, part.end)
            return conn.send(encode_result(200, r.opaque, OffsetReply(part.end).encode()))
        if r.base_offset > end:
            return conn.send(encode_result(301, r.opaque, Redirect(end).encode()))  # behind
        if r.base_offset < end:
            have = part.read_raw(r.base_offset, len(buf))
            if have == bytes(buf):
                return conn.send(encode_result(200, r.opaque, OffsetReply(end).encode()))  # here
            return self._error(
                conn, 500, r.opaque, f"msync: slave diverges from the master at {r.base_offset}"
            )
        try:
            base = part.end
            part.append(buf)
        except NotifyError as e:
            return self._error(conn, 500, r.opaque, str(e))
        self.producers.observe(part, buf, base)  # a promoted slave knows the producers
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        group.body = encode_result(200, r.opaque, OffsetReply(part.end).encode())
        conn.send(group)
        self._await_all([group], self.flusher.after_append(part, r.count), None)

    def _get_redo(self, conn: Connection, r: Get) -> None:
        """A slave pulls the redo log: ``get __txlog <group> <fileNo> <offset> <maxSize>``;
        200 = whole frames, 301 = continue at the start of segment ``<body>``, 404 = none
        yet (see :mod:`notify.replication.redo`). ``get __delaylog ...`` and ``get
        __queuelog ...``: the same for the delay queue's and the queues' logs."""
        src = self.stream_log(r.topic)
        if src is None:
            return self._error(conn, 404, r.opaque, f"no {r.topic} log on this broker")
        try:
            data, nxt = src.read_frames(
                Position(r.partition, r.offset), min(r.max_size, self.max_transfer)
            )
        except TxLogError as e:
            return self._error(conn, 500, r.opaque, f"redo log: {e}")
        if nxt is not None:
            return conn.send(encode_result(301, r.opaque, b"%d" % nxt.file_no))
        if not data:
            return self._error(conn, 404, r.opaque, "no redo frames at this position yet")
        conn.send(encode_value_header(len(data), r.opaque) + data)

    def _msync_redo(self, conn: Connection, r: MultiSync) -> None:
        """The synchronous master pushes redo frames; answered after this slave forced them
        (one fdatasync for every push of a loop turn); 301 = behind, the pull catches up."""
        rr = self.stream_replica(r.topic)
        if rr is None:
            return self._error(conn, 500, r.opaque, f"msync: this slave keeps no {r.topic} log")
        at = Position(r.partition, r.base_offset)
        try:
            rr.append(at, r.records)
        except RedoBehindError:
            return conn.send(encode_result(301, r.opaque, b"%d %d" % rr.end))
        except TxLogError as e:
            return self._error(conn, 500, r.opaque, f"msync: {e}")
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        self._redo_acks.append((group, rr))
        if len(self._redo_acks) == 1:
            self.loop.call_soon(self._force_redo)
        conn.send(group)

    def stream_log(self, stream: str) -> TxLog | None:
        """The log a replicated stream reads from on this broker (None: none here)."""
        if stream == DELAYLOG_STREAM:
            return self.delay.log if self.delay is not None else None
        if stream == QUEUELOG_STREAM:
            return self.queues.log if self.queues is not None else None
        return self.transactions.log if self.transactions is not None else None

    def stream_replica(self, stream: str) -> ReplicaRedo | None:
        """This slave's copy of its master's log ``stream`` (None on a master)."""
        if stream == DELAYLOG_STREAM:
            return self.delay.replica_log if self.delay is not None else None
        if stream == QUEUELOG_STREAM:
            return self.queues.replica_log if self.queues is not None else None
        return self.redo_replica

    def _force_redo(self) -> None:
        acks, self._redo_acks = self._redo_acks, []
        failed: dict[int, str] = {}
        for rr in {id(rr): rr for _g, rr in acks}.values():  # one fsync per log
            try:
                if rr.log.closed:
                    raise TxLogError("this broker no longer keeps that replica log")
                rr.log.sync()
            except TxLogError as e:
                failed[id(rr)] = str(e)
        for g, rr in acks:
            if id(rr) in failed:
                g.fail(500, f"msync: forcing the replica log failed: {failed[id(rr)]}")
            else:
                g.body = encode_result(200, g.items[0][0], b"%d %d" % rr.end)
                g.resolve()

    def _sync(self, conn: Connection, r: Sync) -> None:
        """MetaQ's single-message ``sync``: append one record with the master's id."""
        if self.role != "slave":
            return self._error(conn, 403, r.opaque, "sync: this broker is not a slave")
        if not conn.replica:
            return self._denied(conn, r.opaque, "sync", "replica")
        part = self._lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        crc = zlib.crc32(r.body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            return self._error(conn, 400, r.opaque, "sync: checksum mismatch")
        try:
            rec = records.encode(r.msg_id, r.flag, r.body, crc)
            off = part.append(rec)
        except NotifyError as e:
            return self._error(conn, 500, r.opaque, str(e))
        if r.flag & FLAG_PROPERTIES:
            self.producers.observe(part, rec, off)
        conn.send(encode_result(200, r.opaque, PutAck(r.msg_id, r.partition, off).encode()))

    def _tx_put(self, conn: Connection, r: Put, crc: int) -> None:
        if self.transactions is None:
            return self._error(conn, 500, r.opaque, "transactions are not enabled on this broker")
        self.transactions.put(conn, r, crc)

    def _tx_mput(self, conn: Connection, r: MultiPut, buf: bytearray) -> None:
        if self.transactions is None:
            return self._error(conn, 500, r.opaque, "transactions are not enabled on this broker")
        self.transactions.mput(conn, r, buf)

    def _auth(self, conn: Connection, r: Auth) -> None:
        """``auth <secret>``: the secret selects the role (README "Security"):
        ``adminSecret`` -> admin (and produce/consume), ``authSecret`` -> produce/consume
        (and admin when no adminSecret is set), ``replicationSecret`` -> replica (a broker
        of the replication set: produce/consume, internal topics, msync/sync)."""
        sysc = self.config.system
        if not (sysc.auth_secret or sysc.admin_secret or sysc.replication_secret):
            conn.grant(True, True, False)
            return conn.send(encode_result(200, r.opaque, b"authentication not required"))
        given = r.secret.encode()

        def match(secret: str) -> bool:
            return bool(secret) and hmac.compare_digest(given, secret.encode())

        if match(sysc.admin_secret):
            conn.grant(True, True, conn.replica)
            return conn.send(encode_result(200, r.opaque, b"ok role=admin"))
        if match(sysc.auth_secret):
            admin = conn.admin or not sysc.admin_secret
            conn.grant(True, admin, conn.replica)
            return conn.send(encode_result(200, r.opaque, b"ok role=admin" if admin else b"ok"))
        if match(sysc.replication_secret):
            # the link also names the broker id it replicates: a slave takes writes only from
            # its own master (same brokerId, as in MetaQ), a master serves its own slaves
            if r.broker_id != sysc.broker_id:
                self.stats.denied += 1
                log.warning(
                    "replica auth from %s for broker %s refused: this is broker %d",
                    conn.peer,
                    r.broker_id,
                    sysc.broker_id,
                )
                conn.send(
                    encode_result(
                        403,
                        r.opaque,
                        b"replica auth must name this broker's id %d" % sysc.broker_id,
                    )
                )
                return conn.close_after_replies()
            if self.epoch and (r.epoch or 0) < self.epoch:  # a replaced master, or behind
                self.stats.denied += 1
                conn.send(
                    encode_result(
                        403,
                        r.opaque,
                        b"replica auth in failover epoch %d refused: this broker is in epoch %d"
                        % (r.epoch or 0, self.epoch),
                    )
                )
                return conn.close_after_replies()
            if r.epoch and r.epoch > self.epoch and self.saw_epoch is not None:
                self.saw_epoch(r.epoch)  # this broker may have been replaced: fence now
            conn.grant(True, conn.admin, True)
            ack = encode_replica_ack(sysc.broker_id, self.epoch)
            return conn.send(encode_result(200, r.opaque, ack))
        record_auth_failure(conn.peer)  # counted in /metrics; rate-limited log lines
        conn.send(encode_result(403, r.opaque, b"authentication failed"))
        conn.close_after_replies()

    def _do_reload(self, conn: Connection, r: Reload) -> None:
        if self._reload is None:
            return self._error(conn, 500, r.opaque, "reload is not available")
        try:
            summary = self._reload()
        except NotifyError as e:
            return self._error(conn, 500, r.opaque, f"reload failed, config unchanged: {e}")
        conn.send(encode_result(200, r.opaque, summary.encode()))

    def _stats(self, conn: Connection, r: Stats) -> None:
        item = r.item or ""
        st = self.stats
        items: list[tuple[str, object]]
        if item == "":
            items = [
                ("version", __version__),
                ("broker_id", self.config.system.broker_id),
                *st.system(),
                ("topics", len(self._topic_parts)),
                ("parked_gets_current", sum(map(len, self._waiting.values()))),
                ("idempotent_duplicates", self.producers.duplicates),
                ("idempotent_evicted", self.producers.evicted),
                ("idempotent_refused", self.producers.refused),
                ("idempotent_fenced", self.producers.fenced),
                ("producer_state_bytes", self.producers.bytes),
                ("producer_identities_named", len(self.producers.named)),
                ("fsyncs", self.flusher.fsyncs),
                ("fsync_seconds", round(self.flusher.fsync_seconds, 3)),
            ]
            if self.transactions is not None:
                items += self.transactions.stats_items()
            if self.delay is not None:
                items += self.delay.stats_items()
            if self.sync_master is not None:
                items += self.sync_master.stats_items()
            elif self.replication_stats is not None:
                items += self.replication_stats()
            if self.failover_stats is not None:
                items += self.failover_stats()
        elif item == "topics":
            items = []
            for t, parts in sorted(self._topic_parts.items()):
                tc = st.topic(t)
                pub, sub = self._accept[t]
                size = sum(p.size_bytes for p in parts)
                items.append(
                    (
                        t,
                        f"partitions={len(parts)} bytes={size} put_messages={tc.put_messages} "
                        f"put_bytes={tc.put_bytes} get_requests={tc.get_requests} "
                        f"accept_publish={str(pub).lower()} accept_subscribe={str(sub).lower()}",
                    )
                )
        elif item == "offsets":
            items = [
                (
                    f"{t}-{p.index}",
                    f"min_offset={p.min_offset} max_offset={p.visible_end} "
                    f"flushed_offset={p.flushed_end} segments={len(p.segments)}",
                )
                for t, parts in sorted(self._topic_parts.items())
                for p in parts
            ]
        elif item == "realtime":
            items = st.realtime()
        elif item == "queues":
            items = self.queues.stats_items() if self.queues is not None else []
        elif item == "producers":  # named identities' holders: replicas and admins
            if not (conn.replica or conn.admin):
                return self._denied(conn, r.opaque, "stats producers", "admin")
            items = self.producers.newest_holders()
        elif item == "config":
            return self._stats_config(conn, r)
        elif item == "reset":
            if not conn.admin:
                return self._denied(conn, r.opaque, "stats reset", "admin")
            st.reset()
            items = [("reset", "ok")]
        elif item == "help":
            items = [(i or "(empty)", "") for i in (*STATS_ITEMS, "<topic>")]
        elif item in self._topic_parts:
            parts = self._topic_parts[item]
            tc = st.topic(item)
            items = [
                ("topic", item),
                ("partitions", len(parts)),
                ("put_messages", tc.put_messages),
                ("put_bytes", tc.put_bytes),
                ("put_failed", tc.put_failed),
                ("get_requests", tc.get_requests),
                ("get_misses", tc.get_misses),
                ("get_bytes", tc.get_bytes),
            ] + [(f"partition.{p.index}", f"min={p.min_offset} max={p.visible_end}") for p in parts]
        else:
            # MetaQ reads any other item as a topic: 200, resultCode 1 = no such topic
            items = [
                (item, None),
                ("resultCode", 1),
                ("partitions", 0),
                ("message_count", 0),
                ("bytes", 0),
            ]
        conn.send(encode_result(200, r.opaque, encode_stats_body(items)))

    def _stats_config(self, conn: Connection, r: Stats) -> None:
        """MetaQ's ``stats config``: the server.ini text as loaded (see ``served_config``),
        which a MetaQ async slave with ``autoSyncMasterConfig`` loads as its own ini."""
        text = served_config(self.config)
        if text is None:
            return self._error(conn, 500, r.opaque, "this broker was not started from a file")
        conn.send(encode_result(200, r.opaque, text))

