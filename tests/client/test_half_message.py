"""``producer.half_message(...)``: a half message around a block, in both APIs, against a
real broker; and a client killed inside the block, whose message the check-back settles."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ClientTransactionError,
    LocalTxState,
    Message,
    TxState,
    connect,
)
from notify.errors import BrokerError
from notify.testing import BrokerProcess
from tests.client.conftest import kill_when_marked
from tests.client.test_transactions import bodies
from tests.conftest import BrokerFactory
from tests.helpers import wait_until

FAST = ClientConfig(
    request_timeout_s=3.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def never(msg: Message) -> LocalTxState:  # the producer decides every message itself
    raise AssertionError(f"unexpected check-back of {msg.data!r}")


def test_blocking_half_message_commits_after_the_block(broker: BrokerProcess) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_transactional_producer("shop", never)
        with p.half_message("single", b"order-1", key="user-7", headers={"n": 1}) as half:
            r = half.prepared()  # PREPARE acknowledged: the message is there, invisible
            assert r.success and r.msg_id > 0 and r.offset == -1
            assert half.message.msg_id == r.msg_id and half.state is TxState.PREPARED
            assert bodies(broker.addr, "single", 1) == []
        assert half.state is TxState.COMMITTED and half.error is None
        assert bodies(broker.addr, "single", 1) == [b"order-1"]
        # without waiting in the block: PREPARE's ack is awaited on exit, then COMMIT
        with p.half_message("single", b"order-2") as half2:
            pass
        assert half2.state is TxState.COMMITTED
        # an exception in the block rolls the message back and propagates
        with pytest.raises(KeyError), p.half_message("single", b"never") as half3:
            half3.prepared()
            raise KeyError("the database refused")
        assert half3.state is TxState.ROLLED_BACK
        assert bodies(broker.addr, "single", 1) == [b"order-1", b"order-2"]
        plain = s.create_producer()
        with pytest.raises(ClientTransactionError, match="producer group"):  # noqa: SIM117
            with plain.half_message("single", b"x"):
                pass


def test_a_half_message_that_is_not_prepared_raises_on_exit(
    broker_factory: BrokerFactory,
) -> None:
    b = broker_factory(maxMessageSize=1000)
    ran: list[bool] = []
    with connect([b.addr], config=FAST) as s:
        p = s.create_transactional_producer("shop", never)
        with pytest.raises(BrokerError, match="maxMessageSize"):  # noqa: SIM117
            with p.half_message("single", b"x" * 5000):
                ran.append(True)  # PREPARE is not awaited before the block
        assert ran == [True]
        with pytest.raises(BrokerError, match="maxMessageSize"):  # noqa: SIM117
            with p.half_message("single", b"y" * 5000) as half:
                half.prepared()  # the block stops here, before its own commit
                ran.append(False)
        assert ran == [True]
        with pytest.raises(BrokerError, match="unknown topic"):  # noqa: SIM117
            with p.half_message("nosuch", b"z"):
                ran.append(False)
        assert ran == [True]
    assert bodies(b.addr, "single", 1) == []


def test_asyncio_half_message(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_transactional_producer("shop", never)
            async with p.half_message("orders", b"a-1", key="k") as half:
                r = await half.prepared()
                assert r.msg_id > 0 and bodies(broker.addr, "orders", 2) == []
            assert half.state is TxState.COMMITTED
            with pytest.raises(RuntimeError):
                async with p.half_message("orders", b"a-never"):
                    raise RuntimeError("no")
            async with p.half_message("orders", b"a-2"):
                await asyncio.sleep(0)
        assert sorted(bodies(broker.addr, "orders", 2)) == [b"a-1", b"a-2"]

    asyncio.run(main())


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from notify.client import LocalTxState, connect

    addr, marker = sys.argv[1], Path(sys.argv[2])
    s = connect([addr])
    p = s.create_transactional_producer("shop", lambda m: LocalTxState.UNKNOWN)
    with p.half_message("orders", b"paid") as paid:
        with p.half_message("orders", b"abandoned") as abandoned:
            paid.prepared()
            abandoned.prepared()
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(f"{paid.message.msg_id} {abandoned.message.msg_id}")
            tmp.rename(marker)  # the test polls for the marker: it appears whole
            time.sleep(60)  # killed here: both prepared, neither decided
    """
)


@pytest.mark.crash
def test_client_killed_inside_the_block_is_settled_by_check_back(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """kill -9 of the client inside two half_message blocks: both messages are prepared and
    invisible; the group's checker in another process decides each (COMMIT for the one the
    application's data shows, ROLLBACK for the other): exactly one becomes visible, once."""
    b = broker_factory(txCheckBackDelay=300)
    marker = tmp_path / "prepared"
    text = kill_when_marked(CHILD, marker, b.addr, str(marker))
    paid_id, abandoned_id = (int(x) for x in text.split())
    assert bodies(b.addr, "orders", 2) == []
    asked: dict[int, bytes] = {}

    def checker(msg: Message) -> LocalTxState:  # the application's data says which
        asked[msg.msg_id] = msg.data
        return LocalTxState.COMMIT if msg.data == b"paid" else LocalTxState.ROLLBACK

    with connect([b.addr], config=FAST) as s:
        s.create_transactional_producer("shop", checker)
        wait_until(lambda: len(asked) == 2, timeout=15)
        wait_until(lambda: bodies(b.addr, "orders", 2) == [b"paid"], timeout=10)
    assert asked == {paid_id: b"paid", abandoned_id: b"abandoned"}
    b.restart()
    assert bodies(b.addr, "orders", 2) == [b"paid"]
