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

Back-pressure: when the transport's write buffer passes its high-water mark the connection
stops reading until the client has drained it, so a slow consumer cannot grow memory.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from notify.errors import ProtocolError
from notify.protocol.frames import RequestParser, encode_error
from notify.store.partition import Slice

if TYPE_CHECKING:
    from notify.broker.service import BrokerService

log = logging.getLogger("notify.broker")

WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024


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
        part = self.partition
        out = []
        for it in self.items:
            body = b"%d %d %d" % (it[4], part, it[5])
            out.append(b"result 200 %d %d\r\n%b" % (len(body), it[0], body))
        return b"".join(out)

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

    def __init__(self, service: BrokerService):
        self.service = service
        self.parser = RequestParser(service.max_frame_body)
        self.out: deque[OutItem] = deque()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closing = False
        self.closed = False
        self.authenticated = not service.auth_required
        self.open_groups: dict[tuple[str, int], PendingReplies] = {}
        self.session: set[str] | None = None  # keys of the transactions this connection began
        self.producer_group = ""  # set by the ``register`` extension
        self._fd = -1
        self._reading_paused = False
        self._writing_paused = False
        self._pump_scheduled = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = t = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        t.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)
        if not self.service.connection_opened(self):
            self.closing = True
            self.closed = True
            t.write(encode_error(ProtocolError("too many connections, try again later", 503)))
            t.close()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        reqs = self.parser.feed(data)
        if reqs:
            self.service.handle(self, reqs)

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
        self.service.connection_closed(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self.transport is not None and self._reading_paused and not self.closing:
            self._reading_paused = False
            self.transport.resume_reading()
        self.pump()

    # ------------------------------------------------------------------ output

    def send(self, item: OutItem) -> None:
        """Queue a reply item; written as soon as everything before it is ready.

        Writes are deferred to the end of the current loop turn, so all the replies a
        turn produces for this connection leave in one ``write``."""
        self.out.append(item)
        self.schedule_pump()

    def schedule_pump(self) -> None:
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
        chunks: list[bytes] = []
        while out:
            if self._writing_paused:
                break  # the client is not reading: keep the rest queued (resume_writing pumps)
            item = out[0]
            if type(item) is bytes:
                chunks.append(item)
            elif type(item) is PendingReplies:
                if not item.done:
                    break
                chunks.append(item.render())
                if item.tail is not None:
                    t.write(b"".join(chunks))
                    chunks = []
                    self._send_slice(item.tail)
            else:
                assert isinstance(item, Slice)
                if chunks:
                    t.write(b"".join(chunks))
                    chunks = []
                self._send_slice(item)
            out.popleft()
        if chunks:
            t.write(b"".join(chunks))
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
