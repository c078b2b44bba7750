"""The ZooKeeper node store: kazoo's asynchronous API bridged onto an asyncio loop.

Every operation is issued with kazoo's ``*_async`` call; its result is handed to the loop
with ``call_soon_threadsafe`` and bounded by ``op_timeout_s``. Calls fail fast with
:class:`ConfigServerUnavailableError` unless the session is connected (kazoo would queue
them until it reconnects). kazoo's exceptions are translated here and nowhere else.

kazoo reconnects by itself (``connection_retry`` without limit): a suspended connection comes
back to the same session (ephemeral nodes intact) or, once ZooKeeper expired the session,
kazoo reports LOST and opens a new one. On SUSPENDED kazoo fires every pending watch with an
empty event and forgets them: the configserver re-arms them when connected again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError as KzBadVersionError,
)
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.exceptions import (
    NodeExistsError as KzNodeExistsError,
)
from kazoo.exceptions import (
    NoNodeError as KzNoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError

from ._errors import (
    BadVersionError,
    ConfigServerError,
    ConfigServerUnavailableError,
    NodeExistsError,
    NoNodeError,
)
from ._nodes import NodeStat, SessionState, StateListener, Watcher

__all__ = ["KazooNodeStore"]

log = logging.getLogger("notify.configserver")

T = TypeVar("T")

_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}
_UNAVAILABLE = (
    ConnectionLoss,
    ConnectionClosedError,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)


def _translate(e: BaseException, what: str) -> ConfigServerError:
    if isinstance(e, ConfigServerError):
        return e
    if isinstance(e, KzNoNodeError):
        return NoNodeError(what)
    if isinstance(e, KzNodeExistsError):
        return NodeExistsError(what)
    if isinstance(e, KzBadVersionError):
        return BadVersionError(what)
    if isinstance(e, _UNAVAILABLE):
        return ConfigServerUnavailableError(f"ZooKeeper unavailable ({type(e).__name__}): {what}")
    return ConfigServerError(f"ZooKeeper {type(e).__name__} {e}: {what}")


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class KazooNodeStore:
    """A :class:`~configserver._nodes.NodeStore` on a real ZooKeeper (``hosts`` as kazoo
    takes them: ``"h1:2181,h2:2181"``), or on a started ``KazooClient`` the caller keeps."""

    def __init__(
        self,
        hosts: str | KazooClient,
        *,
        session_timeout_s: float = 30.0,
        op_timeout_s: float = 10.0,
    ):
        self._own = not isinstance(hosts, KazooClient)
        self.hosts = hosts if isinstance(hosts, str) else str(getattr(hosts, "hosts", ""))
        self.session_timeout_s = session_timeout_s
        self.op_timeout_s = op_timeout_s
        self._client: KazooClient | None = None if isinstance(hosts, str) else hosts
        self._listeners: list[StateListener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = SessionState.LOST

    @property
    def client(self) -> KazooClient:
        """The kazoo client (for :class:`notify.offsets.ZooKeeperOffsetStore` to share)."""
        if self._client is None:
            raise ConfigServerError("ZooKeeper node store not started")
        return self._client

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def session_id(self) -> int:
        client = self._client
        if client is None:
            return 0
        cid = client.client_id
        return int(cid[0]) if cid else 0

    @property
    def description(self) -> str:
        return f"zookeeper {self.hosts}"

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def _on_state(self, kstate: Any) -> None:  # kazoo's thread: never block
        state = _STATES.get(kstate, SessionState.LOST)
        self._state = state
        for cb in list(self._listeners):
            try:
                cb(state)
            except Exception:  # pragma: no cover - a listener bug must not kill kazoo
                log.exception("configserver state listener failed")

    async def start(self, timeout_s: float) -> bool:
        self._loop = asyncio.get_running_loop()
        if self._client is None:
            self._client = KazooClient(
                hosts=self.hosts,
                timeout=self.session_timeout_s,
                connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
                command_retry={"max_tries": 0},
            )
        client = self._client
        client.add_listener(self._on_state)
        if client.connected:
            self._on_state(KazooState.CONNECTED)
            return True
        event = client.start_async()
        await asyncio.to_thread(event.wait, timeout_s)
        if client.connected:
            self._on_state(KazooState.CONNECTED)
            return True
        return False

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        with contextlib.suppress(Exception):
            client.remove_listener(self._on_state)
        self._state = SessionState.LOST
        if self._own:
            await asyncio.to_thread(_stop, client)

    # -- operations

    async def _call(self, what: str, start: Callable[[KazooClient], Any]) -> Any:
        client, loop = self._client, self._loop
        if client is None or loop is None:
            raise ConfigServerUnavailableError(f"ZooKeeper node store not started: {what}")
        if self._state is not SessionState.CONNECTED:
            raise ConfigServerUnavailableError(
                f"ZooKeeper {self.hosts} session is {self._state.value}: {what}"
            )
        fut: asyncio.Future[Any] = loop.create_future()

        def done(ar: Any) -> None:  # kazoo's thread
            try:
                value, ok = ar.get_nowait(), True
            except BaseException as e:
                value, ok = e, False
            with contextlib.suppress(RuntimeError):  # loop closed meanwhile
                loop.call_soon_threadsafe(_settle, fut, ok, value)

        try:
            start(client).rawlink(done)
        except (KazooException, KazooTimeoutError, ValueError, TypeError) as e:
            raise _translate(e, what) from e
        try:
            return await asyncio.wait_for(fut, self.op_timeout_s)
        except TimeoutError:
            raise ConfigServerUnavailableError(
                f"ZooKeeper {self.hosts}: no answer within {self.op_timeout_s} s: {what}"
            ) from None
        except (KazooException, KazooTimeoutError) as e:
            raise _translate(e, what) from e

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        await self._call(
            f"create {path}",
            lambda c: c.create_async(path, data, ephemeral=ephemeral, makepath=True),
        )

    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, NodeStat]:
        raw, stat = await self._call(f"get {path}", lambda c: c.get_async(path, watch=watch))
        return bytes(raw or b""), NodeStat(int(stat.version), int(stat.ephemeralOwner))

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        kids = await self._call(
            f"children {path}", lambda c: c.get_children_async(path, watch=watch)
        )
        return sorted(str(k) for k in kids)

    async def exists(self, path: str, watch: Watcher | None = None) -> NodeStat | None:
        stat = await self._call(f"exists {path}", lambda c: c.exists_async(path, watch=watch))
        return None if stat is None else NodeStat(int(stat.version), int(stat.ephemeralOwner))

    async def set(self, path: str, data: bytes, version: int = -1) -> None:
        await self._call(f"set {path}", lambda c: c.set_async(path, data, version))

    async def delete(self, path: str, version: int = -1) -> None:
        await self._call(f"delete {path}", lambda c: c.delete_async(path, version))


def _stop(client: KazooClient) -> None:
    for step in (client.stop, client.close):
        try:
            step()
        except Exception as e:  # pragma: no cover - best effort
            log.debug("kazoo %s: %s", step.__name__, e)
