"""MetaQ's ZooKeeper layout: node paths and node values, as pure functions (no I/O).

Under the root (``zk.zkRoot``, default ``/meta``); parents are persistent, leaves as marked::

    brokers/ids/<id>/master                       meta://host:port                   ephemeral
    brokers/ids/<id>/slave<N>                     meta://host:port                   ephemeral
    brokers/ids/<id>/master_config_checksum       <CRC32 of the served server.ini>   ephemeral
    brokers/topics/<topic>/<id>-m                 <numPartitions>  (legacy clients)  ephemeral
    brokers/topics/<topic>/<id>-s<N>              <numPartitions>  (a slave)         ephemeral
    brokers/topics-pub/<topic>/<id>-m             {"numParts":N,"broker":"<id>-m"}   ephemeral
    brokers/topics-sub/<topic>/<id>-m             {"numParts":N,"broker":"<id>-m"}   ephemeral
    brokers/topics-sub/<topic>/<id>-s<N>          {"numParts":N,"broker":"<id>-s<N>"}
    consumers/<group>/ids/<consumerId>            topic1,topic2                      ephemeral
    consumers/<group>/owners/<topic>/<id>-<part>  <consumerId>                       ephemeral
    consumers/<group>/offsets/<topic>/<id>-<part> <msgId>-<offset>   (notify.offsets.zookeeper)
    consumers/<group>/queue-ids/<topic>/<consumerId>  <topic>  (notify queue consumer)  ephemeral

``topics-pub`` nodes exist only for topics with ``acceptPublish``, ``topics-sub`` nodes only
with ``acceptSubscribe``; a slave never registers ``topics-pub``. Values are UTF-8 without a
trailing newline; the JSON is compact (no spaces), key order ``numParts`` then ``broker``.
A consumer id is MetaQ's ``<group>_<host>-<pid>-<millis>-<n>``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ._errors import ConfigServerError

__all__ = [
    "BrokerRegistration",
    "Layout",
    "TopicRegistration",
    "broker_key",
    "decode_address",
    "decode_topic_broker",
    "decode_topics",
    "encode_address",
    "encode_topic_broker",
    "encode_topics",
    "parse_broker_key",
    "partition_id",
]

DEFAULT_ROOT = "/meta"
_BROKER_KEY_RE = re.compile(r"(\d+)-(m|s(\d+))")
_NAME_RE = re.compile(r"[^/\x00]+")


def _name(kind: str, value: str) -> str:
    if not _NAME_RE.fullmatch(value) or value in (".", ".."):
        raise ConfigServerError(f"invalid {kind} for a ZooKeeper path: {value!r}")
    return value


def normalize_root(root: str) -> str:
    """``"/meta"`` for ``"meta"``, ``"/meta/"``; ``""`` for ``"/"``."""
    stripped = root.strip().strip("/")
    return "/" + stripped if stripped else ""


def broker_key(broker_id: int, slave_id: int | None = None) -> str:
    """``"<id>-m"`` for a master, ``"<id>-s<N>"`` for slave N."""
    return f"{broker_id}-m" if slave_id is None else f"{broker_id}-s{slave_id}"


def parse_broker_key(key: str) -> tuple[int, int | None]:
    """Inverse of :func:`broker_key`: ``(broker_id, slave_id or None)``."""
    m = _BROKER_KEY_RE.fullmatch(key)
    if m is None:
        raise ValueError(f"not a broker key (<id>-m or <id>-s<N>): {key!r}")
    return int(m.group(1)), None if m.group(3) is None else int(m.group(3))


def partition_id(broker_id: int, partition: int) -> str:
    """MetaQ's global partition name ``"<brokerId>-<part>"``."""
    return f"{broker_id}-{partition}"


def encode_address(host: str, port: int) -> bytes:
    """``meta://host:port``."""
    return f"meta://{host}:{port}".encode()


def decode_address(raw: bytes) -> str:
    """``"host:port"`` of a ``meta://host:port`` value."""
    text = raw.decode("utf-8").strip()
    return text.removeprefix("meta://")


def encode_topic_broker(num_parts: int, key: str) -> bytes:
    """``{"numParts":N,"broker":"<key>"}`` (compact JSON, MetaQ's field order)."""
    return json.dumps({"numParts": num_parts, "broker": key}, separators=(",", ":")).encode()


def decode_topic_broker(raw: bytes) -> tuple[int, str]:
    """``(numParts, broker key)`` of a topics-pub/topics-sub value; a bare number is accepted."""
    text = raw.decode("utf-8").strip()
    if text.isdigit():
        return int(text), ""
    obj = json.loads(text)
    if not isinstance(obj, dict) or not isinstance(obj.get("numParts"), int):
        raise ValueError(f"not a topic-broker value: {text[:80]!r}")
    return int(obj["numParts"]), str(obj.get("broker", ""))


def encode_topics(topics: list[str] | tuple[str, ...]) -> bytes:
    """A consumer id node's value: the subscribed topics joined by commas."""
    return ",".join(topics).encode()


def decode_topics(raw: bytes) -> tuple[str, ...]:
    """Inverse of :func:`encode_topics` (blank: no topic)."""
    text = raw.decode("utf-8").strip()
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True, slots=True)
class TopicRegistration:
    """What a broker publishes about one topic."""

    topic: str
    num_partitions: int
    accept_publish: bool = True
    accept_subscribe: bool = True


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A broker (master, or slave ``slave_id``) and its topics."""

    broker_id: int
    host: str
    port: int
    topics: tuple[TopicRegistration, ...] = ()
    slave_id: int | None = None
    #: CRC32 of the config a master serves with ``stats config`` (None: not published)
    config_checksum: int | None = None

    @property
    def key(self) -> str:
        """``"<id>-m"`` / ``"<id>-s<N>"``."""
        return broker_key(self.broker_id, self.slave_id)

    @property
    def address(self) -> str:
        """``"host:port"``."""
        return f"{self.host}:{self.port}"


class Layout:
    """The node paths under one root."""

    def __init__(self, root: str = DEFAULT_ROOT):
        self.root = normalize_root(root)

    # -- brokers

    @property
    def broker_ids(self) -> str:
        return f"{self.root}/brokers/ids"

    def broker_dir(self, broker_id: int) -> str:
        return f"{self.broker_ids}/{broker_id}"

    def broker_node(self, broker_id: int, slave_id: int | None = None) -> str:
        """``ids/<id>/master`` or ``ids/<id>/slave<N>``."""
        leaf = "master" if slave_id is None else f"slave{slave_id}"
        return f"{self.broker_dir(broker_id)}/{leaf}"

    def failover_epoch(self, broker_id: int) -> str:
        """``<root>/failover/<id>/epoch``: automatic failover's epoch node of broker group
        ``id`` (:mod:`notify.protocol.failover`; absent when the group does not fail over)."""
        return f"{self.root}/failover/{broker_id}/epoch"

    def master_config_checksum(self, broker_id: int) -> str:
        """``ids/<id>/master_config_checksum``: a MetaQ slave with ``autoSyncMasterConfig``
        fetches ``stats config`` when this differs from its own file's CRC32."""
        return f"{self.broker_dir(broker_id)}/master_config_checksum"

    def topics_dir(self, kind: str = "topics") -> str:
        """``brokers/topics``, ``brokers/topics-pub`` or ``brokers/topics-sub``."""
        if kind not in ("topics", "topics-pub", "topics-sub"):
            raise ValueError(f"unknown topic registry {kind!r}")
        return f"{self.root}/brokers/{kind}"

    def topic_dir(self, kind: str, topic: str) -> str:
        return f"{self.topics_dir(kind)}/{_name('topic', topic)}"

    def topic_broker(self, kind: str, topic: str, key: str) -> str:
        return f"{self.topic_dir(kind, topic)}/{key}"

    def broker_nodes(self, reg: BrokerRegistration) -> dict[str, bytes]:
        """Every ephemeral node of a registration, with its value (insertion order = creation
        order: the address first, then per topic the legacy, pub and sub nodes)."""
        key = reg.key
        out = {self.broker_node(reg.broker_id, reg.slave_id): encode_address(reg.host, reg.port)}
        if reg.slave_id is None and reg.config_checksum is not None:
            out[self.master_config_checksum(reg.broker_id)] = str(reg.config_checksum).encode()
        for t in sorted(reg.topics, key=lambda t: t.topic):
            out[self.topic_broker("topics", t.topic, key)] = str(t.num_partitions).encode()
            value = encode_topic_broker(t.num_partitions, key)
            if t.accept_publish and reg.slave_id is None:
                out[self.topic_broker("topics-pub", t.topic, key)] = value
            if t.accept_subscribe:
                out[self.topic_broker("topics-sub", t.topic, key)] = value
        return out

    # -- consumers

    def group_dir(self, group: str) -> str:
        return f"{self.root}/consumers/{_name('group', group)}"

    def consumer_ids(self, group: str) -> str:
        return f"{self.group_dir(group)}/ids"

    def consumer_node(self, group: str, consumer_id: str) -> str:
        return f"{self.consumer_ids(group)}/{_name('consumer id', consumer_id)}"

    def owners_dir(self, group: str, topic: str) -> str:
        return f"{self.group_dir(group)}/owners/{_name('topic', topic)}"

    def owner_node(self, group: str, topic: str, partition: str) -> str:
        return f"{self.owners_dir(group, topic)}/{_name('partition', partition)}"

    def queue_consumer_node(self, group: str, topic: str, consumer_id: str) -> str:
        """A live consumer of queue group ``group`` of ``topic`` (notify's extension beside
        MetaQ's ``ids``; brokers drop the consumer when this node goes, README "Queues")."""
        return (
            f"{self.group_dir(group)}/queue-ids/{_name('topic', topic)}/"
            f"{_name('consumer id', consumer_id)}"
        )

    def offset_node(self, group: str, topic: str, partition: str) -> str:
        """Where :class:`notify.offsets.ZooKeeperOffsetStore` keeps the group's offset."""
        return f"{self.group_dir(group)}/offsets/{_name('topic', topic)}/{partition}"
