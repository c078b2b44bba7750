"""GroupMember rebalancing on both backends with recording targets: the share, no
partition held by two members at once, prompt rebalances, session trouble."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from notify.configserver import (
    BrokerRegistration,
    ConfigServer,
    GroupMember,
    PartitionInfo,
    SessionState,
    TopicRegistration,
)
from tests.cluster.conftest import Backend
from tests.cluster.test_configserver import eventually, run
from tests.helpers import timing


class Ledger:
    """Who fetches what, across all members of a test; flags any overlap."""

    def __init__(self) -> None:
        self.fetching: dict[str, str] = {}  # partition id -> member
        self.overlaps: list[str] = []
        self.events: list[tuple[str, str, str]] = []


class Target:
    """An AssignmentTarget recording calls into a shared :class:`Ledger`."""

    def __init__(self, name: str, ledger: Ledger):
        self.name = name
        self.ledger = ledger
        self.running: set[str] = set()
        self.parked: set[str] = set()
        self.losses = 0

    async def assign(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        for p in partitions:
            if p.id in self.running:
                continue
            holder = self.ledger.fetching.get(p.id)
            if holder is not None and holder != self.name:
                self.ledger.overlaps.append(f"{p.id}: {holder} and {self.name}")
            self.ledger.fetching[p.id] = self.name
            self.ledger.events.append(("assign", self.name, p.id))
            self.running.add(p.id)
            self.parked.discard(p.id)

    async def revoke(self, topic: str, partitions: Sequence[PartitionInfo]) -> None:
        for p in partitions:
            self._stop(p.id)
            self.parked.discard(p.id)

    def _stop(self, pid: str) -> None:
        if pid in self.running:
            self.running.discard(pid)
            if self.ledger.fetching.get(pid) == self.name:
                del self.ledger.fetching[pid]
            self.ledger.events.append(("stop", self.name, pid))

    async def suspend(self) -> None:
        for pid in list(self.running):
            self._stop(pid)
            self.parked.add(pid)

    async def lost(self) -> None:
        await self.suspend()
        self.parked.clear()
        self.losses += 1


async def start_brokers(backend: Backend, n: int, parts: int) -> ConfigServer:
    s = backend.make()
    await s.start()
    for b in range(n):
        await s.register_broker(
            BrokerRegistration(b, "127.0.0.1", 9100 + b, (TopicRegistration("t", parts),))
        )
    return s


def member(server: ConfigServer, name: str, ledger: Ledger) -> GroupMember:
    return GroupMember(
        server, "g", ["t"], Target(name, ledger), consumer_id=f"g_{name}", retry_max_s=0.5
    )


def shares(members: list[GroupMember]) -> list[int]:
    return [len(m.owned["t"]) for m in members]


def test_one_four_two_members_no_overlap(backend: Backend) -> None:
    async def main() -> None:
        brokers = await start_brokers(backend, 3, 4)  # 12 partitions
        ledger = Ledger()
        servers = [backend.make() for _ in range(4)]
        members = [member(s, f"c{i}", ledger) for i, s in enumerate(servers)]
        try:
            await members[0].start()
            await eventually(lambda: _true(shares(members[:1]) == [12]))
            for m in members[1:]:
                await m.start()
            await eventually(lambda: _true(sorted(shares(members)) == [3, 3, 3, 3]))
            assert len(ledger.fetching) == 12
            # graceful leave of one, crash (session expiry) of another
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await members[3].leave()
            await servers[3].close()
            await eventually(lambda: _true(sorted(shares(members[:3])) == [4, 4, 4]))
            graceful_s = loop.time() - t0
            t0 = loop.time()
            await members[2].stop()  # a crash: nothing released, then its session ends
            await servers[2].close()
            dead = members[2].target
            assert isinstance(dead, Target)
            await dead.lost()  # the process is gone: it fetches nothing any more
            await eventually(lambda: _true(sorted(shares(members[:2])) == [6, 6]))
            crash_s = loop.time() - t0
            assert ledger.overlaps == []
            timing(graceful_s < 2.0, f"rebalanced {graceful_s:.2f} s after a member left (< 2)")
            # from the session's end: watch + claim
            timing(crash_s < 2.0, f"rebalanced {crash_s:.2f} s after a session ended (< 2)")
            owners = await brokers.owners("g", "t")
            assert sorted(set(owners.values())) == ["g_c0", "g_c1"] and len(owners) == 12
        finally:
            for m in members[:2]:
                await m.leave()
            for s in [*servers, brokers]:
                await s.close()

    run(main())


def test_partition_change_rebalances(backend: Backend) -> None:
    async def main() -> None:
        brokers = await start_brokers(backend, 1, 2)
        ledger = Ledger()
        s1, s2 = backend.make(), backend.make()
        m1, m2 = member(s1, "a", ledger), member(s2, "b", ledger)
        try:
            await m1.start()
            await m2.start()
            await eventually(lambda: _true(sorted(shares([m1, m2])) == [1, 1]))
            extra = backend.make()
            await extra.start()
            await extra.register_broker(
                BrokerRegistration(5, "127.0.0.1", 9105, (TopicRegistration("t", 4),))
            )
            await eventually(lambda: _true(sorted(shares([m1, m2])) == [3, 3]))
            await extra.close()  # the broker leaves: its partitions are released
            await eventually(lambda: _true(sorted(shares([m1, m2])) == [1, 1]))
            assert ledger.overlaps == []
            assert not any(pid.startswith("5-") for pid in ledger.fetching)
        finally:
            await m1.leave()
            await m2.leave()
            for s in (s1, s2, brokers):
                await s.close()

    run(main())


def test_session_lost_stops_then_reclaims(backend: Backend) -> None:
    async def main() -> None:
        brokers = await start_brokers(backend, 1, 4)
        ledger = Ledger()
        s = backend.make()
        m = member(s, "solo", ledger)
        target = m.target
        assert isinstance(target, Target)
        try:
            await m.start()
            await eventually(lambda: _true(len(target.running) == 4))
            await asyncio.to_thread(backend.expire, s)
            await eventually(lambda: _true(target.losses == 1))
            await eventually(
                lambda: _true(len(target.running) == 4 and s.state is SessionState.CONNECTED)
            )
            # ownership was claimed again in the new session
            assert sorted((await brokers.owners("g", "t")).values()) == ["g_solo"] * 4
            kinds = [e[0] for e in ledger.events]
            assert kinds == ["assign"] * 4 + ["stop"] * 4 + ["assign"] * 4
        finally:
            await m.leave()
            await s.close()
            await brokers.close()

    run(main())


def test_embedded_suspension_pauses_and_resumes_in_place() -> None:
    async def main() -> None:
        backend = Backend("embedded", "/meta")
        brokers = await start_brokers(backend, 1, 2)
        ledger = Ledger()
        s = backend.make()
        m = member(s, "x", ledger)
        target = m.target
        assert isinstance(target, Target)
        await m.start()
        await eventually(lambda: _true(len(target.running) == 2))
        backend.tree.suspend(s.store)  # type: ignore[arg-type]
        await eventually(lambda: _true(not target.running and len(target.parked) == 2))
        backend.tree.resume(s.store)  # type: ignore[arg-type]
        await eventually(lambda: _true(len(target.running) == 2))
        assert target.losses == 0 and m.conflicts == 0
        await m.leave()
        assert await brokers.owners("g", "t") == {} and await brokers.group_members("g") == {}
        await s.close()
        await brokers.close()

    run(main())


async def _true(v: bool) -> bool:
    return v


def test_consistent_hash_strategy_covers_every_partition_once() -> None:
    async def main() -> None:
        backend = Backend("embedded", "/meta")
        brokers = await start_brokers(backend, 2, 8)
        ledger = Ledger()
        servers = [backend.make() for _ in range(3)]
        members = [
            GroupMember(
                s, "g", ["t"], Target(f"h{i}", ledger), strategy="consistent_hash", debounce_s=0
            )
            for i, s in enumerate(servers)
        ]
        for m in members:
            await m.start()
        await eventually(lambda: _true(sum(shares(members)) == 16 and len(ledger.fetching) == 16))
        await members[0].leave()
        await eventually(lambda: _true(sum(shares(members[1:])) == 16))
        assert ledger.overlaps == []
        for m in members[1:]:
            await m.leave()
        for s in [*servers, brokers]:
            await s.close()

    run(main())
