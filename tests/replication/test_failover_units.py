"""Automatic failover's pure pieces: the epoch in the replica handshake, the ZooKeeper node
values, and the config checks (the processes are in ``test_auto_failover.py``)."""

from __future__ import annotations

import pytest

from notify.config import parse_config
from notify.errors import ConfigError
from notify.protocol.failover import (
    EpochInfo,
    MemberInfo,
    decode_ends,
    decode_epoch,
    decode_member,
    decode_redo,
    encode_ends,
    encode_epoch,
    encode_member,
    epoch_node_name,
)
from notify.protocol.frames import (
    Auth,
    Epoch,
    ProtocolError,
    RequestParser,
    encode_line,
    encode_replica_auth,
)
from notify.protocol.replies import encode_replica_ack, parse_replica_ack, parse_replica_epoch


def test_replica_handshake_carries_the_epoch() -> None:
    (with_epoch,) = RequestParser(1 << 20).feed(encode_replica_auth("s3", 7, 42, epoch=5))
    assert with_epoch == Auth("s3", 42, 7, 5)
    (without,) = RequestParser(1 << 20).feed(encode_replica_auth("s3", 7, 42))
    assert without == Auth("s3", 42, 7, None)
    ack = encode_replica_ack(7, 5)
    assert ack == b"ok role=replica broker=7 epoch=5"
    assert parse_replica_ack(ack) == 7 and parse_replica_epoch(ack) == 5
    old = encode_replica_ack(7)  # a broker without autoFailover
    assert parse_replica_ack(old) == 7 and parse_replica_epoch(old) == 0


def test_epoch_node_values_round_trip_and_reject_garbage() -> None:
    info = EpochInfo(3, 1, "127.0.0.1:8123")
    assert encode_epoch(info) == b'{"epoch":3,"member":1,"address":"127.0.0.1:8123"}'
    assert decode_epoch(encode_epoch(info)) == info
    ends = [("orders", 1, 20), ("orders", 0, 10)]
    assert decode_ends(encode_ends(ends)) == {("orders", 0): 10, ("orders", 1): 20}
    assert decode_redo(encode_ends(ends)) is None  # not recorded (a leader at start)
    assert decode_redo(encode_ends(ends, (2, 5, 77))) == (2, 5, 77)
    with pytest.raises(ValueError):
        decode_redo(b'{"ends":[],"redo":[1,2]}')
    assert epoch_node_name(12) == "0000000012"
    for bad in (b"[]", b'{"epoch":"3","member":1,"address":"x"}', b"{"):
        with pytest.raises(ValueError):
            decode_epoch(bad)
    with pytest.raises(ValueError):
        decode_ends(b'{"ends":[["orders",0]]}')
    member = MemberInfo(True, 1234, "127.0.0.1:8124")
    assert encode_member(member) == b'{"eligible":true,"size":1234,"address":"127.0.0.1:8124"}'
    assert decode_member(encode_member(member)) == member
    for bad in (b"[]", b'{"eligible":1,"size":1,"address":"x"}', b'{"eligible":true}'):
        with pytest.raises(ValueError):
            decode_member(bad)


def test_epoch_request_parses_and_rejects_garbage() -> None:
    (req,) = RequestParser(1 << 20).feed(encode_line("epoch", 3, 7, 11))
    assert req == Epoch(3, 7, 11)
    for line, opaque in ((b"epoch 3 7\r\n", 0), (b"epoch 3 x 5\r\n", 5), (b"epoch -1 2 6\r\n", 6)):
        (err,) = RequestParser(1 << 20).feed(line)
        assert isinstance(err, ProtocolError) and err.code == 400 and err.opaque == opaque, err


def test_auto_failover_needs_zookeeper_a_secret_and_a_fixed_port() -> None:
    zk = "[zookeeper]\nzk.zkEnable=true\n"
    with pytest.raises(ConfigError, match="autoFailover"):
        parse_config("[system]\nautoFailover=true\nreplicationSecret=r\n")
    with pytest.raises(ConfigError, match="autoFailover"):
        parse_config("[system]\nautoFailover=true\n" + zk)
    with pytest.raises(ConfigError, match="serverPort"):
        parse_config("[system]\nautoFailover=true\nreplicationSecret=r\nserverPort=0\n" + zk)
    cfg = parse_config("[system]\nautoFailover=true\nreplicationSecret=r\n" + zk)
    assert cfg.system.failover.enabled and cfg.system.failover.require_in_sync
    assert cfg.system.failover.max_lag_bytes == 0 and cfg.system.failover.slave_id == 0
