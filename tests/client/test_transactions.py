"""Client transactions against a real broker: local transactions and half messages (#4)."""

from __future__ import annotations

import asyncio
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import notify.client as client
from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ClientTransactionError,
    LocalTxState,
    Message,
    ProducerConfig,
    RoundRobinSelector,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    XAError,
    connect,
)
from notify.client._halfmsg import as_state
from notify.client.core.wire import reply_error
from notify.client.transport import AsyncConnection
from notify.errors import BrokerError, ClientError, TransactionError
from notify.protocol import logrecords as lr
from notify.protocol.frames import Response, encode_check
from notify.testing import BrokerProcess
from notify.txlog import records as txrecords
from tests.client.conftest import kill_when_marked
from tests.conftest import BrokerFactory
from tests.helpers import read_all as read_part
from tests.helpers import timing, wait_until

FAST = ClientConfig(
    request_timeout_s=3.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def bodies(addr: str, topic: str, nparts: int) -> list[bytes]:
    return [r.body for p in range(nparts) for r in read_part(addr, topic, p)]


# --------------------------------------------------------------------------- units


def test_reply_errors_and_states() -> None:
    e = reply_error(Response("result", 500, 1, b"XAException:code=106,msg=timed out"), "TX:a:1")
    assert isinstance(e, TransactionTimeoutError) and e.code == 106 and e.tx_key == "TX:a:1"
    assert isinstance(e, TransactionError) and isinstance(e, ClientError)
    e = reply_error(Response("result", 503, 1, b"XAException:code=-7,msg=too many"), None)
    assert type(e) is XAError and e.code == -7 and e.text == "too many" and e.retriable
    e = reply_error(Response("result", 404, 1, b"no such topic"), None)
    assert isinstance(e, BrokerError) and e.code == 404
    assert as_state(LocalTxState.ROLLBACK, "k") is LocalTxState.ROLLBACK
    assert as_state("commit", "k") is LocalTxState.COMMIT
    assert as_state(None, "k") is LocalTxState.UNKNOWN
    for name in ("Transaction", "AsyncTransaction", "LocalTxState", "TransactionSendResult"):
        assert name in client.__all__
    assert issubclass(TransactionOutcomeUnknownError, TransactionConnectionError)


def test_check_frames_are_not_replies() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn = AsyncConnection("x:1", loop)
        written: list[bytes] = []

        class Transport:
            def write(self, data: bytes) -> None:
                written.append(data)

            def get_extra_info(self, name: str, default: object = None) -> object:
                return default

        conn.connection_made(Transport())  # type: ignore[arg-type]
        fut = conn.send(b"stats 7\r\n", 7)
        conn.data_received(encode_check("TX:a:1", "t", 0, b"", 7))  # no handler: dropped
        got: list[Response] = []
        conn.check_handler = lambda c, r: got.append(r)
        conn.data_received(encode_check("TX:a:2", "t", 1, b"rec", 7) + b"result 200 0 7\r\n")
        assert [(r.kind, r.tx_key, r.topic, r.partition, r.body) for r in got] == [
            ("check", "TX:a:2", "t", 1, b"rec")
        ]
        assert (await fut).kind == "result" and written == [b"stats 7\r\n"]

    asyncio.run(main())


# --------------------------------------------------------------------------- local


def test_commit_is_all_at_once_and_rollback_invisible(broker: BrokerProcess) -> None:
    seen: list[tuple[int, ...]] = []
    stop = threading.Event()

    def observe() -> None:  # what a consumer could see, round after round
        while not stop.is_set():
            seen.append(tuple(len(read_part(broker.addr, "test", p)) for p in range(4)))

    with connect([broker.addr], config=FAST) as s:
        # one message per partition in turn, so each transaction spans the four partitions
        # (the default selector keeps a transaction's keyless messages on one partition)
        p = s.create_producer(selector=RoundRobinSelector())
        with p.transaction(timeout=10) as tx:
            first = p.send("test", b"m0")
            futs = [p.send_future("test", b"m%d" % i) for i in range(1, 40)]
            futs += [p.send_future(t, b"x-" + t.encode()) for t in ("orders", "single")]
            results = [first] + [f.result(5) for f in futs]
            assert all(r.success and r.offset == -1 and r.msg_id > 0 for r in results)
            assert tx.broker == broker.addr and tx.key.startswith(f"TX:{p.session_id}:")
            assert bodies(broker.addr, "test", 4) == []  # recorded, not visible
            watcher = threading.Thread(target=observe)
            watcher.start()
            wait_until(lambda: len(seen) >= 3)
        assert tx.status == "committed"
        wait_until(lambda: bool(seen) and seen[-1] == (10,) * 4)
        for _ in range(30):  # more commits while the observer reads: 2 per partition each
            with p.transaction():
                for i in range(8):
                    p.send_future("test", b"more-%d" % i)
        wait_until(lambda: seen[-1] == (70,) * 4)
        stop.set()
        watcher.join()
        assert seen[0] == (0, 0, 0, 0) and seen[-1] == (70,) * 4
        for rnd in seen:  # partitions are read one after the other within a round
            assert all(n == 0 or (n >= 10 and n % 2 == 0) for n in rnd), rnd
            assert list(rnd) == sorted(rnd), rnd
        got = sorted(x for x in bodies(broker.addr, "test", 4) if not x.startswith(b"more"))
        assert got == sorted(b"m%d" % i for i in range(40))
        assert bodies(broker.addr, "orders", 2) == [b"x-orders"]
        assert bodies(broker.addr, "single", 1) == [b"x-single"]
        ids = {r.msg_id for p_ in range(4) for r in read_part(broker.addr, "test", p_)[:10]}
        assert ids == {r.msg_id for r in results[:40]}

        with pytest.raises(ValueError, match="boom"), p.transaction() as tx2:
            assert p.send("single", b"never").success
            raise ValueError("boom")
        assert tx2.status == "rolled_back" and p.current_transaction() is None
        with p.transaction():  # a transaction without messages never talks to the broker
            pass
        assert p.send("single", b"after").success  # plain send again: visible at once
        assert bodies(broker.addr, "single", 1) == [b"x-single", b"after"]


def test_keyless_messages_of_a_transaction_share_one_partition(broker: BrokerProcess) -> None:
    """The default selector: a transaction's messages without a key go to one partition
    (one mput, one append), the next transaction's to the next partition; keyed messages
    still go by their key's hash."""
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        before = [len(read_part(broker.addr, "test", i)) for i in range(4)]
        used: list[int] = []
        for _ in range(4):
            with p.transaction():
                rs = [p.send_future("test", b"k") for _ in range(6)]
            parts = {r.result(5).partition.partition for r in rs}
            assert len(parts) == 1, parts
            used += parts
        assert sorted(used) == [0, 1, 2, 3]  # round robin by transaction
        after = [len(read_part(broker.addr, "test", i)) for i in range(4)]
        assert [a - b for a, b in zip(after, before, strict=True)] == [6, 6, 6, 6]
        with p.transaction():
            keyed = [p.send_future("test", b"x", key=f"key-{i}") for i in range(12)]
        assert len({f.result(5).partition.partition for f in keyed}) > 1


def test_explicit_begin_threads_and_misuse(broker: BrokerProcess) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        tx = p.begin_transaction(timeout=5)
        assert p.current_transaction() is tx
        with pytest.raises(ClientTransactionError, match="do not nest"):
            p.begin_transaction()
        assert p.send("orders", b"in-tx").offset == -1
        # another thread sending through the same producer is not part of the transaction
        other: list[Any] = []
        t = threading.Thread(target=lambda: other.append(p.send("single", b"outside")))
        t.start()
        t.join()
        assert other[0].success and other[0].offset == 0
        assert bodies(broker.addr, "single", 1) == [b"outside"]
        assert bodies(broker.addr, "orders", 2) == []
        tx.commit()
        assert bodies(broker.addr, "orders", 2) == [b"in-tx"]
        with pytest.raises(ClientTransactionError, match="committed"):
            tx.commit()
        with pytest.raises(ClientTransactionError, match="takes no more"):
            tx.send("orders", b"late")
        with pytest.raises(ClientTransactionError, match="already committed"):
            tx.rollback()
        assert p.send("orders", b"plain").offset >= 0  # no transaction any more

        tx = p.begin_transaction()
        p.send("orders", b"dropped")
        tx.rollback()
        tx.rollback()  # idempotent
        assert tx.status == "rolled_back"
        assert sorted(bodies(broker.addr, "orders", 2)) == [b"in-tx", b"plain"]
        # a failed send makes the transaction rollback-only
        tx = p.begin_transaction()
        assert p.send("orders", b"ok").success
        with pytest.raises(BrokerError) as bad:
            p.send("nosuch", b"x")
        with pytest.raises(TransactionAbortedError) as ei:
            tx.commit()
        assert ei.value.cause is bad.value and tx.status == "rolled_back"
        assert sorted(bodies(broker.addr, "orders", 2)) == [b"in-tx", b"plain"]


def test_one_broker_per_transaction(broker_factory: BrokerFactory) -> None:
    a = broker_factory(topics={"both": 2, "onlya": 1}, name="a")
    b = broker_factory(topics={"both": 2, "onlyb": 1}, name="b")
    with connect([a.addr, b.addr], config=FAST) as s:
        p = s.create_producer()
        assert len(s.partitions("both")) == 4
        with p.transaction() as tx:
            rs = [p.send("both", b"%d" % i) for i in range(6)]
            p.send("onlya", b"a")
        assert tx.broker == a.addr
        assert {r.partition.broker_id for r in rs if r.partition} == {0}
        assert sorted(bodies(a.addr, "both", 2)) == [b"%d" % i for i in range(6)]
        assert bodies(a.addr, "onlya", 1) == [b"a"] and bodies(b.addr, "both", 2) == []
        with pytest.raises(ClientTransactionError, match="no partition on broker 0"):  # noqa: SIM117
            with p.transaction():
                p.send("onlya", b"bound-to-a")
                p.send("onlyb", b"b")
        assert bodies(a.addr, "onlya", 1) == [b"a"] and bodies(b.addr, "onlyb", 1) == []


def test_pipelined_commit_never_commits_without_a_refused_put(
    broker_factory: BrokerFactory,
) -> None:
    """COMMIT goes right behind the puts (one round trip); a put the broker refuses before
    the transaction sees it (here: over maxMessageSize) must roll the whole one back,
    whether it went as a lone ``put`` or inside a transactional ``mput``."""
    b = broker_factory(maxMessageSize=1000)
    big = b"x" * 5000
    with connect([b.addr], config=FAST) as s:
        p = s.create_producer()
        with pytest.raises(TransactionAbortedError, match="maxMessageSize") as ei:  # noqa: SIM117
            with p.transaction() as tx:
                p.send_future("test", b"before", key="k")  # a put to another partition
                p.send_future("single", big)  # a lone put: refused
        assert tx.status == "rolled_back" and isinstance(ei.value.__cause__, ClientError)
        with pytest.raises(TransactionAbortedError, match="outside"):  # noqa: SIM117
            with p.transaction():  # three for one partition: one mput, refused whole
                for body in (b"before", big, b"after"):
                    p.send_future("single", body)
        assert bodies(b.addr, "single", 1) == [] and bodies(b.addr, "test", 4) == []
        with p.transaction() as ok:  # the producer and its connection go on
            rs = [p.send_future("single", b"m%d" % i) for i in range(3)]
        assert ok.status == "committed"
        assert len({f.result().msg_id for f in rs}) == 3
        assert bodies(b.addr, "single", 1) == [b"m0", b"m1", b"m2"]
    # the same without pipelining (ProducerConfig.pipeline_commit=False: puts only)
    with connect([b.addr], config=FAST) as s:
        p = s.create_producer(ProducerConfig(pipeline_commit=False))
        with pytest.raises(TransactionAbortedError):  # noqa: SIM117
            with p.transaction():
                p.send_future("single", b"lost")
                p.send_future("single", big)
        with p.transaction():
            p.send("single", b"m3")
        assert bodies(b.addr, "single", 1) == [b"m0", b"m1", b"m2", b"m3"]


@pytest.mark.crash
def test_connection_drop_fails_the_transaction(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    with connect([b.addr], config=FAST) as s:
        p = s.create_producer()
        tx = p.begin_transaction()
        assert p.send("orders", b"lost-1").success
        b.kill()
        with pytest.raises(TransactionConnectionError):
            p.send("orders", b"lost-2")
        with pytest.raises(TransactionConnectionError) as ei:
            tx.commit()
        assert not isinstance(ei.value, TransactionOutcomeUnknownError)
        assert tx.status == "rolled_back"
        b.start()  # same port, same data
        assert bodies(b.addr, "orders", 2) == []
        # a new transaction gets a new connection
        deadline = time.monotonic() + 10
        while True:
            try:
                with p.transaction():
                    p.send("orders", b"again").raise_for_error()
                break
            except TransactionConnectionError:
                assert time.monotonic() < deadline
        assert bodies(b.addr, "orders", 2) == [b"again"]


def test_async_transactions(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer()
            outside_done = asyncio.Event()
            go = asyncio.Event()

            async def outsider() -> None:  # its own context: not in the transaction
                await go.wait()
                assert (await p.send("orders", b"outside")).offset >= 0
                outside_done.set()

            task = asyncio.create_task(outsider())
            async with p.transaction(timeout=10) as tx:
                assert p.current_transaction() is tx
                futs = [p.send_nowait("single", b"%02d" % i) for i in range(20)]
                both = await asyncio.gather(p.send("orders", b"in-1"), p.send("orders", b"in-2"))
                go.set()
                await outside_done.wait()
                assert all(r.offset == -1 for r in [*both, *await asyncio.gather(*futs)])
                assert bodies(broker.addr, "single", 1) == []
                assert bodies(broker.addr, "orders", 2) == [b"outside"]
            await task
            assert tx.status == "committed" and p.current_transaction() is None
            assert bodies(broker.addr, "single", 1) == [b"%02d" % i for i in range(20)]
            assert sorted(bodies(broker.addr, "orders", 2)) == [b"in-1", b"in-2", b"outside"]

            with pytest.raises(KeyError):
                async with p.transaction():
                    await p.send("single", b"no")
                    raise KeyError("x")
            tx = p.begin_transaction()
            await p.send("single", b"explicit")
            assert bodies(broker.addr, "single", 1)[-1] == b"19"
            await tx.commit()
            tx = p.begin_transaction()
            await tx.send("single", b"no-2")
            await tx.rollback()
            assert bodies(broker.addr, "single", 1)[-2:] == [b"19", b"explicit"]

    asyncio.run(main())


# --------------------------------------------------------------------------- half messages


def test_half_commit_is_readable_when_acknowledged_by_default(
    broker_factory: BrokerFactory,
) -> None:
    """Without ``halfCommitEarlyAck`` a half message's COMMIT is answered once forced and
    applied: the message is readable the moment ``send_in_transaction`` returns, every time."""
    b = broker_factory(halfCommitForceDelay=600)  # unused unless early acks are on
    with connect([b.addr], config=FAST) as s:
        p = s.create_transactional_producer("shop-strict", lambda m: LocalTxState.COMMIT)
        for i in range(20):
            r = p.send_in_transaction("single", b"m%d" % i, lambda m: LocalTxState.COMMIT)
            assert r.state is LocalTxState.COMMIT and r.error is None
            assert bodies(b.addr, "single", 1)[-1] == b"m%d" % i  # no wait


def test_half_commit_is_readable_after_half_commit_force_delay(
    broker_factory: BrokerFactory,
) -> None:
    """halfCommitEarlyAck + halfCommitForceDelay: an answered half-message COMMIT that no
    other fsync covers is forced (and becomes readable) that long after it, not before and
    not much later."""
    b = broker_factory(halfCommitEarlyAck="true", halfCommitForceDelay=600)
    with connect([b.addr], config=FAST) as s:
        p = s.create_transactional_producer("shop-delay", lambda m: LocalTxState.COMMIT)
        r = p.send_in_transaction("single", b"late", lambda m: LocalTxState.COMMIT)
        acked = time.monotonic()
        assert r.state is LocalTxState.COMMIT
        assert bodies(b.addr, "single", 1) == []  # answered, not forced yet: invisible
        wait_until(lambda: bodies(b.addr, "single", 1) == [b"late"], timeout=5)
        waited = time.monotonic() - acked
        assert waited >= 0.4, waited
        timing(waited < 3.0, f"a 600 ms halfCommitForceDelay made it readable after {waited:.2f} s")


def test_half_messages_commit_rollback_unknown(broker_factory: BrokerFactory) -> None:
    b = broker_factory(txCheckBackDelay=300)
    asked: list[Message] = []

    def checker(msg: Message) -> LocalTxState:
        asked.append(msg)
        assert threading.current_thread().name.startswith("notify-tx-check")
        return LocalTxState.COMMIT if msg.data == b"unknown" else LocalTxState.ROLLBACK

    with connect([b.addr], config=FAST) as s:
        p = s.create_transactional_producer("shop", checker)
        local: list[Message] = []

        def decide(state: LocalTxState) -> Any:
            def local_tx(msg: Message) -> LocalTxState:
                local.append(msg)
                assert bodies(b.addr, "single", 1) == bodies_before  # prepared: invisible
                return state

            return local_tx

        bodies_before: list[bytes] = []
        r = p.send_in_transaction("single", b"commit", decide(LocalTxState.COMMIT), key="k")
        assert r.state is LocalTxState.COMMIT and r.error is None and r.msg_id > 0
        assert r.send_result.offset == -1 and r.tx_key.startswith(f"TX:{p.session_id}:")
        assert local[0].data == b"commit" and local[0].msg_id == r.msg_id
        assert bodies(b.addr, "single", 1) == [b"commit"]  # readable when acknowledged
        bodies_before = [b"commit"]
        r = p.send_in_transaction("single", b"rollback", decide(LocalTxState.ROLLBACK))
        assert r.state is LocalTxState.ROLLBACK
        r = p.send_in_transaction("single", b"unknown", decide(LocalTxState.UNKNOWN), "attr")
        assert r.state is LocalTxState.UNKNOWN

        def raising(msg: Message) -> LocalTxState:
            raise RuntimeError("db down")

        with pytest.raises(RuntimeError, match="db down"):
            p.send_in_transaction("single", b"raised", raising)
        assert bodies(b.addr, "single", 1) == [b"commit"]
        # the broker checks back with the group: UNKNOWN -> COMMIT, raised -> ROLLBACK
        wait_until(lambda: len(asked) >= 2, timeout=10)
        wait_until(lambda: bodies(b.addr, "single", 1) == [b"commit", b"unknown"])
        unknown = next(m for m in asked if m.data == b"unknown")
        assert unknown.attribute == "attr" and unknown.topic == "single"
        assert unknown.partition.address == b.addr and unknown.partition.broker_id == 0
        assert sorted(m.data for m in asked) == [b"raised", b"unknown"]

        plain = s.create_producer()
        with pytest.raises(ClientTransactionError, match="producer group"):
            plain.send_in_transaction("single", b"x", decide(LocalTxState.COMMIT))


def test_checker_exception_means_unknown(broker_factory: BrokerFactory) -> None:
    b = broker_factory(txCheckBackDelay=200)
    calls: list[float] = []

    def checker(msg: Message) -> LocalTxState:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("checker bug")
        return LocalTxState.COMMIT

    with connect([b.addr], config=FAST) as s:
        p = s.create_transactional_producer("g2", checker)
        r = p.send_in_transaction("single", b"m", lambda m: LocalTxState.UNKNOWN)
        assert r.state is LocalTxState.UNKNOWN
        wait_until(lambda: len(calls) == 1, timeout=5)
        time.sleep(0.5)
        assert bodies(b.addr, "single", 1) == []  # no answer: still prepared
        # the broker asks again once its check times out (5 s)
        wait_until(lambda: bodies(b.addr, "single", 1) == [b"m"], timeout=15)
        assert len(calls) == 2


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from notify.client import LocalTxState, connect

    addr, marker = sys.argv[1], Path(sys.argv[2])

    def local_tx(msg):
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(str(msg.msg_id))
        tmp.rename(marker)  # the test polls for the marker: it appears whole
        time.sleep(60)  # killed here: after PREPARE, before deciding

    s = connect([addr])
    p = s.create_transactional_producer("shop", lambda m: LocalTxState.UNKNOWN)
    p.send_in_transaction("orders", b"from-dead-producer", local_tx)
    """
)


@pytest.mark.crash
def test_half_commit_lost_in_a_crash_is_recommitted_by_check_back(tmp_path: Path) -> None:
    """With ``halfCommitEarlyAck`` COMMIT_TWO_PHASE of a half message is answered before its
    force (the PREPARE was forced; README "Transactions"). A crash that loses that COMMIT
    (cut off the redo log, as a power loss drops the page cache) brings the message back
    prepared and invisible, and the check-back commits it from the application's answer,
    exactly once."""
    b = BrokerProcess(
        tmp_path,
        topics={"single": 1},
        system={"flushTxLogAtCommit": 1, "txCheckBackDelay": 200, "halfCommitEarlyAck": "true"},
        env={"NOTIFY_CRASHPOINTS": "before_half_commit_force"},
    )
    b.start()
    committed: set[bytes] = set()  # the application's table

    def checker(msg: Message) -> LocalTxState:
        return LocalTxState.COMMIT if msg.data in committed else LocalTxState.ROLLBACK

    def local_tx(msg: Message) -> LocalTxState:
        committed.add(msg.data)
        return LocalTxState.COMMIT

    try:
        with connect([b.addr], config=FAST) as s:
            p = s.create_transactional_producer("shop", checker)
            r = p.send_in_transaction("single", b"paid-7", local_tx)
            assert r.state is LocalTxState.COMMIT and r.error is None  # acknowledged
        assert b.wait_exit(10) is not None, "crashpoint not reached"
        redo = tmp_path / "data" / "transactions"
        segs = sorted(redo.glob("redo.*"), key=lambda q: int(q.name.split(".")[1]))
        data = segs[-1].read_bytes()
        last = txrecords.decode(data).records[-1]
        assert last.type == lr.COMMIT and lr.key_of(last.body) == r.tx_key
        os.truncate(segs[-1], last.offset)  # the unforced COMMIT is lost
        b.env = {}
        b.start()
        assert bodies(b.addr, "single", 1) == []  # prepared again: invisible
        with connect([b.addr], config=FAST) as s:
            s.create_transactional_producer("shop", checker)
            wait_until(lambda: bodies(b.addr, "single", 1) == [b"paid-7"], timeout=10)
        b.restart()
        assert bodies(b.addr, "single", 1) == [b"paid-7"]
    finally:
        b.stop()


@pytest.mark.crash
def test_check_back_reaches_another_process_of_the_group(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    b = broker_factory(txCheckBackDelay=1000)
    marker = tmp_path / "prepared"
    msg_id = int(kill_when_marked(CHILD, marker, b.addr, str(marker)))
    assert bodies(b.addr, "orders", 2) == []
    asked: list[Message] = []

    def checker(msg: Message) -> LocalTxState:
        asked.append(msg)
        return LocalTxState.COMMIT

    with connect([b.addr], config=FAST) as s:
        s.create_transactional_producer("shop", checker)
        wait_until(lambda: bodies(b.addr, "orders", 2) == [b"from-dead-producer"], timeout=15)
    assert [(m.msg_id, m.data, m.topic) for m in asked] == [
        (msg_id, b"from-dead-producer", "orders")
    ]
