"""One contract for every way the client runs a broker transaction, against a real broker.

The same tests run on each path that drives the client's transaction core
(``notify.client.core.transaction.TxCore``), as the offset-store contract tests run on every
store:

* ``asyncio``  — :class:`AsyncTransaction` on the session's loop (``_txloop``);
* ``direct``   — the blocking API over the calling thread's own socket (``_directtx``);
* ``loop``     — the blocking API through the loop thread (a producer without ``mput``
  never takes the direct path);
* ``xa``       — the XA broker participant (``notify.xa.resources.broker``), where the test
  applies (its errors are the coordinator's :mod:`notify.xa.errors` classes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from notify.client import (
    ClientConfig,
    ClientTransactionError,
    MessageSessionFactory,
    Partition,
    ProducerConfig,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    connect,
)
from notify.client._directtx import DirectBackend
from notify.client._txloop import LoopBackend
from notify.errors import BrokerError
from notify.protocol.keys import Xid
from notify.testing import BrokerProcess
from notify.xa import BrokerParticipant
from notify.xa.errors import (
    ParticipantError,
    ParticipantUnavailableError,
    VoteRollbackError,
)
from tests.client.test_transactions import bodies
from tests.conftest import BrokerFactory

FAST = ClientConfig(
    request_timeout_s=3.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)
PATHS = ["asyncio", "direct", "loop", "xa"]
_seq = iter(range(1, 1 << 30))


@dataclass
class Expect:
    """What each path raises for one outcome."""

    aborted: type[Exception]  # commit after a failed send
    refused: type[Exception]  # a send the broker refuses
    timed_out: type[Exception]  # commit after the broker timed it out
    dropped: type[Exception]  # commit after the connection dropped


CLIENT = Expect(TransactionAbortedError, BrokerError, TransactionTimeoutError,
                TransactionConnectionError)
XA = Expect(ParticipantError, ParticipantError, VoteRollbackError, ParticipantUnavailableError)


class TxPath:
    """One way of running a transaction: begin, send, commit, rollback, status."""

    expect = CLIENT

    def begin(self, timeout: float | None = None) -> Any:
        raise AssertionError("a path defines begin")

    def send(self, tx: Any, topic: str, data: bytes) -> int:
        """Send one message in ``tx``; its message id (raises the send's error)."""
        r = tx.send(topic, data)
        assert r.success and r.offset == -1 and r.msg_id > 0
        return int(r.msg_id)

    def commit(self, tx: Any) -> None:
        tx.commit()

    def rollback(self, tx: Any) -> None:
        tx.rollback()

    def status(self, tx: Any) -> str | None:
        return str(tx.status)

    def close(self) -> None:
        pass


class SyncPath(TxPath):
    def __init__(self, addr: str, direct: bool):
        self.session = connect([addr], config=FAST)
        # without mput (a MetaQ broker's extension) transactions never take the direct path
        config = None if direct else ProducerConfig(use_mput=False)
        self.producer = self.session.create_producer(config)
        for topic in ("orders", "single"):
            self.producer.publish(topic)
        self.direct = direct

    def begin(self, timeout: float | None = None) -> Any:
        tx = self.producer.begin_transaction(timeout)
        return tx

    def send(self, tx: Any, topic: str, data: bytes) -> int:
        mid = super().send(tx, topic, data)
        backend = tx._backend
        if self.direct:  # it did take the path under test
            assert isinstance(backend, DirectBackend) and backend._loop_path is None
        else:
            assert isinstance(backend, LoopBackend)
        return mid

    def close(self) -> None:
        self.session.close()


class AsyncPath(TxPath):
    """The asyncio API, run on the session's own loop."""

    def __init__(self, addr: str):
        self.session: MessageSessionFactory = connect([addr], config=FAST)
        self.producer = self.session.core.create_producer()

    def begin(self, timeout: float | None = None) -> Any:
        async def begin() -> Any:
            return self.producer.begin_transaction(timeout)

        return self.session.run(begin())

    def send(self, tx: Any, topic: str, data: bytes) -> int:
        r = self.session.run(tx.send(topic, data))
        assert r.success and r.offset == -1 and r.msg_id > 0
        return int(r.msg_id)

    def commit(self, tx: Any) -> None:
        self.session.run(tx.commit())

    def rollback(self, tx: Any) -> None:
        self.session.run(tx.rollback())

    def close(self) -> None:
        self.session.close()


class XaPath(TxPath):
    """The XA broker participant, as the coordinator drives one branch."""

    expect = XA

    def __init__(self, addr: str):
        self.p = BrokerParticipant(addr, request_timeout_s=3.0)

    def begin(self, timeout: float | None = None) -> Any:
        xid = Xid(1, b"tx-paths-%d" % next(_seq), b"b1")
        self.p.start(xid, int(timeout or 60))
        return xid

    def send(self, tx: Any, topic: str, data: bytes) -> int:
        return self.p.handle.send(topic, data).msg_id

    def commit(self, tx: Any) -> None:
        self.p.end(tx, True)
        self.p.commit(tx, one_phase=True)

    def rollback(self, tx: Any) -> None:
        self.p.end(tx, False)
        self.p.rollback(tx)

    def status(self, tx: Any) -> str | None:
        return None  # the coordinator keeps the state of XA transactions

    def close(self) -> None:
        self.p.close()


def make_path(name: str, addr: str) -> TxPath:
    if name == "asyncio":
        return AsyncPath(addr)
    if name == "xa":
        return XaPath(addr)
    return SyncPath(addr, direct=name == "direct")


@pytest.fixture(params=PATHS)
def path_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def tx_path(path_name: str, broker: BrokerProcess) -> Iterator[TxPath]:
    p = make_path(path_name, broker.addr)
    yield p
    p.close()


def test_commit_shows_all_at_once_and_rollback_nothing(
    tx_path: TxPath, broker: BrokerProcess
) -> None:
    tx = tx_path.begin(timeout=10)
    ids = [tx_path.send(tx, "single", b"s%d" % i) for i in range(5)]
    ids.append(tx_path.send(tx, "orders", b"o"))
    assert len(set(ids)) == 6
    assert bodies(broker.addr, "single", 1) == [] and bodies(broker.addr, "orders", 2) == []
    tx_path.commit(tx)
    assert tx_path.status(tx) in ("committed", None)
    assert bodies(broker.addr, "single", 1) == [b"s%d" % i for i in range(5)]
    assert bodies(broker.addr, "orders", 2) == [b"o"]
    tx = tx_path.begin()
    tx_path.send(tx, "single", b"dropped")
    tx_path.rollback(tx)
    assert tx_path.status(tx) in ("rolled_back", None)
    tx = tx_path.begin()  # a transaction without messages never talks to the broker
    tx_path.commit(tx)
    assert tx_path.status(tx) in ("committed", None)
    assert bodies(broker.addr, "single", 1) == [b"s%d" % i for i in range(5)]


def test_a_refused_send_rolls_the_whole_transaction_back(
    path_name: str, broker_factory: BrokerFactory
) -> None:
    b = broker_factory(maxMessageSize=1000)
    p = make_path(path_name, b.addr)
    try:
        tx = p.begin()
        p.send(tx, "single", b"before")
        with pytest.raises(p.expect.refused, match="maxMessageSize"):
            p.send(tx, "single", b"x" * 5000)
        if path_name == "xa":
            p.rollback(tx)  # the coordinator rolls back after a failed branch
        else:
            with pytest.raises(p.expect.aborted):
                p.commit(tx)
            assert p.status(tx) == "rolled_back"
        assert bodies(b.addr, "single", 1) == []
        tx = p.begin()  # the producer and its connection go on
        p.send(tx, "single", b"after")
        p.commit(tx)
        assert bodies(b.addr, "single", 1) == [b"after"]
    finally:
        p.close()


def test_the_broker_times_a_transaction_out(path_name: str, broker_factory: BrokerFactory) -> None:
    b = broker_factory(maxTxTimeoutInSeconds=1)
    p = make_path(path_name, b.addr)
    try:
        tx = p.begin(timeout=30)  # capped at 1 s by the broker
        p.send(tx, "single", b"late")
        time.sleep(1.8)
        with pytest.raises(p.expect.timed_out):
            p.commit(tx)
        assert p.status(tx) in ("rolled_back", None)
        assert bodies(b.addr, "single", 1) == []
    finally:
        p.close()


@pytest.mark.crash
def test_a_dropped_connection_rolls_back(path_name: str, broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    p = make_path(path_name, b.addr)
    try:
        tx = p.begin()
        p.send(tx, "orders", b"lost")
        b.kill()
        with pytest.raises(p.expect.dropped) as ei:
            p.commit(tx)
        assert not isinstance(ei.value, TransactionOutcomeUnknownError)
        assert p.status(tx) in ("rolled_back", None)
        b.start()  # same port, same data: the broker rolled it back
        assert bodies(b.addr, "orders", 2) == []
    finally:
        p.close()


@pytest.mark.parametrize("path_name", ["asyncio", "direct", "loop"])
def test_a_failed_send_before_the_first_good_one_still_aborts(
    path_name: str, broker: BrokerProcess
) -> None:
    """A send that fails before the transaction is bound to a broker (an unknown topic)
    makes it rollback-only all the same: later sends are refused, commit rolls back."""
    p = make_path(path_name, broker.addr)
    try:
        tx = p.begin()
        with pytest.raises(BrokerError):
            p.send(tx, "nosuch", b"x")
        with pytest.raises(TransactionAbortedError, match="rollback-only"):
            p.send(tx, "single", b"never")
        with pytest.raises(TransactionAbortedError):
            p.commit(tx)
        assert bodies(broker.addr, "single", 1) == []
    finally:
        p.close()


def test_the_loop_path_keeps_a_failure_of_the_direct_path(broker: BrokerProcess) -> None:
    """A blocking transaction that failed a send before its route was known, then falls
    back to the loop path (its next send comes from another thread), stays rollback-only
    (the direct path's failure goes with it)."""
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        p.publish("single")
        tx = p.begin_transaction()
        with pytest.raises(BrokerError):
            p.send("nosuch", b"x")
        refused: list[BaseException] = []

        def send_from_another_thread() -> None:
            try:
                tx.send("single", b"from another thread")
            except TransactionAbortedError as e:
                refused.append(e)

        other = threading.Thread(target=send_from_another_thread)
        other.start()
        other.join(10)
        assert len(refused) == 1  # the loop path knew of the failure
        assert isinstance(tx._backend, DirectBackend) and tx._backend._loop_path is not None
        assert tx.rollback_only and tx.status == "rollback_only"
        with pytest.raises(TransactionAbortedError):
            tx.commit()
        assert tx.status == "rolled_back"
    assert bodies(broker.addr, "single", 1) == []


@pytest.mark.parametrize("path_name", ["asyncio", "direct", "loop"])
def test_misuse_raises_on_every_client_path(path_name: str, broker: BrokerProcess) -> None:
    p = make_path(path_name, broker.addr)
    try:
        tx = p.begin()
        p.send(tx, "orders", b"in-tx")
        p.commit(tx)
        with pytest.raises(ClientTransactionError, match="committed"):
            p.commit(tx)
        with pytest.raises(ClientTransactionError, match="takes no more"):
            p.send(tx, "orders", b"late")
        with pytest.raises(ClientTransactionError, match="already committed"):
            p.rollback(tx)
        tx = p.begin()
        p.send(tx, "orders", b"gone")
        p.rollback(tx)
        p.rollback(tx)  # idempotent
        assert p.status(tx) == "rolled_back"
        assert bodies(broker.addr, "orders", 2) == [b"in-tx"]
    finally:
        p.close()


def test_partition_of_keyless_messages_is_one_per_transaction(broker: BrokerProcess) -> None:
    """The default selector keeps a transaction's keyless messages on one partition (on
    every path: the choice is the core's)."""
    for name in ("asyncio", "direct", "loop"):
        p = make_path(name, broker.addr)
        try:
            tx = p.begin()
            parts: set[Partition] = set()
            for i in range(4):
                r = (
                    p.session.run(tx.send("orders", b"k%d" % i))  # type: ignore[attr-defined]
                    if name == "asyncio"
                    else tx.send("orders", b"k%d" % i)
                )
                parts.add(r.partition)
            p.commit(tx)
            assert len(parts) == 1, (name, parts)
        finally:
            p.close()


def test_a_refused_put_fails_on_a_producer_that_returns_results(broker: BrokerProcess) -> None:
    """``raise_on_error=False``: a transaction's failed send is a result, and commit still
    rolls back."""
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer(ProducerConfig(raise_on_error=False))
        tx = p.begin_transaction()
        assert p.send("single", b"ok").success
        bad = p.send("nosuch", b"x")
        assert not bad.success and isinstance(bad.error, BrokerError)
        with pytest.raises(TransactionAbortedError) as ei:
            tx.commit()
        assert ei.value.cause is bad.error and tx.status == "rolled_back"
    assert bodies(broker.addr, "single", 1) == []
