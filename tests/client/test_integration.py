"""The client against a real broker process (``broker`` fixture of tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    FileOffsetStore,
    KeyHashSelector,
    ListenerTimeoutError,
    Message,
    Partition,
    ProducerConfig,
    RoundRobinSelector,
    TopicPartitionOffset,
    connect,
    list_dead_letters,
    replay_dead_letters,
)
from notify.errors import BrokerError, ClientError, ConnectionLostError
from notify.testing import BrokerProcess
from tests.helpers import wait_until

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def cconf(tmp_path: Path, group: str = "g", **kw: Any) -> ConsumerConfig:
    kw.setdefault("commit_interval_s", 0.2)
    kw.setdefault("retry_delay_s", 0.001)
    return ConsumerConfig(group=group, data_dir=tmp_path / "consumer", **kw)


def test_send_and_consume_roundtrip(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        assert [str(p) for p in s.partitions("test")] == ["0-0", "0-1", "0-2", "0-3"]
        p = s.create_producer()
        r = p.send("test", b"hello", attribute="greeting")
        assert r.success and r.error is None and r.offset == 0 and r.msg_id > 0
        assert r.partition is not None and str(r.partition) == "0-0"
        sent = [p.send_future("test", b"m%d" % i) for i in range(200)]
        results = [f.result(10) for f in sent]
        assert all(x.success for x in results)
        got: list[Message] = []
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("test", got.append).complete_subscribe()
        wait_until(lambda: len(got) == 201)
        first = next(m for m in got if m.data == b"hello")
        assert first.attribute == "greeting" and first.msg_id == r.msg_id and first.offset == 0
        assert {(str(m.partition), m.offset) for m in got} >= {
            (str(x.partition), x.offset) for x in results
        }
        c.shutdown()
    again = FileOffsetStore(tmp_path / "consumer" / "offsets")
    loaded = [again.load("g", "test", f"0-{i}") for i in range(4)]
    total = sum(x.offset for x in loaded if x is not None)
    assert total == sum(20 + len(m.payload) for m in got)


def test_send_batch_async_and_sync(broker: BrokerProcess, tmp_path: Path) -> None:
    """send_batch: one result per batch, ids and offsets per message as stored; a batch
    larger than one mput frame goes as several, in order, to one partition."""

    async def produce() -> list[Any]:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer(ProducerConfig(batch_max_count=64))
            one = await p.send_batch("test", [b"a%d" % i for i in range(10)], key="k")
            big = p.send_batch_nowait("test", [b"b%d" % i for i in range(300)], key="k")
            single = p.send_nowait("test", b"after", key="k")  # queued behind the batch
            empty = await p.send_batch("test", [])
            with pytest.raises(ClientError):
                p.send_batch_nowait("test", ["text"])  # type: ignore[list-item]
            return [one, await big, await single, empty]

    one, big, single, empty = asyncio.run(produce())
    assert one.success and len(one) == 10 and big.success and len(big) == 300
    assert empty.success and len(empty) == 0
    assert one.partition == big.partition == single.partition
    assert list(big.msg_ids) == sorted(big.msg_ids) and big.offsets[0] > one.offsets[-1]
    assert single.offset > big.offsets[-1]
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        sb = p.send_batch("test", [b"s%d" % i for i in range(50)], attribute="tag", key="k")
        assert sb.success and len(sb.results()) == 50
        got: list[Message] = []
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("test", got.append).complete_subscribe()
        wait_until(lambda: len(got) == 10 + 300 + 1 + 50)
        c.shutdown()
    by_off = {m.offset: m for m in got}
    a_s, b_s = [b"a%d" % i for i in range(10)], [b"b%d" % i for i in range(300)]
    for res, want in ((one, a_s), (big, b_s)):
        ms = [by_off[o] for o in res.offsets]
        assert [m.data for m in ms] == want and [m.msg_id for m in ms] == list(res.msg_ids)
        assert {m.key for m in ms} == {"k"}  # the batch's key stays on every message
    tagged = [by_off[o] for o in sb.offsets]
    assert {m.attribute for m in tagged} == {"tag"} and tagged[0].data == b"s0"
    assert {m.key for m in tagged} == {"k"}


def test_keyless_sends_go_round_robin_by_batch(broker: BrokerProcess) -> None:
    """Without a key, the messages of one burst join one partition (one frame) until a
    batch's worth is queued, then the next partition; successive bursts rotate over all
    partitions (sticky round robin, README "Client API"); ``RoundRobinSelector`` still
    picks a partition per message."""

    async def produce() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer(ProducerConfig(batch_max_count=8))
            await p.publish("test")
            n = 4  # DEFAULT_TOPICS of notify.testing
            seen: list[str] = []
            for _burst in range(2 * n):
                res = await asyncio.gather(*[p.send_nowait("test", b"m") for _ in range(20)])
                assert all(r.success for r in res)
                parts = [str(r.partition) for r in res]
                runs = [parts[0:8], parts[8:16], parts[16:20]]  # batches of 8
                assert all(len(set(run)) == 1 for run in runs), parts
                assert len({run[0] for run in runs}) == min(3, n), parts
                seen += parts
            assert len(set(seen)) == n
            rr = s.create_producer(selector=RoundRobinSelector())
            res = await asyncio.gather(*[rr.send_nowait("test", b"m") for _ in range(n)])
            assert len({str(r.partition) for r in res}) == n

    asyncio.run(produce())


def test_unknown_topic_is_a_failed_send(broker: BrokerProcess) -> None:
    """A failed send raises by default; ``raise_on_error=False`` returns it as a result."""
    with connect([broker.addr], config=FAST) as s:
        with pytest.raises(BrokerError) as ei:
            s.create_producer().send("nope", b"x")
        assert ei.value.code == 404
        fut = s.create_producer().send_future("nope", b"x")
        with pytest.raises(BrokerError):
            fut.result(10)
        lenient = s.create_producer(ProducerConfig(raise_on_error=False))
        r = lenient.send("nope", b"x")
        assert not r.success and isinstance(r.error, BrokerError) and r.error.code == 404
        with pytest.raises(BrokerError):
            r.raise_for_error()
        given = connect([broker.addr], config=FAST, partitions={"ghost": 1})
        with given:
            r2 = given.create_producer(ProducerConfig(raise_on_error=False)).send("ghost", b"x")
        assert not r2.success and isinstance(r2.error, BrokerError) and r2.error.code == 404


def test_async_api_batches_and_orders_per_key(broker: BrokerProcess, tmp_path: Path) -> None:
    keys = [f"order-{i}" for i in range(10)]

    async def produce() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer(selector=KeyHashSelector())
            futs = [
                p.send_nowait("test", f"{k}:{seq}".encode(), key=k)
                for seq in range(300)
                for k in keys
            ]
            res = await asyncio.gather(*futs)
            assert all(r.success for r in res)
            by_key = defaultdict(set)
            for k, r in zip([k for _ in range(300) for k in keys], res, strict=True):
                by_key[k].add(str(r.partition))
            assert all(len(v) == 1 for v in by_key.values())

    asyncio.run(produce())

    # a second producer, several threads, sync sends: each thread's keys stay ordered
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer(selector=KeyHashSelector())

        def worker(t: int) -> None:
            for seq in range(300, 400):
                k = f"thread-{t}"
                assert p.send("test", f"{k}:{seq}".encode(), key=k).success

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        seqs: dict[str, list[int]] = defaultdict(list)
        lock = threading.Lock()

        def listener(m: Message) -> None:
            k, seq = m.data.decode().split(":")
            with lock:
                seqs[k].append(int(seq))

        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("test", listener).complete_subscribe()
        wait_until(lambda: sum(map(len, seqs.values())) == 3000 + 400)
        c.shutdown()
    for k in keys:
        assert seqs[k] == list(range(300)), k
    for n in range(4):
        assert seqs[f"thread-{n}"] == list(range(300, 400))


def test_retry_recover_dead_letter_and_replay(broker: BrokerProcess, tmp_path: Path) -> None:
    attempts: dict[bytes, int] = defaultdict(int)
    ok: list[bytes] = []
    heal = threading.Event()

    def listener(m: Message) -> None:
        attempts[m.data] += 1
        if m.data == b"flaky" and attempts[m.data] < 3:
            raise RuntimeError("transient")
        if m.data in (b"poison", b"later") and not heal.is_set():
            raise ValueError("cannot handle " + m.data.decode())
        ok.append(m.data)

    cfg = cconf(tmp_path, max_retries=2, recover_interval_s=0.3, max_recover_attempts=2)
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        for d in (b"a", b"flaky", b"poison", b"b"):
            assert p.send("single", d).success
        c = s.create_consumer(cfg)
        c.subscribe("single", listener).complete_subscribe()
        # consumption moves on past the poison message
        wait_until(lambda: ok[:3] == [b"a", b"flaky", b"b"])
        assert attempts[b"flaky"] == 3 and attempts[b"poison"] >= 3
        # retried in the background by the recover job, then a dead letter
        wait_until(lambda: c.stats.dead_lettered == 1)
        st = c.stats
        assert st.recover_stored == 1 and st.recover_failures == 2 and st.listener_failures >= 4
        dead = list_dead_letters(tmp_path / "consumer")
        assert [(d.data, d.topic, d.partition, d.group) for d in dead] == [
            (b"poison", "single", "0-0", "g")
        ]
        # the admin replays it; it is delivered once the listener can cope
        heal.set()
        assert replay_dead_letters(tmp_path / "consumer", "g") == 1
        wait_until(lambda: b"poison" in ok)
        assert list_dead_letters(tmp_path / "consumer") == []
        # a message left in the recover store survives a consumer restart
        heal.clear()
        assert p.send("single", b"later").success
        wait_until(lambda: c.stats.recover_stored == 2)
        c.shutdown()
        heal.set()
        c2 = s.create_consumer(cfg)
        c2.subscribe("single", listener).complete_subscribe()
        wait_until(lambda: b"later" in ok)
        assert ok.count(b"b") == 1 and ok.count(b"later") == 1  # offsets were committed
        c2.shutdown()


def test_hanging_listener_times_out_and_goes_to_recovery(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    release = threading.Event()
    seen: list[bytes] = []

    def listener(m: Message) -> None:
        if m.data == b"hang":
            release.wait(5)
        seen.append(m.data)

    cfg = cconf(tmp_path, max_retries=0, listener_timeout_s=0.2, listener_threads=2)
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.send("single", b"hang")
        p.send("single", b"next")
        c = s.create_consumer(cfg)
        c.subscribe("single", listener).complete_subscribe()
        wait_until(lambda: b"next" in seen)
        assert c.stats.recover_stored == 1
        pend = c.core.recover_store.pending()
        assert pend[0].data == b"hang" and ListenerTimeoutError.__name__ in pend[0].last_error
        release.set()
        c.shutdown()


def test_async_listener_filter_and_dedup(broker: BrokerProcess, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer()
            for i in range(30):
                attr = ("red", "green", "blue")[i % 3]
                assert (await p.send("orders", b"%d" % i, attribute=attr)).success
            got: list[Message] = []
            odd: list[Message] = []

            async def listener(m: Message) -> None:
                got.append(m)

            c = s.create_consumer(cconf(tmp_path))
            c.subscribe("orders", listener, filter={"red", "blue"})
            c.subscribe("single", odd.append, filter=lambda m: int(m.data) % 2 == 1)
            for i in range(10):
                await p.send("single", b"%d" % i)
            await c.complete_subscribe()
            for _ in range(500):
                if len(got) == 20 and len(odd) == 5:
                    break
                await asyncio.sleep(0.01)
            assert sorted(m.attribute or "" for m in got).count("green") == 0
            assert len(got) == 20 and [int(m.data) for m in odd] == [1, 3, 5, 7, 9]
            assert c.stats.filtered == 15
            # re-fetching the same records is suppressed by the duplicate window
            cur = next(iter(c.state.cursors.values()))
            before = c.stats.duplicates
            cur.position = 0
            for _ in range(200):
                if c.stats.duplicates > before:
                    break
                await asyncio.sleep(0.01)
            assert c.stats.duplicates > before and len(got) == 20

    asyncio.run(main())


def test_broadcast_every_instance_gets_everything(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        for i in range(20):
            p.send("orders", b"%d" % i)
        boxes: list[list[Message]] = [[], []]
        cons = []
        for i, box in enumerate(boxes):
            cfg = cconf(tmp_path / f"inst{i}", group="bc", broadcast=True)
            c = s.create_consumer(cfg)
            c.subscribe("orders", box.append).complete_subscribe()
            cons.append(c)
        wait_until(lambda: all(len(b) == 20 for b in boxes))
        assert cons[0].group != cons[1].group and cons[0].group.startswith("bc-")
        group0 = cons[0].group
        for c in cons:
            c.shutdown()
        # the instance id is stable across restarts of the same instance (local offsets)
        c = s.create_consumer(cconf(tmp_path / "inst0", group="bc", broadcast=True))
        assert c.group == group0
        late: list[Message] = []
        c.subscribe("orders", late.append).complete_subscribe()
        p.send("orders", b"late")
        wait_until(lambda: len(late) == 1)
        c.shutdown()


def test_consumer_restart_resumes_from_committed_offset(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        for i in range(50):
            p.send("test", b"%d" % i)
        first: list[int] = []
        c = s.create_consumer(cconf(tmp_path, initial_offset="earliest"))
        c.subscribe("test", lambda m: first.append(int(m.data))).complete_subscribe()
        wait_until(lambda: len(first) == 50)
        c.shutdown()
        for i in range(50, 80):
            p.send("test", b"%d" % i)
        second: list[int] = []
        c2 = s.create_consumer(cconf(tmp_path))
        c2.subscribe("test", lambda m: second.append(int(m.data))).complete_subscribe()
        wait_until(lambda: len(second) == 30)
        time.sleep(0.1)
        c2.shutdown()
        assert sorted(second) == list(range(50, 80))
        # a new group starting at "latest" sees only what comes after it
        latest: list[bytes] = []
        c3 = s.create_consumer(cconf(tmp_path, group="late", initial_offset="latest"))
        c3.subscribe("test", lambda m: latest.append(m.data)).complete_subscribe()
        curs = c3.core.state.cursors.values()
        wait_until(lambda: len(curs) == 4 and all(cur.position >= 0 for cur in curs))
        p.send("test", b"new")
        wait_until(lambda: latest == [b"new"])
        c3.shutdown()


def test_fetch_api_and_iterator(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        for i in range(40):
            p.send("orders", b"%d" % i)
        c = s.create_consumer(cconf(tmp_path, commit_interval_s=0))
        seen = []
        for m in c.messages("orders", idle_timeout_s=0.3):
            seen.append(int(m.data))
        assert sorted(seen) == list(range(40))
        c.commit()
        c.shutdown()
        c2 = s.create_consumer(cconf(tmp_path, commit_interval_s=0))
        assert c2.fetch("orders", max_wait_s=0.2) == []
        p.send("orders", b"40")
        p.send("orders", b"41")
        got = c2.fetch("orders", max_wait_s=2) + c2.fetch("orders", max_wait_s=2)
        assert sorted(int(m.data) for m in got) == [40, 41]
        c2.shutdown()


def test_large_message_grows_the_fetch_window(broker: BrokerProcess, tmp_path: Path) -> None:
    big = bytes(range(256)) * 2000  # 512000 bytes
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.send("single", b"small")
        assert p.send("single", big).success
        p.send("single", b"after")
        got: list[bytes] = []
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("single", lambda m: got.append(m.data), max_size=4096).complete_subscribe()
        wait_until(lambda: len(got) == 3)
        assert got == [b"small", big, b"after"]
        assert c.stats.fetch_growths >= 1
        cur = next(iter(c.core.state.cursors.values()))
        assert cur.sizer.current == 4096
        c.shutdown()


@pytest.mark.slow
def test_broker_restart_mid_stream(broker: BrokerProcess, tmp_path: Path) -> None:
    total = 600
    got: set[bytes] = set()
    lock = threading.Lock()

    def listener(m: Message) -> None:
        with lock:
            got.add(m.data)

    cfg = ProducerConfig(retries=20, retry_backoff_s=0.05)
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer(cfg)
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("test", listener).complete_subscribe()
        results = []
        for i in range(total):
            if i == 200:
                broker.restart()  # graceful stop, start again on the same port and data
            if i == 400:
                broker.restart(kill=True)  # SIGKILL
            results.append(p.send_future("test", b"%d" % i))
            if i % 50 == 0:
                time.sleep(0.01)
        res = [f.result(30) for f in results]
        assert all(r.success for r in res), [r.error for r in res if not r.success][:3]
        wait_until(lambda: len(got) == total, timeout=20)
        assert s.core.pool.connects >= 2
        st = c.stats
        c.shutdown()
    assert got == {b"%d" % i for i in range(total)}
    assert st.fetch_errors >= 1


def test_ordered_producer_spools_while_partition_is_down(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    cfg = ProducerConfig(
        ordered=True,
        spool_dir=tmp_path / "spool",
        retries=1,
        retry_backoff_s=0.01,
        spool_replay_interval_s=0.05,
    )
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer(cfg, selector=KeyHashSelector())
        assert p.send("single", b"0", key="k").success
        broker.stop()
        spooled = [p.send("single", b"%d" % i, key="k") for i in range(1, 6)]
        assert all(r.success and r.spooled and r.offset == -1 for r in spooled)
        assert list((tmp_path / "spool" / "single").glob("*.spool"))
        broker.start()
        assert p.send("single", b"6", key="k").success
        p.flush()
        wait_until(lambda: not list((tmp_path / "spool" / "single").glob("*.spool")))
        got: list[bytes] = []
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("single", lambda m: got.append(m.data)).complete_subscribe()
        wait_until(lambda: len(got) == 7)
        assert got == [b"%d" % i for i in range(7)]
        c.shutdown()


def test_send_after_close_raises(broker: BrokerProcess) -> None:
    s = connect([broker.addr], config=FAST)
    p = s.create_producer()
    p.close()
    from notify.errors import ClientError

    with pytest.raises(ClientError):
        p.send("test", b"x")
    s.close()
    with pytest.raises(ClientError):
        s.create_producer()
    assert ConnectionLostError.retriable


def test_custom_selector_and_send_async_from_another_loop(broker: BrokerProcess) -> None:
    def last_partition(topic: str, parts: Sequence[Partition], key: Any, data: bytes) -> Partition:
        return parts[-1]

    def broken(topic: str, parts: Sequence[Partition], key: Any, data: bytes) -> Partition:
        raise ZeroDivisionError

    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer(selector=last_partition)

        async def other_loop() -> list[str]:
            res = await asyncio.gather(*(p.send_async("orders", b"%d" % i) for i in range(5)))
            return [str(r.partition) for r in res if r.success]

        assert asyncio.run(other_loop()) == ["0-1"] * 5
        bad = s.create_producer(selector=broken)
        with pytest.raises(ZeroDivisionError):  # a programming error raises
            bad.send("orders", b"x")

        def refusing(topic: str, parts: Sequence[Partition], key: Any, data: bytes) -> Partition:
            raise ClientError("no partition for this key")

        lenient = ProducerConfig(raise_on_error=False)
        r = s.create_producer(lenient, selector=refusing).send("orders", b"x")
        assert not r.success and "no partition" in str(r.error)  # a refusal is a result
        with pytest.raises(ClientError, match="no partition"):  # which raises by default
            s.create_producer(selector=refusing).send("orders", b"x")
        strict = s.create_producer()
        with pytest.raises(BrokerError) as e:
            strict.send("nope", b"x")
        assert e.value.code == 404
        assert strict.send("orders", b"fine").success
        with pytest.raises(BrokerError):
            strict.send("nope", b"x", delay=1)


def test_ordered_spool_survives_a_producer_restart(broker: BrokerProcess, tmp_path: Path) -> None:
    cfg = ProducerConfig(
        ordered=True,
        spool_dir=tmp_path / "spool",
        retries=0,
        spool_replay_interval_s=0.05,
    )
    broker.stop()
    with connect([broker.addr], config=FAST, partitions={"single": 1}) as s:
        p = s.create_producer(cfg)
        assert all(p.send("single", b"%d" % i).spooled for i in range(3))
    broker.start()
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer(cfg)
        p.publish("single")  # a new producer picks up the spool left behind
        wait_until(lambda: not list((tmp_path / "spool").rglob("*.spool")))
        got: list[bytes] = []
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("single", lambda m: got.append(m.data)).complete_subscribe()
        wait_until(lambda: len(got) == 3)
        assert got == [b"0", b"1", b"2"]
        c.shutdown()


def test_member_share_and_long_poll_setting(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        for i in range(40):
            p.send("test", b"%d" % i)
        boxes: list[list[Message]] = [[], []]
        cons = []
        for i, box in enumerate(boxes):
            cfg = cconf(tmp_path, member_index=i, member_count=2, long_poll_ms=50)
            c = s.create_consumer(cfg)
            c.subscribe("test", box.append).complete_subscribe()
            cons.append(c)
        wait_until(lambda: sum(map(len, boxes)) == 40)
        assert {str(m.partition) for m in boxes[0]} == {"0-0", "0-1"}
        assert {str(m.partition) for m in boxes[1]} == {"0-2", "0-3"}
        for c in cons:
            c.shutdown()
        # both members share one offset file: every partition's offset is there
        store = FileOffsetStore(tmp_path / "consumer" / "offsets")
        assert all(store.load("g", "test", f"0-{i}") is not None for i in range(4))


def test_hanging_async_listener_is_cut_by_the_watchdog(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer()
            for d in (b"hang", b"next"):
                assert (await p.send("single", d)).success
            seen: list[bytes] = []

            async def listener(m: Message) -> None:
                if m.data == b"hang":
                    await asyncio.sleep(30)
                seen.append(m.data)

            c = s.create_consumer(cconf(tmp_path, max_retries=1, listener_timeout_s=0.1))
            c.subscribe("single", listener)
            await c.complete_subscribe()
            for _ in range(300):
                if seen:
                    break
                await asyncio.sleep(0.01)
            assert seen == [b"next"]
            st = c.stats
            assert st.listener_failures == 2 and st.recover_stored == 1

    asyncio.run(main())


def test_watchdog_in_a_run_cuts_only_the_message_past_the_timeout(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Messages delivered as one run are timed by their progress: a slow message under the
    timeout is never cut, a hanging one in the middle of the run is cut soon after it."""

    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer()
            datas = [b"%d" % i for i in range(40)]
            for d in datas:
                assert (await p.send("single", d)).success
            seen: list[bytes] = []
            started: dict[bytes, float] = {}
            cut_after: list[float] = []
            loop = asyncio.get_running_loop()

            async def listener(m: Message) -> None:
                first = m.data not in started
                started.setdefault(m.data, loop.time())
                if m.data == b"5":
                    await asyncio.sleep(0.3)  # under the 0.5 s timeout, with others before it
                if m.data == b"20" and first:
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        cut_after.append(loop.time() - started[m.data])
                        raise
                seen.append(m.data)

            c = s.create_consumer(cconf(tmp_path, max_retries=1, listener_timeout_s=0.5))
            c.subscribe("single", listener)
            await c.complete_subscribe()
            for _ in range(1000):
                if len(seen) == len(datas):
                    break
                await asyncio.sleep(0.01)
            assert seen == datas  # each once, in order; "20" on its retry
            assert len(cut_after) == 1 and 0.5 < cut_after[0] < 1.5, cut_after
            assert c.stats.listener_failures == 1

    asyncio.run(main())


def test_delayed_send_arrives_when_due(broker: BrokerProcess, tmp_path: Path) -> None:
    import time as _time

    from notify.client import ConsumerConfig, connect

    with connect([broker.addr]) as session:
        producer = session.create_producer()
        t0 = _time.time()
        r = producer.send("single", b"later", delay=0.8)  # = send_delayed(..., delay=0.8)
        assert r.success and r.offset == -1 and r.msg_id > 0
        r2 = producer.send_delayed("single", b"sooner", deliver_at=t0 + 0.3)
        assert r2.success
        with pytest.raises(BrokerError):
            producer.send_delayed("nosuch", b"x", delay=1)
        consumer = session.create_consumer(ConsumerConfig(group="dl", data_dir=tmp_path))
        got: list[bytes] = []
        deadline = _time.monotonic() + 10
        while len(got) < 2 and _time.monotonic() < deadline:
            got += [m.data for m in consumer.fetch("single", max_wait_s=0.5)]
        assert got == [b"sooner", b"later"]
        assert _time.time() - t0 >= 0.8
        consumer.shutdown()


def test_offset_beyond_the_end_moves_to_the_end(broker: BrokerProcess, tmp_path: Path) -> None:
    """A broker answers a get beyond the end with MetaQ's 404 (like "nothing new"); the
    consumer asks ``offset`` once per position and continues from the real end."""
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.send("single", b"first")
        c = s.create_consumer(cconf(tmp_path, commit_interval_s=0))
        assert [m.data for m in c.fetch("single", max_wait_s=2)] == [b"first"]
        c.commit()
        c.shutdown()
        store = FileOffsetStore(tmp_path / "consumer" / "offsets")
        doc = json.loads(store.path("g").read_bytes())
        (key,) = doc["offsets"]["single"]
        old = store.load("g", "single", key)
        assert old is not None and old.offset == 25
        store.commit("g", [TopicPartitionOffset("single", key, 10_000, old.msg_id)])
        c2 = s.create_consumer(cconf(tmp_path, commit_interval_s=0))
        assert c2.fetch("single", max_wait_s=0.3) == []
        p.send("single", b"second")
        got = c2.fetch("single", max_wait_s=2) or c2.fetch("single", max_wait_s=2)
        assert [m.data for m in got] == [b"second"]
        assert c2.stats.redirects == 1
        c2.shutdown()
