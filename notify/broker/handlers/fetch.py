"""``get`` and ``offset``, and long-poll parking of gets that find nothing yet.

A ``get`` answers with a slice of a segment file (sent with ``sendfile`` by the connection),
301 to the nearest offset, or 404. In its 8-token form (``maxWaitMs``) a get that finds
nothing is parked on its partition until data becomes visible or the wait ends; its reply
is queued only when ready, after whatever the connection was sent meanwhile. Gets of the
internal streams (``__txlog``, ``__delaylog``, ``__queuelog``, ``__cut``) are a replica
link's and go to :mod:`notify.broker.handlers.replica` and the cut server.
"""

from __future__ import annotations

from typing import Any, Final

from notify.broker.connection import Connection, PendingReplies
from notify.broker.context import BrokerContext
from notify.broker.handlers.replica import ReplicaVerbs
from notify.errors import OffsetOutOfRangeError
from notify.protocol.frames import Get, Offset, encode_result, encode_value_header
from notify.protocol.replies import OffsetReply, Redirect
from notify.replication.cut import CUT_STREAM
from notify.replication.redo import LOG_STREAMS
from notify.store.partition import Partition

LONG_MAX: Final = 2**63 - 1


class FetchVerbs:
    """``get`` (with long-poll parking) and ``offset``."""

    def __init__(self, ctx: BrokerContext, replica: ReplicaVerbs) -> None:
        self.ctx = ctx
        self.replica = replica

    def get(self, conn: Connection, r: Get) -> None:
        ctx = self.ctx
        st = ctx.stats
        st.cmd_get += 1
        if r.topic.startswith("__") and not conn.replica:
            return ctx.denied(conn, r.opaque, f"get on internal topic {r.topic!r}", "replica")
        if r.topic in LOG_STREAMS:
            return self.replica.get_redo(conn, r)
        if r.topic == CUT_STREAM:
            return ctx.cuts.get(conn, r)
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if not ctx.accept[r.topic][1]:
            return ctx.error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept subscribe")
        if r.max_size <= 0:
            return ctx.error(conn, 400, r.opaque, f"Bad request,invalid max size {r.max_size}")
        tc = st.topic(r.topic)
        tc.get_requests += 1
        ctx.consumer_positions.record(r.topic, r.partition, r.group, r.offset)
        try:
            sl = part.slice(r.offset, min(ctx.max_transfer, r.max_size), r.max_size)
        except OffsetOutOfRangeError as e:
            if self.not_shown_yet(part, r.offset):
                if r.max_wait_ms > 0:
                    return self.park(conn, part, r)
                st.get_misses += 1
                tc.get_misses += 1
                return ctx.error(conn, 404, r.opaque, f"Nothing yet at position {r.offset}")
            if r.offset > e.nearest and r.max_wait_ms == 0 and not self._moved_past_end(r):
                # MetaQ: beyond the end is "not found" unless updateConsumerOffsets
                st.get_misses += 1
                tc.get_misses += 1
                return ctx.error(
                    conn, 404, r.opaque, f"Could not find message at position {r.offset}"
                )
            return conn.send(encode_result(301, r.opaque, Redirect(e.nearest).encode()))
        if sl is None:
            if r.max_wait_ms > 0:
                return self.park(conn, part, r)
            st.get_misses += 1
            tc.get_misses += 1
            return ctx.error(conn, 404, r.opaque, f"Could not find message at position {r.offset}")
        st.get_bytes += sl.length
        tc.get_bytes += sl.length
        conn.send(encode_value_header(sl.length, r.opaque))
        conn.send(sl)

    @staticmethod
    def not_shown_yet(part: Partition, offset: int) -> bool:
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
        return self.ctx.config.system.update_consumer_offsets or r.offset == LONG_MAX

    def offset(self, conn: Connection, r: Offset) -> None:
        ctx = self.ctx
        ctx.stats.cmd_offset += 1
        if r.topic.startswith("__") and not conn.replica:
            return ctx.denied(conn, r.opaque, f"offset on internal topic {r.topic!r}", "replica")
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if conn.replica and ctx.role == "slave" and r.offset >= part.visible_end:
            # the synchronous master's probe: where this copy ends, shown to readers or not
            # (they see the master's last consistent cut this slave reached)
            return conn.send(encode_result(200, r.opaque, OffsetReply(part.end).encode()))
        conn.send(encode_result(200, r.opaque, OffsetReply(part.nearest_offset(r.offset)).encode()))

    # ------------------------------------------------------------------ long poll

    def park(self, conn: Connection, part: Partition, r: Get) -> None:
        """Hold a ``get`` (8-token form) until the partition has data or the wait ends.

        Its reply is queued only when it is ready, after whatever the connection was sent
        meanwhile: a parked fetch never holds back the replies to later requests on the same
        connection (a long-poll client matches replies by opaque, as the protocol allows).
        At most ``maxParkedGets`` per connection (503 beyond); released when it closes."""
        ctx = self.ctx
        cap = ctx.config.system.max_parked_gets
        if len(conn.parked) >= cap:
            ctx.stats.parked_refused += 1
            return ctx.error(
                conn,
                503,
                r.opaque,
                f"too many parked gets on this connection (maxParkedGets={cap}): "
                "wait for their replies",
            )
        slot = PendingReplies(conn, r.partition)
        slot.items.append([r.opaque])
        wait_s = min(r.max_wait_ms, ctx.config.system.max_long_poll_wait_ms) / 1000.0
        entry: list[Any] = [conn, r, slot, None]
        entry[3] = ctx.loop.call_later(wait_s, self.unpark, part, entry, True)
        waiters = ctx.waiting.get(part)
        if waiters is None:
            waiters = ctx.waiting[part] = []
        waiters.append(entry)
        conn.parked[id(entry)] = (part, entry)
        part.waiting = True
        ctx.stats.parked_gets += 1

    def unpark(self, part: Partition, entry: list[Any], expired: bool) -> None:
        ctx = self.ctx
        conn, r, slot, timer = entry
        conn.parked.pop(id(entry), None)
        waiters = ctx.waiting.get(part)
        if waiters is not None and entry in waiters:
            waiters.remove(entry)
            if not waiters:
                del ctx.waiting[part]
                part.waiting = ctx.cuts.watching
        if not expired:
            timer.cancel()
        if slot.done:
            return
        try:
            sl = part.slice(r.offset, min(ctx.max_transfer, r.max_size), r.max_size)
        except OffsetOutOfRangeError as e:
            if self.not_shown_yet(part, r.offset):
                sl = None  # the wait ended before this master showed the slave's end
            else:
                slot.body = encode_result(301, r.opaque, Redirect(e.nearest).encode())
                return self._deliver(conn, slot)
        if sl is None:
            ctx.stats.get_misses += 1
            slot.body = encode_result(
                404,
                r.opaque,
                f"Could not find message at position {r.offset}".encode(),
            )
        else:
            # header now, bytes straight from the segment when the reply is written
            ctx.stats.get_bytes += sl.length
            slot.body = encode_value_header(sl.length, r.opaque)
            slot.tail = sl
        self._deliver(conn, slot)

    @staticmethod
    def _deliver(conn: Connection, slot: PendingReplies) -> None:
        slot.done = True
        if not conn.closed:
            conn.send(slot)

    def visible(self, part: Partition) -> None:
        """``part``'s visible end advanced: answer the gets parked on it that it covers."""
        waiting = self.ctx.waiting.get(part)
        if waiting:
            for entry in list(waiting):
                if entry[1].offset < part.visible_end:
                    self.unpark(part, entry, False)

    def connection_closed(self, conn: Connection) -> None:
        """Parked gets die with their connection."""
        for part, entry in list(conn.parked.values()):
            entry[2].done = True
            self.unpark(part, entry, False)
        conn.parked.clear()
