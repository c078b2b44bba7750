"""Consumer-group membership and rebalancing (MetaQ's ``ZKLoadRebalanceListener``).

A :class:`GroupMember` registers ``consumers/<group>/ids/<consumerId>`` and keeps the
consumer's share of every subscribed topic owned and fetched. It drives an
:class:`AssignmentTarget` (the consumer) from one task, so the target sees one change at a
time:

1. wake on a watch (members joined or left, a topic's partitions changed, an owner node we
   wait for went away), on a session change, or on the periodic resync;
2. read the members and each topic's ``topics-sub`` partitions, compute the share with the
   strategy;
3. partitions leaving the share: ``target.revoke`` (stop fetching, commit offsets), then
   delete their owner nodes;
4. partitions entering it: create their owner nodes (a node another member still holds is
   a conflict: watch it and retry with backoff), then ``target.assign`` what we own.

Safety: a partition is fetched only while this session holds its owner node. On SUSPENDED
fetching stops at once (``target.suspend``: positions kept, nothing committed, ownership
uncertain); back on the same session, ownership is verified and fetching resumes where it
stopped. On LOST the owner nodes are gone with the session: ``target.lost`` drops the
positions without committing (they may belong to another member by now) and the member
claims its share again from the committed offsets. Duplicates happen only around such
changes; nothing is skipped, since offsets are committed only for partitions still owned.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from ._assign import AssignmentStrategy, get_strategy
from ._errors import ConfigServerError, ConfigServerUnavailableError
from ._nodes import SessionState
from ._server import ConfigServer, PartitionInfo

__all__ = ["AssignmentTarget", "GroupMember", "new_consumer_id"]

log = logging.getLogger("notify.configserver")

DEFAULT_DEBOUNCE_S = 0.05
DEFAULT_RETRY_MIN_S = 0.1
DEFAULT_RETRY_MAX_S = 2.0
DEFAULT_RESYNC_S = 30.0

_counter = itertools.count(1)


def new_consumer_id(group: str) -> str:
    """MetaQ's consumer id: ``<group>_<host>-<pid>-<millis>-<n>``."""
    host = socket.gethostname().replace("/", "_") or "localhost"
    return f"{group}_{host}-{os.getpid()}-{int(time.time() * 1000)}-{next(_counter)}"


@runtime_checkable
class AssignmentTarget(Protocol):
    """What a :class:`GroupMember` drives (the consumer). Calls never overlap."""

    async def assign(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        """Fetch these partitions (we own them); idempotent: running ones keep running,
        suspended ones resume from their in-memory position, new ones load the committed
        offset."""
        ...

    async def revoke(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        """Stop fetching these partitions, commit their offsets and forget them."""
        ...

    async def suspend(self) -> None:
        """Stop fetching everything now, keep positions, commit nothing (ownership unsure)."""
        ...

    async def lost(self) -> None:
        """Stop fetching everything and forget uncommitted positions (ownership gone)."""
        ...


class GroupMember:
    """One member of a consumer group on a :class:`ConfigServer` (see the module doc)."""

    def __init__(
        self,
        server: ConfigServer,
        group: str,
        topics: Sequence[str],
        target: AssignmentTarget,
        *,
        consumer_id: str | None = None,
        strategy: str | AssignmentStrategy = "contiguous",
        debounce_s: float = DEFAULT_DEBOUNCE_S,
        retry_min_s: float = DEFAULT_RETRY_MIN_S,
        retry_max_s: float = DEFAULT_RETRY_MAX_S,
        resync_s: float = DEFAULT_RESYNC_S,
    ):
        if not topics:
            raise ConfigServerError("a group member needs at least one topic")
        self.server = server
        self.group = group
        self.topics = tuple(dict.fromkeys(topics))
        self.target = target
        self.consumer_id = consumer_id or new_consumer_id(group)
        self.strategy = get_strategy(strategy)
        self.debounce_s = debounce_s
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.resync_s = resync_s
        #: topic -> {partition id: partition} whose owner node this member holds
        self.owned: dict[str, dict[str, PartitionInfo]] = {t: {} for t in self.topics}
        self.rebalances = 0
        self.conflicts = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._remove_listener: Callable[[], None] | None = None
        self._suspended = False
        self._lost = False
        self._verify = False
        self._stopping = False
        self._balanced: asyncio.Event | None = None  # created on the loop

    # -- lifecycle

    async def start(self) -> None:
        """Register the member and start rebalancing (registered when this returns, unless
        the session is down: then as soon as it is back)."""
        self._wake = asyncio.Event()
        self._balanced = asyncio.Event()
        await self.server.start()
        self._remove_listener = self.server.add_session_listener(self._on_session)
        try:
            await self.server.register_consumer(self.group, self.consumer_id, list(self.topics))
        except ConfigServerUnavailableError as e:
            # remembered by the server: created once the session is back, then rebalanced
            log.warning(
                "group %s: %s registers when connected: %s", self.group, self.consumer_id, e
            )
        self._task = asyncio.ensure_future(self._run())
        self.trigger()

    async def stop(self) -> None:
        """Stop rebalancing (the target keeps what it has; see :meth:`leave`)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        self.server.forget_watch(self.trigger)

    async def leave(self) -> None:
        """Graceful leave: stop, revoke everything (commit), release the owner nodes and
        delete the id node, so the others rebalance at once."""
        await self.stop()
        try:
            for topic, parts in self.owned.items():
                if parts:
                    await self.target.revoke(topic, list(parts.values()))
            for topic, parts in self.owned.items():
                for pid in list(parts):
                    await self.server.release(self.group, topic, pid, self.consumer_id)
                    del parts[pid]
                # a claim interrupted by stop() may have left a node of ours behind
                for pid, owner in (await self.server.owners(self.group, topic)).items():
                    if owner == self.consumer_id:
                        await self.server.release(self.group, topic, pid, self.consumer_id)
            await self.server.unregister_consumer(self.group, self.consumer_id)
        except ConfigServerError as e:
            log.warning("group %s: leave of %s incomplete: %s", self.group, self.consumer_id, e)

    def trigger(self) -> None:
        """Ask for a rebalance (also the watch callback)."""
        if self._wake is not None:
            self._wake.set()

    async def wait_balanced(self, timeout_s: float) -> bool:
        """Wait until a rebalance completed without conflict (tests, tools)."""
        assert self._balanced is not None
        try:
            async with asyncio.timeout(timeout_s):
                await self._balanced.wait()
        except TimeoutError:
            return False
        return True

    @property
    def assignment(self) -> dict[str, list[str]]:
        """``{topic: [partition ids]}`` owned now."""
        return {t: sorted(p, key=_pid_key) for t, p in self.owned.items()}

    # -- the loop

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self._lost = True
        elif state is SessionState.SUSPENDED:
            self._verify = True
        self.trigger()

    async def _run(self) -> None:
        assert self._wake is not None and self._balanced is not None
        wake = self._wake
        backoff = self.retry_min_s
        loop = asyncio.get_running_loop()
        next_resync = loop.time() + self.resync_s
        while not self._stopping:
            timeout = max(0.0, next_resync - loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await wake.wait()
            wake.clear()
            if await self._session_changes():
                continue
            if self.debounce_s > 0:
                await asyncio.sleep(self.debounce_s)
                wake.clear()
                if await self._session_changes():
                    continue
            try:
                done = await self._rebalance()
            except ConfigServerUnavailableError as e:
                log.info("group %s: rebalance postponed: %s", self.group, e)
                done = False
            except ConfigServerError as e:
                log.error("group %s: rebalance failed: %s", self.group, e)
                done = False
            if done:
                backoff = self.retry_min_s
                next_resync = loop.time() + self.resync_s
                self._balanced.set()
            else:
                self._balanced.clear()
                next_resync = loop.time() + backoff
                backoff = min(backoff * 2, self.retry_max_s)

    async def _session_changes(self) -> bool:
        """Apply session trouble to the target; True when not connected (wait for more)."""
        if self._lost:
            self._lost = False
            self._verify = False
            self._suspended = False
            for parts in self.owned.values():
                parts.clear()
            log.warning(
                "group %s: session lost, %s drops its partitions", self.group, self.consumer_id
            )
            await self.target.lost()
        if self.server.state is not SessionState.CONNECTED:
            if not self._suspended:
                self._suspended = True
                await self.target.suspend()
            return True
        self._suspended = False
        return False

    async def _rebalance(self) -> bool:
        server, cid = self.server, self.consumer_id
        if self._verify:  # back from SUSPENDED on the same session: are the nodes still ours?
            for topic, parts in self.owned.items():
                owners = await server.owners(self.group, topic)
                gone = [p for pid, p in parts.items() if owners.get(pid) != cid]
                for p in gone:
                    del parts[p.id]
                if gone:
                    await self.target.revoke(topic, gone)
            self._verify = False
        members = await server.group_members(self.group, watch=self.trigger)
        if cid not in members:
            log.warning("group %s: %s is not registered: registering again", self.group, cid)
            await server.register_consumer(self.group, cid, list(self.topics))
            return False
        complete = True
        changed = False
        for topic in self.topics:
            available = await server.topic_partitions(topic, publish=False, watch=self.trigger)
            consumers = [c for c, ts in members.items() if topic in ts]
            share = self.strategy.assign(consumers, available).get(cid, [])
            desired = {p.id: p for p in share}
            have = self.owned[topic]
            gone = [p for pid, p in have.items() if desired.get(pid) != p]
            if gone:
                changed = True
                await self.target.revoke(topic, gone)
                for p in gone:
                    await server.release(self.group, topic, p.id, cid)
                    del have[p.id]
            wanted = [p for pid, p in desired.items() if pid not in have]
            if wanted:
                changed = True
                claims = await asyncio.gather(
                    *(
                        server.claim(self.group, topic, p.id, cid, watch=self.trigger)
                        for p in wanted
                    )
                )
                for p, ok in zip(wanted, claims, strict=True):
                    if ok:
                        have[p.id] = p
                    else:
                        complete = False
                        self.conflicts += 1
            if server.state is not SessionState.CONNECTED or self._lost:
                return False
            await self.target.assign(topic, list(have.values()))
        if changed:
            self.rebalances += 1
            log.info(
                "group %s: %s owns %s%s",
                self.group,
                cid,
                {t: len(p) for t, p in self.owned.items()},
                "" if complete else " (waiting for partitions still owned by others)",
            )
        return complete


def _pid_key(pid: str) -> tuple[int, int]:
    b, _, p = pid.partition("-")
    return (int(b), int(p)) if b.isdigit() and p.isdigit() else (-1, -1)
