"""Pull consumption (``fetch()``/``messages()``) in cluster mode: the group shares the
partitions through ZooKeeper, rebalances when a member joins or leaves, and what a member
processed is committed before its partitions move ("Discovery follows")."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from notify.client import ClientConfig, Consumer, ConsumerConfig, Message, connect
from notify.errors import NotifyError
from tests.cluster.conftest import SESSION_S, ZkBrokers
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

CFG = ClientConfig(zk_session_timeout_s=SESSION_S, request_timeout_s=2.0)


def _consumer_cfg(tmp: str) -> ConsumerConfig:
    return ConsumerConfig(
        group="pullers",
        initial_offset="earliest",
        long_poll_ms=200,
        commit_interval_s=0.2,
        data_dir=Path(tmp),
    )


def test_fetch_and_messages_share_partitions_in_a_cluster(
    zk_brokers: ZkBrokers, tmp_path: Path
) -> None:
    zk_brokers.start(1, {"orders": 4})
    url = zk_brokers.url
    with connect(zk=url, config=CFG) as s:
        producer = s.create_producer()
        wait_until(lambda: len(s.partitions("orders")) == 4)
        for i in range(40):
            assert producer.send("orders", b"a%d" % i, key=f"k{i}").success

        first = s.create_consumer(_consumer_cfg(str(tmp_path)))
        got_first: list[Message] = []
        deadline = time.monotonic() + 15
        while len(got_first) < 40 and time.monotonic() < deadline:
            got_first.extend(first.fetch("orders", 0.5))
        assert sorted(m.data for m in got_first) == sorted(b"a%d" % i for i in range(40))
        first.fetch("orders", 0.05)  # marks the batch above processed
        first.commit()

        # a second member joins: the partitions are split, and neither re-reads what the
        # first processed and committed
        with connect(zk=url, config=CFG) as s2:
            second = s2.create_consumer(_consumer_cfg(str(tmp_path)))
            seen: dict[str, list[bytes]] = {"first": [], "second": []}
            stop = threading.Event()

            def pull_second() -> None:
                for m in second.messages("orders", idle_timeout_s=8):
                    seen["second"].append(m.data)
                    if stop.is_set():
                        return

            t = threading.Thread(target=pull_second)
            t.start()

            def owned(c: Consumer) -> int:
                member = c.core.member
                return -1 if member is None else len(member.owned.get("orders", ()))

            # the first member keeps pulling (its partitions move only when it lets go)
            def split() -> bool:
                seen["first"].extend(m.data for m in first.fetch("orders", 0.05))
                return 0 < owned(second) < 4 and 0 < owned(first) < 4

            wait_until(split, timeout=15)
            for i in range(40):
                assert producer.send("orders", b"b%d" % i, key=f"k{i}").success
            deadline = time.monotonic() + 15
            while len(seen["first"]) + len(seen["second"]) < 40 and time.monotonic() < deadline:
                seen["first"].extend(m.data for m in first.fetch("orders", 0.3))
            stop.set()
            t.join(15)
            assert not t.is_alive()
            both = seen["first"] + seen["second"]
            assert sorted(both) == sorted(b"b%d" % i for i in range(40))  # none lost, no replay
            assert seen["first"] and seen["second"]  # both members consumed
            second.close()
        first.close()


def test_topic_must_be_subscribed_before_the_group_is_joined(
    zk_brokers: ZkBrokers, tmp_path: Path
) -> None:
    zk_brokers.start(1, {"orders": 2, "audit": 1})
    with connect(zk=zk_brokers.url, config=CFG) as s:
        c = s.create_consumer(_consumer_cfg(str(tmp_path)))
        assert c.fetch("orders", 0.1) == []  # joins the group with "orders"
        with pytest.raises(NotifyError, match="subscribe every topic before"):
            c.fetch("audit", 0.1)
        c.close()
