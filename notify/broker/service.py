"""Request handling: the broker's connections and the dispatch of each decoded request.

:class:`BrokerService` is the :class:`~notify.broker.context.BrokerContext` (state shared by
every verb) plus the dispatch: each chunk of requests a connection read is run through the
:class:`~notify.broker.dispatch.VerbTable` of the connection's role, whose handlers live in
:mod:`notify.broker.handlers`:

=============================  ==========================================================
``handlers.put``               ``put``, ``mput``, delayed ``put``; per-partition batches
                               and their commit (one buffer, one write per partition)
``handlers.fetch``             ``get``, ``offset``; long-poll parking
``handlers.tx``                ``transaction``, ``register``; one-shot local transactions
``handlers.replica``           ``msync``, ``sync``, the replicated logs' ``get``
``handlers.producer``          ``producer`` (identity claims), ``epoch``; idempotent puts'
                               checks and retried batches
``handlers.queue``             ``qsub``, ``qack``, ``qunsub``, ``qdlq``, ``qdel``
``handlers.admin``             ``auth``, ``version``, ``quit``, ``stats``, ``reload``,
                               ``promote``
=============================  ==========================================================

Puts are collected per partition and written by one commit round per loop turn, for every
connection read in it (or earlier, when a request of another kind needs them written first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, get_args

from notify.broker.connection import Connection
from notify.broker.context import BrokerContext
from notify.broker.dispatch import AnyHandler, VerbTable
from notify.broker.handlers.admin import AdminVerbs
from notify.broker.handlers.fetch import FetchVerbs
from notify.broker.handlers.producer import ProducerVerbs
from notify.broker.handlers.put import PutVerbs
from notify.broker.handlers.queue import QueueVerbs
from notify.broker.handlers.replica import ReplicaVerbs
from notify.broker.handlers.tx import TxVerbs
from notify.config import ServerConfig
from notify.core.effects import Applied
from notify.errors import ProtocolError
from notify.fdbudget import connection_budget
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
)
from notify.protocol.identity import Claim
from notify.replication.redo import ReplicaRedo
from notify.store.flusher import Flusher
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.txlog import TxLog

#: the index of a connection's verb table: by its roles
UNAUTHENTICATED, AUTHENTICATED, ADMIN = 0, 1, 2


class BrokerService(BrokerContext):
    """The broker's connections and request dispatch over a :class:`MessageStore`."""

    def __init__(
        self,
        config: ServerConfig,
        store: MessageStore,
        flusher: Flusher,
        loop: asyncio.AbstractEventLoop,
        reload: Callable[[], str] | None = None,
    ):
        super().__init__(config, store, flusher, loop, reload)
        #: TLS handshakes in progress (they count toward maxConnections: tlsaccept.py)
        self.handshaking = 0
        #: connections the file descriptors allow (see _fds_allow), and when worked out
        self._fd_budget = 0
        self._fd_budget_at = float("-inf")
        self.producer = ProducerVerbs(self)
        self.puts = PutVerbs(self, self.producer)
        self.replica = ReplicaVerbs(self, self.puts)
        self.fetch = FetchVerbs(self, self.replica)
        self.tx = TxVerbs(self, self.puts)
        self.queue = QueueVerbs(self)
        self.admin = AdminVerbs(self)
        self._tables = self._build_tables()
        self._put = self._tables[AUTHENTICATED][Put]
        self._tx = self._tables[AUTHENTICATED][Transaction]
        self.refresh_topics()

    # ------------------------------------------------------------------ verb tables

    def _build_tables(self) -> tuple[VerbTable, VerbTable, VerbTable]:
        """One table per role: unauthenticated, authenticated, admin."""
        stats = self.stats

        def counted(fn: Callable[[Connection, Any], None]) -> AnyHandler:
            """Verbs other than put, mput, get and offset count in ``cmd_other``."""

            def handler(conn: Connection, r: Any) -> None:
                stats.cmd_other += 1
                fn(conn, r)

            return handler

        unauth = VerbTable(self._refuse_unauthenticated, self._unknown)
        for kind in get_args(Request):
            unauth[kind] = self._auth_required
        unauth.on(Auth, counted(self.admin.auth))
        unauth.on(Quit, counted(self.admin.quit))

        user = VerbTable(self._protocol_error, self._unknown)
        user.on(Put, self.puts.put)
        user.on(MultiPut, self.puts.mput)
        user.on(Get, self.fetch.get)
        user.on(Offset, self.fetch.offset)
        user.on(Transaction, counted(self.tx.transaction))
        user.on(Register, counted(self.tx.register))
        user.on(DelayedPut, counted(self.puts.dput))
        user.on(Claim, counted(self.producer.claim))
        user.on(Epoch, counted(self.producer.epoch))
        user.on(MultiSync, counted(self.replica.msync))
        user.on(Sync, counted(self.replica.sync))
        user.on(Version, counted(self.admin.version))
        user.on(Stats, counted(self.admin.stats))
        user.on(Quit, counted(self.admin.quit))
        user.on(Auth, counted(self.admin.auth))
        user.on(QueueSubscribe, counted(self.queue.queue))
        user.on(QueueAck, counted(self.queue.queue))
        user.on(QueueUnsubscribe, counted(self.queue.queue))
        admin = VerbTable(self._protocol_error, self._unknown)
        admin.update(user)
        # the admin verbs: refused by role for everyone else
        user.on(Reload, counted(self.admin.reload_denied))
        user.on(Promote, counted(self.admin.promote_denied))
        user.on(QueueDeadLetters, counted(self.queue.dead_letters_denied))
        user.on(QueueDelete, counted(self.queue.delete_denied))
        admin.on(Reload, counted(self.admin.reload))
        admin.on(Promote, counted(self.admin.promote))
        admin.on(QueueDeadLetters, counted(self.queue.queue))
        admin.on(QueueDelete, counted(self.queue.queue))
        return unauth, user, admin

    def verbs(self, conn: Connection) -> VerbTable:
        """The table serving ``conn`` now (its roles change with ``auth``)."""
        return self._tables[ADMIN if conn.admin else AUTHENTICATED if conn.authenticated else 0]

    def _auth_required(self, conn: Connection, r: Any) -> None:
        opaque = getattr(r, "opaque", 0)
        conn.send(encode_result(403, opaque, b"authentication required: send auth first"))

    def _refuse_unauthenticated(self, conn: Connection, r: ProtocolError) -> None:
        if r.fatal:  # framing lost: answer and close, authenticated or not
            conn.send(encode_error(r))
            conn.close_after_replies()
        else:
            self._auth_required(conn, r)

    def _protocol_error(self, conn: Connection, r: ProtocolError) -> None:
        self.stats.protocol_errors += 1
        conn.send(encode_error(r))
        if r.fatal:
            conn.close_after_replies()

    def _unknown(self, conn: Connection, r: Any) -> None:
        self.error(conn, 500, getattr(r, "opaque", 0), f"no handler for {type(r).__name__}")

    # ------------------------------------------------------------------ dispatch

    def handle(self, conn: Connection, reqs: list[Request | ProtocolError]) -> None:
        """Serve one chunk of requests a connection read, in order."""
        table = self._tables[ADMIN if conn.admin else AUTHENTICATED if conn.authenticated else 0]
        put = self._put
        tx = self._tx
        puts = self.puts
        i = 0
        n = len(reqs)
        while i < n:
            r = reqs[i]
            i += 1
            fn = table[type(r)]
            if fn is put:
                fn(conn, r)
                continue
            if puts.pending:
                puts.commit()
            if fn is tx and i < n - 1 and r.type == "BEGIN":  # type: ignore[union-attr]
                end = self.tx.oneshot(conn, reqs, i - 1)
                if end:
                    self.stats.cmd_other += 1  # the BEGIN
                    i = end
                    continue
            fn(conn, r)
            if conn.closing:
                break
            if type(r) is Auth:  # the connection's roles may have changed
                table = self.verbs(conn)
        if puts.pending and not puts.scheduled:
            # with the puts other connections' reads of this loop turn add, in one append
            # per partition, and answered in this turn when the flush policy needs no fsync
            puts.commit_soon()

    def commit(self) -> None:
        """Write every pending put (one buffer and one write per partition)."""
        self.puts.commit()

    # ------------------------------------------------------------------ topics

    def refresh_topics(self) -> None:
        """Re-read the topic table from the store (after a config reload)."""
        for part in self.store.all_partitions():
            part.on_visible = self.partition_visible
            if self.cuts.watching:
                part.waiting = True
        self.topic_parts = {t: self.store.topic_partitions(t) for t in self.store.topics}
        self.accept = {
            t: (c.accept_publish, c.accept_subscribe) for t, c in self.store.topics.items()
        }
        self.publish_parts = {t: p for t, p in self.topic_parts.items() if self.accept[t][0]}

    def partition_visible(self, part: Partition) -> None:
        """Called when ``part``'s visible end advanced: answer the gets parked on it and the
        commits waiting until readers can see them."""
        self.fetch.visible(part)
        if self.transactions is not None:
            self.transactions.partition_visible(part)
        if self.queues is not None:
            self.queues.partition_visible(part.topic)
        self.cuts.visible()

    def transaction_applied(self, eff: Applied) -> None:
        """A committed transaction reached its partitions: count it; index delayed messages."""
        self.puts.transaction_applied(eff)

    def taken_back(self, part: Partition, offset: int) -> None:
        """Refused puts from ``offset`` on were cut from ``part``: forget what indexed them."""
        self.replica.taken_back(part, offset)

    def stream_log(self, stream: str) -> TxLog | None:
        """The log a replicated stream reads from on this broker (None: none here)."""
        return self.replica.stream_log(stream)

    def stream_replica(self, stream: str) -> ReplicaRedo | None:
        """This slave's copy of its master's log ``stream`` (None on a master)."""
        return self.replica.stream_replica(stream)

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
            http = sysc.http.max_connections if sysc.dashboard_http_port else 0
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
        self.fetch.connection_closed(conn)
        if conn.producers:
            self.producers.release(conn.producers)
        self.cuts.closed(conn)
        if self.transactions is not None:
            self.transactions.connection_closed(conn)
        if self.queues is not None:
            self.queues.connection_closed(conn)
