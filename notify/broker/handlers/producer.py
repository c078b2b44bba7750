"""Producer identity: the ``producer`` claim, the checks a put of an idempotent producer
passes, the answer to a retried batch, and the ``epoch`` a producer declares.

An idempotent producer's put names an identity its connection must have claimed (and that no
newer instance fenced); a put that repeats the identity's last stored batch in its partition
is answered with that batch's ids and offsets instead of being stored again
(:mod:`notify.broker.idempotence` keeps the state). ``epoch <brokerId> <epoch> <opaque>``
tells a master of an automatic-failover group the newest epoch the producer has seen.
"""

from __future__ import annotations

import logging

from notify.broker.authlog import record_auth_failure
from notify.broker.connection import Connection, PendingReplies
from notify.broker.context import BrokerContext
from notify.protocol.frames import Epoch, encode_result
from notify.protocol.identity import Claim
from notify.protocol.replies import MultiPutAck, PutAck
from notify.store.partition import Partition

log = logging.getLogger("notify.broker")


class ProducerVerbs:
    """``producer`` and ``epoch``, and the idempotence checks of puts."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def claim(self, conn: Connection, r: Claim) -> None:
        """``producer <id> <secret> <epoch> <instance> <opaque>`` (notify.protocol.identity)."""
        if self.ctx.role != "master":
            return self.ctx.refuse_write(conn, r.opaque)
        code, body = self.ctx.producers.claim(conn.producers, r)
        if code == 403:
            record_auth_failure(conn.peer)
        conn.send(encode_result(code, r.opaque, body))

    def may_put(self, conn: Connection, part: Partition, opaque: int, pid: str) -> bool:
        """Whether ``conn`` may put as idempotent producer ``pid`` in ``part`` (claimed on
        this connection, not fenced, room in the state); else answered with why."""
        states = self.ctx.producers
        why = states.refusal(conn.producers, pid)
        if why is not None:
            self.ctx.error(conn, why[0], opaque, why[1])
            return False
        full = states.room_for(part, pid)
        if full is not None:
            conn.send(encode_result(503, opaque, full))
            return False
        return True

    def answer_duplicate(
        self, conn: Connection, part: Partition, opaque: int, pid: str, seq: int, count: int = 0
    ) -> bool:
        """A put of idempotent producer ``pid`` starting at ``seq`` that repeats its last
        stored batch is answered with that batch's ack (once what it covers is flushed as
        the partition's policy asks and, with a sync slave, the slave has it: the range is
        pushed again, a slave that has it says so) instead of being stored again; True when
        answered."""
        ctx = self.ctx
        last = ctx.producers.duplicate_of(part, pid, seq)
        if last is None:
            return False
        found = None
        if last.first_seq <= seq and seq + max(count, 1) - 1 <= last.last_seq:
            found = ctx.producers.locate(part, last, seq)
        if found is None:
            ctx.error(
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
        if ctx.sync_master is not None:  # acknowledged only once the sync slave has it
            data = part.read_raw(last.first_offset, last.end_offset - last.first_offset)
            replicated = ctx.sync_master.replicate(part, last.first_offset, data, last.count)
        ctx.await_all([group], ctx.flusher.after_append(part, 0), replicated)
        return True

    def epoch(self, conn: Connection, r: Epoch) -> None:
        """``epoch <brokerId> <epoch> <opaque>``: remember the newest epoch the producer saw
        for this broker's group; answer this broker's (503 when it is older: stale)."""
        ctx = self.ctx
        ctx.stats.epoch_declared += 1
        bid = ctx.config.system.broker_id
        if r.broker_id == bid and r.epoch > conn.client_epoch:
            conn.client_epoch = r.epoch
        stale = ctx.stale(conn)
        if stale is not None:
            ctx.stats.epoch_refused += 1
            if ctx.epoch_declared is not None:
                ctx.epoch_declared(conn.client_epoch)
            return ctx.error(conn, 503, r.opaque, stale)
        conn.send(encode_result(200, r.opaque, b"%d %d" % (bid, ctx.epoch)))
