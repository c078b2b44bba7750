"""Session expiry with real ZooKeeper on a real broker and a real consumer (in process, so
the test can expire their sessions): the broker registers again, the consumer stops, claims
its partitions again and goes on from the committed offsets - nothing lost."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient

from notify.broker.app import Broker
from notify.client import ClientConfig, ConsumerConfig, Message, ZkBrokerDirectory, connect
from notify.config import load_config
from notify.configserver import ConfigServer, SessionState
from notify.configserver._kazoo import KazooNodeStore
from notify.testing import render_ini
from tests.cluster.conftest import SESSION_S
from tests.cluster.conftest import ZkBrokers as ZkBrokersT
from tests.helpers import wait_until
from tests.services import ZooKeeperServer


class InProcessBroker:
    """A :class:`Broker` on its own event loop in a thread."""

    def __init__(self, config_path: Path):
        self.config = load_config(config_path)
        self.loop = asyncio.new_event_loop()
        self.broker = Broker(self.config)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.broker.start(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def expire(zk: ZooKeeperServer, server: ConfigServer) -> int:
    """Close ``server``'s ZooKeeper session from a second client; returns the old id."""
    store = server.store
    assert isinstance(store, KazooNodeStore)
    sid, passwd = store.client.client_id
    other = KazooClient(hosts=zk.connect, client_id=(sid, passwd))
    other.start(timeout=10)
    other.stop()
    other.close()
    return int(sid)


def test_expired_sessions_reregister_and_reclaim(
    zookeeper: ZooKeeperServer, zk_root: str, kz: KazooClient, tmp_path: Path
) -> None:
    ini = tmp_path / "server.ini"
    ini.write_text(
        render_ini(
            tmp_path / "data",
            0,
            {"t": 2},
            {"brokerId": 5},
            zookeeper={"zkEnable": True, "zkConnect": zookeeper.connect, "zkRoot": zk_root},
        )
    )
    node = f"{zk_root}/brokers/ids/5/master"
    broker = InProcessBroker(ini)
    try:
        assert kz.exists(node) is not None
        registrar = broker.broker.registrar
        assert registrar is not None
        got: list[bytes] = []
        lock = threading.Lock()

        def on_message(m: Message) -> None:
            with lock:
                got.append(m.data)

        url = f"{zookeeper.connect}{zk_root}"
        cfg = ClientConfig(zk_session_timeout_s=SESSION_S)
        # producer and consumer in separate sessions (connections), as in production: a
        # parked long-poll get delays later replies on its connection
        with connect(zk=url, config=cfg) as psession, connect(zk=url, config=cfg) as session:
            producer = psession.create_producer()
            consumer = session.create_consumer(
                ConsumerConfig(group="g", data_dir=tmp_path / "c", commit_interval_s=0.2)
            )
            consumer.subscribe("t", on_message).complete_subscribe()
            for i in range(50):
                assert producer.send("t", f"a{i}".encode()).success
            wait_until(lambda: len(got) >= 50, 10)

            # the broker's session expires: its nodes come back under a new session
            old = expire(zookeeper, registrar.server)
            wait_until(lambda: (st := kz.exists(node)) is not None and st.ephemeralOwner != old, 10)
            wait_until(lambda: kz.exists(f"{zk_root}/brokers/topics-pub/t/5-m") is not None, 5)

            # the consumer's session expires: it drops its partitions, claims them again
            member = consumer.core.member
            assert member is not None
            cluster = session.core.cluster
            assert cluster is not None
            owner_node = f"{zk_root}/consumers/g/owners/t/5-0"
            old_c = expire(zookeeper, cluster)
            wait_until(
                lambda: (
                    cluster.state is SessionState.CONNECTED
                    and (st := kz.exists(owner_node)) is not None
                    and st.ephemeralOwner not in (0, old_c)
                ),
                10,
            )
            # the owner node of 5-0 can appear before the member has claimed 5-1 and
            # published its new assignment: wait for the whole claim
            wait_until(lambda: member.assignment == {"t": ["5-0", "5-1"]}, 10)
            directory = psession.core.directory
            assert isinstance(directory, ZkBrokerDirectory)
            wait_until(lambda: len(directory.current("t") or ()) == 2, 5)
            for i in range(50):
                assert producer.send("t", f"b{i}".encode()).success
            want = {f"{x}{i}".encode() for x in "ab" for i in range(50)}
            wait_until(lambda: want <= set(got), 10)
        # at-least-once: at most what was not yet committed came twice
        assert len(got) - len(set(got)) <= 50
    finally:
        broker.stop()
    assert kz.exists(node) is None  # unregistered on stop


def test_broadcast_across_hosts(zk_brokers: ZkBrokersT, kz: KazooClient, tmp_path: Path) -> None:
    """Broadcast: every instance is its own group (``<group>-<instanceId>``) and takes every
    partition, offsets kept locally; a broker joining later is picked up by all."""
    zk_brokers.start(0, {"news": 2})
    cfg = ClientConfig(zk_session_timeout_s=SESSION_S)
    got: dict[str, list[bytes]] = {"hostA": [], "hostB": []}
    with (
        connect(zk=zk_brokers.url, config=cfg) as psession,
        connect(zk=zk_brokers.url, config=cfg) as a,
        connect(zk=zk_brokers.url, config=cfg) as b,
    ):
        for name, session in (("hostA", a), ("hostB", b)):
            c = session.create_consumer(
                ConsumerConfig(
                    group="news-readers",
                    data_dir=tmp_path / name,
                    broadcast=True,
                    instance_id=name,
                    commit_interval_s=0.2,
                )
            )
            c.subscribe("news", _collect(got[name])).complete_subscribe()
        producer = psession.create_producer()
        for i in range(20):
            assert producer.send("news", f"n{i}".encode()).success
        zk_brokers.start(1, {"news": 1})
        wait_until(lambda: any(p.broker_id == 1 for p in psession.partitions("news")), 5)
        for i in range(20, 40):
            assert producer.send("news", f"n{i}".encode()).success
        want = {f"n{i}".encode() for i in range(40)}
        wait_until(lambda: want <= set(got["hostA"]) and want <= set(got["hostB"]), 15)
        root = zk_brokers.root
        for name in ("hostA", "hostB"):
            owners = kz.get_children(f"{root}/consumers/news-readers-{name}/owners/news")
            assert sorted(owners) == ["0-0", "0-1", "1-0"]
        # offsets stay local in broadcast mode (MetaQ), not in ZooKeeper
        assert kz.exists(f"{root}/consumers/news-readers-hostA/offsets") is None


def _collect(sink: list[bytes]) -> Callable[[Message], None]:
    def on_message(m: Message) -> None:
        sink.append(m.data)

    return on_message
