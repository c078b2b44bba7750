"""A synchronous producer's transactions over the calling thread's own socket (_directtx)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from notify.client import (
    ClientConfig,
    ClientTransactionError,
    ProducerConfig,
    TransactionAbortedError,
    TransactionTimeoutError,
    connect,
)
from notify.client._directtx import DirectBackend
from notify.client._txloop import LoopBackend
from notify.client.core.selectors import KeyHashSelector
from notify.errors import BrokerError
from tests.client.test_transactions import bodies, read_part
from tests.conftest import BrokerFactory

FAST = ClientConfig(
    request_timeout_s=3.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def test_direct_transactions(broker_factory: BrokerFactory) -> None:
    b = broker_factory(maxMessageSize=1000)
    with connect([b.addr], config=FAST) as s:
        p = s.create_producer()
        # warm the route so the first transaction can take the direct path
        assert p.send("orders", b"plain").success

        # BEGIN, the puts (one mput per partition) and COMMIT go in one write at commit
        with p.transaction() as tx:
            assert isinstance(tx._backend, DirectBackend)
            futs = [p.send_future("orders", b"m%d" % i) for i in range(10)]
            assert not any(f.done() for f in futs)  # queued on this thread, nothing sent
        assert tx.status == "committed" and tx.broker == b.addr
        results = [f.result(0) for f in futs]
        assert all(r.success and r.offset == -1 for r in results)
        assert len({r.msg_id for r in results}) == 10
        for part in (0, 1):  # each partition keeps the call order
            got = [r.body for r in read_part(b.addr, "orders", part)]
            mine = [x for x in got if x != b"plain"]
            assert mine == sorted(mine, key=lambda x: int(x[1:]))
        want = sorted([b"plain"] + [b"m%d" % i for i in range(10)])
        assert sorted(bodies(b.addr, "orders", 2)) == want

        # waiting on a queued send by any means flushes it first (no deadlock)
        with p.transaction():
            f1 = p.send_future("orders", b"w1")
            done, _ = concurrent.futures.wait([f1], timeout=5)
            assert f1 in done and f1.result(0).success
            f2 = p.send_future("orders", b"w2")
            seen: list[bool] = []
            f2.add_done_callback(lambda f: seen.append(f.result().success))
            assert seen == [True]
            f3 = p.send_future("orders", b"w3")
            other: list[bool] = []
            t = threading.Thread(target=lambda: other.append(f3.result(5).success))
            t.start()
            t.join(5)
            assert other == [True]
            assert p.send_batch("orders", [b"b1", b"b2"]).success
        assert {b"w1", b"w2", b"w3", b"b1", b"b2"} <= set(bodies(b.addr, "orders", 2))

        # rollback: flushed sends become invisible, queued ones are dropped unsent
        tx = p.begin_transaction()
        assert p.send("orders", b"rb-flushed").success
        queued = p.send_future("orders", b"rb-queued")
        tx.rollback()
        assert tx.status == "rolled_back" and queued.exception(0) is not None
        with pytest.raises(ClientTransactionError):
            tx.send_future("orders", b"late")

        # a put the broker refuses: COMMIT msgs=<n> rolls everything back
        tx = p.begin_transaction()
        ok = p.send_future("orders", b"ok-but-rolled-back")
        big = p.send_future("orders", b"x" * 2000)
        with pytest.raises(TransactionAbortedError):
            tx.commit()
        # (both went in one mput to the transaction's partition: refused together)
        assert tx.status == "rolled_back" and big.exception(0) is not None
        assert "outside" in str(ok.exception(0))
        # an unknown topic fails its send and makes the transaction rollback-only
        tx = p.begin_transaction()
        with pytest.raises(BrokerError):
            p.send("nosuch", b"x")
        with pytest.raises(TransactionAbortedError):
            tx.commit()
        seen_all = set(bodies(b.addr, "orders", 2))
        assert not seen_all & {b"rb-flushed", b"rb-queued", b"ok-but-rolled-back"}

        # a first send from another thread than the one that began it: the loop path
        tx = p.begin_transaction()
        sent: list[bool] = []
        t = threading.Thread(
            target=lambda: sent.append(tx.send_future("orders", b"xt").result(5).success)
        )
        t.start()
        t.join(5)
        tx.commit()
        assert sent == [True] and tx.status == "committed" and tx.broker == b.addr
        assert b"xt" in set(bodies(b.addr, "orders", 2))

        # BEGIN waits for the commit, so the timeout is checked here as the broker would
        tx = p.begin_transaction(timeout=1)
        late = p.send_future("orders", b"too-late")
        time.sleep(1.2)
        with pytest.raises(TransactionTimeoutError):
            tx.commit()
        assert tx.status == "rolled_back" and late.exception(0) is not None
        assert b"too-late" not in set(bodies(b.addr, "orders", 2))

        # a producer closed meanwhile does not commit (its connection would be gone)
        closing = s.create_producer()
        tx = closing.begin_transaction()
        gone = closing.send_future("orders", b"closed-before-commit")
        closing.close()
        with pytest.raises(TransactionAbortedError):
            tx.commit()
        assert tx.status == "rolled_back" and gone.exception(0) is not None

        # a transaction without a message commits without the broker
        with p.transaction() as empty:
            pass
        assert empty.status == "committed" and empty.broker is None

        # a producer whose settings do not allow it keeps the loop path
        slow = s.create_producer(ProducerConfig(pipeline_commit=False))
        with slow.transaction() as tx2:
            assert isinstance(tx2._backend, LoopBackend)
            slow.send("orders", b"loop")
        assert tx2.status == "committed"
        custom = s.create_producer(selector=lambda topic, parts, key, data: parts[0])
        assert isinstance(custom.begin_transaction()._backend, LoopBackend)
        keyed = s.create_producer(selector=KeyHashSelector())
        with keyed.transaction() as tx3:
            assert isinstance(tx3._backend, DirectBackend)
            keyed.send("orders", b"keyed", key="k")
        assert b"loop" in set(bodies(b.addr, "orders", 2))
