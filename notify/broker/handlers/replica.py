"""Replication verbs: what a slave takes from its master, and the logs a master serves.

On a slave, from a link authenticated with ``replicationSecret``: ``msync`` (a batch of
records at the master's offsets, or redo frames of a replicated log), MetaQ's single-record
``sync``. On a master, to its slaves: ``get __txlog|__delaylog|__queuelog`` reads the redo,
delay and queue logs (:mod:`notify.replication.redo`).
"""

from __future__ import annotations

import logging
import zlib
from typing import Final

from notify.broker.connection import Connection, PendingReplies
from notify.broker.context import BrokerContext
from notify.broker.delay import DELAY_TOPIC
from notify.broker.handlers.put import PutVerbs
from notify.errors import NotifyError, TxLogError
from notify.protocol import records
from notify.protocol.frames import Get, MultiSync, Sync, encode_result, encode_value_header
from notify.protocol.properties import FLAG_PROPERTIES
from notify.protocol.replies import OffsetReply, PutAck, Redirect
from notify.replication.redo import (
    DELAYLOG_STREAM,
    LOG_STREAMS,
    QUEUELOG_STREAM,
    RedoBehindError,
    ReplicaRedo,
)
from notify.store.partition import Partition
from notify.txlog import Position, TxLog

log = logging.getLogger("notify.broker")

_CRC_MASK: Final = 0x7FFFFFFF


class ReplicaVerbs:
    """``msync``, ``sync`` and the replicated logs' ``get``."""

    def __init__(self, ctx: BrokerContext, puts: PutVerbs) -> None:
        self.ctx = ctx
        self.puts = puts
        self._redo_acks: list[tuple[PendingReplies, ReplicaRedo]] = []

    def msync(self, conn: Connection, r: MultiSync) -> None:
        ctx = self.ctx
        if ctx.role != "slave":
            return ctx.error(conn, 403, r.opaque, "msync: this broker is not a slave")
        if not conn.replica:  # only the master, authenticated with replicationSecret
            return ctx.denied(conn, r.opaque, "msync", "replica")
        if r.topic in LOG_STREAMS:
            return self._msync_redo(conn, r)
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        err = self.puts.check_records(r.records, r.count)
        buf = bytearray(r.records)
        if err:
            return ctx.error(conn, 400, r.opaque, f"msync: {err}")
        end = part.end
        if not buf and r.base_offset < end:  # the master took back puts it refused
            try:
                part.rollback_to(max(r.base_offset, part.min_offset))
                ctx.store.write_recovery_points()  # none may point past the cut
            except (NotifyError, OSError) as e:
                return ctx.error(conn, 500, r.opaque, f"msync: cutting back failed: {e}")
            self.taken_back(part, r.base_offset)
            log.warning("%s-%d cut back to the master's end %d", r.topic, r.partition, part.end)
            return conn.send(encode_result(200, r.opaque, OffsetReply(part.end).encode()))
        if r.base_offset > end:
            return conn.send(encode_result(301, r.opaque, Redirect(end).encode()))  # behind
        if r.base_offset < end:
            have = part.read_raw(r.base_offset, len(buf))
            if have == bytes(buf):
                return conn.send(encode_result(200, r.opaque, OffsetReply(end).encode()))  # here
            return ctx.error(
                conn, 500, r.opaque, f"msync: slave diverges from the master at {r.base_offset}"
            )
        try:
            base = part.end
            part.append(buf)
        except NotifyError as e:
            return ctx.error(conn, 500, r.opaque, str(e))
        ctx.producers.observe(part, buf, base)  # a promoted slave knows the producers
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        group.body = encode_result(200, r.opaque, OffsetReply(part.end).encode())
        conn.send(group)
        ctx.await_all([group], ctx.flusher.after_append(part, r.count), None)

    def taken_back(self, part: Partition, offset: int) -> None:
        """Refused puts from ``offset`` on were cut from ``part``: forget what indexed them."""
        ctx = self.ctx
        ctx.producers.forget_from(part, offset)
        if part.topic == DELAY_TOPIC and ctx.delay is not None:
            ctx.delay.forget_from(offset)

    def get_redo(self, conn: Connection, r: Get) -> None:
        """A slave pulls the redo log: ``get __txlog <group> <fileNo> <offset> <maxSize>``;
        200 = whole frames, 301 = continue at the start of segment ``<body>``, 404 = none
        yet (see :mod:`notify.replication.redo`). ``get __delaylog ...`` and ``get
        __queuelog ...``: the same for the delay queue's and the queues' logs."""
        ctx = self.ctx
        src = self.stream_log(r.topic)
        if src is None:
            return ctx.error(conn, 404, r.opaque, f"no {r.topic} log on this broker")
        try:
            data, nxt = src.read_frames(
                Position(r.partition, r.offset), min(r.max_size, ctx.max_transfer)
            )
        except TxLogError as e:
            return ctx.error(conn, 500, r.opaque, f"redo log: {e}")
        if nxt is not None:
            return conn.send(encode_result(301, r.opaque, b"%d" % nxt.file_no))
        if not data:
            return ctx.error(conn, 404, r.opaque, "no redo frames at this position yet")
        conn.send(encode_value_header(len(data), r.opaque) + data)

    def _msync_redo(self, conn: Connection, r: MultiSync) -> None:
        """The synchronous master pushes redo frames; answered after this slave forced them
        (one fdatasync for every push of a loop turn); 301 = behind, the pull catches up."""
        ctx = self.ctx
        rr = self.stream_replica(r.topic)
        if rr is None:
            return ctx.error(conn, 500, r.opaque, f"msync: this slave keeps no {r.topic} log")
        at = Position(r.partition, r.base_offset)
        try:
            rr.append(at, r.records)
        except RedoBehindError:
            return conn.send(encode_result(301, r.opaque, b"%d %d" % rr.end))
        except TxLogError as e:
            return ctx.error(conn, 500, r.opaque, f"msync: {e}")
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        self._redo_acks.append((group, rr))
        if len(self._redo_acks) == 1:
            ctx.loop.call_soon(self._force_redo)
        conn.send(group)

    def stream_log(self, stream: str) -> TxLog | None:
        """The log a replicated stream reads from on this broker (None: none here)."""
        ctx = self.ctx
        if stream == DELAYLOG_STREAM:
            return ctx.delay.log if ctx.delay is not None else None
        if stream == QUEUELOG_STREAM:
            return ctx.queues.log if ctx.queues is not None else None
        return ctx.transactions.log if ctx.transactions is not None else None

    def stream_replica(self, stream: str) -> ReplicaRedo | None:
        """This slave's copy of its master's log ``stream`` (None on a master)."""
        ctx = self.ctx
        if stream == DELAYLOG_STREAM:
            return ctx.delay.replica_log if ctx.delay is not None else None
        if stream == QUEUELOG_STREAM:
            return ctx.queues.replica_log if ctx.queues is not None else None
        return ctx.redo_replica

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

    def sync(self, conn: Connection, r: Sync) -> None:
        """MetaQ's single-message ``sync``: append one record with the master's id."""
        ctx = self.ctx
        if ctx.role != "slave":
            return ctx.error(conn, 403, r.opaque, "sync: this broker is not a slave")
        if not conn.replica:
            return ctx.denied(conn, r.opaque, "sync", "replica")
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        crc = zlib.crc32(r.body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            return ctx.error(conn, 400, r.opaque, "sync: checksum mismatch")
        try:
            rec = records.encode(r.msg_id, r.flag, r.body, crc)
            off = part.append(rec)
        except NotifyError as e:
            return ctx.error(conn, 500, r.opaque, str(e))
        if r.flag & FLAG_PROPERTIES:
            ctx.producers.observe(part, rec, off)
        conn.send(encode_result(200, r.opaque, PutAck(r.msg_id, r.partition, off).encode()))
