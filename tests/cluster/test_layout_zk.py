"""The ZooKeeper tree written by real brokers and clients, byte for byte against MetaQ's
layout (docs: /work/shared/reference/METAQ.md, "ZooKeeper layout")."""

from __future__ import annotations

import os
import re
import signal
import time
import zlib
from pathlib import Path

from kazoo.client import KazooClient

from notify.client import ClientConfig, ConsumerConfig, connect
from notify.config import load_config, served_config
from tests.cluster.conftest import SESSION_S, ZkBrokers, dump_tree
from tests.helpers import wait_until

E, P = True, False  # ephemeral / persistent


def _crc(path: Path) -> bytes:
    """``master_config_checksum``: the CRC32 of the config as ``stats config`` serves it."""
    served = served_config(load_config(path))
    assert served is not None
    return str(zlib.crc32(served)).encode()


def test_broker_nodes_byte_for_byte(zk_brokers: ZkBrokers, kz: KazooClient) -> None:
    root = zk_brokers.root
    b0 = zk_brokers.start(
        0,
        {
            "orders": 4,
            "audit": {"numPartitions": 2, "acceptPublish": "false"},
            "feed": {"numPartitions": 1, "acceptSubscribe": "false"},
        },
    )
    b1 = zk_brokers.start(1, {"orders": 2})
    a0, a1 = f"meta://127.0.0.1:{b0.port}".encode(), f"meta://127.0.0.1:{b1.port}".encode()
    br = f"{root}/brokers"
    expected = {
        f"{br}/ids": (b"", P),
        f"{br}/ids/0": (b"", P),
        f"{br}/ids/0/master": (a0, E),
        f"{br}/ids/0/master_config_checksum": (_crc(b0.config_path), E),
        f"{br}/ids/1": (b"", P),
        f"{br}/ids/1/master": (a1, E),
        f"{br}/ids/1/master_config_checksum": (_crc(b1.config_path), E),
        f"{br}/topics": (b"", P),
        f"{br}/topics/audit": (b"", P),
        f"{br}/topics/audit/0-m": (b"2", E),
        f"{br}/topics/feed": (b"", P),
        f"{br}/topics/feed/0-m": (b"1", E),
        f"{br}/topics/orders": (b"", P),
        f"{br}/topics/orders/0-m": (b"4", E),
        f"{br}/topics/orders/1-m": (b"2", E),
        f"{br}/topics-pub": (b"", P),
        f"{br}/topics-pub/feed": (b"", P),
        f"{br}/topics-pub/feed/0-m": (b'{"numParts":1,"broker":"0-m"}', E),
        f"{br}/topics-pub/orders": (b"", P),
        f"{br}/topics-pub/orders/0-m": (b'{"numParts":4,"broker":"0-m"}', E),
        f"{br}/topics-pub/orders/1-m": (b'{"numParts":2,"broker":"1-m"}', E),
        f"{br}/topics-sub": (b"", P),
        f"{br}/topics-sub/audit": (b"", P),
        f"{br}/topics-sub/audit/0-m": (b'{"numParts":2,"broker":"0-m"}', E),
        f"{br}/topics-sub/orders": (b"", P),
        f"{br}/topics-sub/orders/0-m": (b'{"numParts":4,"broker":"0-m"}', E),
        f"{br}/topics-sub/orders/1-m": (b'{"numParts":2,"broker":"1-m"}', E),
    }
    assert dump_tree(kz, br) == expected

    # a topic added by a config reload (SIGHUP) is registered; a grown one updated
    b1.topics = {"orders": 3, "later": 1}
    b1.write_config()
    os.kill(b1.pid, signal.SIGHUP)
    wait_until(lambda: kz.exists(f"{br}/topics-pub/later/1-m") is not None, 10)
    assert kz.get(f"{br}/topics-pub/later/1-m")[0] == b'{"numParts":1,"broker":"1-m"}'
    grown = b'{"numParts":3,"broker":"1-m"}'
    wait_until(lambda: kz.get(f"{br}/topics-sub/orders/1-m")[0] == grown, 10)
    assert kz.get(f"{br}/topics/orders/1-m")[0] == b"3"
    assert kz.get(f"{br}/topics-pub/orders/1-m")[0] == grown

    # a slave of broker 0 finds its master in ZooKeeper and registers as <id>-s<N>
    slave = zk_brokers.start(
        0,
        {"orders": 4},
        slave={"slaveId": 1, "slaveGroup": "meta-slave-group"},
        replicationSecret="rs",  # a slave cannot start without one
    )
    addr = f"meta://127.0.0.1:{slave.port}".encode()
    wait_until(lambda: kz.exists(f"{br}/ids/0/slave1") is not None, 10)
    assert kz.get(f"{br}/ids/0/slave1")[0] == addr
    assert kz.get(f"{br}/topics/orders/0-s1")[0] == b"4"
    assert kz.get(f"{br}/topics-sub/orders/0-s1")[0] == b'{"numParts":4,"broker":"0-s1"}'
    assert kz.exists(f"{br}/topics-pub/orders/0-s1") is None
    assert f"of 127.0.0.1:{b0.port}" in slave.log_tail(200)  # replicating from the master

    # graceful stop removes every ephemeral node of the broker at once
    b0.stop()
    assert kz.exists(f"{br}/ids/0/master") is None
    assert kz.get_children(f"{br}/topics-pub/orders") == ["1-m"]


def test_consumer_nodes_byte_for_byte(
    zk_brokers: ZkBrokers, kz: KazooClient, tmp_path: Path
) -> None:
    root = zk_brokers.root
    zk_brokers.start(0, {"t": 2})
    cfg = ClientConfig(zk_session_timeout_s=SESSION_S)
    with connect(zk=zk_brokers.url, config=cfg) as session:
        p = session.create_producer()
        # no key: a key now travels in the record's attribute block, and the offset below
        # counts a bare 20-byte header + 5-byte body
        r = p.send("t", b"hello")
        assert r.success
        consumer = session.create_consumer(
            ConsumerConfig(group="grp", data_dir=tmp_path, commit_interval_s=0.2)
        )
        got: list[bytes] = []
        consumer.subscribe("t", lambda m: got.append(m.data)).complete_subscribe()
        wait_until(lambda: got == [b"hello"], 10)
        member = consumer.core.member
        assert member is not None
        cid = member.consumer_id
        assert re.fullmatch(r"grp_[^/]+-\d+-\d{13}-\d+", cid)  # MetaQ: group_host-pid-ms-n
        g = f"{root}/consumers/grp"
        node, want = f"{g}/offsets/t/{r.partition}", f"{r.msg_id}-{r.offset + 20 + 5}".encode()
        wait_until(lambda: kz.exists(node) is not None and kz.get(node)[0] == want, 10)
        tree = dump_tree(kz, g)
        assert tree[f"{g}/ids/{cid}"] == (b"t", E)
        assert tree[f"{g}/owners/t/0-0"] == (cid.encode(), E)
        assert tree[f"{g}/owners/t/0-1"] == (cid.encode(), E)
        assert tree[node] == (want, P)  # <msgId>-<offset of the next record>
    # leaving the group removed the member and its owner nodes, not the offsets
    time.sleep(0.1)
    tree = dump_tree(kz, f"{root}/consumers/grp")
    assert [k for k, (_v, e) in tree.items() if e] == []
    assert any("/offsets/t/" in k for k in tree)
