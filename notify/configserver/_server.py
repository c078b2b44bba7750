"""The configserver: cluster membership and discovery in MetaQ's ZooKeeper layout.

One class, :class:`ConfigServer`, over a :class:`~configserver._nodes.NodeStore`: ZooKeeper
(kazoo) or the embedded in-process tree. It runs on one asyncio loop (the one that called
:meth:`ConfigServer.start`) and offers:

* brokers: :meth:`~ConfigServer.register_broker` / :meth:`~ConfigServer.unregister_broker`
  (ephemeral nodes, see :mod:`configserver._layout`), :meth:`~ConfigServer.brokers`,
  :meth:`~ConfigServer.topic_partitions`, :meth:`~ConfigServer.topics`;
* consumers: :meth:`~ConfigServer.register_consumer`, :meth:`~ConfigServer.group_members`,
  :meth:`~ConfigServer.claim` / :meth:`~ConfigServer.release` of partition owner nodes.

**Watches.** Read methods take ``watch``, a zero-argument callback run on the loop, at most
once, when the answer may have changed. It is also run after the session comes back from
SUSPENDED or LOST (ZooKeeper drops watches then), never while disconnected: callers simply
read again with the same callback, which re-arms it.

**Sessions.** Registrations of brokers and consumers are remembered and re-created when
the session is new (after LOST, or if a write failed while disconnected) before listeners
hear CONNECTED. Partition owner nodes are *not* re-created: ownership after LOST must be
claimed again through a rebalance (:mod:`configserver._group`). A broker node left by a
previous process of the same broker (same id and address, killed before its session
expired) is replaced; one of another address is a conflict (two brokers with one id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from notify.protocol.failover import decode_epoch

from ._errors import (
    ConfigServerError,
    ConfigServerUnavailableError,
    NodeExistsError,
    NoNodeError,
)
from ._layout import (
    DEFAULT_ROOT,
    BrokerRegistration,
    Layout,
    decode_address,
    decode_topic_broker,
    decode_topics,
    encode_topics,
    parse_broker_key,
    partition_id,
)
from ._nodes import MemoryNodeStore, MemoryZooKeeper, NodeStore, SessionState

if TYPE_CHECKING:
    from notify.client.offsets import OffsetStore

__all__ = ["BrokerInfo", "ConfigServer", "PartitionInfo", "SessionListener"]

log = logging.getLogger("notify.configserver")

DEFAULT_SESSION_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_OP_TIMEOUT_S = 10.0

SessionListener = Callable[[SessionState], None]
WatchCallback = Callable[[], None]


@dataclass(frozen=True, slots=True, order=True)
class PartitionInfo:
    """A global partition: broker ``broker_id`` at ``address`` (host:port), local ``partition``."""

    broker_id: int
    partition: int
    address: str = ""

    @property
    def id(self) -> str:
        """``"<brokerId>-<part>"``."""
        return partition_id(self.broker_id, self.partition)

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True, slots=True, order=True)
class BrokerInfo:
    """A registered broker: master (``slave_id`` None) or slave."""

    broker_id: int
    slave_id: int | None
    address: str


class _Watch:
    """The watcher object of one callback, registered with the node store on every path the
    callback's reads touch. One object per callback for the server's life (the store's
    watcher sets hold it once per path, however often it is re-armed); it fires at most
    once per arming. kazoo/memory call it from any thread."""

    __slots__ = ("callback", "fired", "lock", "server")

    def __init__(self, server: ConfigServer, callback: WatchCallback):
        self.server = server
        self.callback = callback
        self.fired = False
        self.lock = threading.Lock()

    def __call__(self, event: object = None) -> None:
        with self.lock:
            if self.fired:
                return
            self.fired = True
        self.server._post(self.server._watch_fired, self)

    def rearm(self) -> None:
        with self.lock:
            self.fired = False


class ConfigServer:
    """Membership and discovery (see the module doc). Create with :meth:`zookeeper`,
    :meth:`embedded` or :meth:`from_url`; ``await start()``; ``await close()``."""

    def __init__(self, store: NodeStore, root: str = DEFAULT_ROOT):
        self.store = store
        self.layout = Layout(root)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = SessionState.LOST
        self._started = False
        self._closed = False
        self._start_lock: asyncio.Lock | None = None
        self._listeners: list[SessionListener] = []
        self._watches: dict[WatchCallback, _Watch] = {}
        self._deferred: dict[WatchCallback, None] = {}
        self._brokers: dict[tuple[int, int | None], BrokerRegistration] = {}
        self._consumers: dict[tuple[str, str], tuple[str, ...]] = {}
        self._registered_session = 0
        self._dirty = False
        self._renewing: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ construction

    @classmethod
    def zookeeper(
        cls,
        hosts: str,
        root: str = DEFAULT_ROOT,
        *,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
    ) -> ConfigServer:
        """On ZooKeeper ``hosts`` (``"h1:2181,h2:2181"``) under ``root``."""
        from ._kazoo import KazooNodeStore

        store = KazooNodeStore(
            hosts, session_timeout_s=session_timeout_s, op_timeout_s=op_timeout_s
        )
        return cls(store, root)

    @classmethod
    def embedded(
        cls, tree: MemoryZooKeeper | None = None, root: str = DEFAULT_ROOT
    ) -> ConfigServer:
        """In-process (no ZooKeeper): a session on ``tree``, default the process-wide one."""
        return cls(MemoryNodeStore(tree), root)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
    ) -> ConfigServer:
        """``"127.0.0.1:2181/meta"``, ``"zookeeper://h1:2181,h2:2181/meta"`` (path = root,
        default ``/meta``) or ``"embedded://"`` / ``"embedded:///root"``."""
        hosts, root, embedded = parse_url(url)
        if embedded:
            return cls.embedded(root=root)
        return cls.zookeeper(
            hosts, root, session_timeout_s=session_timeout_s, op_timeout_s=op_timeout_s
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def state(self) -> SessionState:
        """CONNECTED only once the session's registrations are in place."""
        return self._state

    @property
    def started(self) -> bool:
        return self._started

    @property
    def description(self) -> str:
        return f"{self.store.description}{self.layout.root or '/'}"

    async def start(
        self, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, *, require: bool = True
    ) -> None:
        """Connect (idempotent). ``require``: raise ConfigServerUnavailableError unless
        connected within ``timeout_s``; otherwise go on and connect in the background."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._closed:
                raise ConfigServerError("configserver is closed")
            if self._started:
                return
            self._loop = asyncio.get_running_loop()
            self.store.add_listener(self._on_store_state)
            ok = await self.store.start(timeout_s)
            self._started = True
        if not ok and require:
            await self.close()
            raise ConfigServerUnavailableError(
                f"cannot connect to {self.description} within {timeout_s} s"
            )
        if ok:
            await self._renewal()

    async def close(self) -> None:
        """Close the session: every ephemeral node of it disappears. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._watches.clear()
        self._deferred.clear()
        await self.store.close()
        self._state = SessionState.LOST

    async def wait_connected(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until the session is CONNECTED; True if it is."""
        if self._state is SessionState.CONNECTED:
            return True
        if self._closed:
            return False
        up = asyncio.Event()
        remove = self.add_session_listener(
            lambda s: up.set() if s is SessionState.CONNECTED else None
        )
        try:
            async with asyncio.timeout(timeout_s):
                await up.wait()
        except TimeoutError:
            pass
        finally:
            remove()
        return self._connected()

    def _connected(self) -> bool:
        return self._state is SessionState.CONNECTED

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        """Call ``listener(state)`` on the loop at each session change; returns a remover.

        CONNECTED after LOST is reported once this session's registrations are re-created.
        """
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def offset_store(self) -> OffsetStore | None:
        """A :class:`notify.offsets.ZooKeeperOffsetStore` sharing this session (None when
        embedded: offsets then stay with the consumer's own store)."""
        from ._kazoo import KazooNodeStore

        if not isinstance(self.store, KazooNodeStore):
            return None
        from notify.offsets.zookeeper import ZooKeeperOffsetStore

        store = self.store
        return ZooKeeperOffsetStore(
            store.client, self.layout.root or "/", op_timeout_s=store.op_timeout_s
        )

    # ------------------------------------------------------------------ loop plumbing

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop (from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_store_state(self, state: SessionState) -> None:  # any thread
        self._post(self._state_changed, state)

    def _state_changed(self, state: SessionState) -> None:
        if self._closed:
            return
        if state is SessionState.CONNECTED:
            self._renewal()
            return
        if state is self._state:
            return
        log.warning("configserver %s: session %s", self.description, state.value)
        self._set_state(state)

    def _set_state(self, state: SessionState) -> None:
        self._state = state
        for cb in list(self._listeners):
            try:
                cb(state)
            except Exception:  # pragma: no cover - a listener bug must not stop the others
                log.exception("configserver session listener failed")

    def _renewal(self) -> asyncio.Task[None]:
        """The running re-registration task, started if none is running."""
        if self._renewing is None or self._renewing.done():
            self._renewing = self._spawn(self._renew_if_needed())
        return self._renewing

    async def _renew_if_needed(self) -> None:
        """On CONNECTED: re-create registrations if the session is new, then report."""
        backoff = 0.05
        while not self._closed and self.store.state is SessionState.CONNECTED:
            sid = self.store.session_id
            if sid == self._registered_session and not self._dirty:
                break
            try:
                await self._reregister()
            except ConfigServerUnavailableError:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            except ConfigServerError as e:
                log.error("configserver: re-registration failed: %s", e)
                await asyncio.sleep(1.0)
                continue
            if self.store.session_id == sid:
                self._registered_session = sid
                self._dirty = False
        if self._closed or self.store.state is not SessionState.CONNECTED:
            return
        if self._state is not SessionState.CONNECTED:
            if self._state is not SessionState.LOST or self._registered_session:
                log.info("configserver %s: session connected", self.description)
            self._set_state(SessionState.CONNECTED)
        self._fire_all()

    async def _reregister(self) -> None:
        for reg in list(self._brokers.values()):
            await self._apply_broker(reg, None)
        for (group, cid), topics in list(self._consumers.items()):
            await self._ephemeral(self.layout.consumer_node(group, cid), encode_topics(topics))

    # ------------------------------------------------------------------ watches

    def _arm(self, callback: WatchCallback | None) -> _Watch | None:
        if callback is None:
            return None
        w = self._watches.get(callback)
        if w is None:
            w = self._watches[callback] = _Watch(self, callback)
        w.rearm()
        return w

    def forget_watch(self, callback: WatchCallback) -> None:
        """Never call ``callback`` again (its owner is done)."""
        w = self._watches.pop(callback, None)
        if w is not None:
            with w.lock:
                w.fired = True
        self._deferred.pop(callback, None)

    def _watch_fired(self, w: _Watch) -> None:
        if self._watches.get(w.callback) is not w:
            return  # forgotten
        if self._closed:
            return
        if self._state is not SessionState.CONNECTED:
            self._deferred[w.callback] = None
            return
        self._deliver(w.callback)

    def _fire_all(self) -> None:
        """After (re)connecting: every armed or deferred watch may have missed a change."""
        armed = []
        for w in self._watches.values():
            with w.lock:
                if not w.fired:
                    w.fired = True
                    armed.append(w.callback)
        callbacks = dict.fromkeys([*self._deferred, *armed])
        self._deferred.clear()
        for cb in callbacks:
            self._deliver(cb)

    @staticmethod
    def _deliver(cb: WatchCallback) -> None:
        try:
            cb()
        except Exception:  # pragma: no cover - a watcher bug must not stop the others
            log.exception("configserver watch callback failed")

    # ------------------------------------------------------------------ node helpers

    def _note_failure(self, e: BaseException) -> None:
        if isinstance(e, ConfigServerUnavailableError):
            self._dirty = True

    async def _ephemeral(self, path: str, data: bytes, *, replace_other: bool = True) -> None:
        """Make ``path`` an ephemeral node of this session holding ``data``.

        A node of another session is replaced when it holds ``data`` or ``replace_other``;
        otherwise NodeExistsError.
        """
        store = self.store
        for _ in range(5):
            try:
                await store.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                raw, stat = await store.get(path)
            except NoNodeError:
                continue
            if stat.ephemeral_owner == store.session_id and stat.ephemeral_owner:
                if raw != data:
                    await store.set(path, data, stat.version)
                return
            if raw != data and not replace_other:
                raise NodeExistsError(f"{path} is held by another session: {raw[:80]!r}")
            with contextlib.suppress(NoNodeError):
                await store.delete(path, stat.version)
        raise ConfigServerError(f"{path}: could not create it (kept racing)")

    async def _delete_mine(self, path: str, value: bytes | None = None) -> bool:
        """Delete ``path`` if this session owns it (and it holds ``value``)."""
        try:
            raw, stat = await self.store.get(path)
        except NoNodeError:
            return False
        if stat.ephemeral_owner != self.store.session_id or (value is not None and raw != value):
            return False
        try:
            await self.store.delete(path, stat.version)
        except NoNodeError:
            return False
        return True

    async def _children(self, path: str, watch: _Watch | None) -> list[str]:
        try:
            return await self.store.children(path, watch)
        except NoNodeError:
            if watch is not None:  # learn when it is created
                stat = await self.store.exists(path, watch)
                if stat is not None:
                    return await self.store.children(path, watch)
            return []

    # ------------------------------------------------------------------ brokers

    async def register_broker(self, reg: BrokerRegistration, *, take_over: bool = False) -> None:
        """Publish ``reg`` (ephemeral); calling it again applies the difference (topics added
        by a reload, partition counts, accept flags). Remembered for re-registration even
        when this call fails for want of a connection. ``take_over``: replace the address
        node even when another session holds it (an elected master replacing one whose
        session has not yet expired)."""
        key = (reg.broker_id, reg.slave_id)
        old = self._brokers.get(key)
        self._brokers[key] = reg
        try:
            await self._apply_broker(reg, old, take_over)
        except ConfigServerError as e:
            self._note_failure(e)
            raise

    async def _apply_broker(
        self, reg: BrokerRegistration, old: BrokerRegistration | None, take_over: bool = False
    ) -> None:
        nodes = self.layout.broker_nodes(reg)
        first = True
        for path, data in nodes.items():
            # the address node: a live node of another address is another broker
            await self._ephemeral(path, data, replace_other=take_over or not first)
            first = False
        if old is not None:
            for path in self.layout.broker_nodes(old):
                if path not in nodes:
                    await self._delete_mine(path)

    async def unregister_broker(self, broker_id: int, slave_id: int | None = None) -> None:
        """Remove the broker's nodes (and forget it)."""
        reg = self._brokers.pop((broker_id, slave_id), None)
        if reg is None:
            return
        for path in reversed(list(self.layout.broker_nodes(reg))):
            await self._delete_mine(path)

    async def brokers(self, watch: WatchCallback | None = None) -> list[BrokerInfo]:
        """Every registered master and slave, sorted."""
        w = self._arm(watch)
        out: list[BrokerInfo] = []
        for bid in await self._children(self.layout.broker_ids, w):
            if not bid.isdigit():
                continue
            for leaf in await self._children(self.layout.broker_dir(int(bid)), w):
                if leaf == "master":
                    slave: int | None = None
                elif leaf.startswith("slave") and leaf[5:].isdigit():
                    slave = int(leaf[5:])
                else:
                    continue
                try:
                    raw, _ = await self.store.get(f"{self.layout.broker_dir(int(bid))}/{leaf}", w)
                except NoNodeError:
                    continue
                out.append(BrokerInfo(int(bid), slave, decode_address(raw)))
        return sorted(out, key=lambda b: (b.broker_id, -1 if b.slave_id is None else b.slave_id))

    async def failover_epoch(self, broker_id: int) -> int | None:
        """The failover epoch of broker group ``broker_id`` (automatic failover), None when
        the group has no epoch node (it does not fail over automatically)."""
        try:
            raw, _ = await self.store.get(self.layout.failover_epoch(broker_id))
        except NoNodeError:
            return None
        try:
            return decode_epoch(bytes(raw)).epoch
        except ValueError:
            return None

    async def topics(self, watch: WatchCallback | None = None) -> list[str]:
        """Every topic any broker registered (``brokers/topics`` children)."""
        return await self._children(self.layout.topics_dir("topics"), self._arm(watch))

    async def topic_partitions(
        self, topic: str, *, publish: bool = True, watch: WatchCallback | None = None
    ) -> list[PartitionInfo]:
        """The partitions of ``topic`` on live masters, sorted by (broker id, partition):
        from ``topics-pub`` (``publish``) or ``topics-sub``. ``watch`` fires when a broker
        joins or leaves the topic, its partition count changes or its address changes."""
        w = self._arm(watch)
        kind = "topics-pub" if publish else "topics-sub"
        keys = await self._children(self.layout.topic_dir(kind, topic), w)
        masters: list[tuple[int, str]] = []
        for key in keys:
            try:
                bid, slave = parse_broker_key(key)
            except ValueError:
                continue
            if slave is None:
                masters.append((bid, key))

        async def one(bid: int, key: str) -> list[PartitionInfo]:
            try:
                raw, _ = await self.store.get(self.layout.topic_broker(kind, topic, key), w)
                n, _k = decode_topic_broker(raw)
            except NoNodeError:
                return []
            except ValueError as e:
                log.warning("configserver: unreadable %s/%s/%s: %s", kind, topic, key, e)
                return []
            try:
                addr_raw, _ = await self.store.get(self.layout.broker_node(bid), w)
            except NoNodeError:
                if w is not None:
                    await self.store.exists(self.layout.broker_node(bid), w)
                return []
            addr = decode_address(addr_raw)
            return [PartitionInfo(bid, p, addr) for p in range(n)]

        parts = await asyncio.gather(*(one(b, k) for b, k in masters))
        return sorted(p for ps in parts for p in ps)

    # ------------------------------------------------------------------ consumers

    async def register_consumer(self, group: str, consumer_id: str, topics: list[str]) -> None:
        """``consumers/<group>/ids/<consumerId>`` = topics (ephemeral, re-created after LOST)."""
        value = tuple(topics)
        self._consumers[(group, consumer_id)] = value
        try:
            await self._ephemeral(
                self.layout.consumer_node(group, consumer_id), encode_topics(value)
            )
        except ConfigServerError as e:
            self._note_failure(e)
            raise

    async def unregister_consumer(self, group: str, consumer_id: str) -> None:
        """Remove the consumer's id node (and forget it)."""
        if self._consumers.pop((group, consumer_id), None) is None:
            return
        await self._delete_mine(self.layout.consumer_node(group, consumer_id))

    @property
    def embedded_backend(self) -> bool:
        """True for the in-process tree (other processes do not see its nodes)."""
        return isinstance(self.store, MemoryNodeStore)

    async def register_queue_consumer(self, group: str, topic: str, consumer_id: str) -> None:
        """``consumers/<group>/queue-ids/<topic>/<consumerId>`` (ephemeral, this session).
        Not re-created after LOST: the queue consumer registers again before it subscribes
        again (the brokers drop it when the node goes)."""
        try:
            await self._ephemeral(
                self.layout.queue_consumer_node(group, topic, consumer_id), topic.encode()
            )
        except ConfigServerError as e:
            self._note_failure(e)
            raise

    async def unregister_queue_consumer(self, group: str, topic: str, consumer_id: str) -> None:
        """Remove the queue consumer's node if this session holds it."""
        await self._delete_mine(self.layout.queue_consumer_node(group, topic, consumer_id))

    async def queue_consumer_alive(
        self, group: str, topic: str, consumer_id: str, watch: WatchCallback | None = None
    ) -> bool:
        """Whether the queue consumer's node exists; ``watch`` fires when that may change."""
        path = self.layout.queue_consumer_node(group, topic, consumer_id)
        return await self.store.exists(path, self._arm(watch)) is not None

    async def group_members(
        self, group: str, watch: WatchCallback | None = None
    ) -> dict[str, tuple[str, ...]]:
        """``{consumerId: subscribed topics}`` of the group's live members."""
        w = self._arm(watch)
        base = self.layout.consumer_ids(group)
        ids = await self._children(base, w)

        async def topics_of(cid: str) -> tuple[str, tuple[str, ...]] | None:
            try:
                raw, _ = await self.store.get(f"{base}/{cid}")
            except NoNodeError:
                return None
            return cid, decode_topics(raw)

        found = await asyncio.gather(*(topics_of(c) for c in ids))
        return dict(sorted(f for f in found if f is not None))

    async def claim(
        self,
        group: str,
        topic: str,
        partition: str,
        owner: str,
        watch: WatchCallback | None = None,
    ) -> bool:
        """Create the owner node of ``partition`` for ``owner`` (ephemeral). False when
        another member holds it; ``watch`` then fires once that node goes."""
        path = self.layout.owner_node(group, topic, partition)
        data = owner.encode()
        store = self.store
        for _ in range(3):
            try:
                await store.create(path, data, ephemeral=True)
                return True
            except NodeExistsError:
                pass
            try:
                raw, stat = await store.get(path, self._arm(watch))
            except NoNodeError:
                continue
            return raw == data and stat.ephemeral_owner == store.session_id
        return False

    async def release(self, group: str, topic: str, partition: str, owner: str) -> bool:
        """Delete the owner node if this session holds it for ``owner``."""
        return await self._delete_mine(
            self.layout.owner_node(group, topic, partition), owner.encode()
        )

    async def owners(self, group: str, topic: str) -> dict[str, str]:
        """``{partition: owner}`` of a group's topic (tools, tests)."""
        base = self.layout.owners_dir(group, topic)
        out: dict[str, str] = {}
        for p in await self._children(base, None):
            with contextlib.suppress(NoNodeError):
                raw, _ = await self.store.get(f"{base}/{p}")
                out[p] = raw.decode("utf-8", "replace")
        return out


def parse_url(url: str) -> tuple[str, str, bool]:
    """``(hosts, root, embedded)`` of a configserver address (see :meth:`ConfigServer.from_url`)."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    scheme = scheme.lower()
    if scheme in ("embedded", "memory"):
        return "", rest or DEFAULT_ROOT, True
    if scheme not in ("", "zookeeper", "zk"):
        raise ConfigServerError(f"unknown configserver scheme {scheme!r} in {url!r}")
    hosts, slash, root = rest.partition("/")
    if not hosts:
        raise ConfigServerError(f"no ZooKeeper host in {url!r}")
    return hosts, ("/" + root) if slash and root.strip("/") else DEFAULT_ROOT, False
