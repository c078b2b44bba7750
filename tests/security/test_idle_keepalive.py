"""Item 8 of the security issue: ``idleTimeout`` is on by default (300 s) and closes silent
sockets, while every connection that is legitimately quiet survives it: a long-poll get or
a queue subscription outlasting it, a replication link, and notify's own clients (async and
sync), which keep an idle connection alive with a ``version`` heartbeat or, for the sync
producer's own socket, notice the close and reconnect before sending.

The brokers here use ``idleTimeout=500`` and the clients a 0.1 s heartbeat, so each test
takes a few seconds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    connect,
)
from notify.config import SystemConfig
from tests.conftest import BrokerFactory
from tests.helpers import WireClient, timing

REPL = "repl-secret"
IDLE_MS = 500
IDLE_S = IDLE_MS / 1000
BEAT = ClientConfig(
    heartbeat_interval_s=0.1,
    request_timeout_s=3.0,
    reconnect_backoff_min_s=0.02,
    reconnect_backoff_max_s=0.2,
)
NO_BEAT = ClientConfig(
    heartbeat_interval_s=0.0,
    request_timeout_s=3.0,
    reconnect_backoff_min_s=0.02,
    reconnect_backoff_max_s=0.2,
)


def test_silent_socket_closed_waiting_ones_kept(broker_factory: BrokerFactory) -> None:
    """A silent socket goes after idleTimeout; a parked long poll, a queue subscription and
    a replication link outlast it; the answer to a long poll counts as activity."""
    assert SystemConfig().idle_timeout_ms == 300_000  # on by default
    b = broker_factory({"r": 1}, idleTimeout=IDLE_MS, replicationSecret=REPL)
    with (
        WireClient(b.addr) as silent,
        WireClient(b.addr) as poll,
        WireClient(b.addr) as sub,
        WireClient(b.addr) as replica,
    ):
        assert sub.call(b"qsub r q 1 earliest 1\r\n").code == 200
        assert replica.call(f"auth {REPL} 0 1\r\n".encode()).code == 200
        t0 = time.monotonic()
        poll.send(b"get r g 0 0 4096 1100 1\r\n")  # parked 1.1 s: over idleTimeout
        assert silent.is_closed(3.0)
        closed_s = time.monotonic() - t0
        assert closed_s >= 0.9 * IDLE_S
        timing(closed_s < 1.1, f"a silent socket closed after {closed_s:.2f} s (idle {IDLE_S} s)")
        r = poll.replies(1)[0]
        assert r.code == 404 and time.monotonic() - t0 >= 1.05  # answered, not cut
        assert not poll.is_closed(0.9 * IDLE_S)  # the answer was activity: a full idleTimeout
        assert poll.call(b"version 2\r\n").code == 200
        assert time.monotonic() - t0 > 2 * IDLE_S
        assert not sub.is_closed(0.05) and not replica.is_closed(0.05)
        assert sub.call(b"qunsub r q 3\r\n").code == 200  # no longer waiting for anything
        assert sub.is_closed(3.0)
        assert replica.call(b"version 4\r\n").code == 200


def test_async_client_survives_idle_timeout(broker_factory: BrokerFactory) -> None:
    """An idle async session keeps its connection with heartbeats; without them it
    reconnects transparently."""
    b = broker_factory({"t": 1}, idleTimeout=IDLE_MS)

    async def main() -> None:
        async with AsyncMessageSessionFactory([b.addr], config=BEAT) as s:
            p = s.create_producer()
            assert (await p.send("t", b"a")).success
            await asyncio.sleep(3 * IDLE_S)
            assert (await p.send("t", b"b")).success
            assert s.pool.connects == 1  # kept open by heartbeats
            conn = s.pool.cached(b.addr)
            assert conn is not None and conn.heartbeats >= 8
        async with AsyncMessageSessionFactory([b.addr], config=NO_BEAT) as s:
            p = s.create_producer()
            assert (await p.send("t", b"c")).success
            await asyncio.sleep(2 * IDLE_S)
            assert (await p.send("t", b"d")).success  # closed by the broker, reopened
            assert s.pool.connects == 2

    asyncio.run(main())


def test_long_polling_consumer_outlasts_idle_timeout(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """A consumer without heartbeats whose gets are parked for twice idleTimeout keeps its
    connection (the parked get is waiting, its answer is activity)."""
    b = broker_factory({"t": 1}, idleTimeout=IDLE_MS)

    async def main() -> None:
        got: list[bytes] = []
        cfg = ConsumerConfig(group="g", data_dir=tmp_path / "c", long_poll_ms=2 * IDLE_MS)
        async with AsyncMessageSessionFactory([b.addr], config=NO_BEAT) as s:
            c = s.create_consumer(cfg)
            await c.subscribe("t", lambda m: got.append(m.data)).complete_subscribe()
            await asyncio.sleep(3 * IDLE_S)  # parked gets of 2 x idleTimeout, nothing else
            assert (await s.create_producer().send("t", b"e")).success
            deadline = asyncio.get_running_loop().time() + 5
            while not got and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            assert got == [b"e"]
            assert s.pool.connects == 1  # the long-polling connection was never cut

    asyncio.run(main())


def test_sync_client_survives_idle_timeout(broker_factory: BrokerFactory) -> None:
    """The sync producer's own blocking socket, closed by the broker while unused, is
    replaced before the next send (still the direct path, nothing fell back); the session's
    loop connection is kept by heartbeats."""
    b = broker_factory({"t": 1}, idleTimeout=IDLE_MS)
    with connect([b.addr], config=BEAT) as s:
        p = s.create_producer()
        p.publish("t")
        assert p.send("t", b"x").success
        direct = s.core.pool.blocking_of("send")[b.addr]
        assert p.send_future("t", b"y").result(5).success  # the loop path
        time.sleep(2 * IDLE_S)
        assert direct.peer_closed()  # the broker closed the unused socket
        assert p.send("t", b"z").success
        assert s.core.pool.blocking_of("send")[b.addr] is direct
        assert direct.is_open and not direct.peer_closed() and not s.core.pool._skip_until
        assert p.send_future("t", b"w").result(5).success
        assert s.core.pool.connects == 1  # the loop connection: kept by heartbeats
