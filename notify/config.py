"""``server.ini`` in MetaQ's format: ``[system]``, ``[zookeeper]`` and ``[topic=NAME]``.

Parsing turns the file into small frozen config objects; every key is checked against the
known keys of its section and an unknown key is rejected with its section and name. Values
are converted to their types with the key named on failure. ``[topic=NAME]`` sections inherit
every unset topic-level key from ``[system]``.

Relative paths (``dataPath``, ``dataLogPath``) are resolved against the directory holding the
ini file, so ``conf/server.ini`` with ``dataPath=../data`` keeps data inside the project.
"""

from __future__ import annotations

import configparser
import functools
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from notify.cron import quartz_trigger
from notify.errors import ConfigError, InvalidTopicError

TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: Topic names with this prefix belong to the broker (``__delay``); config and REST refuse them.
RESERVED_PREFIX: Final = "__"
#: A secret is one wire token: printable ASCII without spaces (``auth <secret>``, bearer).
SECRET_RE: Final = re.compile(r"[!-~]{1,1024}")
KIB: Final = 1024
MIB: Final = 1024 * KIB
#: Default ``maxMessageSize``. A MetaQ Java consumer reads replies into a buffer that stops
#: growing at 2 MiB (gecko's and ``MessageUtils.MAX_READ_BUFFER_SIZE``, 2097152): the whole
#: ``value <len> <opaque>\r\n`` frame holding one record (20-byte header + payload) must fit.
#: 1 KiB of slack covers the record header and the reply line with room to spare.
MAX_METAQ_CLIENT_PAYLOAD: Final = 2 * MIB - KIB
GIB: Final = 1024 * MIB


def validate_topic(name: str) -> str:
    """Return ``name`` if it is a legal topic name, else raise InvalidTopicError.

    Legal: ``[A-Za-z0-9._-]{1,249}`` and not ``.`` or ``..``. The partition directory is
    ``<dataPath>/<topic>-<partition>``, so a legal name can never leave the data directory.
    """
    if not TOPIC_RE.fullmatch(name) or name in (".", ".."):
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise InvalidTopicError(f"invalid topic name {shown!r}: must match [A-Za-z0-9._-]{{1,249}}")
    return name


def check_user_topic(name: str) -> str:
    """``validate_topic`` plus: names starting with ``__`` are reserved for internal topics
    (created by the broker only), so neither ``server.ini`` nor REST may define one."""
    validate_topic(name)
    if name.startswith(RESERVED_PREFIX):
        raise InvalidTopicError(
            f"topic name {name[:60]!r} is reserved: names starting with {RESERVED_PREFIX!r} "
            "belong to the broker's internal topics"
        )
    return name


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s in ("true", "yes", "1", "on"):
        return True
    if s in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _int(v: str) -> int:
    return int(v.strip())


def _str(v: str) -> str:
    return v.strip()


def _secret(v: str) -> str:
    """Empty (no auth), or one token of printable ASCII: a value with a space could never be
    sent by a client, and a whitespace-only one would silently turn auth off."""
    s = v.strip()
    if v and not s:
        raise ValueError("whitespace only (leave the key empty to turn auth off)")
    if s and not SECRET_RE.fullmatch(s):
        raise ValueError("must be 1..1024 printable ASCII characters without spaces")
    return s


def _names(v: str) -> tuple[str, ...]:
    """A comma-separated list of host names (``*`` = any)."""
    out = tuple(n.strip().lower() for n in v.split(",") if n.strip())
    for n in out:
        if n != "*" and not re.fullmatch(r"[a-z0-9._:\[\]-]{1,253}", n):
            raise ValueError(f"not a host name: {n!r}")
    return out


@dataclass(frozen=True)
class DeletePolicy:
    """``delete,N`` or ``archive,N[,zip]`` with N in hours unless suffixed s/m/h."""

    action: str = "delete"
    max_age_s: float = 168 * 3600.0
    compress: bool = False

    @classmethod
    def parse(cls, text: str) -> DeletePolicy:
        parts = [p.strip() for p in text.split(",")]
        if len(parts) < 2 or parts[0] not in ("delete", "archive"):
            raise ValueError(f"expected delete,N or archive,N[,zip], got {text!r}")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", parts[1])
        if not m:
            raise ValueError(f"bad age {parts[1]!r} in {text!r}")
        unit = {"s": 1, "m": 60, "h": 3600, "": 3600}[m.group(2)]
        compress = False
        if len(parts) == 3:
            if parts[0] != "archive" or parts[2] != "zip":
                raise ValueError(f"only archive,N,zip takes a third field: {text!r}")
            compress = True
        elif len(parts) > 3:
            raise ValueError(f"too many fields in {text!r}")
        return cls(parts[0], float(m.group(1)) * unit, compress)


@dataclass(frozen=True)
class TopicConfig:
    """Settings of one topic (``[topic=NAME]`` merged over ``[system]``)."""

    name: str
    num_partitions: int = 1
    unflush_threshold: int = 1000
    unflush_interval_ms: int = 10000
    delete_policy: DeletePolicy = field(default_factory=DeletePolicy)
    delete_when: str = "0 0 6,18 * * ?"
    data_path: Path | None = None
    accept_publish: bool = True
    accept_subscribe: bool = True
    stat: bool = True
    retention_ignores_consumers: bool = False
    store: str = "disk"
    memory_max_bytes: int = 64 * MIB
    memory_full_policy: str = "drop_oldest"


@dataclass(frozen=True)
class SystemConfig:
    """``[system]``. Names follow MetaQ; units are in the attribute names."""

    broker_id: int = 0
    host_name: str = "127.0.0.1"
    server_port: int = 8123
    dashboard_http_port: int = 8120
    data_path: Path = Path("data")
    data_log_path: Path | None = None
    num_partitions: int = 1
    unflush_threshold: int = 1000
    unflush_interval_ms: int = 10000
    max_segment_size: int = GIB
    max_transfer_size: int = MIB
    get_process_thread_count: int = 10
    put_process_thread_count: int = 10
    delete_policy: DeletePolicy = field(default_factory=DeletePolicy)
    delete_when: str = "0 0 6,18 * * ?"
    max_checkpoints: int = 3
    checkpoint_interval_ms: int = 3_600_000
    max_tx_timeout_timer_capacity: int = 30000
    max_tx_timeout_in_seconds: int = 60
    flush_tx_log_at_commit: int = 1
    #: answer a half message's COMMIT once logged, before its force (README "Transactions")
    half_commit_early_ack: bool = False
    #: ms an answered half-message COMMIT waits for a force another step starts (README)
    half_commit_force_delay_ms: int = 2
    accept_publish: bool = True
    accept_subscribe: bool = True
    stat: bool = True
    update_consumer_offsets: bool = False
    # notify extensions (documented in README)
    retention_ignores_consumers: bool = False
    #: the largest payload a MetaQ Java consumer can read (see MAX_METAQ_CLIENT_PAYLOAD)
    max_message_size: int = MAX_METAQ_CLIENT_PAYLOAD
    max_connections: int = 10000
    auth_secret: str = ""
    admin_secret: str = ""
    config_watch_interval_ms: int = 2000
    max_tx_size: int = 64 * MIB
    tx_check_back_delay_ms: int = 6000
    tx_check_back_max_times: int = 15
    tx_check_back_concurrency: int = 16
    sync_slave: str = ""
    sync_slave_timeout_ms: int = 3000
    sync_slave_failure_policy: str = "refuse"
    sync_slave_max_failures: int = 3
    # automatic failover in ZooKeeper mode (notify.replication.failover)
    auto_failover: bool = False
    failover_require_in_sync: bool = True
    failover_max_lag_bytes: int = 0
    failover_slave_id: int = 0
    # security and resource limits (README "Security")
    http_allowed_hosts: tuple[str, ...] = ()
    http_max_connections: int = 256
    http_keepalive_timeout_ms: int = 15_000
    http_body_timeout_ms: int = 30_000
    max_partitions_per_topic: int = 1024
    fd_reserve: int = 128
    max_consumer_groups: int = 10_000
    #: idempotent producers remembered per partition (least recently used out)
    max_idempotent_producers: int = 10_000
    #: longest idempotent producer id a connection may claim (``producer`` verb)
    max_producer_id_length: int = 128
    #: bytes of all idempotent producers' state (identities and last batches, estimated)
    producer_state_max_bytes: int = 64 * MIB
    #: identities one connection may hold at once
    max_producer_ids_per_connection: int = 1024
    consumer_group_expiry_ms: int = 86_400_000
    consumer_session_timeout_ms: int = 30_000
    metrics_max_consumer_series: int = 10_000
    auth_failure_log_interval_ms: int = 10_000
    # wire hardening (README "Security")
    replication_secret: str = ""
    max_batch_size: int = 16 * MIB
    auth_timeout_ms: int = 10_000
    frame_timeout_ms: int = 30_000
    #: 5 min: 10x notify clients' worst silence (2 x 30 s heartbeat), 30x MetaQ Java's 10 s
    idle_timeout_ms: int = 300_000
    max_parked_gets: int = 1024
    max_queued_replies: int = 65_536
    max_delay_ms: int = 90 * 24 * 3600 * 1000
    delay_checkpoint_interval_ms: int = 10_000
    delay_max_delivered: int = 65_536
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_client_auth: bool = False
    #: ms a client may take to complete its TLS handshake (wire and HTTP ports)
    tls_handshake_timeout_ms: int = 5_000
    #: bytes a client may send before its TLS ClientHello is answered (wire and HTTP ports)
    tls_max_hello_size: int = 64 * KIB
    #: the longest wire request header line (``put topic ... opaque``), CRLF excluded
    max_header_size: int = 4 * KIB
    #: queued reply bytes per wire connection past which reading pauses (resumes at 1/4)
    write_buffer_size: int = 4 * MIB
    #: the longest a long-polling ``get`` (wire, MetaQ HTTP ``/get``) is held
    max_long_poll_wait_ms: int = 60_000
    #: HTTP JSON request bodies (REST); MetaQ's ``/put`` takes ``maxMessageSize``
    http_max_body_size: int = 32 * MIB
    #: REST fetch: ``maxSize`` and ``limit`` at most; REST produce: messages per request
    http_max_fetch_size: int = 16 * MIB
    http_max_fetch_messages: int = 10_000
    http_max_produce_messages: int = 1000
    # queue subscriptions (README "Queues")
    queue_lock_timeout_ms: int = 30_000
    queue_max_deliveries: int = 5
    queue_max_in_flight: int = 10_000
    queue_max_credit: int = 1000
    queue_max_groups: int = 256
    #: new queue groups one connection may have created (still existing) at once
    queue_max_groups_per_connection: int = 16
    #: ms after which a group with no consumer that holds nothing is deleted (0 = never)
    queue_group_expiry_ms: int = 86_400_000
    queue_max_dead_letters: int = 10_000
    queue_max_release_delay_ms: int = 3_600_000
    queue_checkpoint_interval_ms: int = 10_000
    queue_retention_hold_bytes: int = 1 << 30

    @property
    def tx_log_path(self) -> Path:
        return (self.data_log_path or self.data_path) / "transactions"

    @property
    def delay_log_path(self) -> Path:
        """The delay queue's log (replicated as ``__delaylog``)."""
        return (self.data_log_path or self.data_path) / "delay"

    @property
    def queue_log_path(self) -> Path:
        """The queue-subscription log (replicated as ``__queuelog``)."""
        return (self.data_log_path or self.data_path) / "queues"


@dataclass(frozen=True)
class ZookeeperConfig:
    """``[zookeeper]``; ``zk_enable`` False selects the embedded configserver."""

    zk_enable: bool = False
    zk_connect: str = "127.0.0.1:2181"
    zk_root: str = "/meta"
    zk_session_timeout_ms: int = 30000
    zk_connection_timeout_ms: int = 30000
    zk_sync_time_ms: int = 5000


@dataclass(frozen=True)
class SlaveConfig:
    """``[slave]`` (MetaQ's async_slave.properties): present = this broker is a slave.

    ``master_address`` names the master in embedded mode (with ZooKeeper the master of the
    same brokerId is looked up instead).
    """

    slave_id: int = 0
    slave_group: str = "meta-slave-group"
    slave_max_delay_in_mills: int = 500
    auto_sync_master_config: bool = True
    master_address: str = ""


@dataclass(frozen=True)
class ServerConfig:
    """A whole parsed ``server.ini``."""

    system: SystemConfig = field(default_factory=SystemConfig)
    zookeeper: ZookeeperConfig = field(default_factory=ZookeeperConfig)
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    slave: SlaveConfig | None = None
    source: Path | None = None
    text: str = ""
    #: ``[producerGroup=NAME] secret=...``: groups whose ``register`` needs that secret
    producer_groups: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)


#: Section prefix of a producer group's settings: ``[producerGroup=NAME]``.
GROUP_SECTION: Final = "producerGroup="
# ini key -> (attribute, converter)
_Conv = Callable[[str], Any]
_SYSTEM_KEYS: Final[dict[str, tuple[str, _Conv]]] = {
    "brokerId": ("broker_id", _int),
    "hostName": ("host_name", _str),
    "serverPort": ("server_port", _int),
    "dashboardHttpPort": ("dashboard_http_port", _int),
    "dataPath": ("data_path", Path),
    "dataLogPath": ("data_log_path", Path),
    "numPartitions": ("num_partitions", _int),
    "unflushThreshold": ("unflush_threshold", _int),
    "unflushInterval": ("unflush_interval_ms", _int),
    "maxSegmentSize": ("max_segment_size", _int),
    "maxTransferSize": ("max_transfer_size", _int),
    "getProcessThreadCount": ("get_process_thread_count", _int),
    "putProcessThreadCount": ("put_process_thread_count", _int),
    "deletePolicy": ("delete_policy", DeletePolicy.parse),
    "deleteWhen": ("delete_when", _str),
    "maxCheckpoints": ("max_checkpoints", _int),
    "checkpointInterval": ("checkpoint_interval_ms", _int),
    "maxTxTimeoutTimerCapacity": ("max_tx_timeout_timer_capacity", _int),
    "maxTxTimeoutInSeconds": ("max_tx_timeout_in_seconds", _int),
    "flushTxLogAtCommit": ("flush_tx_log_at_commit", _int),
    "halfCommitEarlyAck": ("half_commit_early_ack", _bool),
    "halfCommitForceDelay": ("half_commit_force_delay_ms", _int),
    "acceptPublish": ("accept_publish", _bool),
    "acceptSubscribe": ("accept_subscribe", _bool),
    "stat": ("stat", _bool),
    "updateConsumerOffsets": ("update_consumer_offsets", _bool),
    "maxMessageSize": ("max_message_size", _int),
    "maxConnections": ("max_connections", _int),
    "authSecret": ("auth_secret", _secret),
    "adminSecret": ("admin_secret", _secret),
    "configWatchInterval": ("config_watch_interval_ms", _int),
    "maxTxSize": ("max_tx_size", _int),
    "retentionIgnoresConsumers": ("retention_ignores_consumers", _bool),
    "txCheckBackDelay": ("tx_check_back_delay_ms", _int),
    "txCheckBackMaxTimes": ("tx_check_back_max_times", _int),
    "txCheckBackConcurrency": ("tx_check_back_concurrency", _int),
    "syncSlave": ("sync_slave", _str),
    "syncSlaveTimeout": ("sync_slave_timeout_ms", _int),
    "syncSlaveFailurePolicy": ("sync_slave_failure_policy", _str),
    "syncSlaveMaxFailures": ("sync_slave_max_failures", _int),
    "autoFailover": ("auto_failover", _bool),
    "failoverRequireInSync": ("failover_require_in_sync", _bool),
    "failoverMaxLagBytes": ("failover_max_lag_bytes", _int),
    "failoverSlaveId": ("failover_slave_id", _int),
    "httpAllowedHosts": ("http_allowed_hosts", _names),
    "httpMaxConnections": ("http_max_connections", _int),
    "httpKeepaliveTimeout": ("http_keepalive_timeout_ms", _int),
    "httpBodyTimeout": ("http_body_timeout_ms", _int),
    "maxPartitionsPerTopic": ("max_partitions_per_topic", _int),
    "fdReserve": ("fd_reserve", _int),
    "maxConsumerGroups": ("max_consumer_groups", _int),
    "maxIdempotentProducers": ("max_idempotent_producers", _int),
    "maxProducerIdLength": ("max_producer_id_length", _int),
    "producerStateMaxBytes": ("producer_state_max_bytes", _int),
    "maxProducerIdsPerConnection": ("max_producer_ids_per_connection", _int),
    "consumerGroupExpiry": ("consumer_group_expiry_ms", _int),
    "consumerSessionTimeout": ("consumer_session_timeout_ms", _int),
    "metricsMaxConsumerSeries": ("metrics_max_consumer_series", _int),
    "authFailureLogInterval": ("auth_failure_log_interval_ms", _int),
    "replicationSecret": ("replication_secret", _secret),
    "maxBatchSize": ("max_batch_size", _int),
    "authTimeout": ("auth_timeout_ms", _int),
    "frameTimeout": ("frame_timeout_ms", _int),
    "idleTimeout": ("idle_timeout_ms", _int),
    "maxParkedGets": ("max_parked_gets", _int),
    "maxQueuedReplies": ("max_queued_replies", _int),
    "maxDelay": ("max_delay_ms", _int),
    "delayCheckpointInterval": ("delay_checkpoint_interval_ms", _int),
    "delayMaxDelivered": ("delay_max_delivered", _int),
    "tlsCertFile": ("tls_cert_file", Path),
    "tlsKeyFile": ("tls_key_file", Path),
    "tlsCaFile": ("tls_ca_file", Path),
    "tlsClientAuth": ("tls_client_auth", _bool),
    "tlsHandshakeTimeout": ("tls_handshake_timeout_ms", _int),
    "tlsMaxHelloSize": ("tls_max_hello_size", _int),
    "maxHeaderSize": ("max_header_size", _int),
    "writeBufferSize": ("write_buffer_size", _int),
    "maxLongPollWait": ("max_long_poll_wait_ms", _int),
    "httpMaxBodySize": ("http_max_body_size", _int),
    "httpMaxFetchSize": ("http_max_fetch_size", _int),
    "httpMaxFetchMessages": ("http_max_fetch_messages", _int),
    "httpMaxProduceMessages": ("http_max_produce_messages", _int),
    "queueLockTimeout": ("queue_lock_timeout_ms", _int),
    "queueMaxDeliveries": ("queue_max_deliveries", _int),
    "queueMaxInFlight": ("queue_max_in_flight", _int),
    "queueMaxCredit": ("queue_max_credit", _int),
    "queueMaxGroups": ("queue_max_groups", _int),
    "queueMaxGroupsPerConnection": ("queue_max_groups_per_connection", _int),
    "queueGroupExpiry": ("queue_group_expiry_ms", _int),
    "queueMaxDeadLetters": ("queue_max_dead_letters", _int),
    "queueMaxReleaseDelay": ("queue_max_release_delay_ms", _int),
    "queueCheckpointInterval": ("queue_checkpoint_interval_ms", _int),
    "queueRetentionHoldBytes": ("queue_retention_hold_bytes", _int),
}
_ZK_KEYS: Final[dict[str, tuple[str, _Conv]]] = {
    "zk.zkEnable": ("zk_enable", _bool),
    "zk.zkConnect": ("zk_connect", _str),
    "zk.zkRoot": ("zk_root", _str),
    "zk.zkSessionTimeoutMs": ("zk_session_timeout_ms", _int),
    "zk.zkConnectionTimeoutMs": ("zk_connection_timeout_ms", _int),
    "zk.zkSyncTimeMs": ("zk_sync_time_ms", _int),
}
_GROUP_KEYS: Final[dict[str, tuple[str, _Conv]]] = {"secret": ("secret", _secret)}
_SLAVE_KEYS: Final[dict[str, tuple[str, _Conv]]] = {
    "slaveId": ("slave_id", _int),
    "slaveGroup": ("slave_group", _str),
    "slaveMaxDelayInMills": ("slave_max_delay_in_mills", _int),
    "autoSyncMasterConfig": ("auto_sync_master_config", _bool),
    "masterAddress": ("master_address", _str),
}
_TOPIC_KEYS: Final[dict[str, tuple[str, _Conv]]] = {
    "numPartitions": ("num_partitions", _int),
    "unflushThreshold": ("unflush_threshold", _int),
    "unflushInterval": ("unflush_interval_ms", _int),
    "deletePolicy": ("delete_policy", DeletePolicy.parse),
    "deleteWhen": ("delete_when", _str),
    "dataPath": ("data_path", Path),
    "acceptPublish": ("accept_publish", _bool),
    "acceptSubscribe": ("accept_subscribe", _bool),
    "stat": ("stat", _bool),
    "retentionIgnoresConsumers": ("retention_ignores_consumers", _bool),
    "store": ("store", _str),
    "memoryMaxBytes": ("memory_max_bytes", _int),
    "memoryFullPolicy": ("memory_full_policy", _str),
}
#: topic-level attributes inherited from [system]
_INHERITED: Final = (
    "num_partitions",
    "unflush_threshold",
    "unflush_interval_ms",
    "delete_policy",
    "delete_when",
    "accept_publish",
    "accept_subscribe",
    "stat",
    "retention_ignores_consumers",
)

SYSTEM_KEYS: Final = tuple(_SYSTEM_KEYS)
ZOOKEEPER_KEYS: Final = tuple(_ZK_KEYS)
TOPIC_KEYS: Final = tuple(_TOPIC_KEYS)


def _convert(
    section: str, items: dict[str, str], table: dict[str, tuple[str, _Conv]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in items.items():
        if key not in table:
            known = ", ".join(sorted(table))
            raise ConfigError(f"[{section}]: unknown key {key!r} (known keys: {known})")
        attr, conv = table[key]
        try:
            out[attr] = conv(raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"[{section}] {key}: invalid value {raw.strip()!r}: {e}") from None
    return out


_DAY_MS: Final = 86_400_000
#: The largest message a broker may be configured to take (records carry an i32 length and a
#: put is buffered whole before it is checked).
MAX_MESSAGE_SIZE_LIMIT: Final = 256 * MIB
#: ini key -> (lo, hi): every numeric key of every section is range-checked, key named.
_RANGES: Final[dict[str, tuple[int, int]]] = {
    "brokerId": (0, 1023),
    "serverPort": (0, 65535),
    "dashboardHttpPort": (0, 65535),
    "numPartitions": (1, 65536),
    "unflushThreshold": (0, 10**9),
    "unflushInterval": (0, _DAY_MS),
    "maxSegmentSize": (4096, 64 * GIB),
    "maxTransferSize": (64, 256 * MIB),
    "getProcessThreadCount": (0, 10_000),
    "putProcessThreadCount": (0, 10_000),
    "maxCheckpoints": (1, 1000),
    "checkpointInterval": (1, 7 * _DAY_MS),
    "delayCheckpointInterval": (100, _DAY_MS),
    "delayMaxDelivered": (2, 10_000_000),
    "maxTxTimeoutTimerCapacity": (1, 10_000_000),
    "maxTxTimeoutInSeconds": (1, 7 * 86_400),
    "flushTxLogAtCommit": (0, 2),
    "halfCommitForceDelay": (0, 1000),
    "maxMessageSize": (1, MAX_MESSAGE_SIZE_LIMIT),
    "maxConnections": (1, 1_000_000),
    "configWatchInterval": (0, _DAY_MS),
    "maxTxSize": (1, 16 * GIB),
    "txCheckBackDelay": (1, _DAY_MS),
    "txCheckBackMaxTimes": (1, 1_000_000),
    "txCheckBackConcurrency": (1, 10_000),
    "syncSlaveTimeout": (1, 600_000),
    "syncSlaveMaxFailures": (1, 1_000_000),
    "failoverMaxLagBytes": (0, 1 << 40),
    "failoverSlaveId": (0, 1023),
    "httpMaxConnections": (1, 100_000),
    "httpKeepaliveTimeout": (100, _DAY_MS),
    "httpBodyTimeout": (100, _DAY_MS),
    "maxPartitionsPerTopic": (1, 65536),
    "fdReserve": (0, 1_000_000),
    "maxConsumerGroups": (1, 10_000_000),
    "maxIdempotentProducers": (1, 10_000_000),
    "maxProducerIdLength": (23, 1024),
    "producerStateMaxBytes": (64 * KIB, 64 * GIB),
    "maxProducerIdsPerConnection": (1, 1_000_000),
    "consumerGroupExpiry": (1000, 365 * _DAY_MS),
    "consumerSessionTimeout": (100, _DAY_MS),
    "metricsMaxConsumerSeries": (0, 10_000_000),
    "authFailureLogInterval": (100, _DAY_MS),
    "maxBatchSize": (1, (1 << 31) - 1),
    "authTimeout": (0, _DAY_MS),
    "frameTimeout": (0, _DAY_MS),
    "tlsHandshakeTimeout": (100, 600_000),
    "tlsMaxHelloSize": (4 * KIB, 16 * MIB),
    "maxHeaderSize": (512, 64 * KIB),
    "writeBufferSize": (64 * KIB, GIB),
    "maxLongPollWait": (0, 3_600_000),
    "httpMaxBodySize": (KIB, GIB),
    "httpMaxFetchSize": (KIB, 256 * MIB),
    "httpMaxFetchMessages": (1, 1_000_000),
    "httpMaxProduceMessages": (1, 1_000_000),
    "idleTimeout": (0, 30 * _DAY_MS),
    "maxParkedGets": (1, 1_000_000),
    "maxQueuedReplies": (16, 10_000_000),
    "maxDelay": (1, 10 * 365 * _DAY_MS),
    "queueLockTimeout": (100, _DAY_MS),
    "queueMaxDeliveries": (1, 1000),
    "queueMaxInFlight": (1, 1_000_000),
    "queueMaxCredit": (1, 100_000),
    "queueMaxGroups": (1, 100_000),
    "queueMaxGroupsPerConnection": (1, 100_000),
    "queueGroupExpiry": (0, 365 * _DAY_MS),
    "queueMaxDeadLetters": (0, 1_000_000),
    "queueMaxReleaseDelay": (0, 30 * _DAY_MS),
    "queueCheckpointInterval": (100, _DAY_MS),
    "queueRetentionHoldBytes": (0, 1 << 50),
    "memoryMaxBytes": (4096, 1 << 40),
    "zk.zkSessionTimeoutMs": (1, _DAY_MS),
    "zk.zkConnectionTimeoutMs": (1, _DAY_MS),
    "zk.zkSyncTimeMs": (1, _DAY_MS),
    "slaveId": (0, 1023),
    "slaveMaxDelayInMills": (1, _DAY_MS),
}


def _check_ranges(section: str, obj: object, table: dict[str, tuple[str, _Conv]]) -> None:
    for key, (attr, _conv) in table.items():
        bounds = _RANGES.get(key)
        if bounds is None:
            continue
        value = getattr(obj, attr)
        lo, hi = bounds
        if not lo <= value <= hi:
            raise ConfigError(f"[{section}] {key}: {value} is out of range {lo}..{hi}")


def _check_system(s: SystemConfig) -> None:
    def need(cond: bool, key: str, what: str) -> None:
        if not cond:
            raise ConfigError(f"[system] {key}: {what}")

    _check_ranges("system", s, _SYSTEM_KEYS)
    need(
        s.num_partitions <= s.max_partitions_per_topic,
        "numPartitions",
        f"{s.num_partitions} exceeds maxPartitionsPerTopic {s.max_partitions_per_topic}",
    )
    need(
        s.sync_slave_failure_policy in ("refuse", "async"),
        "syncSlaveFailurePolicy",
        "must be refuse (stop acknowledging) or async (go on and flag it)",
    )
    need(
        not s.admin_secret or s.admin_secret != s.auth_secret,
        "adminSecret",
        "must differ from authSecret (else anyone who may publish may also administer)",
    )
    need(s.sync_slave_timeout_ms >= 1, "syncSlaveTimeout", "must be >= 1")
    need(s.sync_slave_max_failures >= 1, "syncSlaveMaxFailures", "must be >= 1")
    need(s.max_tx_timeout_timer_capacity >= 1, "maxTxTimeoutTimerCapacity", "must be >= 1")
    need(s.max_batch_size >= s.max_message_size, "maxBatchSize", "must be >= maxMessageSize")
    need(s.max_batch_size < 1 << 31, "maxBatchSize", "must be < 2 GiB")
    need(s.auth_timeout_ms >= 0, "authTimeout", "must be >= 0 (0 = no limit)")
    need(s.frame_timeout_ms >= 0, "frameTimeout", "must be >= 0 (0 = no limit)")
    need(s.idle_timeout_ms >= 0, "idleTimeout", "must be >= 0 (0 = no limit)")
    need(s.max_parked_gets >= 1, "maxParkedGets", "must be >= 1")
    need(s.max_queued_replies >= 16, "maxQueuedReplies", "must be >= 16")
    need(s.max_delay_ms >= 1, "maxDelay", "must be >= 1")
    need(
        (s.tls_cert_file is None) == (s.tls_key_file is None),
        "tlsCertFile",
        "tlsCertFile and tlsKeyFile go together",
    )
    need(
        not s.tls_client_auth or (s.tls_ca_file is not None and s.tls_cert_file is not None),
        "tlsClientAuth",
        "needs tlsCaFile (the CA client certificates must chain to) and tlsCertFile/tlsKeyFile",
    )
    secrets = [x for x in (s.auth_secret, s.admin_secret, s.replication_secret) if x]
    need(
        len(secrets) == len(set(secrets)),
        "adminSecret",
        "authSecret, adminSecret and replicationSecret must differ (the secret selects the role)",
    )


@functools.lru_cache(maxsize=256)
def _check_delete_when(expr: str) -> None:
    """Validate a Quartz expression once (building the trigger costs ~0.5 ms; every topic
    usually shares one expression). Failures are not cached: they raise."""
    quartz_trigger(expr)


def _check_topic(t: TopicConfig, max_partitions: int = 65536) -> None:
    sec = f"topic={t.name}"
    _check_ranges(sec, t, _TOPIC_KEYS)
    try:
        _check_delete_when(t.delete_when)
    except ConfigError as e:
        raise ConfigError(f"[{sec}] {e}") from None
    if t.num_partitions > max_partitions:
        raise ConfigError(
            f"[{sec}] numPartitions: {t.num_partitions} exceeds maxPartitionsPerTopic "
            f"{max_partitions}"
        )
    if t.store not in ("disk", "memory"):
        raise ConfigError(f"[{sec}] store: must be disk or memory, got {t.store!r}")
    if t.memory_full_policy not in ("drop_oldest", "refuse"):
        raise ConfigError(
            f"[{sec}] memoryFullPolicy: must be drop_oldest or refuse, got {t.memory_full_policy!r}"
        )


def parse_config(text: str, source: Path | None = None) -> ServerConfig:
    """Parse the text of a ``server.ini``; raise ConfigError naming the offending key."""
    cp = configparser.ConfigParser(
        interpolation=None, comment_prefixes=(";", "#"), inline_comment_prefixes=None, strict=True
    )
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    where = str(source) if source else "<config>"
    try:
        cp.read_string(text, source=where)
    except configparser.Error as e:
        raise ConfigError(f"{where}: {e.message if hasattr(e, 'message') else e}") from None
    base = source.parent if source else Path.cwd()
    # configparser strips values, so a whitespace-only secret would read as "no auth"
    for m in re.finditer(
        r"^[ \t]*(authSecret|adminSecret|replicationSecret|secret)[ \t]*[=:]([^\r\n]*)$", text, re.M
    ):
        if m.group(2) and not m.group(2).strip():
            where_key = m.group(1) if m.group(1) == "secret" else f"[system] {m.group(1)}"
            raise ConfigError(f"{where_key}: whitespace only (leave it empty to turn auth off)")

    def resolve(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    sys_kw: dict[str, Any] = {}
    zk_kw: dict[str, Any] = {}
    slave_kw: dict[str, Any] | None = None
    topic_sections: list[tuple[str, dict[str, Any]]] = []
    groups: dict[str, str] = {}
    for name in cp.sections():
        items = dict(cp.items(name))
        if name == "system":
            sys_kw = _convert(name, items, _SYSTEM_KEYS)
        elif name == "zookeeper":
            zk_kw = _convert(name, items, _ZK_KEYS)
        elif name == "slave":
            slave_kw = _convert(name, items, _SLAVE_KEYS)
        elif name.startswith("topic="):
            topic = name[len("topic=") :].strip()
            try:
                check_user_topic(topic)
            except InvalidTopicError as e:
                raise ConfigError(f"[{name}]: {e}") from None
            topic_sections.append((topic, _convert(name, items, _TOPIC_KEYS)))
        elif name.startswith(GROUP_SECTION):
            group = name[len(GROUP_SECTION) :].strip()
            if not group or not SECRET_RE.fullmatch(group):
                raise ConfigError(f"[{name}]: the group name must be one token")
            secret = _convert(name, items, _GROUP_KEYS).get("secret", "")
            if not secret:
                raise ConfigError(f"[{name}] secret: required (the section exists to set it)")
            groups[group] = secret
        else:
            raise ConfigError(
                f"{where}: unknown section [{name}] "
                "(expected [system], [zookeeper], [slave], [topic=NAME], [producerGroup=NAME])"
            )
    system = SystemConfig(**sys_kw)
    system = replace(
        system,
        data_path=resolve(system.data_path) or system.data_path,
        data_log_path=resolve(system.data_log_path),
        tls_cert_file=resolve(system.tls_cert_file),
        tls_key_file=resolve(system.tls_key_file),
        tls_ca_file=resolve(system.tls_ca_file),
    )
    _check_system(system)
    zookeeper = ZookeeperConfig(**zk_kw)
    _check_ranges("zookeeper", zookeeper, _ZK_KEYS)
    topics: dict[str, TopicConfig] = {}
    for topic, kw in topic_sections:
        merged = {a: getattr(system, a) for a in _INHERITED}
        merged.update(kw)
        if "data_path" in merged:
            merged["data_path"] = resolve(merged["data_path"])
        tc = TopicConfig(name=topic, **merged)
        _check_topic(tc, system.max_partitions_per_topic)
        topics[topic] = tc
    slave = SlaveConfig(**slave_kw) if slave_kw is not None else None
    if slave is not None:
        _check_ranges("slave", slave, _SLAVE_KEYS)
    if (slave is not None or system.sync_slave) and not system.replication_secret:
        # without it anyone could write into a slave: replication always authenticates
        raise ConfigError(
            f"[system] replicationSecret: required by {'[slave]' if slave else 'syncSlave'} "
            "(master and slaves share it; replication links authenticate with it)"
        )
    if system.auto_failover and not (zookeeper.zk_enable and system.replication_secret):
        raise ConfigError(
            "[system] autoFailover: needs [zookeeper] zk.zkEnable=true (the election and the "
            "epoch live in ZooKeeper) and replicationSecret"
        )
    if system.auto_failover and not system.server_port:
        raise ConfigError("[system] autoFailover: needs a fixed serverPort (not 0)")
    return ServerConfig(system, zookeeper, topics, slave, source, text, groups)


def load_config(path: str | Path) -> ServerConfig:
    """Read and parse a ``server.ini`` file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
    return parse_config(text, p.resolve())


def default_topic(system: SystemConfig, name: str) -> TopicConfig:
    """The config a topic without its own section gets."""
    return TopicConfig(name=name, **{a: getattr(system, a) for a in _INHERITED})


def describe(config: ServerConfig) -> list[tuple[str, object]]:
    """Flattened ``key value`` pairs (for ``stats config``)."""
    out: list[tuple[str, object]] = []
    for f in fields(config.system):
        value = getattr(config.system, f.name)
        if f.name.endswith("_secret") and value:
            value = "***"
        out.append((f"system.{f.name}", value))
    for f in fields(config.zookeeper):
        out.append((f"zookeeper.{f.name}", getattr(config.zookeeper, f.name)))
    for t in config.topics.values():
        for f in fields(t):
            if f.name != "name":
                out.append((f"topic.{t.name}.{f.name}", getattr(t, f.name)))
    return out


#: ini keys whose values ``stats config`` never shows.
SECRET_KEYS: Final = frozenset({"authSecret", "adminSecret", "replicationSecret", "secret"})
#: notify's own ini keys ("(ext)" in the README). MetaQ's ``MetaConfig`` rejects keys it does
#: not know, so ``stats config`` serves them commented out.
EXTENSION_KEYS: Final = frozenset(
    {
        "maxMessageSize",
        "maxConnections",
        "authSecret",
        "adminSecret",
        "replicationSecret",
        "configWatchInterval",
        "maxTxSize",
        "retentionIgnoresConsumers",
        "txCheckBackDelay",
        "txCheckBackMaxTimes",
        "txCheckBackConcurrency",
        "syncSlave",
        "syncSlaveTimeout",
        "syncSlaveFailurePolicy",
        "syncSlaveMaxFailures",
        "store",
        "memoryMaxBytes",
        "memoryFullPolicy",
    }
)
_KEY_LINE: Final = re.compile(r"([^=:\s;#\[]+)\s*[=:]")
EXTENSION_MARK: Final = "; notify: "


def served_config(config: ServerConfig) -> bytes | None:
    """The ``server.ini`` text as ``stats config`` serves it (MetaQ serves the file itself,
    and a MetaQ slave loads it with ``MetaConfig.loadFromString``): the text that was loaded,
    with the lines of :data:`EXTENSION_KEYS` commented out (``; notify: key=value``) and the
    values of :data:`SECRET_KEYS` replaced by ``***``. None when the config did not come
    from a file."""
    if config.source is None and not config.text:
        return None
    out: list[str] = []
    key: str | None = None  # the key whose (continued) value this line belongs to
    in_group = False  # inside a [producerGroup=NAME] section (notify's own: all commented)
    for line in config.text.splitlines(keepends=True):
        if line.lstrip().startswith("["):
            in_group = line.strip().startswith("[" + GROUP_SECTION)
        if in_group:
            m = _KEY_LINE.match(line)
            if m and m.group(1) in SECRET_KEYS:
                line = f"{m.group(1)}=***{line[len(line.rstrip(chr(13) + chr(10))) :]}"
            elif line[:1] in (" ", "\t") and line.strip():
                continue  # a continuation of a secret: never served
            out.append(EXTENSION_MARK + line if line.strip() else line)
            continue
        if key is not None and line[:1] in (" ", "\t") and line.strip():
            if key not in SECRET_KEYS:  # a continuation line of an extension key's value
                out.append(";" + line)
            continue
        key = None
        m = _KEY_LINE.match(line)
        if m and m.group(1) in EXTENSION_KEYS:
            key = m.group(1)
            if key in SECRET_KEYS:
                end = line[len(line.rstrip("\r\n")) :]
                line = f"{key}=***{end}"
            line = EXTENSION_MARK + line
        out.append(line)
    return "".join(out).encode("utf-8")


def config_checksum(config: ServerConfig) -> int | None:
    """CRC32 of :func:`served_config`, as MetaQ publishes its config file's CRC32 in
    ``/meta/brokers/ids/<id>/master_config_checksum`` (a slave compares it with its own)."""
    served = served_config(config)
    return None if served is None else zlib.crc32(served)
