"""``put``, ``mput`` and delayed ``put``: checks, the per-partition batches and their commit.

Puts are not written one by one. Every put accepted during one turn of the event loop, from
every connection, is collected per partition (:class:`_Batch`); one commit round, run once
the turn's reads are handled (:meth:`PutVerbs.commit_soon`), then encodes each partition's
records into one buffer, writes it with one ``pwrite``, hands the flush policy its chance to
make the replies wait for an fsync (group commit) and writes the replies that need no wait,
one write per connection, in the same turn. Ten producers each waiting for its ack cost one
append per partition for all of them, not one each. A request of another kind commits what
is pending first (a get after a put sees it). Message ids are allocated in blocks. An
``mput`` (a batch of records in their on-disk layout, checked in the compiled hot path) is
appended at once, as is a delayed put (an envelope in ``__delay``).
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any, Final

from notify.broker.connection import Connection, PendingReplies
from notify.broker.context import RANDOM_PARTITION, BrokerContext
from notify.broker.delay import DELAY_TOPIC, encode_envelope
from notify.broker.handlers.producer import ProducerVerbs
from notify.broker.idempotence import LastBatch, batch_verdict
from notify.core.effects import Applied
from notify.core.transactions import TxPut
from notify.errors import NotifyError, StoreFullError
from notify.protocol import hotpath, records
from notify.protocol.frames import DelayedPut, MultiPut, Put, encode_result
from notify.protocol.idgen import MAX_BATCH, IdGenerator
from notify.protocol.properties import FLAG_PROPERTIES, record_producer
from notify.protocol.replies import MultiPutAck, PutAck
from notify.store.partition import Partition

log = logging.getLogger("notify.broker")

_HEADER = records.HEADER
_HEADER_SIZE: Final = records.HEADER_SIZE
_CRC_MASK: Final = 0x7FFFFFFF
NOT_IN_TX: Final = (
    "an idempotent producer's messages (producer members in their properties) cannot be "
    "sent in a transaction"
)
_NOT_DELAYED: Final = (
    "an idempotent producer's messages (producer members in their properties) cannot be "
    "delayed"
)


class _Batch:
    """Puts for one partition collected during one event-loop turn."""

    __slots__ = ("count", "groups", "idempotent", "nbytes")

    def __init__(self) -> None:
        self.groups: list[PendingReplies] = []
        self.count = 0
        self.nbytes = 0
        #: (reply item, producer id, sequence, size) of idempotent puts
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


class PutVerbs:
    """``put``, ``mput`` and delayed ``put``, and the commit of the collected puts."""

    def __init__(self, ctx: BrokerContext, producer: ProducerVerbs) -> None:
        self.ctx = ctx
        self.producer = producer
        #: puts accepted and not yet written, per partition
        self.pending: dict[Partition, _Batch] = {}
        #: a commit round is scheduled for this loop turn
        self.scheduled = False
        self._checked_flags = 0  # OR of the flags of the records check_records validated
        #: and their producer members (hotpath.check_batch: verdict, id span, sequences)
        self._checked_producer: list[int] = [0, -1, -1, -1, -1]

    # ------------------------------------------------------------------ put

    def put(self, conn: Connection, r: Put) -> None:
        ctx = self.ctx
        ctx.stats.cmd_put += 1
        parts = ctx.publish_parts.get(r.topic)
        if parts is not None and 0 <= r.partition < len(parts):
            part = parts[r.partition]
        else:  # a random partition, or a refusal (the first check that fails answers)
            found = self._target(conn, r)
            if found is None:
                ctx.stats.put_failed += 1
                return
            part = found
        body = r.body
        if len(body) > ctx.max_message:
            ctx.stats.put_failed += 1
            return ctx.error(
                conn,
                400,
                r.opaque,
                f"message of {len(body)} bytes exceeds maxMessageSize {ctx.max_message}",
            )
        crc = zlib.crc32(body) & _CRC_MASK
        if r.checksum != crc and r.checksum != -1:
            ctx.stats.put_failed += 1
            return ctx.error(
                conn, 400, r.opaque, f"checksum mismatch: sent {r.checksum}, body has {crc}"
            )
        if (
            ctx.role != "master" or ctx.fence is not None or ctx.sync_master is not None
        ) and ctx.writes_refused(conn):
            ctx.stats.put_failed += 1
            return ctx.refuse_write(conn, r.opaque)
        flag = r.flag
        idem = record_producer(flag, body) if flag & FLAG_PROPERTIES else None
        if r.tx_key is not None:
            if idem is not None:
                ctx.stats.put_failed += 1
                return ctx.error(conn, 400, r.opaque, NOT_IN_TX)
            if ctx.transactions is None:
                return ctx.error(
                    conn, 500, r.opaque, "transactions are not enabled on this broker"
                )
            return ctx.transactions.put(conn, r, crc)
        if part.failed:
            ctx.stats.put_failed += 1
            return ctx.error(conn, 500, r.opaque, part.failed)
        if idem is not None:
            if not self.producer.may_put(conn, part, r.opaque, idem[0]):
                ctx.stats.put_failed += 1
                return
            if self.producer.answer_duplicate(conn, part, r.opaque, idem[0], idem[1]):
                return
        group = conn.open_groups.get(part)
        if group is None:
            group = conn.open_groups[part] = PendingReplies(conn, r.partition)
            conn.send(group)
            batch = self.pending.get(part)
            if batch is None:
                batch = self.pending[part] = _Batch()
            batch.groups.append(group)
        else:
            batch = self.pending[part]
            conn.queued += 1  # one more reply in a group already queued (read back-pressure)
        item = [r.opaque, body, crc, flag, 0, 0]
        group.items.append(item)
        batch.count += 1
        batch.nbytes += len(body)
        if idem is not None:
            batch.idempotent.append((item, idem[0], idem[1], len(body)))

    def _target(self, conn: Connection, r: Put) -> Partition | None:
        """The partition of a put the fast lookup did not find (partition -1: one chosen at
        random), or None after answering why there is none (400/404, 403 for a topic that
        does not accept publish)."""
        ctx = self.ctx
        if r.partition == RANDOM_PARTITION:
            r.partition = ctx.random_partition(r.topic)
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return None
        if not ctx.accept[r.topic][0]:
            ctx.error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept publish")
            return None
        return part

    # ------------------------------------------------------------------ mput

    def mput(self, conn: Connection, r: MultiPut) -> None:
        ctx = self.ctx
        ctx.stats.cmd_mput += 1
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if not ctx.accept[r.topic][0]:
            return ctx.error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept publish")
        if not 1 <= r.count <= MAX_BATCH:
            return ctx.error(conn, 400, r.opaque, f"mput count {r.count} outside 1..{MAX_BATCH}")
        err = self.check_records(r.records, r.count)
        if err:
            return ctx.error(conn, 400, r.opaque, f"mput: {err}")
        if ctx.writes_refused(conn):
            return ctx.refuse_write(conn, r.opaque)
        idem = batch_verdict(r.records, *self._checked_producer)
        if isinstance(idem, str):
            return ctx.error(conn, 400, r.opaque, f"mput: {idem}")
        buf = bytearray(r.records)
        if r.tx_key is not None:
            if idem is not None:
                return ctx.error(conn, 400, r.opaque, NOT_IN_TX)
            if ctx.transactions is None:
                return ctx.error(
                    conn, 500, r.opaque, "transactions are not enabled on this broker"
                )
            return ctx.transactions.mput(conn, r, buf)
        if part.failed:
            return ctx.error(conn, 500, r.opaque, part.failed)
        if idem is not None:
            if not self.producer.may_put(conn, part, r.opaque, idem[0]):
                return
            if self.producer.answer_duplicate(conn, part, r.opaque, idem[0], idem[1], r.count):
                return
        base = part.end
        first_id = ctx.ids.next_block(r.count)
        records.stamp_ids(buf, first_id)
        try:
            part.append(buf, hold=ctx.holds)
        except NotifyError as e:
            code = 503 if isinstance(e, StoreFullError) else 500
            return ctx.error(conn, code, r.opaque, str(e))
        if idem is not None:
            batch = LastBatch(idem[1], idem[2], first_id, base, base + len(buf))
            ctx.producers.record(part, idem[0], batch)
        ctx.count_put(r.topic, r.count, len(buf) - r.count * records.HEADER_SIZE)
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        group.body = encode_result(
            200, r.opaque, MultiPutAck(first_id, r.partition, base, r.count).encode()
        )
        conn.send(group)
        ctx.await_all(
            [group],
            ctx.flusher.after_append(part, r.count),
            ctx.sync_master.replicate(part, base, buf, r.count) if ctx.sync_master else None,
        )

    def check_records(self, data: bytes, count: int) -> str | None:
        """Validate ``count`` whole records with correct checksums filling ``data`` (the
        loop is compiled with the client's hot paths: notify.protocol.hotpath)."""
        max_msg = self.ctx.max_message
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
        self._checked_producer = producer  # read by mput (idempotent producers)
        return None

    # ------------------------------------------------------------------ one-shot transactions

    def tx_put(self, r: Put) -> TxPut | None:
        """A transactional put as :meth:`put` would accept it, else None (no reply)."""
        ctx = self.ctx
        if r.partition == RANDOM_PARTITION:
            r.partition = ctx.random_partition(r.topic)
        parts = ctx.publish_parts.get(r.topic)
        if parts is None or not 0 <= r.partition < len(parts):
            return None
        body = r.body
        if len(body) > ctx.max_message:
            return None
        crc = zlib.crc32(body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            return None
        if r.flag & FLAG_PROPERTIES and record_producer(r.flag, body) is not None:
            return None
        return TxPut(r.topic, r.partition, r.opaque, body, 0, r.flag, crc)

    def tx_mput(self, r: MultiPut) -> TxPut | None:
        """A transactional mput as :meth:`mput` would accept it, else None (no reply)."""
        ctx = self.ctx
        parts = ctx.publish_parts.get(r.topic)
        if parts is None or not 0 <= r.partition < len(parts):
            return None
        if not 1 <= r.count <= MAX_BATCH:
            return None
        if self.check_records(r.records, r.count):
            return None
        if self._checked_producer[0] != hotpath.NO_PRODUCER:
            return None
        return TxPut(r.topic, r.partition, r.opaque, bytearray(r.records), r.count)

    # ------------------------------------------------------------------ delayed put

    def dput(self, conn: Connection, r: DelayedPut) -> None:
        ctx = self.ctx
        ctx.stats.cmd_put += 1
        part = ctx.lookup(conn, r.topic, r.partition, r.opaque)
        if part is None:
            return
        if not ctx.accept[r.topic][0]:
            return ctx.error(conn, 403, r.opaque, f"topic {r.topic!r} does not accept publish")
        if len(r.body) > ctx.max_message:
            return ctx.error(
                conn, 400, r.opaque, f"message of {len(r.body)} bytes exceeds maxMessageSize"
            )
        crc = zlib.crc32(r.body) & _CRC_MASK
        if r.checksum != -1 and r.checksum != crc:
            return ctx.error(conn, 400, r.opaque, "checksum mismatch")
        if r.flag & FLAG_PROPERTIES and record_producer(r.flag, r.body) is not None:
            return ctx.error(conn, 400, r.opaque, _NOT_DELAYED)
        if ctx.writes_refused(conn):
            return ctx.refuse_write(conn, r.opaque)
        delay = ctx.delay
        dpart = ctx.store.get(DELAY_TOPIC, 0)
        if delay is None or dpart is None:
            return ctx.error(conn, 500, r.opaque, "delayed messages are not enabled")
        # deliverAt in the past (or 0) is due now: it neither skews the lateness figures nor
        # sits in the index; beyond maxDelay it is refused (it would pin __delay segments)
        now_ms = int(time.time() * 1000)
        max_delay = ctx.config.system.delay.max_delay_ms
        if r.deliver_at_ms > now_ms + max_delay:
            return ctx.error(
                conn,
                400,
                r.opaque,
                f"deliverAt {r.deliver_at_ms} is more than maxDelay {max_delay} ms ahead",
            )
        env = encode_envelope(r.topic, r.partition, max(r.deliver_at_ms, now_ms), r.body)
        if r.tx_key is not None:
            if ctx.transactions is None:
                return ctx.error(conn, 500, r.opaque, "transactions are not enabled")
            put = Put(DELAY_TOPIC, 0, r.flag, -1, r.tx_key, r.opaque, env)
            return ctx.transactions.put(conn, put, zlib.crc32(env) & _CRC_MASK, r.partition)
        if self.pending:
            self.commit()
        msg_id = ctx.ids.next()
        rec = records.encode(msg_id, r.flag, env)
        try:
            off = dpart.append(rec, hold=ctx.holds)
        except NotifyError as e:
            code = 503 if isinstance(e, StoreFullError) else 500
            return ctx.error(conn, code, r.opaque, str(e))
        delay.add(off, r.deliver_at_ms)
        group = PendingReplies(conn, r.partition)
        group.items.append([r.opaque])
        group.body = encode_result(200, r.opaque, PutAck(msg_id, r.partition, -1).encode())
        conn.send(group)
        ctx.await_all(
            [group],
            ctx.flusher.after_append(dpart, 1),
            ctx.sync_master.replicate(dpart, off, rec, 1) if ctx.sync_master else None,
        )

    # ------------------------------------------------------------------ commit

    def commit_soon(self) -> None:
        """Run a commit round once the reads of this loop turn are handled."""
        if not self.scheduled:
            self.scheduled = True
            self.ctx.loop.call_soon(self._commit_round)

    def _commit_round(self) -> None:
        """Commit what is pending and write the replies that became ready, one write per
        connection (a reply to a connection being read waits for the end of that read)."""
        self.scheduled = False
        ctx = self.ctx
        wake: dict[Connection, None] = {}
        ctx.wake = wake
        try:
            self.commit()
        finally:
            ctx.wake = None
        for conn in wake:
            conn.pump()

    def commit(self) -> None:
        """Write every pending batch: one buffer and one write per partition."""
        pending = self.pending
        if not pending:
            return
        self.pending = {}
        ctx = self.ctx
        pack = _HEADER.pack
        for part, batch in pending.items():
            groups = batch.groups
            offset = base = part.end
            if batch.count == 1:  # a lone put: no id stream, no list of chunks
                g = groups[0]
                g.conn.open_groups.clear()
                it = g.items[0]
                body = it[1]
                first = ctx.ids.next_block(1)
                data = pack(len(body), it[2], first, it[3]) + body
                it[1] = None
                it[4] = first
                it[5] = offset
                offset += 20 + len(body)
            else:
                for g in groups:
                    g.conn.open_groups.clear()
                count = batch.count
                ids: _IdStream | None = None
                if count <= MAX_BATCH:  # one block (what the id stream would take)
                    first = ctx.ids.next_block(count)
                else:
                    ids = _IdStream(ctx.ids, count)
                chunks: list[bytes] = []
                add = chunks.append
                for g in groups:
                    items = g.items
                    if ids is not None:
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
                part.append(data, hold=ctx.holds)
            except NotifyError as e:
                code = 503 if isinstance(e, StoreFullError) else 500
                log.error("append to %s-%d failed: %s", part.topic, part.index, e)
                ctx.stats.put_failed += batch.count
                for g in groups:
                    g.fail(code, str(e))
                continue
            assert offset - base == batch.count * 20 + batch.nbytes
            for it, pid, seq, size in batch.idempotent:  # it[4], it[5]: id and offset given
                batch_end = it[5] + records.HEADER_SIZE + size
                ctx.producers.record(part, pid, LastBatch(seq, seq, it[4], it[5], batch_end))
            ctx.count_put(part.topic, batch.count, batch.nbytes)
            ctx.await_all(
                groups,
                ctx.flusher.after_append(part, batch.count),
                ctx.sync_master.replicate(part, base, data, batch.count)
                if ctx.sync_master
                else None,
            )

    def transaction_applied(self, eff: Applied) -> None:
        """A committed transaction reached its partitions: count it; index delayed messages."""
        ctx = self.ctx
        for pl in eff.placements:
            ctx.count_put(pl.topic, pl.count, pl.nbytes - pl.count * _HEADER_SIZE)
        if ctx.delay is not None:
            for offset, data in eff.delayed:
                ctx.delay.index_appended(offset, data)
