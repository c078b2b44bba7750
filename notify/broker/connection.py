"""One client connection: the only place the broker reads and writes sockets.

Input: every ``data_received`` chunk goes through the sans-IO :class:`RequestParser` and the
whole list of requests is handed to the service at once (pipelining costs one callback per
chunk, not per message).

Output: an ordered queue of reply items. An item is ready bytes, a :class:`PendingReplies`
(put replies waiting for their append and, under group commit, their fsync) or a
:class:`~notify.store.partition.Slice` of a segment file, sent with ``os.sendfile`` straight
from the page cache when the transport's buffer is empty (zero copy) and copied otherwise.
Items leave in queue order, so a client that does not pipeline sees replies in request
order; put replies of one pipelined chunk are grouped per partition.

Back-pressure: the connection stops reading while the transport's write buffer is past its
high-water mark (a slow consumer) and while more than ``maxQueuedReplies`` replies wait in
its queue (a client pipelining requests without reading replies, or replies waiting for an
fsync); it reads again once the queue is down to half. Either way memory stays bounded.

Deadlines (``[system]`` settings, re-read on reload, one timer per connection): a connection
that must authenticate and has not within ``authTimeout`` ms is closed; a frame (header and
body) must complete within ``frameTimeout`` ms of its first byte; a connection that sent
nothing and was sent nothing for ``idleTimeout`` ms (default 5 minutes), and waits for
nothing, is closed. Waiting means: replies queued, a long-poll get parked, a transaction
open, a queue subscription (``qsub``: pushes may be minutes apart) or a replication link
(``replica`` role). Clients keep an idle connection alive with a cheap request: notify's
send ``version`` after ``heartbeat_interval_s`` (30 s) without one, MetaQ's Java client
(Gecko) after 10 s.

Roles: ``authenticated`` (may produce and consume), ``admin`` (``reload``, ``promote``,
``stats reset``, resolving other connections' transactions) and ``replica`` (a broker of the
same replication set: reads internal topics, writes to a slave with ``msync``/``sync``); see
:mod:`notify.broker.handlers.admin` for which secret grants which.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections import deque
from typing import Any, Protocol, cast

from notify.broker.idempotence import Holder
from notify.broker.stats import BrokerStats
from notify.config import ServerConfig
from notify.errors import ProtocolError
from notify.protocol.frames import RequestParser, encode_error, encode_result
from notify.protocol.replies import encode_put_ack, encode_put_acks
from notify.store.partition import Partition, Slice


class ConnectionHost(Protocol):
    """What a connection needs from the broker it serves (the service implements it)."""

    config: ServerConfig
    loop: asyncio.AbstractEventLoop
    stats: BrokerStats

    def connection_opened(self, conn: Connection) -> bool: ...

    def connection_closed(self, conn: Connection) -> None: ...

    def handle(self, conn: Connection, reqs: list[Any]) -> None: ...

log = logging.getLogger("notify.broker")


class PendingReplies:
    """Replies to the puts of one connection to one partition in one commit round."""

    __slots__ = ("body", "conn", "done", "error", "items", "partition", "tail")

    def __init__(self, conn: Connection, partition: int):
        self.conn = conn
        self.partition = partition
        # per put: [opaque, payload, crc, flag, msg_id, offset]; ids/offsets filled at commit
        self.items: list[list[Any]] = []
        self.done = False
        self.error: ProtocolError | None = None
        self.body: bytes | None = None  # a ready-made reply (mput)
        self.tail: Slice | None = None  # file bytes sent after ``body`` (a parked get)

    def render(self) -> bytes:
        if self.error is not None:
            err = self.error
            return b"".join(
                encode_error(ProtocolError(str(err), err.code, it[0])) for it in self.items
            )
        if self.body is not None:
            return self.body
        if len(self.items) == 1:  # a lone put
            it = self.items[0]
            return encode_put_ack(self.partition, it[0], it[4], it[5])
        return encode_put_acks(self.partition, ((it[0], it[4], it[5]) for it in self.items))

    def resolve(self) -> None:
        self.done = True
        self.conn.schedule_pump()

    def fail(self, code: int, message: str) -> None:
        self.error = ProtocolError(message, code)
        self.done = True
        self.conn.schedule_pump()


OutItem = bytes | PendingReplies | Slice


class Connection(asyncio.Protocol):
    """asyncio protocol for one client; requests go to the shared :class:`BrokerService`."""

    def __init__(self, service: ConnectionHost):
        self.service = service
        sysc = service.config.system  # read per connection: a reload applies to the next one
        self.parser = RequestParser(
            sysc.max_message_size,
            max_batch_bytes=sysc.max_batch_size,
            max_header_bytes=sysc.max_header_size,
        )
        #: queued reply bytes past which reading pauses (``writeBufferSize``; resumes at 1/4)
        self._write_high = sysc.write_buffer_size
        self.out: deque[OutItem] = deque()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closing = False
        self.closed = False
        self.authenticated = not sysc.auth_secret
        #: no adminSecret: whoever may produce may also administer (as before roles)
        self.admin = self.authenticated and not sysc.admin_secret
        #: never implicit: only ``auth <replicationSecret> <brokerId>`` naming this broker's
        #: replication set grants it (writes into a slave, internal topics, the redo log)
        self.replica = False
        self.parser.bodies_allowed = self.authenticated
        #: the reply group of each partition this connection put to in the current round
        self.open_groups: dict[Partition, PendingReplies] = {}
        self.session: set[str] | None = None  # keys of the transactions this connection began
        self.producer_group = ""  # set by the ``register`` extension
        #: idempotent producer identities claimed on this connection (``producer`` verb):
        #: id -> the holder it was given (notify.broker.idempotence)
        self.producers: dict[str, Holder] = {}
        #: the newest failover epoch of this broker's group the client declared (``epoch``
        #: extension; 0 = none): a master in an older epoch refuses this connection's writes
        self.client_epoch = 0
        #: id(entry) -> (partition, entry) of the long-poll gets parked for this connection
        self.parked: dict[int, tuple[Any, list[Any]]] = {}
        #: queue groups this connection consumes (``qsub``; kept by the QueueManager)
        self.queue_subscriptions = 0
        #: replies queued and not yet handed to the transport (a put group counts each put)
        self.queued = 0
        self._fd = -1
        self._reading_paused = False
        self._writing_paused = False
        self._queue_full = False
        self._pump_scheduled = False
        #: inside ``data_received``: a pump asked for runs at its end, in the same loop turn
        self.receiving = False
        self._pump_wanted = False
        self._opened_at = 0.0
        self._time = service.loop.time
        self._last_io = 0.0  # the last byte in either direction (``idleTimeout``)
        self._frame_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def grant(self, authenticated: bool, admin: bool, replica: bool) -> None:
        """Set this connection's roles (``auth``): bodies are accepted once authenticated."""
        self.authenticated = authenticated
        self.admin = admin
        self.replica = replica
        self.parser.bodies_allowed = authenticated

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = t = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        # TLS: the bytes must go through the SSL object, never sendfile'd in clear
        tls = transport.get_extra_info("ssl_object") is not None
        self._fd = sock.fileno() if sock is not None and not tls else -1
        t.set_write_buffer_limits(self._write_high, self._write_high // 4)
        if not self.service.connection_opened(self):
            self.closing = True
            self.closed = True
            t.write(encode_error(ProtocolError("too many connections, try again later", 503)))
            t.close()
            return
        self._opened_at = self._last_io = self.service.loop.time()
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        parser = self.parser
        reqs = parser.feed(data)
        if reqs:
            self.receiving = True
            try:
                self.service.handle(self, reqs)
            finally:
                self.receiving = False
                if self._pump_wanted:  # replies ready now: written this turn
                    self._pump_wanted = False
                    self.pump()
            if parser.closed and not self.closing:  # (framing is lost only in a feed that
                self.close_after_replies()  # returns the fatal error): nothing more can be read
        now = self._time()
        self._last_io = now
        if parser.in_frame:
            if reqs or self._frame_since is None:  # a new frame started in this chunk
                self._frame_since = now
                if self._timer is None:
                    self._arm()
        else:
            self._frame_since = None
        if self.queued > self.service.config.system.max_queued_replies:
            self._queue_full = True
            self._set_reading()

    def eof_received(self) -> bool | None:
        self.closing = True
        self.pump()
        return True  # keep the transport open until our replies are written

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.closing = True
        self.out.clear()
        self.queued = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.service.connection_closed(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._set_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._set_reading()
        self.pump()

    def _set_reading(self) -> None:
        """Read only while the client drains its replies and few enough wait in the queue."""
        t = self.transport
        if t is None or self.closed:
            return
        pause = self._writing_paused or self._queue_full
        if pause and not self._reading_paused:
            self._reading_paused = True
            t.pause_reading()
        elif not pause and self._reading_paused and not self.closing:
            self._reading_paused = False
            t.resume_reading()
            if self._frame_since is not None:  # our pause is not the client's slowness
                self._frame_since = self.service.loop.time()
                self._arm()

    # ------------------------------------------------------------------ deadlines

    def _arm(self) -> None:
        """Schedule the check of this connection's deadlines at the earliest one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.closed:
            return
        sysc = self.service.config.system
        now = self.service.loop.time()
        due: list[float] = []
        if not self.authenticated and sysc.auth_timeout_ms:
            due.append(self._opened_at + sysc.auth_timeout_ms / 1000.0)
        if self._frame_since is not None and not self._reading_paused and sysc.frame_timeout_ms:
            due.append(self._frame_since + sysc.frame_timeout_ms / 1000.0)
        if sysc.idle_timeout_ms:
            idle_s = sysc.idle_timeout_ms / 1000.0
            at = self._last_io + idle_s
            # silent but waiting (a parked get, a subscription...): look again in idle_s; a
            # wait mostly ends with a write (the answer, a push) that restarts the count
            due.append(at if at > now else now + idle_s)
        if due:
            self._timer = self.service.loop.call_at(min(due) + 0.001, self._deadline)

    def _deadline(self) -> None:
        self._timer = None
        if self.closed:
            return
        sysc = self.service.config.system
        now = self.service.loop.time()
        why = ""
        if (
            not self.authenticated
            and sysc.auth_timeout_ms
            and now - self._opened_at >= sysc.auth_timeout_ms / 1000.0
        ):
            why = f"not authenticated within authTimeout {sysc.auth_timeout_ms} ms"
        elif (
            self._frame_since is not None
            and not self._reading_paused
            and sysc.frame_timeout_ms
            and now - self._frame_since >= sysc.frame_timeout_ms / 1000.0
        ):
            why = f"incomplete frame for longer than frameTimeout {sysc.frame_timeout_ms} ms"
        elif (
            sysc.idle_timeout_ms
            and now - self._last_io >= sysc.idle_timeout_ms / 1000.0
            and not self.out
            and not self.parked
            and not self.session
            and not self.queue_subscriptions
            and not self.replica
        ):
            log.info(
                "closing idle connection %s (idleTimeout %d ms)", self.peer, sysc.idle_timeout_ms
            )
            self.service.stats.connections_timed_out += 1
            self._hard_close(b"")
            return
        if why:
            log.info("closing connection %s: %s", self.peer, why)
            self.service.stats.connections_timed_out += 1
            self._hard_close(encode_result(408, 0, why.encode()))
            return
        self._arm()

    def hard_close(self, last: bytes) -> None:
        """Close now, with ``last`` as a last word if the client is reading."""
        self._hard_close(last)

    def _hard_close(self, last: bytes) -> None:
        """Close now: a last word if the client is reading, abort if it is not."""
        t = self.transport
        self.closing = True
        if t is None:
            return
        if self._writing_paused:
            t.abort()
            return
        self.out.clear()
        self.queued = 0
        if last:
            t.write(last)
        t.close()

    # ------------------------------------------------------------------ output

    def send(self, item: OutItem) -> None:
        """Queue a reply item; written as soon as everything before it is ready.

        Replies produced while a chunk of requests is handled are written when its
        handling ends (one ``write`` for all of them, in the same loop turn); others
        (a flush or a slave confirming later) at the next loop turn. A reply slot not
        filled yet asks for no write: filling it does."""
        self.out.append(item)
        self.queued += 1
        if type(item) is not PendingReplies or item.done:
            self.schedule_pump()

    def schedule_pump(self) -> None:
        if self.receiving:
            self._pump_wanted = True
            return
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.service.loop.call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def close_after_replies(self) -> None:
        self.closing = True
        self.pump()

    def pump(self) -> None:
        """Write every ready item at the head of the queue, in order."""
        t = self.transport
        if t is None or self.closed:
            return
        out = self.out
        if out:  # bytes to the client count as activity (the answer to a long poll...)
            self._last_io = self._time()
        chunks: list[bytes] = []
        while out:
            if self._writing_paused:
                break  # the client is not reading: keep the rest queued (resume_writing pumps)
            item = out[0]
            if type(item) is PendingReplies:
                if not item.done:
                    break
                self.queued -= len(item.items) or 1
                chunks.append(item.render())
                if item.tail is not None:
                    t.write(b"".join(chunks))
                    chunks = []
                    self._send_slice(item.tail)
            elif type(item) is bytes:
                chunks.append(item)
                self.queued -= 1
            else:
                assert isinstance(item, Slice)
                self.queued -= 1
                if chunks:
                    t.write(b"".join(chunks))
                    chunks = []
                self._send_slice(item)
            out.popleft()
        if chunks:
            t.write(b"".join(chunks))
        if self._queue_full and self.queued <= self.service.config.system.max_queued_replies // 2:
            self._queue_full = False
            self._set_reading()
        if self.closing and not out and not self.closed:
            t.close()

    def _send_slice(self, sl: Slice) -> None:
        t = self.transport
        assert t is not None
        pos, left = sl.file_pos, sl.length
        if self._fd >= 0 and sl.segment.fd >= 0 and t.get_write_buffer_size() == 0:
            try:
                while left > 0:
                    n = os.sendfile(self._fd, sl.segment.fd, pos, left)
                    if n <= 0:
                        break
                    pos += n
                    left -= n
            except BlockingIOError:
                pass
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EINVAL, errno.ENOSYS):
                    log.info("sendfile to %s failed: %s", self.peer, e)
                    self.closing = True
                    t.abort()
                    return
        if left > 0:
            try:
                t.write(sl.segment.read(pos, left))
            except OSError as e:
                log.warning("read for %s failed: %s", self.peer, e)
                self.closing = True
                t.abort()
