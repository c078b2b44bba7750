"""Queue subscriptions on the broker: the I/O shell around :mod:`notify.core.queues`.

What it does with the wire verbs (``qsub``, ``qack``, ``qunsub``; README "Queues"):

* a ``qsub`` makes the connection a consumer of queue group ``(topic, group)`` with a
  credit; the group is created at the first one (``earliest``: its partitions start at
  their first offset; ``latest``: at their end) and its creation is logged;
* :meth:`QueueManager.pump` reads records at each partition's frontier (only what the
  window has room for), lets the core hand them out round robin to consumers with free
  credit and pushes each as a ``qmsg`` frame (header, then the record bytes);
* ``qack`` items change the messages' states; the finished ones (accepted, rejected,
  dead) are appended to the queue log (``<dataLogPath>/queues/``) and the reply waits for
  the group-committed fsync covering them, so an answered accept is never redelivered;
* a closed connection or a ``qunsub`` returns what the consumer held at once; one timer
  per group fires at the earliest lock deadline or delayed release;
* cluster mode (ZooKeeper): a ``qsub`` naming a consumer id is accepted only while the
  consumer's node ``consumers/<group>/queue-ids/<topic>/<id>`` exists, and the broker
  watches it: when it goes (the consumer's session ended: process frozen, network cut,
  even with the TCP connection still open) the connection is closed at once, so what
  the consumer held is available again;
* every ``queueCheckpointInterval`` ms (when something was logged) the compact form of
  every group is written as the log's checkpoint and older log segments are deleted;
* lifecycle: an admin deletes a group and its state (``qdel``, REST ``DELETE
  /api/queues/{topic}/{group}``, ``notify queue delete``; 409 while it has consumers unless
  forced, which closes their connections); a group with no consumer that holds nothing
  (every message of its topic finished, no dead letter) is deleted after
  ``queueGroupExpiry``, and at ``queueMaxGroups`` the longest unused such group makes room
  for a new one; a connection may have created at most ``queueMaxGroupsPerConnection``
  of the groups that exist. A deletion is logged (DROP) and replicated like the rest.

Every push is logged too (DELIVER records with each message's delivery count, appended in
batches within ``DELIVER_LOG_DELAY_S`` of the push, fsynced in the background,
group-committed), so delivery counts survive a crash.

Recovery (start): the latest checkpoint, then the records after it. Messages that were
acquired or available at the crash are delivered again, their delivery counts resuming
from the logged ones (a delivery pushed less than one fsync before the crash may be
missing); a message whose logged count reached ``queueMaxDeliveries`` goes to the
dead-letter queue instead of being delivered again. Finished ones are not delivered.

Replication: the queue log travels to slaves as the reserved stream ``__queuelog`` at the
master's positions, like the redo log (:mod:`notify.replication.redo`). A checkpoint writes
its state into the log too (SNAPSHOT records, :mod:`notify.protocol.queuelog`), so the frames
are all a replica needs. With a synchronous slave an acknowledgement is answered once the
slave has its DONE record as well. A slave serves no queues; it keeps the copy
(:class:`QueueReplica`: checkpointed at the newest whole snapshot) and ``promote`` recovers
the groups from it as a restarted master would.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Final

from notify.broker.queuestate import (
    GroupEntry,
    QueueState,
    Subscriber,
)
from notify.configserver import ConfigServerError
from notify.core.queues import (
    MsgState,
    Run,
    record_spans,
)
from notify.errors import OffsetOutOfRangeError, TxLogError
from notify.protocol import queuelog
from notify.protocol.frames import (
    DeadLetterInfo,
    QueueAck,
    QueueDeadLetters,
    QueueDelete,
    QueueSubscribe,
    QueueUnsubscribe,
    encode_dead_letters,
    encode_qbatch,
    encode_qmsg,
    encode_result,
)
from notify.store.partition import Partition

if TYPE_CHECKING:
    from notify.broker.connection import Connection

log = logging.getLogger("notify.broker.queues")

#: Bytes read from a partition at a time when filling a group's window.
READ_WINDOW: Final = 256 * 1024
#: Refused ``qack`` items described in the reply (the rest are only counted).
MAX_REFUSALS_SHOWN: Final = 16
#: a fenced master (automatic failover) looks again this often whether it may push
FENCED_RECHECK_S: Final = 0.1
#: ``qack`` item kinds as they come on the wire (lower case: the range form)
_ACK_KINDS: Final = {b"A": "A", b"R": "R", b"X": "X", b"N": "N"}
_RANGE_KINDS: Final = {b"a": "A", b"r": "R", b"x": "X", b"n": "N"}
GROUP_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")


class QueueManager(QueueState):
    """The queue verbs over the broker's queue groups: subscriptions (and their ZooKeeper
    nodes in cluster mode), pushing, acknowledgements, deletion and dead letters."""

    # ------------------------------------------------------------------ wire verbs

    def handle(
        self,
        conn: Connection,
        r: QueueSubscribe | QueueAck | QueueUnsubscribe | QueueDeadLetters | QueueDelete,
        role: str,
    ) -> None:
        """One queue verb from ``conn``; ``role`` is the broker's role (master/slave)."""
        if role != "master":
            return _send(conn, 403, r.opaque, "queues are served by the master only")
        if isinstance(r, QueueDeadLetters):
            self._dlq(conn, r)
        elif isinstance(r, QueueDelete):
            self.loop.create_task(self._delete_reply(conn, r))
        elif isinstance(r, QueueSubscribe):
            self._subscribe(conn, r)
        elif isinstance(r, QueueAck):
            self._ack(conn, r)
        else:
            self._unsubscribe(conn, r)

    def _subscribe(self, conn: Connection, r: QueueSubscribe) -> None:
        tc = self.store.topics.get(r.topic)
        if r.topic.startswith("__"):
            return _send(conn, 403, r.opaque, f"no queue groups on internal topic {r.topic!r}")
        if tc is None:
            return _send(conn, 404, r.opaque, f"topic {r.topic!r} does not exist on this broker")
        if not tc.accept_subscribe:
            return _send(conn, 403, r.opaque, f"topic {r.topic!r} does not accept subscribe")
        if not GROUP_NAME.fullmatch(r.group):
            return _send(conn, 400, r.opaque, "invalid group name: [A-Za-z0-9._-]{1,249}")
        if r.credit < 1:
            return _send(conn, 400, r.opaque, f"credit {r.credit} must be >= 1")
        if r.consumer_id and self.cluster is not None:
            self._spawn(self._join_registered(conn, r))
        else:
            self._join(conn, r, None)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        t = self.loop.create_task(coro)
        self._zk_tasks.add(t)
        t.add_done_callback(self._zk_tasks.discard)

    async def _join_registered(self, conn: Connection, r: QueueSubscribe) -> None:
        """Cluster mode: join only while the consumer's ZooKeeper node exists, and watch it.
        A ZooKeeper outage does not refuse the consumer: the watch fires once the broker's
        session is back and the node is checked then."""
        assert self.cluster is not None
        watch = functools.partial(self._zk_changed, conn, (r.topic, r.group), r.consumer_id)
        token = (conn, (r.topic, r.group), r.consumer_id)
        self._zk_joining[token] = False
        try:
            alive = await self.cluster.queue_consumer_alive(
                r.group, r.topic, r.consumer_id, watch
            )
        except ConfigServerError as e:
            log.warning("queue consumer %s: ZooKeeper check deferred: %s", r.consumer_id, e)
            alive = True
        finally:
            fired = self._zk_joining.pop(token, False)
        if fired and alive and not conn.closed:  # the node changed before we joined
            self._spawn(self._zk_recheck(conn, (r.topic, r.group), r.consumer_id))
        if conn.closed:
            self.cluster.forget_watch(watch)
            return
        if not alive:
            self.cluster.forget_watch(watch)
            path = self.cluster.layout.queue_consumer_node(r.group, r.topic, r.consumer_id)
            return _send(conn, 409, r.opaque, f"queue consumer not registered at {path}")
        self._join(conn, r, watch)

    def _zk_changed(self, conn: Connection, key: tuple[str, str], zk_id: str) -> None:
        """The watch on a consumer's node fired: check it again (on the loop)."""
        if (conn, key, zk_id) in self._zk_joining:
            self._zk_joining[(conn, key, zk_id)] = True  # checked again once joined
        self._spawn(self._zk_recheck(conn, key, zk_id))

    async def _zk_recheck(self, conn: Connection, key: tuple[str, str], zk_id: str) -> None:
        cid = self.by_conn.get(conn, {}).get(key)
        g = self.groups.get(key)
        sub = None if cid is None or g is None else g.subs.get(cid)
        if sub is None or sub.zk_id != zk_id or sub.watch is None or self.cluster is None:
            return  # gone or subscribed again under another id
        try:
            alive = await self.cluster.queue_consumer_alive(key[1], key[0], zk_id, sub.watch)
        except ConfigServerError:
            return  # the watch is armed: it fires again once the session is back
        if alive or g is None or conn.closed or self.by_conn.get(conn, {}).get(key) != cid:
            return
        self.zk_removed += 1
        g.zk_removed += 1
        log.warning(
            "queue group %s/%s: consumer %s removed (its ZooKeeper session ended); closing "
            "its connection %s", key[0], key[1], zk_id, getattr(conn, "peer", "?"),
        )
        self.connection_closed(conn)  # what it held is available again at once
        conn.hard_close(encode_result(410, sub.opaque, b"queue consumer's ZooKeeper node is gone"))

    def _join(
        self, conn: Connection, r: QueueSubscribe, watch: Callable[[], None] | None
    ) -> None:
        key = (r.topic, r.group)
        g = self.groups.get(key)
        if g is None:
            sysc = self.config.system
            mine = self.created_by.get(conn)
            if mine is not None and len(mine) >= sysc.queues.max_groups_per_connection:
                return _send(
                    conn,
                    503,
                    r.opaque,
                    f"this connection created {len(mine)} queue groups that still exist "
                    f"(queueMaxGroupsPerConnection={sysc.queues.max_groups_per_connection})",
                )
            if len(self.groups) >= sysc.queues.max_groups and not self._make_room():
                return _send(
                    conn,
                    503,
                    r.opaque,
                    f"too many queue groups (queueMaxGroups={sysc.queues.max_groups}), each "
                    "with a consumer or messages pending: an admin may delete some",
                )
            g = self._new_group(r.topic, r.group)
            if mine is None:
                mine = self.created_by[conn] = set()
            mine.add(key)
        self._grow(g, r.start)
        subs = self.by_conn.setdefault(conn, {})
        cid = subs.get(key)
        if cid is None:
            self._cid += 1
            cid = subs[key] = self._cid
            g.subs[cid] = Subscriber(conn, r.opaque, r.consumer_id, watch, r.batch)
        else:
            sub = g.subs[cid]
            if sub.watch is not None and sub.watch is not watch and self.cluster is not None:
                self.cluster.forget_watch(sub.watch)
            sub.opaque, sub.zk_id, sub.watch, sub.batch = r.opaque, r.consumer_id, watch, r.batch
        conn.queue_subscriptions = len(subs)  # a subscribed consumer is never idle-closed
        granted = g.core.add_consumer(cid, r.credit)
        _send(conn, 200, r.opaque, str(granted))
        self.pump(g)

    def _grow(self, g: GroupEntry, start: str) -> None:
        """Track partitions the group does not know yet (new group, or the topic grew)."""
        core = g.core
        new = {}
        for part in self.store.topic_partitions(core.topic):
            if part.index not in core.parts:
                first = core.parts == {} and start == "latest"
                new[part.index] = part.visible_end if first else part.min_offset
        if new:
            for p, off in new.items():
                core.add_partition(p, off)
            self._append(queuelog.GROUP, queuelog.encode_group(core.topic, core.group, new))

    def _unsubscribe(self, conn: Connection, r: QueueUnsubscribe) -> None:
        key = (r.topic, r.group)
        subs = self.by_conn.get(conn, {})
        cid = subs.pop(key, None)
        if cid is None:
            return _send(conn, 404, r.opaque, f"not subscribed to queue group {r.group!r}")
        conn.queue_subscriptions = len(subs)
        self._leave(key, cid)
        _send(conn, 200, r.opaque, "")

    def _leave(self, key: tuple[str, str], cid: int) -> None:
        g = self.groups.get(key)
        if g is None:
            return
        sub = g.subs.pop(cid, None)
        if sub is not None and sub.watch is not None and self.cluster is not None:
            self.cluster.forget_watch(sub.watch)
        if not g.subs:
            g.unused_since = self.loop.time()
        fins = g.core.remove_consumer(cid, self._now_ms())
        self._sync_later(self._log_finished(g.core, fins))
        self.pump(g)

    def connection_closed(self, conn: Connection) -> None:
        """The consumer is gone: what it held is available again at once."""
        self.created_by.pop(conn, None)
        for key, cid in self.by_conn.pop(conn, {}).items():
            self._leave(key, cid)

    def _ack(self, conn: Connection, r: QueueAck) -> None:
        self.ack_frames += 1
        key = (r.topic, r.group)
        cid = self.by_conn.get(conn, {}).get(key)
        g = self.groups.get(key)
        if cid is None or g is None:
            return _send(conn, 404, r.opaque, f"not subscribed to queue group {r.group!r}")
        core = g.core
        now = self._now_ms()
        refused: list[str] = []
        nrefused = 0
        kinds = _ACK_KINDS
        ranges = _RANGE_KINDS
        items: list[tuple[str, int, int, int, int]] = []
        for line in r.items.split(b"\n"):
            t = line.split()
            if not t:
                continue
            try:
                n = len(t)
                rk = ranges.get(t[0])
                if rk is not None:  # <k> <p> <from> <to> [<delayMs>]
                    if n != 4 and (n != 5 or rk != "R"):
                        raise ValueError
                    end = int(t[3])
                    if end < 0:  # (-1 would name one message)
                        raise ValueError
                    items.append((rk, int(t[1]), int(t[2]), end, int(t[4]) if n == 5 else 0))
                    continue
                if n != 3 and (n != 4 or t[0] != b"R"):
                    raise ValueError
                kind = kinds.get(t[0]) or t[0].decode("ascii")
                items.append((kind, int(t[1]), int(t[2]), -1, int(t[3]) if n == 4 else 0))
            except (ValueError, UnicodeDecodeError):
                nrefused += 1
                core.refused_acks += 1
                if len(refused) < MAX_REFUSALS_SHOWN:
                    refused.append(f"malformed item {line[:40].decode('latin-1')!r}")
        applied, n, why, fins, acked = core.ack_many(
            cid, items, now, max(0, MAX_REFUSALS_SHOWN - len(refused))
        )
        nrefused += n
        refused += why
        body = "\n".join([f"{applied} {nrefused}", *refused])
        pos = self._log_finished(core, fins)
        if acked:
            pos = self._append(
                queuelog.ACKED,
                queuelog.encode_acked(core.topic, core.group, acked, int(time.time() * 1000)),
            )
        if pos is None:
            _send(conn, 200, r.opaque, body)
        else:
            self.loop.create_task(self._reply_durable(conn, r.opaque, body))
        self.pump(g)

    async def _reply_durable(self, conn: Connection, opaque: int, body: str) -> None:
        assert self._log is not None
        shipped = self._shipped
        try:
            await self._log.sync_async()
        except TxLogError as e:
            log.error("queues: fsync of the queue log failed: %s", e)
            return _send(conn, 500, opaque, f"acknowledgement not durable: {e}")
        if shipped is not None:  # the synchronous slave has the DONE record too
            await asyncio.wait({shipped})
            if not shipped.cancelled() and shipped.exception() is not None:
                return _send(conn, 503, opaque, f"acknowledgement not replicated: "
                             f"{shipped.exception()}")
        fenced = self.fence(conn) if self.fence is not None else None
        if fenced is not None:  # replaced meanwhile: the new master decides (redelivers)
            return _send(conn, 503, opaque, f"not acknowledged: {fenced}")
        _send(conn, 200, opaque, body)

    # ------------------------------------------------------------------ delivery

    def partition_visible(self, topic: str) -> None:
        """New messages in ``topic``: groups with free credit take them."""
        for g in self._by_topic.get(topic, ()):
            if g.subs:
                self.pump(g)

    def pump(self, g: GroupEntry) -> None:
        """Fill the group's window from the store and push to consumers with credit."""
        core = g.core
        if not g.subs:
            self._arm(g)
            return
        if self.fence is not None and self.fence(None) is not None:
            # automatic failover: a master that knows it is replaced (lease lapsed, newer
            # epoch seen) pushes nothing; the new master delivers. Looked at again shortly.
            if g.timer is None or g.timer_at > self.loop.time() + FENCED_RECHECK_S:
                if g.timer is not None:
                    g.timer.cancel()
                g.timer_at = self.loop.time() + FENCED_RECHECK_S
                g.timer = self.loop.call_at(g.timer_at, self._wake, g)
            return
        now = self._now_ms()
        fins = core.expire(now)
        counts: list[tuple[int, int, list[int]]] = []
        chunks: dict[int, tuple[int, memoryview]] = {}
        while True:
            chunks.clear()
            if core.wants_records():
                self._fill(g, chunks)
            runs = core.dispatch_runs(now)
            dead = core.take_exhausted()
            fins += dead
            if not runs:
                if dead:  # recovered at the delivery limit: the window has room again
                    continue
                break
            counts += [(r.partition, r.count, [e.offset for e in r.entries]) for r in runs]
            self._push(g, runs, chunks)
        if counts:  # delivery counts survive a crash once logged and fsynced (README "Queues")
            self._note_deliveries(core, counts)
        self._sync_later(self._log_finished(core, fins))
        self._arm(g)

    def _push(
        self, g: GroupEntry, runs: list[Run], chunks: dict[int, tuple[int, memoryview]]
    ) -> None:
        """One write per consumer: a ``qbatch`` frame of runs (``qbsub``) or one ``qmsg``
        frame per message (``qsub``). A run's records come from what :meth:`_fill` just
        read when they are in it (one read for many), else from the store (redeliveries)."""
        frames: dict[int, list[tuple[int, int, int, int, bytes | memoryview]]] = {}
        parts: dict[int, Partition | None] = {}
        topic = g.core.topic
        for r in runs:
            p, ents = r.partition, r.entries
            start = ents[0].offset
            end = ents[-1].offset + ents[-1].length
            ch = chunks.get(p)
            data: bytes | memoryview
            if ch is not None and ch[0] <= start and end <= ch[0] + len(ch[1]):
                data = ch[1][start - ch[0] : end - ch[0]]
            else:
                part = parts.get(p) if p in parts else parts.setdefault(p, self.store.get(topic, p))
                if part is None:  # cannot happen: partitions are never removed while running
                    continue
                data = _read_span(part, start, end - start)
                if len(data) != end - start:  # cannot happen: the records were read before
                    log.error("queue group %s/%s: %s-%d at %d: short read, not pushed",
                              topic, g.core.group, topic, p, start)
                    continue
            out = frames.get(r.consumer)
            if out is None:
                out = frames[r.consumer] = []
            out.append((p, r.count, len(ents), start, data))
        subs = g.subs
        for cid, out in frames.items():
            sub = subs[cid]
            if sub.batch:
                sub.conn.send(b"".join(encode_qbatch(sub.opaque, out)))
                continue
            pieces: list[bytes | memoryview] = []
            for p, count, _n, start, data in out:
                for off, length in record_spans(data, start, len(data)):
                    pieces.append(encode_qmsg(sub.opaque, p, off, count, length))
                    pieces.append(data[off - start : off - start + length])
            sub.conn.send(b"".join(pieces))

    def _fill(self, g: GroupEntry, chunks: dict[int, tuple[int, memoryview]]) -> None:
        """Read records at the frontiers, partitions in turn, while the window has room."""
        core = g.core
        parts = sorted(core.parts)
        if not parts:
            return
        first = g.next_part
        for i in range(len(parts)):
            if core.room() <= 0 or core.available:
                return
            p = parts[(first + i) % len(parts)]
            g.next_part = (first + i + 1) % len(parts)
            part = self.store.get(core.topic, p)
            if part is None:
                continue
            ps = core.parts[p]
            try:
                sl = part.slice(ps.frontier, READ_WINDOW, 1 << 31)
            except OffsetOutOfRangeError as e:
                if ps.frontier >= e.nearest or ps.entries:
                    continue
                self.lost_to_retention += 1
                core.retention_skipped_bytes += e.nearest - ps.frontier
                log.warning(
                    "queue group %s/%s: %s-%d below %d was deleted by retention unread",
                    core.topic, core.group, core.topic, p, e.nearest,
                )
                core.skip_to(p, e.nearest)
                try:  # read on at the store's first offset
                    sl = part.slice(ps.frontier, READ_WINDOW, 1 << 31)
                except OffsetOutOfRangeError:
                    continue
            if sl is None:
                continue
            data = sl.segment.read(sl.file_pos, sl.length)
            # a bounded share per partition, so a backlog in one does not starve the others
            share = max(16, core.free_credit())
            base = ps.frontier
            if core.add_span(p, data, base, share):
                chunks[p] = (base, memoryview(data))  # pushed from here (_push)

    def retention_floor(self, topic: str, partition: int) -> int | None:
        """The lowest offset of ``topic``-``partition`` a queue group may still read (what
        retention holds for, up to ``queueRetentionHoldBytes``); None: no queue group."""
        needs = [
            n for g in self._by_topic.get(topic, ()) if (n := g.core.needed(partition)) is not None
        ]
        return min(needs) if needs else None

    def retention_cut(self, topic: str, partition: int, min_offset: int) -> None:
        """Retention deleted ``topic``-``partition`` below ``min_offset``: groups that still
        needed some of it skip what they had not read and dead-letter what they tracked
        (``stats queues``: retention_skipped_bytes, retention_dropped)."""
        for g in self._by_topic.get(topic, ()):
            need = g.core.needed(partition)
            if need is not None and need < min_offset:
                log.warning(
                    "queue group %s/%s: retention deleted %s-%d below %d, the group was at %d",
                    topic, g.core.group, topic, partition, min_offset, need,
                )
                g.core.set_floor(partition, min_offset)
                self._dirty = True
                self.pump(g)

    def _arm(self, g: GroupEntry) -> None:
        """One timer per group at its earliest lock deadline or delayed release."""
        at = g.core.next_wakeup()
        if at is None:
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None
            return
        when = at / 1000.0
        if g.timer is not None and g.timer_at == when:
            return
        if g.timer is not None:
            g.timer.cancel()
        g.timer_at = when
        g.timer = self.loop.call_at(when, self._wake, g)

    def _wake(self, g: GroupEntry) -> None:
        g.timer = None
        core = g.core
        fins = core.expire(self._now_ms())
        self._sync_later(self._log_finished(core, fins))
        self.pump(g)

    # ------------------------------------------------------------------ lifecycle

    def delete(self, topic: str, group: str, force: bool = False) -> tuple[int, str]:
        """An admin deletes a group and its state: ``(200, "")``, 404 unknown, or 409 while
        it has consumers and not ``force`` (with it, their connections are closed after a
        ``410`` frame carrying their subscription's opaque: what they held returns first)."""
        g = self.groups.get((topic, group))
        if g is None:
            return 404, f"no queue group {group!r} on topic {topic!r}"
        if g.subs and not force:
            return 409, (
                f"queue group {group!r} of {topic!r} has {len(g.subs)} consumer(s): stop "
                "them first, or force (their connections are closed)"
            )
        for sub in list(g.subs.values()):
            self.connection_closed(sub.conn)
            sub.conn.hard_close(
                encode_result(410, sub.opaque, b"queue group deleted by an administrator")
            )
        self.deleted += 1
        pos = self._drop(g, "deleted by an administrator" + (" (forced)" if force else ""))
        self._sync_later(pos)
        return 200, ""

    async def delete_durable(self, topic: str, group: str, force: bool) -> tuple[int, str]:
        """:meth:`delete`, answered once the DROP record is on disk."""
        code, text = self.delete(topic, group, force)
        if code == 200 and self._log is not None:
            await self._log.sync_async()
        return code, text

    async def _delete_reply(self, conn: Connection, r: QueueDelete) -> None:
        try:
            code, text = await self.delete_durable(r.topic, r.group, r.force)
        except TxLogError as e:
            return _send(conn, 500, r.opaque, f"deletion not durable: {e}")
        _send(conn, code, r.opaque, text)

    # ------------------------------------------------------------------ admin

    def _dlq(self, conn: Connection, r: QueueDeadLetters) -> None:
        """``qdlq list|replay`` (the service checked the admin role)."""
        key = (r.topic, r.group)
        if key not in self.groups:
            return _send(conn, 404, r.opaque, f"no queue group {r.group!r} on topic {r.topic!r}")
        try:
            if r.action == "list":
                start, limit = parse_page(r.body, self.limits.max_dead_letters)
                total, dropped, page = self.dead_letters(r.topic, r.group, start, limit)
                return conn.send(
                    encode_result(200, r.opaque, encode_dead_letters(total, dropped, page))
                )
            keys = parse_replay(r.body)
        except ValueError as e:
            return _send(conn, 400, r.opaque, str(e))
        self.loop.create_task(self._replay_reply(conn, r, keys))

    async def _replay_reply(
        self, conn: Connection, r: QueueDeadLetters, keys: list[tuple[int, int]] | None
    ) -> None:
        try:
            done, unknown = await self.replay_durable(r.topic, r.group, keys)
        except (KeyError, TxLogError) as e:
            return _send(conn, 500, r.opaque, f"replay failed: {e}")
        fenced = self.fence(conn) if self.fence is not None else None
        if fenced is not None:  # replaced meanwhile: the new master's state decides
            return _send(conn, 503, r.opaque, f"not acknowledged: {fenced}")
        _send(conn, 200, r.opaque, f"{done} {unknown}")

    def dead_letters(
        self, topic: str, group: str, start: int = 0, limit: int | None = None
    ) -> tuple[int, int, list[DeadLetterInfo]]:
        """``(total, dropped, page)`` of the group's dead-letter queue, oldest first, from
        entry ``start``, at most ``limit`` entries (KeyError: no such group)."""
        core = self.groups[(topic, group)].core
        stop = len(core.dead) if limit is None else start + limit
        page = [
            DeadLetterInfo(
                d.partition,
                d.offset,
                d.length,
                d.count,
                "rejected" if d.reason is MsgState.REJECTED else "max_deliveries",
                d.at_ms,
            )
            for d in itertools.islice(core.dead.values(), start, stop)
        ]
        return len(core.dead), core.dead_dropped, page

    def replay(
        self, topic: str, group: str, keys: list[tuple[int, int]] | None
    ) -> tuple[int, int]:
        """Send dead letters (all when ``keys`` is None) back to available and log it;
        ``(replayed, unknown)``: unknown ones are not in the dead-letter queue, or their
        record is no longer in the store (retention). KeyError: no such group."""
        g = self.groups[(topic, group)]
        core = g.core
        want = list(core.dead) if keys is None else list(dict.fromkeys(keys))
        done = []
        for p, o in want:
            d = core.dead.get((p, o))
            part = self.store.get(topic, p)
            if d is None or part is None or o < part.min_offset:
                continue
            if core.replay(p, o):
                done.append((p, o, d.length))
        if done:
            self._append(queuelog.REPLAY, queuelog.encode_replay(topic, group, done))
            log.warning("queue group %s/%s: %d dead letter(s) replayed", topic, group, len(done))
            self.pump(g)
        return len(done), len(want) - len(done)

    async def replay_durable(
        self, topic: str, group: str, keys: list[tuple[int, int]] | None
    ) -> tuple[int, int]:
        """:meth:`replay`, answered once the REPLAY record is on disk."""
        done, unknown = self.replay(topic, group, keys)
        if done and self._log is not None:
            await self._log.sync_async()
        return done, unknown


def _read_span(part: Partition, start: int, length: int) -> bytes:
    """``length`` bytes of ``part`` at ``start``, across segment files (shorter only when
    the store does not hold them)."""
    out = part.read_raw(start, length)
    while len(out) < length:
        more = part.read_raw(start + len(out), length - len(out))
        if not more:
            break
        out += more
    return out


def parse_page(body: bytes, max_limit: int) -> tuple[int, int]:
    """``qdlq list`` body: empty (everything) or ``<from> <limit>``; ``limit`` is clamped to
    ``max_limit`` (queueMaxDeadLetters). ValueError with the reason when malformed."""
    t = body.split()
    if not t:
        return 0, max_limit
    try:
        if len(t) != 2:
            raise ValueError
        start, limit = int(t[0]), int(t[1])
    except ValueError:
        raise ValueError(
            f"qdlq list: body must be empty or '<from> <limit>', got {body[:40]!r}"
        ) from None
    if start < 0 or limit < 1:
        raise ValueError(f"qdlq list: from must be >= 0 and limit >= 1 (got {start} {limit})")
    return start, min(limit, max_limit)


def parse_replay(body: bytes) -> list[tuple[int, int]] | None:
    """``qdlq replay`` body: ``all`` (None) or ``<partition> <offset>`` lines. ValueError
    naming the first bad line; nothing is replayed then."""
    if body.strip() == b"all":
        return None
    keys: list[tuple[int, int]] = []
    for line in body.split(b"\n"):
        if not line.strip():
            continue
        t = line.split()
        try:
            if len(t) != 2:
                raise ValueError
            p, o = int(t[0]), int(t[1])
            if p < 0 or o < 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"qdlq replay: expected 'all' or '<partition> <offset>' lines, got "
                f"{line[:40].decode('latin-1')!r}"
            ) from None
        keys.append((p, o))
    if not keys:
        raise ValueError(
            "qdlq replay: nothing to replay (body: 'all' or '<partition> <offset>' lines)"
        )
    return keys


def _send(conn: Connection, code: int, opaque: int, text: str) -> None:
    if not conn.closed:
        conn.send(encode_result(code, opaque, text.encode("utf-8", "replace")))
