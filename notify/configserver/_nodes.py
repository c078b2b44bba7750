"""The node store under the configserver: a ZooKeeper-shaped tree behind one Protocol.

:class:`NodeStore` is the small set of ZooKeeper operations the configserver needs
(create persistent/ephemeral, get, children, exists, set, delete, one-shot watches, session
state). Two implementations:

* :class:`~configserver._kazoo.KazooNodeStore` - a real ZooKeeper through kazoo;
* :class:`MemoryNodeStore` - a session on an in-process :class:`MemoryZooKeeper` (the
  embedded backend and the tests' twin). It follows ZooKeeper's semantics where the
  configserver depends on them: ephemeral nodes belong to a session and vanish when it
  expires; watches are one-shot, fire on change or deletion, and are dropped (fired with no
  event) when the session's connection is suspended; a lost session comes back as a new one.

Watchers and state listeners may be called on any thread (kazoo's); they must not block.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ._errors import (
    BadVersionError,
    ConfigServerError,
    ConfigServerUnavailableError,
    NodeExistsError,
    NoNodeError,
)

__all__ = [
    "MemoryNodeStore",
    "MemoryZooKeeper",
    "NodeStat",
    "NodeStore",
    "SessionState",
    "StateListener",
    "Watcher",
]

Watcher = Callable[[object], None]
"""A one-shot watch: called once (any thread) with an opaque event when the node changes."""


class SessionState(enum.Enum):
    """Session state, as kazoo simplifies it."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"  # connection lost; the session (and its ephemeral nodes) may live
    LOST = "lost"  # session expired or never established: ephemeral nodes are gone


StateListener = Callable[[SessionState], None]


@dataclass(frozen=True, slots=True)
class NodeStat:
    """What the configserver reads of a ZooKeeper ``Stat``."""

    version: int
    ephemeral_owner: int  # session id of the owner; 0 = persistent


@runtime_checkable
class NodeStore(Protocol):
    """ZooKeeper operations (async, on the caller's loop). Paths are absolute."""

    @property
    def state(self) -> SessionState:
        """The current session state."""
        ...

    @property
    def session_id(self) -> int:
        """The current session id (0 when none)."""
        ...

    @property
    def description(self) -> str:
        """Where the store points (for messages)."""
        ...

    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener`` with every state change (on any thread)."""
        ...

    async def start(self, timeout_s: float) -> bool:
        """Connect; True when connected within ``timeout_s`` (it keeps trying otherwise)."""
        ...

    async def close(self) -> None:
        """Close the session (its ephemeral nodes go at once)."""
        ...

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        """Create ``path`` (missing parents persistent); NodeExistsError if it exists."""
        ...

    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, NodeStat]:
        """Value and stat; NoNodeError. ``watch`` fires on change or deletion."""
        ...

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        """Child names; NoNodeError. ``watch`` fires when children come or go."""
        ...

    async def exists(self, path: str, watch: Watcher | None = None) -> NodeStat | None:
        """Stat or None. ``watch`` fires on creation, change or deletion."""
        ...

    async def set(self, path: str, data: bytes, version: int = -1) -> None:
        """Replace the value (``version`` -1: any); NoNodeError, BadVersionError."""
        ...

    async def delete(self, path: str, version: int = -1) -> None:
        """Delete a leaf; NoNodeError, BadVersionError."""
        ...


# ---------------------------------------------------------------------------- in memory


@dataclass
class _Node:
    data: bytes
    owner: int
    version: int = 0
    children: set[str] = field(default_factory=set)


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _check_path(path: str) -> None:
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise ConfigServerError(f"invalid node path {path!r}")


class MemoryZooKeeper:
    """An in-process ZooKeeper tree shared by :class:`MemoryNodeStore` sessions (thread-safe).

    :meth:`expire` and :meth:`suspend`/:meth:`resume` let tests drive session trouble.
    """

    _default: MemoryZooKeeper | None = None
    _default_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {"/": _Node(b"", 0)}
        self._data_watches: dict[str, set[Watcher]] = {}
        self._child_watches: dict[str, set[Watcher]] = {}
        self._sessions = itertools.count(0x1000)

    @classmethod
    def default(cls) -> MemoryZooKeeper:
        """The process-wide tree (the embedded configserver of a broker without ZooKeeper)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def new_session(self) -> int:
        return next(self._sessions)

    # -- tree operations (under the lock; watchers collected and fired after)

    def create(self, path: str, data: bytes, owner: int) -> None:
        _check_path(path)
        fire: list[Watcher] = []
        with self._lock:
            if path in self._nodes:
                raise NodeExistsError(path)
            # missing parents, persistent
            chain = []
            p = _parent(path)
            while p not in self._nodes:
                chain.append(p)
                p = _parent(p)
            for q in reversed([*chain]):
                self._add(q, b"", 0, fire)
            parent = self._nodes[_parent(path)]
            if parent.owner:
                raise ConfigServerError(f"ephemeral node {_parent(path)} cannot have children")
            self._add(path, data, owner, fire)
        _fire(fire)

    def _add(self, path: str, data: bytes, owner: int, fire: list[Watcher]) -> None:
        self._nodes[path] = _Node(data, owner)
        par = _parent(path)
        self._nodes[par].children.add(path.rsplit("/", 1)[1])
        fire.extend(self._data_watches.pop(path, ()))
        fire.extend(self._child_watches.pop(par, ()))

    def get(self, path: str, watch: Watcher | None) -> tuple[bytes, NodeStat]:
        with self._lock:
            node = self._nodes.get(path)
            if node is None:
                raise NoNodeError(path)
            if watch is not None:
                self._data_watches.setdefault(path, set()).add(watch)
            return node.data, NodeStat(node.version, node.owner)

    def children(self, path: str, watch: Watcher | None) -> list[str]:
        with self._lock:
            node = self._nodes.get(path)
            if node is None:
                raise NoNodeError(path)
            if watch is not None:
                self._child_watches.setdefault(path, set()).add(watch)
            return sorted(node.children)

    def exists(self, path: str, watch: Watcher | None) -> NodeStat | None:
        with self._lock:
            if watch is not None:
                self._data_watches.setdefault(path, set()).add(watch)
            node = self._nodes.get(path)
            return None if node is None else NodeStat(node.version, node.owner)

    def set(self, path: str, data: bytes, version: int) -> None:
        with self._lock:
            node = self._nodes.get(path)
            if node is None:
                raise NoNodeError(path)
            if version != -1 and version != node.version:
                raise BadVersionError(path)
            node.data = data
            node.version += 1
            fire = list(self._data_watches.pop(path, ()))
        _fire(fire)

    def delete(self, path: str, version: int) -> None:
        fire: list[Watcher] = []
        with self._lock:
            self._delete(path, version, fire)
        _fire(fire)

    def _delete(self, path: str, version: int, fire: list[Watcher]) -> None:
        node = self._nodes.get(path)
        if node is None or path == "/":
            raise NoNodeError(path)
        if version != -1 and version != node.version:
            raise BadVersionError(path)
        if node.children:
            raise ConfigServerError(f"node {path} has children")
        del self._nodes[path]
        par = _parent(path)
        self._nodes[par].children.discard(path.rsplit("/", 1)[1])
        fire.extend(self._data_watches.pop(path, ()))
        fire.extend(self._child_watches.pop(path, ()))
        fire.extend(self._child_watches.pop(par, ()))

    def drop_session(self, session: int) -> None:
        """Delete the ephemeral nodes of ``session`` (closed or expired)."""
        fire: list[Watcher] = []
        with self._lock:
            for path in sorted((p for p, n in self._nodes.items() if n.owner == session), key=len):
                if path in self._nodes:
                    self._delete(path, -1, fire)
        _fire(fire)

    def drop_watches(self, watches: AbstractSet[Watcher]) -> None:
        """Forget ``watches`` (their session's connection dropped) and fire them."""
        with self._lock:
            for table in (self._data_watches, self._child_watches):
                for path in list(table):
                    table[path] -= watches
                    if not table[path]:
                        del table[path]
        _fire(list(watches))

    def dump(self, path: str = "/") -> dict[str, tuple[bytes, bool]]:
        """``{path: (value, ephemeral)}`` of every node under ``path`` (tests, tools)."""
        with self._lock:
            prefix = path.rstrip("/") + "/"
            return {
                p: (n.data, bool(n.owner))
                for p, n in sorted(self._nodes.items())
                if p.startswith(prefix) or p == path
            }

    # -- test hooks acting on a session

    def expire(self, store: MemoryNodeStore) -> None:
        """Expire ``store``'s session, as ZooKeeper does after a session timeout."""
        store._expire()

    def suspend(self, store: MemoryNodeStore) -> None:
        """Cut ``store``'s connection (its session and ephemeral nodes live on)."""
        store._suspend()

    def resume(self, store: MemoryNodeStore) -> None:
        """Give ``store`` its connection back (same session)."""
        store._resume()


def _fire(watches: list[Watcher]) -> None:
    for w in watches:
        w(None)


class MemoryNodeStore:
    """One session on a :class:`MemoryZooKeeper` (the embedded backend's node store)."""

    def __init__(self, tree: MemoryZooKeeper | None = None):
        self.tree = tree if tree is not None else MemoryZooKeeper.default()
        self._state = SessionState.LOST
        self._session = 0
        self._listeners: list[StateListener] = []
        self._watches: set[Watcher] = set()
        self._lock = threading.Lock()

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def session_id(self) -> int:
        return self._session

    @property
    def description(self) -> str:
        return "embedded"

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def _set_state(self, state: SessionState) -> None:
        if state is self._state:
            return
        self._state = state
        for cb in list(self._listeners):
            cb(state)

    async def start(self, timeout_s: float) -> bool:
        if self._state is SessionState.LOST:
            self._session = self.tree.new_session()
            self._set_state(SessionState.CONNECTED)
        return True

    async def close(self) -> None:
        if self._session:
            self.tree.drop_session(self._session)
        self._session = 0
        self._drop_watches()
        self._set_state(SessionState.LOST)

    def _check(self) -> None:
        if self._state is not SessionState.CONNECTED:
            raise ConfigServerUnavailableError(
                f"embedded configserver session is {self._state.value}"
            )

    def _track(self, watch: Watcher | None) -> Watcher | None:
        if watch is None:
            return None
        store = self

        def once(event: object) -> None:
            with store._lock:
                if once not in store._watches:
                    return
                store._watches.discard(once)
            watch(event)

        with self._lock:
            self._watches.add(once)
        return once

    def _drop_watches(self) -> None:
        with self._lock:
            watches, self._watches = self._watches, set()
        self.tree.drop_watches(watches)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        self._check()
        self.tree.create(path, data, self._session if ephemeral else 0)

    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, NodeStat]:
        self._check()
        return self.tree.get(path, self._track(watch))

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        self._check()
        return self.tree.children(path, self._track(watch))

    async def exists(self, path: str, watch: Watcher | None = None) -> NodeStat | None:
        self._check()
        return self.tree.exists(path, self._track(watch))

    async def set(self, path: str, data: bytes, version: int = -1) -> None:
        self._check()
        self.tree.set(path, data, version)

    async def delete(self, path: str, version: int = -1) -> None:
        self._check()
        self.tree.delete(path, version)

    # -- session trouble (driven by MemoryZooKeeper's test hooks)

    def _suspend(self) -> None:
        if self._state is SessionState.CONNECTED:
            self._set_state(SessionState.SUSPENDED)
            self._drop_watches()

    def _resume(self) -> None:
        if self._state is SessionState.SUSPENDED:
            self._set_state(SessionState.CONNECTED)

    def _expire(self) -> None:
        old = self._session
        self._drop_watches()
        self.tree.drop_session(old)
        self._set_state(SessionState.LOST)
        self._session = self.tree.new_session()  # kazoo reconnects with a new session
        self._set_state(SessionState.CONNECTED)
