"""server.ini keys after SystemConfig was grouped into typed sections (tls, http, queues,
delay, replication, failover): every ``[system]`` key is still read, into the same value.

``OLD_VALUES`` was recorded from the flat SystemConfig before the grouping: each key set to a
value that is not its default, parsed, and the value read back. The same text must give the
same values now, each found through the attribute ``settings()`` names for the key.
"""

from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import Any, cast

import pytest

from notify.config import (
    SYSTEM_SECTIONS,
    DeletePolicy,
    SystemConfig,
    describe,
    parse_config,
    settings,
    system_values,
)
from notify.errors import ConfigError
from notify.http.views import config_view

INI = """\
[system]
brokerId=1
hostName=127.0.0.2
serverPort=9123
dashboardHttpPort=8121
dataPath=/srv/store/data
dataLogPath=/srv/notify/redo
numPartitions=2
autoCreateTopics=true
unflushThreshold=1001
unflushInterval=10001
maxSegmentSize=1073741825
maxTransferSize=1048577
getProcessThreadCount=11
putProcessThreadCount=11
deletePolicy=archive,72,zip
deleteWhen=0 0 3 * * ?
maxCheckpoints=4
checkpointInterval=3600001
maxTxTimeoutTimerCapacity=30001
maxTxTimeoutInSeconds=61
flushTxLogAtCommit=2
halfCommitEarlyAck=true
halfCommitForceDelay=3
acceptPublish=false
acceptSubscribe=false
stat=false
updateConsumerOffsets=true
retentionIgnoresConsumers=true
maxMessageSize=1048576
maxConnections=10001
authSecret=app-secret-1
adminSecret=admin-secret-2
configWatchInterval=2001
maxTxSize=67108865
txCheckBackDelay=6001
txCheckBackMaxTimes=16
txCheckBackConcurrency=17
syncSlave=127.0.0.1:9999
syncSlaveTimeout=3001
syncSlaveFailurePolicy=async
syncSlaveMaxFailures=4
autoFailover=true
failoverRequireInSync=false
failoverMaxLagBytes=1
failoverSlaveId=1
httpAllowedHosts=notify.example, *
httpMaxConnections=257
httpKeepaliveTimeout=15001
httpBodyTimeout=30001
maxPartitionsPerTopic=1025
fdReserve=129
maxConsumerGroups=10001
maxIdempotentProducers=10001
maxProducerIdLength=129
producerStateMaxBytes=67108865
maxProducerIdsPerConnection=1025
consumerGroupExpiry=86400001
consumerSessionTimeout=30001
metricsMaxConsumerSeries=10001
authFailureLogInterval=10001
replicationSecret=repl-secret-3
maxBatchSize=8388608
authTimeout=10001
frameTimeout=30001
idleTimeout=300001
maxParkedGets=1025
maxQueuedReplies=65537
maxDelay=7776000001
delayCheckpointInterval=10001
delayMaxDelivered=65537
tlsCertFile=/srv/tls/cert.pem
tlsKeyFile=/srv/tls/key.pem
tlsCaFile=/srv/tls/ca.pem
tlsClientAuth=true
tlsHandshakeTimeout=5001
tlsMaxHelloSize=65537
maxHeaderSize=4097
writeBufferSize=4194305
maxLongPollWait=60001
httpMaxBodySize=33554433
httpMaxFetchSize=16777217
httpMaxFetchMessages=10001
httpMaxProduceMessages=1001
queueLockTimeout=30001
queueMaxDeliveries=6
queueMaxInFlight=10001
queueMaxCredit=1001
queueMaxGroups=257
queueMaxGroupsPerConnection=17
queueGroupExpiry=86400001
queueMaxDeadLetters=10001
queueMaxReleaseDelay=3600001
queueCheckpointInterval=10001
queueRetentionHoldBytes=1073741825
[zookeeper]
zk.zkEnable=true
"""

OLD_VALUES: dict[str, object] = {
    "brokerId": 1,
    "hostName": "127.0.0.2",
    "serverPort": 9123,
    "dashboardHttpPort": 8121,
    "dataPath": "/srv/store/data",
    "dataLogPath": "/srv/notify/redo",
    "numPartitions": 2,
    "autoCreateTopics": True,
    "unflushThreshold": 1001,
    "unflushInterval": 10001,
    "maxSegmentSize": 1073741825,
    "maxTransferSize": 1048577,
    "getProcessThreadCount": 11,
    "putProcessThreadCount": 11,
    "deletePolicy": "archive,72,zip",
    "deleteWhen": "0 0 3 * * ?",
    "maxCheckpoints": 4,
    "checkpointInterval": 3600001,
    "maxTxTimeoutTimerCapacity": 30001,
    "maxTxTimeoutInSeconds": 61,
    "flushTxLogAtCommit": 2,
    "halfCommitEarlyAck": True,
    "halfCommitForceDelay": 3,
    "acceptPublish": False,
    "acceptSubscribe": False,
    "stat": False,
    "updateConsumerOffsets": True,
    "retentionIgnoresConsumers": True,
    "maxMessageSize": 1048576,
    "maxConnections": 10001,
    "authSecret": "app-secret-1",
    "adminSecret": "admin-secret-2",
    "configWatchInterval": 2001,
    "maxTxSize": 67108865,
    "txCheckBackDelay": 6001,
    "txCheckBackMaxTimes": 16,
    "txCheckBackConcurrency": 17,
    "syncSlave": "127.0.0.1:9999",
    "syncSlaveTimeout": 3001,
    "syncSlaveFailurePolicy": "async",
    "syncSlaveMaxFailures": 4,
    "autoFailover": True,
    "failoverRequireInSync": False,
    "failoverMaxLagBytes": 1,
    "failoverSlaveId": 1,
    "httpAllowedHosts": ["notify.example", "*"],
    "httpMaxConnections": 257,
    "httpKeepaliveTimeout": 15001,
    "httpBodyTimeout": 30001,
    "maxPartitionsPerTopic": 1025,
    "fdReserve": 129,
    "maxConsumerGroups": 10001,
    "maxIdempotentProducers": 10001,
    "maxProducerIdLength": 129,
    "producerStateMaxBytes": 67108865,
    "maxProducerIdsPerConnection": 1025,
    "consumerGroupExpiry": 86400001,
    "consumerSessionTimeout": 30001,
    "metricsMaxConsumerSeries": 10001,
    "authFailureLogInterval": 10001,
    "replicationSecret": "repl-secret-3",
    "maxBatchSize": 8388608,
    "authTimeout": 10001,
    "frameTimeout": 30001,
    "idleTimeout": 300001,
    "maxParkedGets": 1025,
    "maxQueuedReplies": 65537,
    "maxDelay": 7776000001,
    "delayCheckpointInterval": 10001,
    "delayMaxDelivered": 65537,
    "tlsCertFile": "/srv/tls/cert.pem",
    "tlsKeyFile": "/srv/tls/key.pem",
    "tlsCaFile": "/srv/tls/ca.pem",
    "tlsClientAuth": True,
    "tlsHandshakeTimeout": 5001,
    "tlsMaxHelloSize": 65537,
    "maxHeaderSize": 4097,
    "writeBufferSize": 4194305,
    "maxLongPollWait": 60001,
    "httpMaxBodySize": 33554433,
    "httpMaxFetchSize": 16777217,
    "httpMaxFetchMessages": 10001,
    "httpMaxProduceMessages": 1001,
    "queueLockTimeout": 30001,
    "queueMaxDeliveries": 6,
    "queueMaxInFlight": 10001,
    "queueMaxCredit": 1001,
    "queueMaxGroups": 257,
    "queueMaxGroupsPerConnection": 17,
    "queueGroupExpiry": 86400001,
    "queueMaxDeadLetters": 10001,
    "queueMaxReleaseDelay": 3600001,
    "queueCheckpointInterval": 10001,
    "queueRetentionHoldBytes": 1073741825,
}


def _plain(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, DeletePolicy):
        return value.text()
    if isinstance(value, tuple):
        return list(value)
    return value


def test_every_old_system_key_loads_to_the_same_value() -> None:
    cfg = parse_config(INI, Path("/srv/notify/server.ini"))
    keys = {s.key: s for s in settings() if s.section == "system"}
    assert set(keys) == set(OLD_VALUES)  # no key lost, none added unnoticed
    for key, old in OLD_VALUES.items():
        assert _plain(attrgetter(keys[key].attr)(cfg.system)) == old, key
    # and every value differs from its default, so a key read into nothing would show
    default = parse_config("", Path("/srv/notify/server.ini")).system
    for key in OLD_VALUES:
        getter = attrgetter(keys[key].attr)
        assert getter(cfg.system) != getter(default), key


def test_sections_hold_their_keys() -> None:
    cfg = parse_config(INI, Path("/srv/notify/server.ini")).system
    assert cfg.tls.cert_file == Path("/srv/tls/cert.pem") and cfg.tls.client_auth
    assert cfg.http.allowed_hosts == ("notify.example", "*")
    assert cfg.queues.max_groups == 257 and cfg.delay.max_delivered == 65_537
    assert cfg.replication.sync_slave == "127.0.0.1:9999"
    assert cfg.replication.secret == "repl-secret-3"
    assert cfg.failover.enabled and not cfg.failover.require_in_sync
    assert {a.split(".")[0] for a, _k, _v in system_values(cfg) if "." in a} == set(SYSTEM_SECTIONS)
    # relative TLS paths resolve against the ini's directory, as before
    rel = parse_config(
        "[system]\ntlsCertFile=c.pem\ntlsKeyFile=k.pem\n", Path("/srv/notify/server.ini")
    )
    assert rel.system.tls.cert_file == Path("/srv/notify/c.pem")
    assert rel.system.tls.key_file == Path("/srv/notify/k.pem")


def test_a_sections_range_and_cross_checks_still_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"\[system\] queueMaxCredit: 0 is out of range"):
        parse_config("[system]\nqueueMaxCredit=0\n")
    with pytest.raises(ConfigError, match="tlsCertFile and tlsKeyFile go together"):
        parse_config("[system]\ntlsCertFile=/c.pem\n")
    with pytest.raises(ConfigError, match="syncSlaveFailurePolicy"):
        parse_config("[system]\nsyncSlaveFailurePolicy=maybe\n")


def test_secrets_stay_masked_inside_a_section() -> None:
    cfg = parse_config(INI, Path("/srv/notify/server.ini"))
    shown = dict(describe(cfg))
    assert shown["system.replication.secret"] == "***"
    assert shown["system.auth_secret"] == "***" and shown["system.admin_secret"] == "***"
    assert "repl-secret-3" not in repr(describe(cfg))
    assert SystemConfig().replication.secret == ""


def test_the_http_config_view_shows_sections_and_masks_their_secrets() -> None:
    """``/api/config``: a section is one object; the replication secret inside it is masked
    as the flat secrets are (a section must not leak through its repr)."""

    class Host:
        config = parse_config(INI, Path("/srv/notify/server.ini"))

    view = cast(dict[str, Any], config_view(cast(Any, Host())))
    system = view["system"]
    assert system["replication"]["secret"] == "***" and system["auth_secret"] == "***"
    assert system["tls"]["cert_file"] == "/srv/tls/cert.pem"
    assert system["queues"]["max_groups"] == 257 and system["max_message_size"] == 1048576
    assert "repl-secret-3" not in json.dumps(view) and "app-secret-1" not in json.dumps(view)
