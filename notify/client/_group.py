"""Group coordination in cluster mode (aiokafka's ``consumer/group_coordinator.py``).

With a configserver (``connect(zk=...)``) a :class:`configserver.GroupMember` registers the
consumer in its group and drives :class:`ClusterTarget`: partitions are fetched only while
this consumer holds their owner node; a rebalance stops the partitions that move, commits
their offsets and releases them before anyone else claims them. Without a cluster every
consumer takes the static share ``member_index``/``member_count`` of each topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from notify.configserver import ConfigServer, GroupMember, PartitionInfo
from notify.errors import ClientError, ConnectionLostError, NotifyError

from ._commits import OffsetCommitter
from ._config import ConsumerConfig
from ._delivery import Delivery
from ._routing import Partition
from ._subscription import Cursor, Lifecycle, Subscription, SubscriptionState

log = logging.getLogger("notify.client")


class CursorOwner(Protocol):
    """What :class:`ClusterTarget` needs of its consumer."""

    group: str
    config: ConsumerConfig
    state: SubscriptionState
    life: Lifecycle
    offsets: OffsetCommitter
    delivery: Delivery

    def start_cursor(self, sub: Subscription, part: Partition) -> None: ...

    async def stop_cursor(self, cur: Cursor) -> None: ...

    async def commit(self) -> None: ...


async def join_group(consumer: CursorOwner, cluster: ConfigServer) -> GroupMember | None:
    """Register ``consumer`` in its group for every subscribed topic (None: no topics).
    Raises :class:`ConnectionLostError` when the configserver cannot be joined."""
    topics = list(consumer.state.subs)  # listener topics and fetch()/messages() topics alike
    if not topics:
        return None
    cfg = consumer.config
    member = GroupMember(
        cluster,
        consumer.group,
        topics,
        ClusterTarget(consumer),
        consumer_id=cfg.consumer_id,
        strategy=cfg.assignment,
        retry_max_s=cfg.rebalance_retry_max_s,
    )
    try:
        await member.start()
    except NotifyError as e:  # configserver errors, translated at the client boundary
        raise ConnectionLostError(f"cannot join group {consumer.group}: {e}") from e
    return member


def _part(p: PartitionInfo) -> Partition:
    return Partition(p.broker_id, p.partition, p.address)


class ClusterTarget:
    """The consumer as a :class:`configserver.AssignmentTarget` (called by its GroupMember,
    one call at a time)."""

    def __init__(self, consumer: CursorOwner):
        self.c = consumer
        self.state = consumer.state

    def _cursor(self, topic: str, p: PartitionInfo) -> Cursor | None:
        return self.state.cursors.get((topic, _part(p)))

    async def assign(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        c = self.c
        sub = self.state.subs.get(topic)
        if sub is None or c.life.stopping:
            return
        if sub.listener is None:
            await self._assign_manual(sub, partitions)
            return
        for p in partitions:
            cur = self._cursor(topic, p)
            if cur is None:
                c.start_cursor(sub, _part(p))
            elif cur.task is None or cur.task.done():  # suspended: resume where handled
                cur.stopped = False
                if cur.done >= 0:
                    cur.position = cur.done
                cur.task = c.life.spawn(c.delivery.run_cursor(sub, cur))

    async def _assign_manual(self, sub: Subscription, partitions: Sequence[PartitionInfo]) -> None:
        """fetch()/messages() topic: a cursor per newly owned partition, starting at the
        committed offset (read after the claim, so the previous owner's last commit counts);
        a suspended one resumes where the application's processing reached."""
        cursors = self.state.manual.setdefault(sub.topic, [])
        for p in partitions:
            cur = self.state.manual_cursor(sub.topic, _part(p))
            if cur is not None:
                if cur.stopped:
                    cur.stopped = False
                    if cur.done >= 0:
                        cur.position = cur.done
                continue
            cur = self.state.new_cursor(sub, _part(p))
            await self.c.offsets.init_offset(cur)
            cursors.append(cur)

    async def revoke(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        c = self.c
        state = self.state
        manual = [m for p in partitions if (m := state.manual_cursor(topic, _part(p))) is not None]
        if manual:  # what the application processed is committed; the rest is redelivered
            for cur in manual:
                cur.stopped = True
                cur.mark_done()
            await self._commit(topic)
            self.state.drop_manual(manual)
        curs = [k for p in partitions if (k := self._cursor(topic, p)) is not None]
        if not curs:
            return
        await asyncio.gather(*(c.stop_cursor(cur) for cur in curs))
        await self._commit(topic)
        for cur in curs:
            self.state.cursors.pop((cur.topic, cur.partition), None)

    async def _commit(self, topic: str) -> None:
        try:
            await self.c.commit()
        except ClientError as e:
            log.error("group %s: commit before releasing %s failed: %s", self.c.group, topic, e)

    async def suspend(self) -> None:
        for cursors in self.state.manual.values():
            for cur in cursors:
                cur.cancel_pending()
                cur.stopped = True
        curs = list(self.state.cursors.values())
        await asyncio.gather(*(self.c.stop_cursor(cur) for cur in curs))

    async def lost(self) -> None:
        self.state.drop_manual([cur for cursors in self.state.manual.values() for cur in cursors])
        curs = list(self.state.cursors.values())
        await asyncio.gather(*(self.c.stop_cursor(cur) for cur in curs))
        for cur in curs:
            self.state.cursors.pop((cur.topic, cur.partition), None)
