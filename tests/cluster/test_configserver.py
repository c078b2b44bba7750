"""ConfigServer on both backends (embedded twin, real ZooKeeper): registration, discovery,
watches, owner claims, session loss."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from notify.configserver import (
    BrokerRegistration,
    ConfigServer,
    ConfigServerError,
    PartitionInfo,
    SessionState,
    TopicRegistration,
)
from tests.cluster.conftest import Backend


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


async def eventually(cond: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def reg(bid: int, port: int, *topics: TopicRegistration) -> BrokerRegistration:
    return BrokerRegistration(bid, "127.0.0.1", port, topics)


def test_discovery_follows_brokers(backend: Backend) -> None:
    async def main() -> None:
        b0, b1, client = backend.make(), backend.make(), backend.make()
        await asyncio.gather(b0.start(), b1.start(), client.start())
        try:
            await b0.register_broker(reg(0, 9000, TopicRegistration("t", 2)))
            fired = asyncio.Event()
            parts = await client.topic_partitions("t", watch=fired.set)
            assert parts == [
                PartitionInfo(0, 0, "127.0.0.1:9000"),
                PartitionInfo(0, 1, "127.0.0.1:9000"),
            ]
            # a broker joins
            await b1.register_broker(reg(1, 9001, TopicRegistration("t", 1)))
            await asyncio.wait_for(fired.wait(), 5)
            fired.clear()
            parts = await client.topic_partitions("t", watch=fired.set)
            assert [str(p) for p in parts] == ["0-0", "0-1", "1-0"]
            # a reload grows a topic: the watch on the node's value fires
            await b1.register_broker(reg(1, 9001, TopicRegistration("t", 3)))
            await asyncio.wait_for(fired.wait(), 5)
            fired.clear()
            assert len(await client.topic_partitions("t", watch=fired.set)) == 5
            # a broker goes away (its session closes)
            await b0.close()
            await asyncio.wait_for(fired.wait(), 5)
            assert [str(p) for p in await client.topic_partitions("t")] == ["1-0", "1-1", "1-2"]
            assert await client.topic_partitions("t", publish=False) != []
            assert [b.broker_id for b in await client.brokers()] == [1]
            assert await client.topics() == ["t"]
        finally:
            for s in (b0, b1, client):
                await s.close()

    run(main())


def test_accept_flags_and_stale_node_of_same_broker(backend: Backend) -> None:
    async def main() -> None:
        old, new, other = backend.make(), backend.make(), backend.make()
        await asyncio.gather(old.start(), new.start(), other.start())
        try:
            r = reg(4, 9004, TopicRegistration("pubonly", 1, accept_subscribe=False))
            await old.register_broker(r)
            assert await new.topic_partitions("pubonly", publish=False) == []
            # the same broker again (restarted before its old session expired): replaces it
            await new.register_broker(r)
            await old.close()
            assert [str(p) for p in await new.topic_partitions("pubonly")] == ["4-0"]
            # another address under the same id is a conflict
            with pytest.raises(ConfigServerError, match="another session"):
                await other.register_broker(reg(4, 9999))
        finally:
            for s in (old, new, other):
                await s.close()

    run(main())


def test_claims_conflict_and_release(backend: Backend) -> None:
    async def main() -> None:
        a, b = backend.make(), backend.make()
        await asyncio.gather(a.start(), b.start())
        try:
            await a.register_consumer("g", "g_a", ["t"])
            await b.register_consumer("g", "g_b", ["t", "u"])
            assert await a.group_members("g") == {"g_a": ("t",), "g_b": ("t", "u")}
            assert await a.claim("g", "t", "0-0", "g_a")
            assert await a.claim("g", "t", "0-0", "g_a")  # idempotent for the holder
            freed = asyncio.Event()
            assert not await b.claim("g", "t", "0-0", "g_b", watch=freed.set)
            assert not await b.release("g", "t", "0-0", "g_b")  # not b's to release
            assert await a.release("g", "t", "0-0", "g_a")
            await asyncio.wait_for(freed.wait(), 5)
            assert await b.claim("g", "t", "0-0", "g_b")
            assert await a.owners("g", "t") == {"0-0": "g_b"}
            left = asyncio.Event()
            await a.group_members("g", watch=left.set)
            await b.unregister_consumer("g", "g_b")
            await asyncio.wait_for(left.wait(), 5)
            assert list(await a.group_members("g")) == ["g_a"]
        finally:
            await a.close()
            await b.close()

    run(main())


def test_session_loss_reregisters_but_never_reclaims(backend: Backend) -> None:
    async def main() -> None:
        s, watcher = backend.make(), backend.make()
        await asyncio.gather(s.start(), watcher.start())
        states: list[SessionState] = []
        s.add_session_listener(states.append)
        try:
            await s.register_broker(reg(2, 9002, TopicRegistration("t", 1)))
            await s.register_consumer("g", "g_s", ["t"])
            assert await s.claim("g", "t", "2-0", "g_s")
            fired = asyncio.Event()
            await watcher.group_members("g", watch=fired.set)
            old_session = s.store.session_id
            await asyncio.to_thread(backend.expire, s)

            async def back() -> bool:
                return (
                    s.state is SessionState.CONNECTED
                    and s.store.session_id != old_session
                    and SessionState.LOST in states
                )

            await eventually(back)
            # broker and consumer registrations are back, ownership is not
            assert [str(p) for p in await watcher.topic_partitions("t")] == ["2-0"]
            assert list(await watcher.group_members("g")) == ["g_s"]
            assert await watcher.owners("g", "t") == {}
            assert fired.is_set()  # the others saw the member come and go
            assert states[-1] is SessionState.CONNECTED
        finally:
            await s.close()
            await watcher.close()

    run(main())


def test_embedded_suspend_defers_watches() -> None:
    async def main() -> None:
        backend = Backend("embedded", "/meta")
        s, other = backend.make(), backend.make()
        await asyncio.gather(s.start(), other.start())
        fired = asyncio.Event()
        await s.group_members("g", watch=fired.set)
        backend.tree.suspend(s.store)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert s.state is SessionState.SUSPENDED and not fired.is_set()
        await other.register_consumer("g", "g_o", ["t"])
        backend.tree.resume(s.store)  # type: ignore[arg-type]
        await asyncio.wait_for(fired.wait(), 5)  # delivered once connected again
        assert list(await s.group_members("g")) == ["g_o"]
        await s.close()
        await other.close()

    run(main())


def test_unreachable_zookeeper_fails_fast() -> None:
    async def main() -> None:
        s = ConfigServer.from_url("127.0.0.1:1/meta")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ConfigServerError, match="cannot connect"):
            await s.start(1.0)
        assert loop.time() - t0 < 5

    run(main())
