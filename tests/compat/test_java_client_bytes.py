"""The Java client's exact bytes against a real broker, replies decoded as it decodes them.

One test per difference found against the Java client's bytes, then the smaller alignments. See
``docs/metaq-compat.md`` for what each Java class sends and expects.
"""

from __future__ import annotations

import configparser
import os
import signal
import zlib
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from notify.config import EXTENSION_KEYS, MAX_METAQ_CLIENT_PAYLOAD, load_config, served_config
from notify.testing import BrokerProcess
from tests.cluster.conftest import ZkBrokers
from tests.compat import javaclient as j
from tests.compat.javaclient import BooleanCommand, DataCommand, JavaConnection
from tests.conftest import BrokerFactory
from tests.helpers import wait_until
from tests.services import ZooKeeperServer


def _bool(r: j.Reply) -> BooleanCommand:
    assert isinstance(r, BooleanCommand), r
    return r


def _send_result(r: j.Reply) -> tuple[int, int, int]:
    """``SimpleMessageProducer.genSendResult``: ``<msgId> <partition> <offset>`` on 200."""
    b = _bool(r)
    assert b.code == 200 and b.message is not None, b
    mid, part, off = b.message.split(" ")
    return int(mid), int(part), int(off)


def _fetch_all(c: JavaConnection, topic: str, part: int, offset: int) -> list[j.JavaMessage]:
    r = c.call(j.get(topic, "javagroup", part, offset, 1024 * 1024, 77))
    assert isinstance(r, DataCommand) and r.opaque == 77, r
    return j.decode_messages(r.data, offset)


# --------------------------------------------------------------------------- 1. partition -1


def test_1_put_to_partition_minus_one_lets_the_broker_choose(broker: BrokerProcess) -> None:
    """``MetaClientConfig.setServerUrl``: ``ProducerZooKeeper.selectPartition`` returns
    ``Partition.RandomPartiton`` and every put says partition -1; the producer takes the
    partition from the reply."""
    sent: dict[int, list[tuple[int, bytes]]] = {}
    with JavaConnection(broker.addr) as c:
        for i in range(40):
            data = j.encode_payload(b"m%d" % i, "tag" if i % 2 else None)
            attr_flag = j.flag_of("tag" if i % 2 else None)
            r = c.call(j.put("test", j.RANDOM_PARTITION, data, attr_flag, 1000 + i))
            assert r.opaque == 1000 + i
            _mid, part, off = _send_result(r)
            assert 0 <= part < 4 and off >= 0
            sent.setdefault(part, []).append((off, b"m%d" % i))
        assert len(sent) > 1, "40 random choices over 4 partitions all hit one"
        for part, items in sent.items():
            got = _fetch_all(c, "test", part, 0)
            assert [(m.offset, m.payload) for m in got] == items
        # an unknown topic is still a 404, not a crash on the random choice
        assert _bool(c.call(j.put("nosuch", -1, b"x", 0, 5))).code == 404


def test_1_transactional_put_to_partition_minus_one(broker: BrokerProcess) -> None:
    """The same producer in a local transaction: MetaQ refuses (500 "Invalid partition for
    transaction command"); notify chooses the partition as for a plain put."""
    key = "TX:javasession:1"
    with JavaConnection(broker.addr) as c:
        assert _bool(c.call(j.transaction(key, "javasession", "BEGIN", 1))).code == 200
        _mid, part, off = _send_result(c.call(j.put("test", -1, b"in-tx", 0, 2, tx_key=key)))
        assert 0 <= part < 4 and off == -1
        assert _bool(c.call(j.transaction(key, "javasession", "COMMIT_ONE_PHASE", 3))).code == 200
        assert [m.payload for m in _fetch_all(c, "test", part, 0)] == [b"in-tx"]


# --------------------------------------------------------------------------- 2. XA BEGIN


@pytest.mark.parametrize("timeout", [0, 30])
def test_2_default_xa_producer_transaction(broker: BrokerProcess, timeout: int) -> None:
    """``TransactionContext`` of ``SimpleXAMessageProducer``: uniqueQualifier
    ``XAMessageProducer-<host>`` on every command; with ``transactionTimeout = 0`` (the
    default) BEGIN is ``BEGIN <uq> <opaque>``."""
    uq = j.DEFAULT_UQ
    key = j.xid_key(1, b"gtrid-%d" % timeout, b"b1", uq)
    sess = "xasession"
    with JavaConnection(broker.addr) as c:
        begin = j.transaction(key, sess, "BEGIN", 1, timeout=timeout, uq=uq)
        assert begin.count(b" ") == (6 if timeout else 5)
        r = _bool(c.call(begin))
        assert (r.code, r.opaque) == (200, 1), r
        _mid, part, off = _send_result(c.call(j.put("orders", 1, b"xa-msg", 0, 2, tx_key=key)))
        assert (part, off) == (1, -1)
        # END: sent with sendToGroup and a listener that ignores the answer (MetaQ sends none)
        assert _bool(c.call(j.transaction(key, sess, "END", 3, uq=uq))).code == 200
        vote = _bool(c.call(j.transaction(key, sess, "PREPARE", 4, uq=uq)))
        assert (vote.code, vote.message) == (200, "0")  # Integer.parseInt(...) == XA_OK
        rec = _bool(c.call(j.transaction("null", sess, "RECOVER", 5, uq=uq)))
        assert rec.code == 200 and rec.message is not None
        assert key in rec.message.split("\r\n")
        assert _bool(c.call(j.transaction(key, sess, "COMMIT_TWO_PHASE", 6, uq=uq))).code == 200
        assert [m.payload for m in _fetch_all(c, "orders", 1, 0)] == [b"xa-msg"]


def test_2_numeric_unique_qualifier_is_not_a_timeout(broker: BrokerProcess) -> None:
    """``setUniqueQualifier("20240101")``: MetaQ reads ``BEGIN 20240101`` as a timeout;
    notify sees that the slot repeats the key's qualifier."""
    uq = "20240101"
    key = j.xid_key(7, b"g", b"b", uq)
    with JavaConnection(broker.addr) as c:
        assert _bool(c.call(j.transaction(key, "s", "BEGIN", 1, uq=uq))).code == 200
        c.call(j.put("orders", 0, b"n", 0, 2, tx_key=key))
        assert _bool(c.call(j.transaction(key, "s", "PREPARE", 3, uq=uq))).message == "0"
        rec = _bool(c.call(j.transaction("null", "s", "RECOVER", 4, uq=uq)))
        assert rec.message == key
        assert _bool(c.call(j.transaction(key, "s", "ROLLBACK", 5, uq=uq))).code == 200


# --------------------------------------------------------------------------- 3. stats config


def test_3_stats_config_is_the_ini_file(broker_factory: BrokerFactory) -> None:
    """``SubscribeHandler.tryReloadConfig``: the slave sends ``StatsCommand(opaque,
    "config")`` and loads ``resp.getErrorMsg()`` as an ini (``MetaConfig.loadFromString``)."""
    b = broker_factory(authSecret="s3cret-value")
    with JavaConnection(b.addr) as c:
        assert _bool(c.call(b"auth s3cret-value 1\r\n")).code == 200
        r = _bool(c.call(j.stats("config", 9)))
    assert (r.code, r.opaque) == (200, 9) and r.message is not None
    assert "s3cret-value" not in r.message
    served = _ini(r.message)
    on_disk = _ini(b.config_path.read_text())
    assert served.sections() == on_disk.sections()
    for sec in on_disk.sections():
        # MetaConfig.checkConfigKeys throws on a key it does not know: notify's own keys
        # are served commented out (the secret's value hidden too)
        want = {k: v for k, v in on_disk[sec].items() if k not in EXTENSION_KEYS}
        assert dict(served[sec]) == want, sec
    assert set(on_disk["system"]) & EXTENSION_KEYS
    assert "; notify: authSecret=***\n" in r.message
    assert f"; notify: configWatchInterval={on_disk['system']['configWatchInterval']}\n" in (
        r.message
    )
    assert "DeletePolicy(" not in r.message


def _ini(text: str) -> configparser.ConfigParser:
    """Read as ini4j reads it (case-sensitive keys, ';' comments)."""
    cp = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(text)
    return cp


def test_3_master_config_checksum_in_zookeeper(
    tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    """``BrokerZooKeeper.registerMasterConfigFileChecksumInZk``: an ephemeral
    ``/meta/brokers/ids/<id>/master_config_checksum`` holding the CRC32 of the config file
    (``FileUtils.checksumCRC32``), updated on reload; slaves do not write it."""
    zb = ZkBrokers(tmp_path, zookeeper, zk_root)
    kz = KazooClient(hosts=zookeeper.connect, timeout=5.0)
    kz.start(timeout=10)
    try:
        m = zb.start(3, {"orders": 2})
        node = f"{zk_root}/brokers/ids/3/master_config_checksum"

        def published() -> bytes:
            return kz.get(node)[0] if kz.exists(node) else b""

        wait_until(lambda: published() != b"", 10)
        data, stat = kz.get(node)
        assert stat.ephemeralOwner
        with JavaConnection(m.addr) as c:
            served = _bool(c.call(j.stats("config", 1))).message
        # the CRC32 of what the slave gets (= the file's, but for notify's own keys); a MetaQ
        # slave that saved it has the same CRC32 and stops fetching
        assert served is not None and data == str(zlib.crc32(served.encode())).encode()
        # a reload of a changed file publishes the new checksum
        m.topics = {"orders": 2, "later": 1}
        m.write_config()
        os.kill(m.pid, signal.SIGHUP)
        reloaded = served_config(load_config(m.config_path))
        assert reloaded is not None
        new = str(zlib.crc32(reloaded)).encode()
        wait_until(lambda: published() == new, 10)
        zb.start(3, {"orders": 2}, slave={"slaveId": 1}, replicationSecret="rs")
        wait_until(lambda: kz.exists(f"{zk_root}/brokers/ids/3/slave1") is not None, 10)
        assert published() == new  # the slave left the master's node alone
        m.stop()
        wait_until(lambda: kz.exists(node) is None, 10)
    finally:
        zb.stop_all()
        kz.stop()
        kz.close()


# --------------------------------------------------------------------------- 4. get past the end


def test_4_get_beyond_the_end_is_not_found(broker_factory: BrokerFactory) -> None:
    """``BrokerCommandProcessor.processGetCommand``: no data at the offset -> 404 "Could not
    find message at position <n>", except 301 with the max offset when the offset is past
    it and ``updateConsumerOffsets`` is set or the offset is Long.MAX_VALUE. Below the
    first offset: 301 with it. The Java consumer keeps its offset on 404, moves on 301."""
    b = broker_factory()
    with JavaConnection(b.addr) as c:
        for i in range(3):
            _send_result(c.call(j.put("single", 0, b"x%d" % i, 0, i)))
        end = 3 * 22
        for off in (end, end + 1, 10_000):
            r = _bool(c.call(j.get("single", "g", 0, off, 1024 * 1024, 5)))
            assert (r.code, r.message, r.opaque) == (
                404,
                f"Could not find message at position {off}",
                5,
            )
        top = _bool(c.call(j.get("single", "g", 0, j.LONG_MAX, 1024 * 1024, 6)))
        assert (top.code, top.message) == (301, str(end))
        low = _bool(c.call(j.get("single", "g", 0, -1, 1024 * 1024, 7)))
        assert (low.code, low.message) == (301, "0")
    moving = broker_factory(name="moving", updateConsumerOffsets="true")
    with JavaConnection(moving.addr) as c:
        _send_result(c.call(j.put("single", 0, b"x", 0, 1)))
        at_end = _bool(c.call(j.get("single", "g", 0, 21, 1024 * 1024, 2)))
        assert (at_end.code, at_end.message) == (404, "Could not find message at position 21")
        past = _bool(c.call(j.get("single", "g", 0, 10_000, 1024 * 1024, 3)))
        assert (past.code, past.message) == (301, "21")


# --------------------------------------------------------------------------- 5. old sync


def test_5_sync_without_checksum_from_an_old_master(tmp_path: Path) -> None:
    """``SyncCommand`` of a master before 1.4.4 has 7 tokens (no checksum); the slave's
    decoder reads checksum -1. The sync frames are the Java master's bytes; a notify slave
    takes them only on a link authenticated as its master (``auth <replicationSecret>
    <brokerId>``, a notify extension a MetaQ master never sends), so the test sends it first."""
    secret = {"replicationSecret": "rs"}
    master = BrokerProcess(tmp_path / "m", topics={"rep": 1}, system=secret).start()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={"rep": 1},
        system=secret,
        slave={"slaveId": 1, "masterAddress": master.addr},
    )
    try:
        slave.start()
        data = j.encode_payload(b"synced", "a")
        msg_id = 123456789
        with JavaConnection(slave.addr) as c:
            assert _bool(c.call(b"auth rs 0 40\r\n")).code == 200
            old = j.sync("rep", 0, data, 1, msg_id, 41, old_master=True)
            assert old.split(b"\r\n")[0].count(b" ") == 6
            r = _bool(c.call(old))
            assert (r.code, r.opaque) == (200, 41), r
            new = _bool(c.call(j.sync("rep", 0, b"second", 0, msg_id + 1, 42)))
            assert (new.code, new.opaque) == (200, 42)
            bad = j.sync("rep", 0, b"third", 0, msg_id + 2, 43).replace(b"third", b"THIRD")
            assert _bool(c.call(bad)).code == 400  # the 8-token form's checksum is checked
            # a slave shows its readers its (notify) master's consistent cuts, which do not
            # hold what this stand-in for a Java master synced: read it once promoted
            assert _bool(c.call(b"promote 44\r\n")).code == 200
            got = _fetch_all(c, "rep", 0, 0)
        assert [(m.msg_id, m.attribute, m.payload) for m in got] == [
            (msg_id, "a", b"synced"),
            (msg_id + 1, None, b"second"),
        ]
    finally:
        slave.stop()
        master.stop()


# --------------------------------------------------------------------------- 6. payload size


def _java_consume_one(addr: str, topic: str, offset: int) -> tuple[j.JavaMessage, int]:
    """A Java consumer's fetch loop on one record: start at maxSize 1 MiB, grow with
    ``increaseMaxSize`` while the window holds no whole record. Returns the message and the
    largest reply frame read."""
    max_size = 1024 * 1024
    with JavaConnection(addr) as c:
        for _ in range(6):
            r = c.call(j.get(topic, "javagroup", 0, offset, max_size, 3))
            assert isinstance(r, DataCommand), r
            msgs = j.decode_messages(r.data, offset)
            if msgs:
                return msgs[0], c.largest_frame
            max_size = j.next_max_size(max_size)
    raise AssertionError(f"no whole record at {offset} with maxSize up to {max_size}")


def test_6_default_max_message_size_fits_a_java_consumer(broker: BrokerProcess) -> None:
    """Every payload the default ``maxMessageSize`` admits reaches a Java consumer whole:
    the ``value`` frame fits its 2 MiB read buffer and ``MessageUtils`` accepts the length."""
    limit = MAX_METAQ_CLIENT_PAYLOAD
    attr = "k" * 200
    with JavaConnection(broker.addr) as c:
        body = os.urandom(limit - 4 - len(attr))
        payload = j.encode_payload(body, attr)
        assert len(payload) == limit
        _mid, _p, off = _send_result(c.call(j.put("single", 0, payload, 1, j.INT_MAX)))
        over = _bool(c.call(j.put("single", 0, os.urandom(limit + 1), 0, 8)))
        assert over.code == 400 and "maxMessageSize" in (over.message or "")
        three_mib = _bool(c.call(j.put("single", 0, os.urandom(3 << 20), 0, 9)))
        assert three_mib.code == 400
        assert _bool(c.call(j.version(10))).code == 200  # the skipped bodies left no trace
    msg, frame = _java_consume_one(broker.addr, "single", off)
    assert (msg.attribute, msg.payload) == (attr, body)
    assert frame <= j.MAX_READ_BUFFER_SIZE


def test_6_larger_limit_stalls_a_java_consumer(broker_factory: BrokerFactory) -> None:
    """The trade-off the default avoids: with ``maxMessageSize=4 MiB`` a 3 MiB message is
    stored and a Java consumer can never read it (its partition stalls for Java)."""
    b = broker_factory(maxMessageSize=4 << 20)
    with JavaConnection(b.addr) as c:
        _send_result(c.call(j.put("single", 0, os.urandom(3 << 20), 0, 1)))
    with pytest.raises(j.ReadBufferStalled):
        _java_consume_one(b.addr, "single", 0)


# --------------------------------------------------------------------------- smaller alignments


def test_version_and_stats_opaque_and_unknown_item(broker: BrokerProcess) -> None:
    """``decodeVersion`` / ``decodeStats`` default the opaque to Integer.MAX_VALUE; any stats
    item that is not a keyword is a topic (``appendTopic``): 200, resultCode 1 if unknown."""
    with JavaConnection(broker.addr) as c:
        assert _bool(c.call(b"version\r\n")).opaque == j.INT_MAX
        assert _bool(c.call(b"stats\r\n")).opaque == j.INT_MAX
        assert _bool(c.call(b"stats topics\r\n")).opaque == j.INT_MAX
        system = _bool(c.call(j.stats(None, 4)))
        assert system.opaque == 4 and (system.message or "").startswith("STATS\r\n")
        unknown = _bool(c.call(j.stats("nosuchtopic", 5)))
        assert (unknown.code, unknown.opaque) == (200, 5)
        lines = (unknown.message or "").split("\r\n")
        assert lines[:3] == ["STATS", "nosuchtopic", "resultCode 1"] and lines[-2] == "END"


def test_forget_of_a_rolled_back_xid_is_ok(broker: BrokerProcess) -> None:
    """``TransactionalCommandProcessor.forgetTransaction``: any XA xid -> 200 (it only drops
    a heuristic outcome); a local key -> XAER_NOTA."""
    uq = j.DEFAULT_UQ
    key = j.xid_key(1, b"f", b"1", uq)
    with JavaConnection(broker.addr) as c:
        c.call(j.transaction(key, "s", "BEGIN", 1, uq=uq))
        c.call(j.put("orders", 0, b"gone", 0, 2, tx_key=key))
        assert _bool(c.call(j.transaction(key, "s", "ROLLBACK", 3, uq=uq))).code == 200
        assert _bool(c.call(j.transaction(key, "s", "FORGET", 4, uq=uq))).code == 200
        never = j.xid_key(1, b"never", b"1", uq)
        assert _bool(c.call(j.transaction(never, "s", "FORGET", 5, uq=uq))).code == 200
        local = _bool(c.call(j.transaction("TX:s:1", "s", "FORGET", 6)))
        assert local.code == 500 and (local.message or "").startswith("XAException:code=-4,")


def test_malformed_request_opaque(broker: BrokerProcess) -> None:
    """A known command with the wrong token count has no known opaque slot: 0, not the last
    token (which may be any field)."""
    with JavaConnection(broker.addr) as c:
        short = _bool(c.call(b"get single g 0 0 1048576\r\n"))  # opaque missing
        assert (short.code, short.opaque) == (400, 0)
        typo = _bool(c.call(b"get single g zero 0 1048576 12\r\n"))  # right count, bad field
        assert (typo.code, typo.opaque) == (400, 12)
        assert _bool(c.call(j.version(13))).opaque == 13  # and the connection serves on
