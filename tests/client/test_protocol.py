"""Reply handling against the scripted fake broker: opaque matching, mput fallback,
timeouts, lost connections, 301 and fetch growth."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    ProducerConfig,
    connect,
)
from notify.client._connection import ConnectionPool
from notify.errors import ConnectionLostError, RequestTimeoutError
from notify.protocol.frames import encode_line
from tests.client.fakebroker import FakeBroker

FAST = ClientConfig(
    request_timeout_s=0.3, reconnect_backoff_min_s=0.01, reconnect_backoff_max_s=0.05
)


def test_out_of_order_replies_are_matched_by_opaque(fake: FakeBroker) -> None:
    fake.knobs.reverse_replies = True

    async def main() -> None:
        pool = ConnectionPool(1.0, 0.01, 0.1)
        conn = await pool.get(fake.addr)
        opaques = [conn.next_opaque() for _ in range(3)]
        futs = [conn.send(encode_line("version", o), o) for o in opaques]
        stats_o = conn.next_opaque()
        futs.append(conn.send(encode_line("stats", "topics", stats_o), stats_o))
        all_o = [*opaques, stats_o]
        replies = [await conn.wait(f, o, 2.0) for f, o in zip(futs, all_o, strict=True)]
        assert [r.opaque for r in replies] == [*opaques, stats_o]
        assert replies[0].body == b"fake" and replies[-1].body.startswith(b"STATS")
        await pool.close()

    asyncio.run(main())


def test_mput_unknown_command_falls_back_to_pipelined_put(fake: FakeBroker) -> None:
    fake.knobs.mput_supported = False

    async def main() -> None:
        async with AsyncMessageSessionFactory([fake.addr], config=FAST) as s:
            p = s.create_producer(ProducerConfig(use_mput=True))
            futs = [p.send_nowait("single", b"m%d" % i) for i in range(50)]
            results = [await f for f in futs]
        assert all(r.success for r in results), results[0]
        offsets = [r.offset for r in results]
        assert offsets == sorted(offsets) and len(set(offsets)) == 50
        ids = [r.msg_id for r in results]
        assert len(set(ids)) == 50

    asyncio.run(main())
    assert fake.knobs.mputs == 0 and fake.knobs.puts == 50
    assert len(fake.data[("single", 0)]) == sum(20 + len(b"m%d" % i) for i in range(50))


def test_mput_batches_and_offsets(fake: FakeBroker) -> None:
    async def main() -> list[int]:
        async with AsyncMessageSessionFactory([fake.addr], config=FAST) as s:
            p = s.create_producer()
            futs = [p.send_nowait("single", b"x" * (i % 7)) for i in range(300)]
            res = [await f for f in futs]
            return [r.offset for r in res]

    offsets = asyncio.run(main())
    want, off = [], 0
    for i in range(300):
        want.append(off)
        off += 20 + i % 7
    assert offsets == want
    assert fake.knobs.mputs >= 1


def test_send_times_out_into_a_failed_result(fake: FakeBroker) -> None:
    fake.knobs.drop_replies = True

    async def main() -> None:
        parts = {"single": 1}
        async with AsyncMessageSessionFactory([fake.addr], config=FAST, partitions=parts) as s:
            cfg = ProducerConfig(retries=1, retry_backoff_s=0.01, raise_on_error=False)
            p = s.create_producer(cfg)
            r = await p.send("single", b"lost?")
            assert not r.success and isinstance(r.error, RequestTimeoutError)
            assert r.partition is not None and str(r.partition) == "0-0"
            fake.knobs.drop_replies = False
            assert (await p.send("single", b"fine")).success

    asyncio.run(main())


def test_lost_connection_is_retried_and_reconnected(fake: FakeBroker) -> None:
    fake.knobs.close_after_requests = 3  # stats + 2 puts, then the broker hangs up

    with connect([fake.addr], config=FAST) as s:
        p = s.create_producer(ProducerConfig(retries=5, retry_backoff_s=0.01))
        results = [p.send_future("single", b"%d" % i).result(10) for i in range(6)]
    assert all(r.success for r in results)
    assert s.core.pool.connects >= 2
    # send() over the caller's own socket (client/_direct): a lost one goes the loop's way
    fake.knobs.close_after_requests = fake.requests + 2  # stats + 1 put
    with connect([fake.addr], config=FAST) as s:
        p = s.create_producer(ProducerConfig(retries=5, retry_backoff_s=0.01))
        results = [p.send("single", b"%d" % i) for i in range(6)]
    assert all(r.success for r in results)


def test_unreachable_broker_gives_failed_result() -> None:
    with connect(["127.0.0.1:1"], config=FAST, partitions={"t": 1}) as s:
        p = s.create_producer(ProducerConfig(retries=1, retry_backoff_s=0.01))
        with pytest.raises(ConnectionLostError):
            p.send("t", b"x")


def test_consumer_follows_301_and_grows_the_fetch_window(fake: FakeBroker, tmp_path: Path) -> None:
    fake.append("single", 0, b"a" * 10)
    fake.append("single", 0, b"b" * 5000)
    fake.append("single", 0, b"c")

    async def main() -> None:
        async with AsyncMessageSessionFactory([fake.addr], config=FAST) as s:
            c = s.create_consumer(ConsumerConfig(group="g", data_dir=tmp_path))
            c.subscribe("single", max_size=64)
            # a stored offset beyond the end: the fake answers 301 with its end
            c.offset_store.commit("g", [])
            got = []
            for _ in range(20):
                got += await c.fetch("single", max_wait_s=0.1)
                if len(got) == 3:
                    break
            assert [m.data[:1] for m in got] == [b"a", b"b", b"c"]
            assert c.stats.fetch_growths >= 1
            cur = c.state.manual["single"][0]
            assert cur.sizer.current == 64  # shrunk back after the big record
            # out of range: the broker's 301 body is followed
            cur.position = 10**9
            assert await c.fetch("single", max_wait_s=0.05) == []
            assert c.stats.redirects == 1 and cur.position == len(fake.data[("single", 0)])

    asyncio.run(main())


def test_send_batch_falls_back_to_pipelined_put(fake: FakeBroker) -> None:
    fake.knobs.mput_supported = False

    async def main() -> None:
        async with AsyncMessageSessionFactory([fake.addr], config=FAST) as s:
            p = s.create_producer()
            r = await p.send_batch("single", [b"b%d" % i for i in range(30)], attribute="t")
        assert r.success and len(r) == 30 and len(set(r.msg_ids)) == 30
        assert list(r.offsets) == sorted(r.offsets) and r.offsets[0] == 0

    asyncio.run(main())
    assert fake.knobs.mputs == 0 and fake.knobs.puts == 30
