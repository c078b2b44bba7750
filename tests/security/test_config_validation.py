"""``server.ini`` values a hostile or careless edit could slip in
are refused with the section and key named, and a broker never starts on them."""

from __future__ import annotations

import subprocess
import sys
from operator import attrgetter
from pathlib import Path

import pytest

from notify.config import _SYSTEM_KEYS, parse_config, served_config
from notify.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[system]\nauthSecret=two words\n", "[system] authSecret"),
        ("[producerGroup=shop]\n", "[producerGroup=shop] secret: required"),
        ("[producerGroup=shop]\nsecret=two words\n", "[producerGroup=shop] secret"),
        ("[producerGroup=shop]\nsecret=s\nother=1\n", "unknown key 'other'"),
        ("[producerGroup=two words]\nsecret=s\n", "one token"),
        ("[system]\nauthSecret=   \n", "[system] authSecret: whitespace only"),
        ("[system]\nadminSecret=\t\n", "[system] adminSecret: whitespace only"),
        ("[system]\nadminSecret=caf\u00e9\n", "[system] adminSecret"),
        ("[system]\nauthSecret=pw\nadminSecret=pw\n", "adminSecret: must differ"),
        ("[system]\nmaxMessageSize=2147483648\n", "[system] maxMessageSize"),
        ("[system]\nunflushInterval=-1\n", "[system] unflushInterval"),
        ("[system]\ncheckpointInterval=-5\n", "[system] checkpointInterval"),
        ("[system]\nconfigWatchInterval=-1\n", "[system] configWatchInterval"),
        ("[system]\nmaxTransferSize=99999999999\n", "[system] maxTransferSize"),
        ("[system]\ngetProcessThreadCount=-3\n", "[system] getProcessThreadCount"),
        ("[system]\nhttpMaxConnections=0\n", "[system] httpMaxConnections"),
        ("[system]\nhttpAllowedHosts=ev il\n", "[system] httpAllowedHosts"),
        ("[system]\nmaxHeaderSize=100\n", "[system] maxHeaderSize: 100 is out of range 512.."),
        ("[system]\nwriteBufferSize=1024\n", "[system] writeBufferSize: 1024 is out of range"),
        ("[system]\ntlsMaxHelloSize=1k\n", "[system] tlsMaxHelloSize: invalid value '1k'"),
        ("[system]\nhttpMaxBodySize=0\n", "[system] httpMaxBodySize"),
        ("[system]\nhttpMaxFetchSize=1073741824\n", "[system] httpMaxFetchSize"),
        ("[system]\nhttpMaxFetchMessages=0\n", "[system] httpMaxFetchMessages"),
        ("[system]\nhttpMaxProduceMessages=-1\n", "[system] httpMaxProduceMessages"),
        ("[system]\nmaxLongPollWait=86400000\n", "[system] maxLongPollWait"),
        ("[zookeeper]\nzk.zkSessionTimeoutMs=-1\n", "[zookeeper] zk.zkSessionTimeoutMs"),
        ("[slave]\nslaveMaxDelayInMills=0\n", "[slave] slaveMaxDelayInMills"),
        ("[topic=t]\nunflushInterval=-10\n", "[topic=t] unflushInterval"),
        ("[topic=t]\nnumPartitions=100000\n", "[topic=t] numPartitions"),
        ("[system]\nmaxPartitionsPerTopic=8\n[topic=t]\nnumPartitions=9\n", "exceeds max"),
        ("[topic=t]\nmemoryMaxBytes=-1\n", "[topic=t] memoryMaxBytes"),
        ("[topic=__delay]\nacceptPublish=true\n", "reserved"),
        ("[topic=__evil]\nnumPartitions=1\n", "reserved"),
        ("[slave]\nmasterAddress=127.0.0.1:1\n", "[system] replicationSecret: required by [slave]"),
        ("[system]\nsyncSlave=127.0.0.1:1\n", "[system] replicationSecret: required by syncSlave"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert needle in str(e.value)


def test_every_numeric_system_key_is_range_checked() -> None:
    """No integer key of [system] takes an absurd value: each one is tried at -1 and 2**62."""
    defaults = parse_config("").system
    numeric = [
        k for k, (attr, _c) in _SYSTEM_KEYS.items() if type(attrgetter(attr)(defaults)) is int
    ]
    assert len(numeric) > 20
    for key in numeric:
        for bad in (-1, 2**62):
            with pytest.raises(ConfigError, match=rf"\[system\] {key}"):
                parse_config(f"[system]\n{key}={bad}\n")


def test_good_values_still_parse() -> None:
    cfg = parse_config(
        "[system]\nauthSecret=s3cr3t!\nadminSecret=root-pw\n"
        "httpAllowedHosts=broker.example, 10.0.0.5\nmaxPartitionsPerTopic=16\n"
        "[topic=a.b-c]\nnumPartitions=16\n"
    )
    assert cfg.system.auth_secret == "s3cr3t!"
    assert cfg.system.admin_secret == "root-pw"
    assert cfg.system.http.allowed_hosts == ("broker.example", "10.0.0.5")
    assert cfg.topics["a.b-c"].num_partitions == 16
    assert parse_config("[system]\nauthSecret=\n").system.auth_secret == ""


def test_broker_refuses_to_start_on_a_bad_secret(tmp_path: Path) -> None:
    ini = tmp_path / "server.ini"
    ini.write_text(f"[system]\ndataPath={tmp_path}/data\nserverPort=0\nauthSecret=two words\n")
    proc = subprocess.run(
        [sys.executable, "-m", "notify", "broker", "start", "-c", str(ini)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "authSecret" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_served_config_hides_every_secret() -> None:
    """``stats config`` is readable by any authenticated client: no secret may be in it."""
    cfg = parse_config(
        "[system]\nauthSecret=a1\nadminSecret=b2\nreplicationSecret=c3\n"
        "[producerGroup=shop]\nsecret=d4\n[topic=t]\nnumPartitions=1\n"
    )
    served = served_config(cfg)
    assert served is not None
    for secret in (b"a1", b"b2", b"c3", b"d4"):
        assert secret not in served, served
    assert cfg.producer_groups == {"shop": "d4"}
