"""``AsyncProducer.post``: messages without a future, results counted and failures kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    PostFailure,
    ProducerConfig,
    connect,
)
from notify.errors import BrokerError, ClientError
from notify.testing import BrokerProcess
from tests.client.fakebroker import FakeBroker

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.01, reconnect_backoff_max_s=0.05
)


def _consume_all(addr: str, tmp_path: Path, topic: str) -> list[bytes]:
    with connect([addr], config=FAST) as s:
        c = s.create_consumer(ConsumerConfig(group="check", data_dir=tmp_path / "check"))
        return [m.data for m in c.messages(topic, idle_timeout_s=0.8)]


def test_posts_are_stored_in_call_order_and_counted(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer(ProducerConfig(batch_max_count=50))
            await p.publish("single")
            await p.publish("test")
            futs = []
            for i in range(600):  # posts and futures interleaved on one partition
                if i % 7 == 3:
                    futs.append(p.send_nowait("single", b"%d" % i))
                else:
                    p.post("single", b"%d" % i)
                if i % 100 == 99:
                    await p.drain(120)
                    assert p.outstanding <= 120
            for i in range(2000):  # spread over 4 partitions, runs of <= 50
                p.post("test", b"t%d" % i, attribute="a" if i % 2 else None)
            await p.flush()
            assert p.outstanding == 0
            assert all(r.success for r in await asyncio.gather(*futs))
            assert p.posts_acked == 600 - len(futs) + 2000 and p.posts_failed == 0
            assert p.post_failures() == []

    asyncio.run(main())
    assert _consume_all(broker.addr, tmp_path, "single") == [b"%d" % i for i in range(600)]
    got = _consume_all(broker.addr, tmp_path / "t", "test")
    assert sorted(got) == sorted(b"t%d" % i for i in range(2000))


def test_post_failures_are_kept_bounded_and_taken(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer(ProducerConfig(max_post_failures=5, retries=0))
            with pytest.raises(ClientError, match="bytes"):
                p.post("test", "text")  # type: ignore[arg-type]
            for i in range(8):
                p.post("nope", b"%d" % i, key="k")
            await p.flush()
            assert p.posts_failed == 8 and p.posts_acked == 0
            kept = p.post_failures()
            assert len(kept) == 5  # the newest 5 of 8
            assert all(isinstance(f, PostFailure) and f.topic == "nope" for f in kept)
            assert all(isinstance(f.error, BrokerError) and f.error.code == 404 for f in kept)
            assert p.post_failures() == []
            p.post("single", b"ok")
            await p.flush()
            assert p.posts_acked == 1
        with pytest.raises(ClientError, match="closed"):
            p.post("single", b"late")

    asyncio.run(main())


def test_posts_are_retried_over_a_lost_connection(fake: FakeBroker) -> None:
    fake.knobs.close_after_requests = 3  # stats + 2 requests, then the broker hangs up

    async def main() -> None:
        cfg = ClientConfig(
            request_timeout_s=0.3, reconnect_backoff_min_s=0.01, reconnect_backoff_max_s=0.05
        )
        async with AsyncMessageSessionFactory([fake.addr], config=cfg) as s:
            p = s.create_producer(ProducerConfig(retries=5, retry_backoff_s=0.01))
            for i in range(6):
                p.post("single", b"%d" % i)
                await p.flush()
            assert p.posts_acked == 6 and p.posts_failed == 0
            assert s.pool.connects >= 2

    asyncio.run(main())
    stored = fake.data[("single", 0)]
    assert stored.count(b"5") >= 1 and len(stored) >= 6 * 21


def test_post_inside_a_transaction_joins_it(broker: BrokerProcess, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer()
            async with p.transaction():
                p.post("single", b"in-tx")
                await p.send("single", b"also")
            with pytest.raises(RuntimeError):
                async with p.transaction():
                    p.post("single", b"rolled-back")
                    raise RuntimeError("abort")
            assert p.posts_acked == 0  # counted by the transaction, not as posts

    asyncio.run(main())
    assert _consume_all(broker.addr, tmp_path, "single") == [b"in-tx", b"also"]


def test_blocking_api_post_keeps_order_with_other_sends(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        futs = []
        for i in range(500):  # posts buffered for the loop, futures and sends in between
            if i % 50 == 7:
                futs.append(p.send_future("single", b"%d" % i))
            elif i % 125 == 9:
                assert p.send("single", b"%d" % i).success
            else:
                p.post("single", b"%d" % i)
        with pytest.raises(ClientError, match="bytes"):
            p.post("single", 5)  # type: ignore[arg-type]
        with p.transaction():
            p.post("single", b"tx")
        p.flush()
        assert all(f.result(10).success for f in futs)
        assert p.outstanding == 0
        assert p.posts_acked == 500 - len(futs) - 4 and p.posts_failed == 0
        assert p.post_failures() == []
    expected = [b"%d" % i for i in range(500)] + [b"tx"]
    assert _consume_all(broker.addr, tmp_path, "single") == expected
