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
import difflib
import functools
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
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

    def text(self) -> str:
        """The ini form :meth:`parse` reads back (``delete,168``)."""
        hours = self.max_age_s / 3600
        age = f"{hours:g}" if hours == int(hours) else f"{self.max_age_s:g}s"
        return f"{self.action},{age}" + (",zip" if self.compress else "")


# --------------------------------------------------------------------------- settings
#
# Every server.ini key is declared once, as a field of its section's config object with
# setting() metadata: its ini key, converter, range, choices and meaning. The parser's tables,
# the range checks and the configuration reference (settings(), rendered by notify.cli.docgen)
# are all read from there, so a key documented is a key parsed and checked.

_DAY_MS: Final = 86_400_000
#: The largest message a broker may be configured to take (records carry an i32 length and a
#: put is buffered whole before it is checked).
MAX_MESSAGE_SIZE_LIMIT: Final = 256 * MIB
_Conv = Callable[[str], Any]
_META: Final = "notify.setting"
#: Converters' names as the reference shows them.
_KINDS: Final[dict[Callable[..., Any], str]] = {
    _int: "integer",
    _bool: "boolean",
    _str: "string",
    Path: "path",
    _secret: "secret",
    _names: "host names",
    DeletePolicy.parse: "retention policy",
}


@dataclass(frozen=True)
class _Meta:
    key: str
    group: str
    doc: str
    conv: _Conv
    range: tuple[int, int] | None
    choices: tuple[str, ...]
    unit: str
    metaq: bool
    inherited: bool


def setting(
    key: str,
    default: Any,
    doc: str,
    *,
    group: str,
    conv: _Conv = _int,
    bounds: tuple[int, int] | None = None,
    choices: tuple[str, ...] = (),
    unit: str = "",
    metaq: bool = False,
    inherited: bool = False,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A config field that is an ini key: ``key`` in its section, converted by ``conv``,
    range- or choice-checked, documented by ``doc`` (markdown, one paragraph). ``metaq``:
    MetaQ's ``MetaConfig`` knows the key (else it is notify's extension, which ``stats
    config`` serves commented out). ``inherited``: a ``[topic=NAME]`` key whose default is
    the ``[system]`` key of the same name (its doc is that key's)."""
    meta = {_META: _Meta(key, group, doc, conv, bounds, choices, unit, metaq, inherited)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """One ``server.ini`` key, as the configuration reference lists it."""

    key: str
    #: ``system``, ``zookeeper``, ``slave``, ``topic`` or ``producerGroup``
    section: str
    #: the attribute of the section's config object
    attr: str
    #: what the value is: ``integer``, ``boolean``, ``string``, ``path``, ``secret``, ...
    kind: str
    default: object
    doc: str
    group: str
    unit: str = ""
    range: tuple[int, int] | None = None
    choices: tuple[str, ...] = ()
    metaq: bool = False
    inherited: bool = False

    @property
    def default_text(self) -> str:
        """The default as it would be written in ``server.ini``."""
        d = self.default
        if d is None:
            return ""
        if isinstance(d, bool):
            return "true" if d else "false"
        if isinstance(d, DeletePolicy):
            return d.text()
        if isinstance(d, tuple):
            return ",".join(str(x) for x in d)
        return str(d)


G_SERVER: Final = "Server"
G_STORAGE: Final = "Storage and flushing"
G_RETENTION: Final = "Retention"
G_TX: Final = "Transactions"
G_DELAY: Final = "Delayed messages"
G_LIMITS: Final = "Connections and limits"
G_SECURITY: Final = "Security and TLS"
G_HTTP: Final = "HTTP"
G_GROUPS: Final = "Consumer groups and producers"
G_REPL: Final = "Replication and failover"
G_QUEUES: Final = "Queues"
G_ZK: Final = "ZooKeeper"
G_SLAVE: Final = "Asynchronous slave"
G_TOPIC: Final = "Topic"
G_PRODUCER_GROUP: Final = "Producer group"


@dataclass(frozen=True)
class TopicConfig:
    """Settings of one topic (``[topic=NAME]`` merged over ``[system]``)."""

    name: str
    num_partitions: int = setting("numPartitions", 1, "", group=G_TOPIC, inherited=True,
                                  bounds=(1, 65536), metaq=True)
    unflush_threshold: int = setting("unflushThreshold", 1000, "", group=G_TOPIC,
                                     inherited=True, bounds=(0, 10**9), metaq=True)
    unflush_interval_ms: int = setting("unflushInterval", 10000, "", group=G_TOPIC,
                                       inherited=True, bounds=(0, _DAY_MS), unit="ms",
                                       metaq=True)
    delete_policy: DeletePolicy = setting("deletePolicy", None, "", group=G_TOPIC,
                                          inherited=True, conv=DeletePolicy.parse,
                                          factory=DeletePolicy, metaq=True)
    delete_when: str = setting("deleteWhen", "0 0 6,18 * * ?", "", group=G_TOPIC,
                               inherited=True, conv=_str, metaq=True)
    data_path: Path | None = setting(
        "dataPath", None, "The topic's own data directory (partitions in "
        "`<dataPath>/<topic>-<n>/`); unset: `[system]` `dataPath`.",
        group=G_TOPIC, conv=Path, metaq=True)
    accept_publish: bool = setting("acceptPublish", True, "", group=G_TOPIC, inherited=True,
                                   conv=_bool, metaq=True)
    accept_subscribe: bool = setting("acceptSubscribe", True, "", group=G_TOPIC,
                                     inherited=True, conv=_bool, metaq=True)
    stat: bool = setting("stat", True, "", group=G_TOPIC, inherited=True, conv=_bool,
                         metaq=True)
    retention_ignores_consumers: bool = setting("retentionIgnoresConsumers", False, "",
                                                group=G_TOPIC, inherited=True, conv=_bool)
    store: str = setting(
        "store", "disk", "`disk`, or `memory`: the topic lives in memory, bounded by "
        "`memoryMaxBytes`; same protocol, offsets and transactions, but **its data is lost "
        "on restart** by design.", group=G_TOPIC, conv=_str, choices=("disk", "memory"))
    memory_max_bytes: int = setting(
        "memoryMaxBytes", 64 * MIB, "Bytes a memory topic keeps (per partition).",
        group=G_TOPIC, bounds=(4096, 1 << 40), unit="bytes")
    memory_full_policy: str = setting(
        "memoryFullPolicy", "drop_oldest", "A full memory topic: `drop_oldest` drops its "
        "oldest chunks (consumers behind get a 301 to the new first offset), `refuse` "
        "answers producers 503.", group=G_TOPIC, conv=_str,
        choices=("drop_oldest", "refuse"))


@dataclass(frozen=True)
class TlsConfig:
    """TLS on the wire and HTTP ports (``tls*`` keys of ``[system]``)."""

    cert_file: Path | None = setting(
        "tlsCertFile", None, "PEM certificate chain: TLS (1.2+) on the wire **and** HTTP "
        "ports (with `tlsKeyFile`).", group=G_SECURITY, conv=Path)
    key_file: Path | None = setting("tlsKeyFile", None, "PEM private key of "
                                        "`tlsCertFile`.", group=G_SECURITY, conv=Path)
    ca_file: Path | None = setting("tlsCaFile", None, "PEM CA bundle client "
                                       "certificates must chain to (with "
                                       "`tlsClientAuth`).", group=G_SECURITY, conv=Path)
    client_auth: bool = setting("tlsClientAuth", False, "Mutual TLS: clients must "
                                    "present a certificate chaining to `tlsCaFile`.",
                                    group=G_SECURITY, conv=_bool)
    handshake_timeout_ms: int = setting(
        "tlsHandshakeTimeout", 5_000, "Time a client may take to complete its TLS handshake "
        "on the wire or HTTP port (a socket in its handshake holds a connection slot until "
        "then).", group=G_SECURITY, bounds=(100, 600_000), unit="ms")
    max_hello_size: int = setting(
        "tlsMaxHelloSize", 64 * KIB, "Bytes a client may send before the broker has taken "
        "its socket into TLS (its ClientHello); more and the socket is dropped.",
        group=G_SECURITY, bounds=(4 * KIB, 16 * MIB), unit="bytes")


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP port's limits (``http*`` keys of ``[system]``)."""

    allowed_hosts: tuple[str, ...] = setting(
        "httpAllowedHosts", (), "Extra names the HTTP `Host` header may carry "
        "(comma-separated; `*` = any) besides `hostName`, `localhost` and IP literals.",
        group=G_HTTP, conv=_names)
    max_connections: int = setting("httpMaxConnections", 256, "Open HTTP connections "
                                        "(503 and close beyond).", group=G_HTTP,
                                        bounds=(1, 100_000))
    keepalive_timeout_ms: int = setting(
        "httpKeepaliveTimeout", 15_000, "How long an HTTP connection may sit idle or spend "
        "sending its headers.", group=G_HTTP, bounds=(100, _DAY_MS), unit="ms")
    body_timeout_ms: int = setting(
        "httpBodyTimeout", 30_000, "Time to send a request body (then 408 and close).",
        group=G_HTTP, bounds=(100, _DAY_MS), unit="ms")
    max_body_size: int = setting(
        "httpMaxBodySize", 32 * MIB, "Largest JSON request body on the HTTP port (413 and "
        "close beyond, chunked included; MetaQ's `/put` takes `maxMessageSize`).",
        group=G_HTTP, bounds=(KIB, GIB), unit="bytes")
    max_fetch_size: int = setting(
        "httpMaxFetchSize", 16 * MIB, "REST fetch: largest `maxSize` (400 beyond).",
        group=G_HTTP, bounds=(KIB, 256 * MIB), unit="bytes")
    max_fetch_messages: int = setting(
        "httpMaxFetchMessages", 10_000, "REST fetch: largest `limit` (400 beyond).",
        group=G_HTTP, bounds=(1, 1_000_000))
    max_produce_messages: int = setting(
        "httpMaxProduceMessages", 1000, "REST produce: messages per request (400 beyond, "
        "nothing written).", group=G_HTTP, bounds=(1, 1_000_000))


@dataclass(frozen=True)
class QueueConfig:
    """Queue groups (``queue*`` keys of ``[system]``)."""

    lock_timeout_ms: int = setting(
        "queueLockTimeout", 30_000, "How long a pushed queue message stays acquired without "
        "`ack` or `renew` before it is redelivered.", group=G_QUEUES, bounds=(100, _DAY_MS),
        unit="ms")
    max_deliveries: int = setting(
        "queueMaxDeliveries", 5, "Deliveries after which a returned queue message goes to "
        "the dead-letter queue.", group=G_QUEUES, bounds=(1, 1000))
    max_in_flight: int = setting(
        "queueMaxInFlight", 10_000, "Messages one queue group tracks between its low-water "
        "offsets and read frontiers (a memory bound: reading pauses when full).",
        group=G_QUEUES, bounds=(1, 1_000_000))
    max_credit: int = setting(
        "queueMaxCredit", 1000, "Largest credit granted to one queue consumer (larger asks "
        "are clamped).", group=G_QUEUES, bounds=(1, 100_000))
    max_groups: int = setting(
        "queueMaxGroups", 256, "Queue groups per broker; at the cap the longest unused group "
        "that holds nothing makes room, else 503.", group=G_QUEUES, bounds=(1, 100_000))
    max_groups_per_connection: int = setting(
        "queueMaxGroupsPerConnection", 16, "Groups one connection may have created that "
        "still exist (503 beyond).", group=G_QUEUES, bounds=(1, 100_000))
    group_expiry_ms: int = setting(
        "queueGroupExpiry", 86_400_000, "A group with no consumer that holds nothing (every "
        "message of its topic finished, no dead letter) is deleted after this; 0 = never.",
        group=G_QUEUES, bounds=(0, 365 * _DAY_MS), unit="ms")
    max_dead_letters: int = setting(
        "queueMaxDeadLetters", 10_000, "Dead-letter entries kept per queue group (the oldest "
        "are dropped and counted).", group=G_QUEUES, bounds=(0, 1_000_000))
    max_release_delay_ms: int = setting(
        "queueMaxReleaseDelay", 3_600_000, "Longest delay a `release` may ask for before "
        "redelivery.", group=G_QUEUES, bounds=(0, 30 * _DAY_MS), unit="ms")
    checkpoint_interval_ms: int = setting(
        "queueCheckpointInterval", 10_000, "Time between checkpoints of the queue log (when "
        "something changed).", group=G_QUEUES, bounds=(100, _DAY_MS), unit="ms")
    retention_hold_bytes: int = setting(
        "queueRetentionHoldBytes", 1 << 30, "Expired bytes per partition that retention "
        "keeps for queue groups that have not finished them (0 = not held); beyond it they "
        "are skipped or dead-lettered, and counted.", group=G_QUEUES, bounds=(0, 1 << 50),
        unit="bytes")


@dataclass(frozen=True)
class DelayConfig:
    """Delayed messages (``maxDelay`` and ``delay*`` keys of ``[system]``)."""

    max_delay_ms: int = setting(
        "maxDelay", 90 * 24 * 3600 * 1000, "How far ahead a delayed message's `deliverAt` "
        "may be (400 beyond); a past or zero `deliverAt` is due now.", group=G_DELAY,
        bounds=(1, 10 * 365 * _DAY_MS), unit="ms")
    checkpoint_interval_ms: int = setting(
        "delayCheckpointInterval", 10_000, "Time between checkpoints of the delay queue's "
        "log; each first compacts the oldest `__delay` segment if it is mostly delivered.",
        group=G_DELAY, bounds=(100, _DAY_MS), unit="ms")
    max_delivered: int = setting(
        "delayMaxDelivered", 65_536, "Delivered `__delay` offsets kept above the watermark "
        "(8 bytes each in the checkpoint); beyond, the oldest pending messages are re-put at "
        "the end of `__delay` so the watermark passes them.", group=G_DELAY,
        bounds=(2, 10_000_000))


@dataclass(frozen=True)
class ReplicationConfig:
    """Replication to a synchronous slave and its secret (``syncSlave*``, ``replicationSecret``)."""

    sync_slave: str = setting("syncSlave", "", "`host:port` of a synchronous slave: "
                              "producers are acknowledged once it has their messages.",
                              group=G_REPL, conv=_str)
    sync_slave_timeout_ms: int = setting(
        "syncSlaveTimeout", 3000, "How long the master waits for the synchronous slave's "
        "answer.", group=G_REPL, bounds=(1, 600_000), unit="ms")
    sync_slave_failure_policy: str = setting(
        "syncSlaveFailurePolicy", "refuse", "When the synchronous slave does not answer: "
        "`refuse` fails the put (503) and takes it back; `async` goes on and flags the "
        "master `degraded`.", group=G_REPL, conv=_str, choices=("refuse", "async"))
    sync_slave_max_failures: int = setting(
        "syncSlaveMaxFailures", 3, "Failures in a row after which the policy applies to "
        "every put until the slave is back in sync.", group=G_REPL, bounds=(1, 1_000_000))
    secret: str = setting(
        "replicationSecret", "", "Shared by master and slaves; **required** with `[slave]` "
        "or `syncSlave` (the broker refuses to start without it). Replication links open "
        "with `auth <replicationSecret> <brokerId>`; a slave accepts `msync`/`sync` only "
        "from such a link, and internal topics are served only to replicas.",
        group=G_SECURITY, conv=_secret)


@dataclass(frozen=True)
class FailoverConfig:
    """Automatic failover in ZooKeeper mode (``autoFailover``, ``failover*``)."""

    enabled: bool = setting(
        "autoFailover", False, "ZooKeeper mode only (needs `zk.zkEnable=true`, "
        "`replicationSecret` and a fixed `serverPort`): the brokers of this `brokerId` elect "
        "their master and fence the old one; a `[slave]` broker's `syncSlave` is the "
        "synchronous slave it pushes to once elected.", group=G_REPL, conv=_bool)
    require_in_sync: bool = setting(
        "failoverRequireInSync", True, "Only an in-sync slave (every partition within "
        "`failoverMaxLagBytes` of the master's last reported end) may be elected; false = "
        "any slave. Of several eligible slaves the one holding the most data leads.",
        group=G_REPL, conv=_bool)
    max_lag_bytes: int = setting(
        "failoverMaxLagBytes", 0, "How far behind a slave may be and still count as in sync.",
        group=G_REPL, bounds=(0, 1 << 40), unit="bytes")
    slave_id: int = setting(
        "failoverSlaveId", 0, "The member id of a configured master when it rejoins its "
        "group as a slave; slaves use their `slaveId`.", group=G_REPL, bounds=(0, 1023))


@dataclass(frozen=True)
class SystemConfig:
    """``[system]``. Names follow MetaQ; units are in the attribute names.

    The keys of one subject are grouped in typed sections (``tls``, ``http``, ``queues``,
    ``delay``, ``replication``, ``failover``): still keys of ``[system]`` in ``server.ini``
    (``tlsCertFile`` is ``system.tls.cert_file``), declared with :func:`setting` in their
    section's class."""

    broker_id: int = setting("brokerId", 0, "Part of every message id; brokers of one "
                             "replication group share it.", group=G_SERVER,
                             bounds=(0, 1023), metaq=True)
    host_name: str = setting("hostName", "127.0.0.1", "Address to listen on (and to "
                             "advertise in ZooKeeper).", group=G_SERVER, conv=_str,
                             metaq=True)
    server_port: int = setting("serverPort", 8123, "Wire protocol port (0 = any free port).",
                               group=G_SERVER, bounds=(0, 65535), metaq=True)
    dashboard_http_port: int = setting("dashboardHttpPort", 8120, "HTTP port: dashboard, "
                                       "REST, metrics, MetaQ's HTTP protocol (0 = off).",
                                       group=G_SERVER, bounds=(0, 65535), metaq=True)
    data_path: Path = setting("dataPath", Path("data"), "Partitions live in "
                              "`<dataPath>/<topic>-<n>/`; relative paths are resolved "
                              "against the ini file's directory.", group=G_STORAGE,
                              conv=Path, metaq=True)
    data_log_path: Path | None = setting("dataLogPath", None, "Where the redo transaction "
                                         "log (`transactions/`), the delay log and the "
                                         "queue log go; unset: `dataPath`.",
                                         group=G_STORAGE, conv=Path, metaq=True)
    num_partitions: int = setting("numPartitions", 1, "Default partitions per topic.",
                                  group=G_STORAGE, bounds=(1, 65536), metaq=True)
    auto_create_topics: bool = setting(
        "autoCreateTopics", False, "Create a topic (with these defaults) the first time a "
        "client names it in a put, a get or a partition lookup. Meant for test brokers "
        "(`notify.testing.broker()`); off in production, where a typo would become a topic.",
        group=G_STORAGE, conv=_bool)
    unflush_threshold: int = setting(
        "unflushThreshold", 1000, "fsync after this many messages (the put that crosses it "
        "waits for the fsync). **0 = group commit**: every acknowledgement waits for the "
        "fsync covering it.", group=G_STORAGE, bounds=(0, 10**9), metaq=True)
    unflush_interval_ms: int = setting("unflushInterval", 10000, "fsync anything older "
                                       "than this (0 = no timer).", group=G_STORAGE,
                                       bounds=(0, _DAY_MS), unit="ms", metaq=True)
    max_segment_size: int = setting("maxSegmentSize", GIB, "Roll segment files at this "
                                    "size.", group=G_STORAGE, bounds=(4096, 64 * GIB),
                                    unit="bytes", metaq=True)
    max_transfer_size: int = setting("maxTransferSize", MIB, "Largest `get` window (a "
                                     "larger single record is still served whole).",
                                     group=G_LIMITS, bounds=(64, 256 * MIB), unit="bytes",
                                     metaq=True)
    get_process_thread_count: int = setting("getProcessThreadCount", 10, "Accepted for "
                                            "compatibility: one event loop serves "
                                            "everything.", group=G_SERVER,
                                            bounds=(0, 10_000), metaq=True)
    put_process_thread_count: int = setting("putProcessThreadCount", 10, "Accepted for "
                                            "compatibility: one event loop serves "
                                            "everything.", group=G_SERVER,
                                            bounds=(0, 10_000), metaq=True)
    delete_policy: DeletePolicy = setting(
        "deletePolicy", None, "`delete,N` or `archive,N[,zip]`: what retention does with "
        "closed segments older than N hours (or N with an `s`/`m`/`h` suffix). `archive` "
        "keeps a `<segment>.meta.arc` hard link (`zip`: a zip file).", group=G_RETENTION,
        conv=DeletePolicy.parse, factory=DeletePolicy, metaq=True)
    delete_when: str = setting("deleteWhen", "0 0 6,18 * * ?", "Quartz cron expression "
                               "of the retention runs.", group=G_RETENTION, conv=_str,
                               metaq=True)
    max_checkpoints: int = setting("maxCheckpoints", 3, "Redo-log checkpoints kept.",
                                   group=G_TX, bounds=(1, 1000), metaq=True)
    checkpoint_interval_ms: int = setting("checkpointInterval", 3_600_000, "Time between "
                                          "redo-log checkpoints.", group=G_TX,
                                          bounds=(1, 7 * _DAY_MS), unit="ms", metaq=True)
    max_tx_timeout_timer_capacity: int = setting(
        "maxTxTimeoutTimerCapacity", 30000, "Open transactions allowed (a clear 503 beyond).",
        group=G_TX, bounds=(1, 10_000_000), metaq=True)
    max_tx_timeout_in_seconds: int = setting(
        "maxTxTimeoutInSeconds", 60, "Cap (and default) of a transaction's timeout.",
        group=G_TX, bounds=(1, 7 * 86_400), unit="s", metaq=True)
    flush_tx_log_at_commit: int = setting(
        "flushTxLogAtCommit", 1, "1: fsync the redo log at every commit and prepare (group "
        "commit); 2: once a second; 0: the OS decides.", group=G_TX, bounds=(0, 2),
        metaq=True)
    half_commit_early_ack: bool = setting(
        "halfCommitEarlyAck", False, "true: a half message's COMMIT is answered once logged, "
        "before its fsync, and its messages are readable once forced; false: answered when "
        "durable and readable, as every commit.", group=G_TX, conv=_bool)
    half_commit_force_delay_ms: int = setting(
        "halfCommitForceDelay", 2, "With `halfCommitEarlyAck`: how long an answered half "
        "message's COMMIT waits for another step's fsync to cover it before forcing its own.",
        group=G_TX, bounds=(0, 1000), unit="ms")
    accept_publish: bool = setting("acceptPublish", True, "Producers may put (enforced: "
                                   "403 otherwise, not just hidden).", group=G_SERVER,
                                   conv=_bool, metaq=True)
    accept_subscribe: bool = setting("acceptSubscribe", True, "Consumers may get (enforced "
                                     "on the wire and over HTTP: 403).", group=G_SERVER,
                                     conv=_bool, metaq=True)
    stat: bool = setting("stat", True, "Accepted for compatibility.", group=G_SERVER,
                         conv=_bool, metaq=True)
    update_consumer_offsets: bool = setting(
        "updateConsumerOffsets", False, "A `get` beyond the end of a partition: false = 404 "
        "\"Could not find message at position N\" (MetaQ's default; the consumer keeps its "
        "offset), true = 301 with the end (the consumer jumps there). Offset Long.MAX_VALUE "
        "always gets the 301.", group=G_SERVER, conv=_bool, metaq=True)
    retention_ignores_consumers: bool = setting(
        "retentionIgnoresConsumers", False, "Delete expired segments even if a live consumer "
        "has not read them.", group=G_RETENTION, conv=_bool)
    max_message_size: int = setting(
        "maxMessageSize", MAX_METAQ_CLIENT_PAYLOAD, "Largest payload (attribute block "
        "included) of one message; larger puts get 400. The default is what MetaQ's Java "
        "consumer can read (its read buffer stops at 2 MiB and one record's reply frame must "
        "fit). Raise it only if no MetaQ Java consumer reads those topics; notify's own "
        "client reads any size.", group=G_LIMITS, bounds=(1, MAX_MESSAGE_SIZE_LIMIT),
        unit="bytes")
    max_connections: int = setting(
        "maxConnections", 10000, "Wire connections (503 and close beyond); also held to what "
        "the file descriptors allow (`RLIMIT_NOFILE` minus open fds minus `fdReserve` minus "
        "`httpMaxConnections`, at least 16).", group=G_LIMITS, bounds=(1, 1_000_000))
    auth_secret: str = setting(
        "authSecret", "", "Shared secret: clients send `auth <secret>` first (HTTP: bearer "
        "token). Empty = no authentication; otherwise 1..1024 printable ASCII characters "
        "without spaces.", group=G_SECURITY, conv=_secret)
    admin_secret: str = setting(
        "adminSecret", "", "When set, admin actions (topic creation, retention, config "
        "reload, resolving others' transactions, `stats reset`, dead-letter replay, queue "
        "group deletion) need it; publish and fetch take either secret. Must differ from "
        "`authSecret`.", group=G_SECURITY, conv=_secret)
    config_watch_interval_ms: int = setting(
        "configWatchInterval", 2000, "Time between checks of the ini file's mtime (a change "
        "is reloaded; 0 = no watch).", group=G_SERVER, bounds=(0, _DAY_MS), unit="ms")
    max_tx_size: int = setting("maxTxSize", 64 * MIB, "Bytes one transaction may hold.",
                               group=G_TX, bounds=(1, 16 * GIB), unit="bytes")
    tx_check_back_delay_ms: int = setting(
        "txCheckBackDelay", 6000, "How long a prepared half message waits before the broker "
        "asks its producer group's checker.", group=G_TX, bounds=(1, _DAY_MS), unit="ms")
    tx_check_back_max_times: int = setting(
        "txCheckBackMaxTimes", 15, "Unanswered check-backs after which a half message is "
        "rolled back (counted: `tx_check_back_exhausted`).", group=G_TX,
        bounds=(1, 1_000_000))
    tx_check_back_concurrency: int = setting(
        "txCheckBackConcurrency", 16, "Check-backs in flight at once.", group=G_TX,
        bounds=(1, 10_000))
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    max_partitions_per_topic: int = setting(
        "maxPartitionsPerTopic", 1024, "Cap of `numPartitions` (ini and REST).",
        group=G_LIMITS, bounds=(1, 65536))
    fd_reserve: int = setting(
        "fdReserve", 128, "File descriptors that topic creation, config reload and wire "
        "connections leave free.", group=G_LIMITS, bounds=(0, 1_000_000))
    max_consumer_groups: int = setting(
        "maxConsumerGroups", 10_000, "Consumer group names remembered (positions for "
        "retention, `/api/groups`, `/metrics`); beyond, the least recently seen is forgotten.",
        group=G_GROUPS, bounds=(1, 10_000_000))
    max_idempotent_producers: int = setting(
        "maxIdempotentProducers", 10_000, "Idempotent producers remembered per partition "
        "(their last batch, for dropping retried puts); beyond, the least recently used is "
        "forgotten.", group=G_GROUPS, bounds=(1, 10_000_000))
    max_producer_id_length: int = setting(
        "maxProducerIdLength", 128, "Longest idempotent producer id a connection may claim "
        "(an anonymous id is 23 characters, a named one the name plus 23).",
        group=G_GROUPS, bounds=(23, 1024))
    producer_state_max_bytes: int = setting(
        "producerStateMaxBytes", 64 * MIB, "Bytes of all idempotent producers' state (last "
        "batches and named identities' holders, each estimated at 560 bytes plus its id); "
        "beyond, the least recently used entries of identities no connection holds are "
        "forgotten, and a put or claim that still finds no room gets 503.", group=G_GROUPS,
        bounds=(64 * KIB, 64 * GIB), unit="bytes")
    max_producer_ids_per_connection: int = setting(
        "maxProducerIdsPerConnection", 1024, "Producer identities one connection may hold "
        "at once (503 beyond).", group=G_GROUPS, bounds=(1, 1_000_000))
    consumer_group_expiry_ms: int = setting(
        "consumerGroupExpiry", 86_400_000, "A group not seen fetching for this long is "
        "forgotten.", group=G_GROUPS, bounds=(1000, 365 * _DAY_MS), unit="ms")
    consumer_session_timeout_ms: int = setting(
        "consumerSessionTimeout", 30_000, "After its last fetch a group stops being shown as "
        "live (`/api/groups`, dashboard, `notify topics describe`) within this time.",
        group=G_GROUPS, bounds=(100, _DAY_MS), unit="ms")
    metrics_max_consumer_series: int = setting(
        "metricsMaxConsumerSeries", 10_000, "Per-group series in one `/metrics` scrape "
        "(`notify_consumer_series_dropped` counts the rest).", group=G_HTTP,
        bounds=(0, 10_000_000))
    auth_failure_log_interval_ms: int = setting(
        "authFailureLogInterval", 10_000, "Time between two aggregated \"authentication "
        "failed\" log lines.", group=G_SECURITY, bounds=(100, _DAY_MS), unit="ms")
    max_batch_size: int = setting(
        "maxBatchSize", 16 * MIB, "Largest `mput`/`msync` body (refused from its header, "
        "skipped unbuffered); at least `maxMessageSize`.", group=G_LIMITS,
        bounds=(1, (1 << 31) - 1), unit="bytes")
    auth_timeout_ms: int = setting(
        "authTimeout", 10_000, "How long a connection may stay unauthenticated when a secret "
        "is required (then 408 and close); 0 = no limit.", group=G_SECURITY,
        bounds=(0, _DAY_MS), unit="ms")
    frame_timeout_ms: int = setting(
        "frameTimeout", 30_000, "How long a started frame (header and body) may take to "
        "complete (then 408 and close); not counted while the broker itself paused reading; "
        "0 = no limit.", group=G_LIMITS, bounds=(0, _DAY_MS), unit="ms")
    idle_timeout_ms: int = setting(
        "idleTimeout", 300_000, "A connection silent in both directions this long that "
        "waits for nothing (no queued reply, parked get, open transaction, queue "
        "subscription or replication link) is closed; 0 = off. Clients keep their "
        "connections with a `version` heartbeat well inside it (notify's after 30 s without "
        "a request, MetaQ's Java client after 10 s idle).", group=G_LIMITS,
        bounds=(0, 30 * _DAY_MS), unit="ms")
    max_parked_gets: int = setting(
        "maxParkedGets", 1024, "Long-poll gets held per connection (503 beyond); released "
        "when the connection closes.", group=G_LIMITS, bounds=(1, 1_000_000))
    max_queued_replies: int = setting(
        "maxQueuedReplies", 65_536, "Replies queued per connection before the broker stops "
        "reading it (it resumes at half).", group=G_LIMITS, bounds=(16, 10_000_000))
    delay: DelayConfig = field(default_factory=DelayConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    max_header_size: int = setting(
        "maxHeaderSize", 4 * KIB, "Longest wire request header line (CRLF excluded): a line "
        "past it is a fatal framing error (400, closed).", group=G_LIMITS,
        bounds=(512, 64 * KIB), unit="bytes")
    write_buffer_size: int = setting(
        "writeBufferSize", 4 * MIB, "Reply bytes buffered per wire connection before the "
        "broker stops reading it (it resumes at a quarter).", group=G_LIMITS,
        bounds=(64 * KIB, GIB), unit="bytes")
    max_long_poll_wait_ms: int = setting(
        "maxLongPollWait", 60_000, "Longest a long-polling `get` is held (wire: capped; "
        "MetaQ HTTP `/get?maxWait=`: 400 beyond).", group=G_LIMITS, bounds=(0, 3_600_000),
        unit="ms")
    queues: QueueConfig = field(default_factory=QueueConfig)
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

    zk_enable: bool = setting("zk.zkEnable", False, "true: brokers register in ZooKeeper "
                              "in MetaQ's layout and clients may find them there; false: "
                              "the embedded single-machine mode.", group=G_ZK, conv=_bool,
                              metaq=True)
    zk_connect: str = setting("zk.zkConnect", "127.0.0.1:2181", "ZooKeeper connect string.",
                              group=G_ZK, conv=_str, metaq=True)
    zk_root: str = setting("zk.zkRoot", "/meta", "Root of the broker and consumer nodes.",
                           group=G_ZK, conv=_str, metaq=True)
    zk_session_timeout_ms: int = setting(
        "zk.zkSessionTimeoutMs", 30000, "ZooKeeper session timeout: how long a dead broker "
        "stays registered (and, with `autoFailover`, how long before a slave takes over).",
        group=G_ZK, bounds=(1, _DAY_MS), unit="ms", metaq=True)
    zk_connection_timeout_ms: int = setting(
        "zk.zkConnectionTimeoutMs", 30000, "Time to connect to ZooKeeper.", group=G_ZK,
        bounds=(1, _DAY_MS), unit="ms", metaq=True)
    zk_sync_time_ms: int = setting("zk.zkSyncTimeMs", 5000, "Accepted for compatibility "
                                   "(MetaQ's ZooKeeper sync time).", group=G_ZK,
                                   bounds=(1, _DAY_MS), unit="ms", metaq=True)


@dataclass(frozen=True)
class SlaveConfig:
    """``[slave]`` (MetaQ's async_slave.properties): present = this broker is a slave.

    ``master_address`` names the master in embedded mode (with ZooKeeper the master of the
    same brokerId is looked up instead).
    """

    slave_id: int = setting("slaveId", 0, "This slave's member id in its group (give "
                            "slaves 1, 2, ...).", group=G_SLAVE, bounds=(0, 1023), metaq=True)
    slave_group: str = setting("slaveGroup", "meta-slave-group", "The consumer group the "
                               "slave reads its master as.", group=G_SLAVE, conv=_str,
                               metaq=True)
    slave_max_delay_in_mills: int = setting(
        "slaveMaxDelayInMills", 500, "Longest wait of a slave's long-poll pull.",
        group=G_SLAVE, bounds=(1, _DAY_MS), unit="ms", metaq=True)
    auto_sync_master_config: bool = setting(
        "autoSyncMasterConfig", True, "Follow the master's topic list.", group=G_SLAVE,
        conv=_bool, metaq=True)
    master_address: str = setting(
        "masterAddress", "", "`host:port` of the master when there is no ZooKeeper (with "
        "ZooKeeper the master of the same `brokerId` is looked up).", group=G_SLAVE,
        conv=_str)


@dataclass(frozen=True)
class ProducerGroupConfig:
    """``[producerGroup=NAME]``: a producer group whose ``register`` needs a secret."""

    secret: str = setting("secret", "", "The secret a producer must give to register in "
                          "this group (and so answer its half messages' check-backs); "
                          "required in the section.", group=G_PRODUCER_GROUP, conv=_secret)


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
#: section name -> the config object its keys fill
SECTIONS: Final[dict[str, type]] = {
    "system": SystemConfig,
    "zookeeper": ZookeeperConfig,
    "slave": SlaveConfig,
    "topic": TopicConfig,
    "producerGroup": ProducerGroupConfig,
}


#: ``[system]``'s typed sections: attribute of SystemConfig -> its class
SYSTEM_SECTIONS: Final[dict[str, type]] = {
    "tls": TlsConfig,
    "http": HttpConfig,
    "queues": QueueConfig,
    "delay": DelayConfig,
    "replication": ReplicationConfig,
    "failover": FailoverConfig,
}


def _metas(cls: type) -> list[tuple[str, _Meta]]:
    """(attribute, setting) of every key of ``cls`` in declaration order; a typed section's
    keys in its place, their attribute dotted (``tls.cert_file``)."""
    out: list[tuple[str, _Meta]] = []
    for f in fields(cls):
        if _META in f.metadata:
            out.append((f.name, f.metadata[_META]))
        elif cls is SystemConfig and f.name in SYSTEM_SECTIONS:
            out += [(f"{f.name}.{a}", m) for a, m in _metas(SYSTEM_SECTIONS[f.name])]
    return out


def _table(cls: type) -> dict[str, tuple[str, _Conv]]:
    """ini key -> (attribute, converter) of a section."""
    return {m.key: (attr, m.conv) for attr, m in _metas(cls)}


def _default(cls: type, attr: str) -> Any:
    """The default of ``attr`` (dotted for a typed section's key) of config class ``cls``."""
    if "." in attr:
        section, attr = attr.split(".", 1)
        return _default(SYSTEM_SECTIONS[section], attr)
    f = next(f for f in fields(cls) if f.name == attr)
    return f.default_factory() if callable(f.default_factory) else f.default


def _build_system(kw: dict[str, Any]) -> SystemConfig:
    """SystemConfig from converted ``[system]`` values, dotted attributes into sections."""
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for attr, value in kw.items():
        section, _, name = attr.partition(".")
        if name:
            parts.setdefault(section, {})[name] = value
        else:
            top[attr] = value
    for section, values in parts.items():
        top[section] = SYSTEM_SECTIONS[section](**values)
    return SystemConfig(**top)


def settings() -> tuple[Setting, ...]:
    """Every ``server.ini`` key of every section, in declaration order: the one list the
    configuration reference is generated from."""
    out: list[Setting] = []
    system = _metas(SystemConfig)
    for section, cls in SECTIONS.items():
        for attr, m in _metas(cls):
            default = _default(cls, attr)
            doc = m.doc
            if m.inherited:
                doc = next(s.doc for a, s in system if s.key == m.key)
            out.append(
                Setting(m.key, section, attr, _KINDS.get(m.conv, "string"), default, doc,
                        m.group, m.unit, m.range, m.choices, m.metaq, m.inherited)
            )
    return tuple(out)


_SYSTEM_KEYS: Final = _table(SystemConfig)
_ZK_KEYS: Final = _table(ZookeeperConfig)
_GROUP_KEYS: Final = _table(ProducerGroupConfig)
_SLAVE_KEYS: Final = _table(SlaveConfig)
_TOPIC_KEYS: Final = _table(TopicConfig)
#: topic-level attributes inherited from [system]
_INHERITED: Final = tuple(attr for attr, m in _metas(TopicConfig) if m.inherited)

SYSTEM_KEYS: Final = tuple(_SYSTEM_KEYS)
ZOOKEEPER_KEYS: Final = tuple(_ZK_KEYS)
TOPIC_KEYS: Final = tuple(_TOPIC_KEYS)


def _convert(
    section: str, items: dict[str, str], table: dict[str, tuple[str, _Conv]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in items.items():
        if key not in table:
            raise ConfigError(f"[{section}] {key}: unknown key {key!r}{_nearest(key, table)}")
        attr, conv = table[key]
        try:
            out[attr] = conv(raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"[{section}] {key}: invalid value {raw.strip()!r}: {e}") from None
    return out


def _nearest(key: str, known: dict[str, Any]) -> str:
    """``; did you mean 'x'?`` for the known key closest to ``key`` (case ignored)."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {by_lower[close[0]]!r}?"
    return " (no known key is close; the configuration reference lists them all)"


#: ``[section] key:`` at the start of a ConfigError message (``key`` optional).
_ERROR_AT: Final = re.compile(r"\[([^\]\r\n]+)\](?: ([\w.]+))?[: ]")


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """The 1-based line of ``key`` in ``[section]`` of ``text`` (of the section header when
    ``key`` is None or not written there), None when the section is not in the text."""
    current, header = None, None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped[1 : stripped.find("]")].strip() if "]" in stripped else None
            if current == section and header is None:
                header = n
        elif current == section and key and re.match(rf"{re.escape(key)}\s*[=:]", stripped):
            return n
    return header


def _located(e: ConfigError, text: str, where: str) -> ConfigError:
    """``e`` with the file and line it is about in front (``path:LINE: [section] key: ...``)."""
    msg = str(e)
    if msg.startswith(where):
        return e
    m = _ERROR_AT.match(msg)
    line = _line_of(text, m.group(1), m.group(2)) if m else None
    return ConfigError(f"{where}:{line}: {msg}" if line else f"{where}: {msg}")


def _check_ranges(section: str, obj: object) -> None:
    """Every numeric key within its range, every choice among its choices, key named."""
    for attr, m in _metas(type(obj)):
        value = attrgetter(attr)(obj)
        if m.range is not None:
            lo, hi = m.range
            if not lo <= value <= hi:
                raise ConfigError(f"[{section}] {m.key}: {value} is out of range {lo}..{hi}")
        if m.choices and value not in m.choices:
            raise ConfigError(
                f"[{section}] {m.key}: must be {' or '.join(m.choices)}, got {value!r}"
            )


def _check_system(s: SystemConfig) -> None:
    def need(cond: bool, key: str, what: str) -> None:
        if not cond:
            raise ConfigError(f"[system] {key}: {what}")

    _check_ranges("system", s)
    need(
        s.num_partitions <= s.max_partitions_per_topic,
        "numPartitions",
        f"{s.num_partitions} exceeds maxPartitionsPerTopic {s.max_partitions_per_topic}",
    )
    need(
        not s.admin_secret or s.admin_secret != s.auth_secret,
        "adminSecret",
        "must differ from authSecret (else anyone who may publish may also administer)",
    )
    need(s.replication.sync_slave_timeout_ms >= 1, "syncSlaveTimeout", "must be >= 1")
    need(s.replication.sync_slave_max_failures >= 1, "syncSlaveMaxFailures", "must be >= 1")
    need(s.max_tx_timeout_timer_capacity >= 1, "maxTxTimeoutTimerCapacity", "must be >= 1")
    need(s.max_batch_size >= s.max_message_size, "maxBatchSize", "must be >= maxMessageSize")
    need(s.max_batch_size < 1 << 31, "maxBatchSize", "must be < 2 GiB")
    need(s.auth_timeout_ms >= 0, "authTimeout", "must be >= 0 (0 = no limit)")
    need(s.frame_timeout_ms >= 0, "frameTimeout", "must be >= 0 (0 = no limit)")
    need(s.idle_timeout_ms >= 0, "idleTimeout", "must be >= 0 (0 = no limit)")
    need(s.max_parked_gets >= 1, "maxParkedGets", "must be >= 1")
    need(s.max_queued_replies >= 16, "maxQueuedReplies", "must be >= 16")
    need(s.delay.max_delay_ms >= 1, "maxDelay", "must be >= 1")
    tls = s.tls
    need(
        (tls.cert_file is None) == (tls.key_file is None),
        "tlsCertFile",
        "tlsCertFile and tlsKeyFile go together",
    )
    need(
        not tls.client_auth or (tls.ca_file is not None and tls.cert_file is not None),
        "tlsClientAuth",
        "needs tlsCaFile (the CA client certificates must chain to) and tlsCertFile/tlsKeyFile",
    )
    secrets = [x for x in (s.auth_secret, s.admin_secret, s.replication.secret) if x]
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
    _check_ranges(sec, t)
    try:
        _check_delete_when(t.delete_when)
    except ConfigError as e:
        raise ConfigError(f"[{sec}] {e}") from None
    if t.num_partitions > max_partitions:
        raise ConfigError(
            f"[{sec}] numPartitions: {t.num_partitions} exceeds maxPartitionsPerTopic "
            f"{max_partitions}"
        )


def parse_config(text: str, source: Path | None = None) -> ServerConfig:
    """Parse the text of a ``server.ini``; raise ConfigError naming the file, the line and
    the offending key (with the nearest known key when it is unknown)."""
    where = str(source) if source else "<config>"
    try:
        return _parse_config(text, source)
    except ConfigError as e:
        raise _located(e, text, where) from None


def _parse_config(text: str, source: Path | None) -> ServerConfig:
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
            close = difflib.get_close_matches(name, ("system", "zookeeper", "slave"), n=1)
            raise ConfigError(
                f"[{name}]: unknown section"
                + (f"; did you mean [{close[0]}]?" if close else "")
                + " (expected [system], [zookeeper], [slave], [topic=NAME], [producerGroup=NAME])"
            )
    system = _build_system(sys_kw)
    tls = system.tls
    system = replace(
        system,
        data_path=resolve(system.data_path) or system.data_path,
        data_log_path=resolve(system.data_log_path),
        tls=replace(
            tls,
            cert_file=resolve(tls.cert_file),
            key_file=resolve(tls.key_file),
            ca_file=resolve(tls.ca_file),
        ),
    )
    _check_system(system)
    zookeeper = ZookeeperConfig(**zk_kw)
    _check_ranges("zookeeper", zookeeper)
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
        _check_ranges("slave", slave)
    if (slave is not None or system.replication.sync_slave) and not system.replication.secret:
        # without it anyone could write into a slave: replication always authenticates
        raise ConfigError(
            f"[system] replicationSecret: required by {'[slave]' if slave else 'syncSlave'} "
            "(master and slaves share it; replication links authenticate with it)"
        )
    if system.failover.enabled and not (zookeeper.zk_enable and system.replication.secret):
        raise ConfigError(
            "[system] autoFailover: needs [zookeeper] zk.zkEnable=true (the election and the "
            "epoch live in ZooKeeper) and replicationSecret"
        )
    if system.failover.enabled and not system.server_port:
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


def system_values(system: SystemConfig) -> list[tuple[str, str, object]]:
    """(attribute, ini key, value) of every ``[system]`` key, a typed section's attribute
    dotted (``tls.cert_file``); secrets (:data:`SECRET_KEYS`) set are shown as ``***``."""
    out: list[tuple[str, str, object]] = []
    for attr, m in _metas(SystemConfig):
        value = attrgetter(attr)(system)
        if m.key in SECRET_KEYS and value:
            value = "***"
        out.append((attr, m.key, value))
    return out


def describe(config: ServerConfig) -> list[tuple[str, object]]:
    """Flattened ``key value`` pairs (for ``stats config``)."""
    out: list[tuple[str, object]] = [
        (f"system.{attr}", value) for attr, _key, value in system_values(config.system)
    ]
    for f in fields(config.zookeeper):
        out.append((f"zookeeper.{f.name}", getattr(config.zookeeper, f.name)))
    for t in config.topics.values():
        for f in fields(t):
            if f.name != "name":
                out.append((f"topic.{t.name}.{f.name}", getattr(t, f.name)))
    return out


#: ini keys whose values ``stats config`` never shows.
SECRET_KEYS: Final = frozenset({"authSecret", "adminSecret", "replicationSecret", "secret"})
#: notify's own ini keys (every setting MetaQ's ``MetaConfig`` does not know). MetaQ rejects
#: keys it does not know, so ``stats config`` serves them commented out.
EXTENSION_KEYS: Final = frozenset(s.key for s in settings() if not s.metaq)
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
