"""A topic's retention run on a broker: the store's plan (:mod:`notify.store.retention`)
bounded by what live consumers and queue groups still read."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from notify.broker.delay import DELAY_TOPIC
from notify.config import SystemConfig
from notify.store.manager import MessageStore
from notify.store.retention import (
    LIVE_CONSUMER_S,
    RetentionResult,
    hold_for_queues,
    plan_cut,
    remove_before,
    zip_segments,
)

if TYPE_CHECKING:
    from notify.broker.service import BrokerService

log = logging.getLogger("notify.broker")


async def apply_retention(
    store: MessageStore, service: BrokerService, system: SystemConfig, topic: str
) -> list[RetentionResult]:
    """Apply ``topic``'s deletePolicy now: per partition, the store's cut, kept back for a
    consumer seen fetching lately (unless ``retentionIgnoresConsumers``) and for queue
    groups up to ``queueRetentionHoldBytes``; archived segments zipped off the loop."""
    tc = store.topics.get(topic)
    if tc is None or tc.store == "memory" or topic == DELAY_TOPIC:
        return []  # __delay: the delay queue deletes what it has delivered
    loop = asyncio.get_running_loop()
    out = []
    now = time.monotonic()
    for part in store.topic_partitions(topic):
        seen = service.consumer_positions.get((topic, part.index), {})
        live = [off for off, t in seen.values() if now - t < LIVE_CONSUMER_S]
        cut, kept = plan_cut(part, tc.delete_policy, live, tc.retention_ignores_consumers)
        queues = service.queues
        if queues is not None and cut > part.min_offset:  # README "Queues": retention
            floor = queues.retention_floor(topic, part.index)
            held = hold_for_queues(part, cut, floor, system.queues.retention_hold_bytes)
            if held < cut:
                log.debug(
                    "retention %s-%d: expired data kept for queue groups from %d",
                    topic, part.index, held,
                )  # fmt: skip
            cut = held
        if cut <= part.min_offset:
            if kept:
                log.info(
                    "retention %s-%d: expired data kept for a live consumer", topic, part.index
                )
            continue
        if tc.delete_policy.action == "archive" and tc.delete_policy.compress:
            paths = [s.path for s in part.segments[:-1] if s.end <= cut]
            await loop.run_in_executor(None, zip_segments, paths)
        out.append(remove_before(part, cut, tc.delete_policy, kept))
        if service.queues is not None:
            service.queues.retention_cut(topic, part.index, part.min_offset)
    return out
