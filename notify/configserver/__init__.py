"""configserver: cluster membership and discovery for notify (MetaQ's ZooKeeper layout).

One interface, :class:`ConfigServer`, two backends:

* **ZooKeeper** (kazoo) - ``ConfigServer.zookeeper("127.0.0.1:2181", "/meta")`` or
  ``ConfigServer.from_url("127.0.0.1:2181/meta")``. Nodes, paths and values are MetaQ's
  (:mod:`configserver._layout`), so MetaQ-era tools and clients read them.
* **embedded** - ``ConfigServer.embedded()``: an in-process tree with the same semantics
  (sessions, ephemeral nodes, one-shot watches). The quickstart default of a broker
  without ZooKeeper (``zk.zkEnable=false``): the broker registers there, clients use static
  addresses (``connect(["host:port"])``) and a static share of partitions. Consumers of
  one process may share an embedded configserver to rebalance among themselves.

Users::

    # broker (notify.broker.app): BrokerRegistrar registers on start, on reload, unregisters on stop
    # client:
    with connect(zk="127.0.0.1:2181/meta") as session:      # ZkBrokerDirectory + rebalancing
        ...

Modules: ``_layout`` (paths and values, pure), ``_nodes`` (the NodeStore Protocol and the
in-memory tree), ``_kazoo`` (ZooKeeper), ``_server`` (ConfigServer), ``_assign``
(strategies, pure), ``_group`` (GroupMember: rebalancing), ``_broker`` (BrokerRegistrar).
"""

from ._assign import (
    AssignmentStrategy,
    ConsistentHashStrategy,
    ContiguousStrategy,
    get_strategy,
)
from ._broker import BrokerRegistrar, resolve_master
from ._errors import (
    BadVersionError,
    ConfigServerError,
    ConfigServerUnavailableError,
    NodeExistsError,
    NoNodeError,
)
from ._group import AssignmentTarget, GroupMember, new_consumer_id
from ._layout import BrokerRegistration, Layout, TopicRegistration
from ._nodes import MemoryNodeStore, MemoryZooKeeper, NodeStat, NodeStore, SessionState
from ._server import BrokerInfo, ConfigServer, PartitionInfo, parse_url

__all__ = [
    "AssignmentStrategy",
    "AssignmentTarget",
    "BadVersionError",
    "BrokerInfo",
    "BrokerRegistrar",
    "BrokerRegistration",
    "ConfigServer",
    "ConfigServerError",
    "ConfigServerUnavailableError",
    "ConsistentHashStrategy",
    "ContiguousStrategy",
    "GroupMember",
    "Layout",
    "MemoryNodeStore",
    "MemoryZooKeeper",
    "NoNodeError",
    "NodeExistsError",
    "NodeStat",
    "NodeStore",
    "PartitionInfo",
    "SessionState",
    "TopicRegistration",
    "get_strategy",
    "new_consumer_id",
    "parse_url",
    "resolve_master",
]
