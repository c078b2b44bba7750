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
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from notify.cron import quartz_trigger
from notify.errors import ConfigError, InvalidTopicError

TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
KIB: Final = 1024
MIB: Final = 1024 * KIB
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
    accept_publish: bool = True
    accept_subscribe: bool = True
    stat: bool = True
    update_consumer_offsets: bool = False
    # notify extensions (documented in README)
    retention_ignores_consumers: bool = False
    max_message_size: int = 4 * MIB
    max_connections: int = 10000
    auth_secret: str = ""
    config_watch_interval_ms: int = 2000
    max_tx_size: int = 64 * MIB
    tx_check_back_delay_ms: int = 6000
    tx_check_back_max_times: int = 15
    tx_check_back_concurrency: int = 16
    sync_slave: str = ""
    sync_slave_timeout_ms: int = 3000
    sync_slave_failure_policy: str = "refuse"
    sync_slave_max_failures: int = 3

    @property
    def tx_log_path(self) -> Path:
        return (self.data_log_path or self.data_path) / "transactions"


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

    def topic(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)


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
    "acceptPublish": ("accept_publish", _bool),
    "acceptSubscribe": ("accept_subscribe", _bool),
    "stat": ("stat", _bool),
    "updateConsumerOffsets": ("update_consumer_offsets", _bool),
    "maxMessageSize": ("max_message_size", _int),
    "maxConnections": ("max_connections", _int),
    "authSecret": ("auth_secret", _str),
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
}
_ZK_KEYS: Final[dict[str, tuple[str, _Conv]]] = {
    "zk.zkEnable": ("zk_enable", _bool),
    "zk.zkConnect": ("zk_connect", _str),
    "zk.zkRoot": ("zk_root", _str),
    "zk.zkSessionTimeoutMs": ("zk_session_timeout_ms", _int),
    "zk.zkConnectionTimeoutMs": ("zk_connection_timeout_ms", _int),
    "zk.zkSyncTimeMs": ("zk_sync_time_ms", _int),
}
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


def _check_system(s: SystemConfig) -> None:
    def need(cond: bool, key: str, what: str) -> None:
        if not cond:
            raise ConfigError(f"[system] {key}: {what}")

    need(0 <= s.broker_id < 1024, "brokerId", "must be in 0..1023 (10 bits of the message id)")
    need(0 <= s.server_port < 65536, "serverPort", "must be a TCP port")
    need(0 <= s.dashboard_http_port < 65536, "dashboardHttpPort", "must be a TCP port")
    need(s.num_partitions >= 1, "numPartitions", "must be >= 1")
    need(s.unflush_threshold >= 0, "unflushThreshold", "must be >= 0")
    need(s.unflush_interval_ms >= 0, "unflushInterval", "must be >= 0")
    need(s.max_segment_size >= 4096, "maxSegmentSize", "must be >= 4096")
    need(s.max_transfer_size >= 64, "maxTransferSize", "must be >= 64")
    need(s.max_message_size >= 1, "maxMessageSize", "must be >= 1")
    need(s.flush_tx_log_at_commit in (0, 1, 2), "flushTxLogAtCommit", "must be 0, 1 or 2")
    need(s.max_checkpoints >= 1, "maxCheckpoints", "must be >= 1")
    need(s.max_tx_timeout_in_seconds >= 1, "maxTxTimeoutInSeconds", "must be >= 1")
    need(s.max_connections >= 1, "maxConnections", "must be >= 1")
    need(s.max_tx_size >= 1, "maxTxSize", "must be >= 1")
    need(s.tx_check_back_delay_ms >= 1, "txCheckBackDelay", "must be >= 1")
    need(s.tx_check_back_max_times >= 1, "txCheckBackMaxTimes", "must be >= 1")
    need(s.tx_check_back_concurrency >= 1, "txCheckBackConcurrency", "must be >= 1")
    need(s.checkpoint_interval_ms >= 1, "checkpointInterval", "must be >= 1")
    need(
        s.sync_slave_failure_policy in ("refuse", "async"),
        "syncSlaveFailurePolicy",
        "must be refuse (stop acknowledging) or async (go on and flag it)",
    )
    need(s.sync_slave_timeout_ms >= 1, "syncSlaveTimeout", "must be >= 1")
    need(s.sync_slave_max_failures >= 1, "syncSlaveMaxFailures", "must be >= 1")
    need(s.max_tx_timeout_timer_capacity >= 1, "maxTxTimeoutTimerCapacity", "must be >= 1")


def _check_topic(t: TopicConfig) -> None:
    sec = f"topic={t.name}"
    try:
        quartz_trigger(t.delete_when)
    except ConfigError as e:
        raise ConfigError(f"[{sec}] {e}") from None
    if t.num_partitions < 1 or t.num_partitions > 65536:
        raise ConfigError(f"[{sec}] numPartitions: must be in 1..65536")
    if t.store not in ("disk", "memory"):
        raise ConfigError(f"[{sec}] store: must be disk or memory, got {t.store!r}")
    if t.memory_full_policy not in ("drop_oldest", "refuse"):
        raise ConfigError(
            f"[{sec}] memoryFullPolicy: must be drop_oldest or refuse, got {t.memory_full_policy!r}"
        )
    if t.memory_max_bytes < 4096:
        raise ConfigError(f"[{sec}] memoryMaxBytes: must be >= 4096")
    if t.unflush_threshold < 0 or t.unflush_interval_ms < 0:
        raise ConfigError(f"[{sec}] unflushThreshold/unflushInterval: must be >= 0")


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

    def resolve(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    sys_kw: dict[str, Any] = {}
    zk_kw: dict[str, Any] = {}
    slave_kw: dict[str, Any] | None = None
    topic_sections: list[tuple[str, dict[str, Any]]] = []
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
                validate_topic(topic)
            except InvalidTopicError as e:
                raise ConfigError(f"[{name}]: {e}") from None
            topic_sections.append((topic, _convert(name, items, _TOPIC_KEYS)))
        else:
            raise ConfigError(
                f"{where}: unknown section [{name}] "
                "(expected [system], [zookeeper], [slave], [topic=NAME])"
            )
    system = SystemConfig(**sys_kw)
    system = replace(
        system,
        data_path=resolve(system.data_path) or system.data_path,
        data_log_path=resolve(system.data_log_path),
    )
    _check_system(system)
    zookeeper = ZookeeperConfig(**zk_kw)
    topics: dict[str, TopicConfig] = {}
    for topic, kw in topic_sections:
        merged = {a: getattr(system, a) for a in _INHERITED}
        merged.update(kw)
        if "data_path" in merged:
            merged["data_path"] = resolve(merged["data_path"])
        tc = TopicConfig(name=topic, **merged)
        _check_topic(tc)
        topics[topic] = tc
    slave = SlaveConfig(**slave_kw) if slave_kw is not None else None
    if slave is not None and slave.slave_max_delay_in_mills < 1:
        raise ConfigError("[slave] slaveMaxDelayInMills: must be >= 1")
    return ServerConfig(system, zookeeper, topics, slave, source, text)


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
        if f.name == "auth_secret" and value:
            value = "***"
        out.append((f"system.{f.name}", value))
    for f in fields(config.zookeeper):
        out.append((f"zookeeper.{f.name}", getattr(config.zookeeper, f.name)))
    for t in config.topics.values():
        for f in fields(t):
            if f.name != "name":
                out.append((f"topic.{t.name}.{f.name}", getattr(t, f.name)))
    return out
