"""The broker's side: keep this broker and its topics registered (``notify.broker.app``).

With ``[zookeeper] zk.zkEnable=true`` the broker registers in ZooKeeper at ``zk.zkConnect``
under ``zk.zkRoot`` with a session of ``zk.zkSessionTimeoutMs``; otherwise in the embedded
in-process configserver (the quickstart default: clients then use static addresses). A
ZooKeeper that is down at start does not stop the broker: it serves, logs, and registers
once the session is up. Topics added by a config reload are registered as they appear;
``acceptPublish`` / ``acceptSubscribe`` decide the ``topics-pub`` / ``topics-sub`` nodes.
Internal topics (``__delay``) are not registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from dataclasses import replace

from notify.config import ServerConfig, TopicConfig, config_checksum

from ._errors import ConfigServerError, ConfigServerUnavailableError
from ._layout import BrokerRegistration, TopicRegistration
from ._nodes import MemoryZooKeeper
from ._server import ConfigServer

__all__ = ["BrokerRegistrar"]

log = logging.getLogger("notify.configserver")

_WILDCARDS = ("", "0.0.0.0", "::")
STARTUP_WAIT_S = 5.0


class BrokerRegistrar:
    """Registers one broker; all methods run on the broker's loop."""

    def __init__(self, config: ServerConfig, server: ConfigServer | None = None):
        self.config = config
        zk = config.zookeeper
        if server is None:
            if zk.zk_enable:
                server = ConfigServer.zookeeper(
                    zk.zk_connect,
                    zk.zk_root,
                    session_timeout_s=zk.zk_session_timeout_ms / 1000,
                    op_timeout_s=max(1.0, zk.zk_sync_time_ms / 1000),
                )
            else:  # a tree of its own: in-process brokers never see each other
                server = ConfigServer.embedded(MemoryZooKeeper(), zk.zk_root)
        self.server = server
        self.registration: BrokerRegistration | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: BrokerRegistration | None = None
        self._take_over = False

    @property
    def enabled(self) -> bool:
        """True when registering in ZooKeeper (False: embedded)."""
        return self.config.zookeeper.zk_enable

    async def start(self, host: str, port: int, topics: Mapping[str, TopicConfig]) -> None:
        """Connect and register (a ZooKeeper outage is logged, registration follows later)."""
        if host in _WILDCARDS:
            host = socket.getfqdn()
        slave = self.config.slave
        self.registration = BrokerRegistration(
            self.config.system.broker_id,
            host,
            port,
            _topics(topics),
            None if slave is None else slave.slave_id,
            config_checksum(self.config) if self.config.source is not None else None,
        )
        # waited for at most STARTUP_WAIT_S: a broker without ZooKeeper serves anyway
        timeout = min(self.config.zookeeper.zk_connection_timeout_ms / 1000, STARTUP_WAIT_S)
        try:
            await self.server.start(timeout, require=False)
        except ConfigServerError as e:
            log.error("configserver %s: %s", self.server.description, e)
        self._submit(self.registration)
        if self._task is not None:  # first attempt inline: registered when start returns
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
        log.info(
            "broker %d registering in configserver %s as %s",
            self.registration.broker_id,
            self.server.description,
            self.registration.key,
        )

    def update(self, topics: Mapping[str, TopicConfig], config: ServerConfig | None = None) -> None:
        """Register the current topics (after a config reload) and, given the reloaded
        ``config``, its checksum; runs in the background."""
        if self.registration is None:
            return
        new = replace(self.registration, topics=_topics(topics))
        if config is not None and config.source is not None:
            new = replace(new, config_checksum=config_checksum(config))
        if new != self.registration:
            self.registration = new
            self._submit(new)

    async def set_slave_id(self, slave_id: int | None) -> None:
        """Register as master (``None``) or as slave ``slave_id`` from now on (automatic
        failover promoted this broker): the old key's nodes go, the new ones come."""
        reg = self.registration
        if reg is None or reg.slave_id == slave_id:
            return
        try:
            await self.server.unregister_broker(reg.broker_id, reg.slave_id)
        except ConfigServerError as e:
            log.warning("configserver: unregistering broker %s: %s", reg.key, e)
        self.registration = replace(reg, slave_id=slave_id)
        self._take_over = slave_id is None  # elected: the old master's node may linger
        self._submit(self.registration)

    def _submit(self, reg: BrokerRegistration) -> None:
        self._pending = reg
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._register_loop())

    async def _register_loop(self) -> None:
        backoff = 0.1
        while self._pending is not None:
            reg = self._pending
            try:
                await self.server.register_broker(reg, take_over=self._take_over)
            except ConfigServerUnavailableError as e:
                # remembered by the server: re-created as soon as the session is back
                log.warning("configserver: registration of broker %s postponed: %s", reg.key, e)
                return
            except ConfigServerError as e:
                log.error("configserver: cannot register broker %s: %s", reg.key, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if self._pending is reg:
                self._pending = None

    async def master_address(self, timeout_s: float = 5.0) -> str | None:
        """``host:port`` of the master of this broker id (slaves without masterAddress)."""
        bid = self.config.system.broker_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            with contextlib.suppress(ConfigServerError):
                for b in await self.server.brokers():
                    if b.broker_id == bid and b.slave_id is None:
                        return b.address
            await asyncio.sleep(0.2)
        return None

    async def stop(self) -> None:
        """Unregister (producers stop choosing this broker at once) and close the session."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        reg = self.registration
        if reg is not None:
            try:
                await self.server.unregister_broker(reg.broker_id, reg.slave_id)
            except ConfigServerError as e:
                log.warning("configserver: unregistering broker %s: %s", reg.key, e)
        await self.server.close()


def _topics(topics: Mapping[str, TopicConfig]) -> tuple[TopicRegistration, ...]:
    return tuple(
        TopicRegistration(t.name, t.num_partitions, t.accept_publish, t.accept_subscribe)
        for name, t in sorted(topics.items())
        if not name.startswith("__")
    )


async def resolve_master(registrar: BrokerRegistrar, config: ServerConfig) -> ServerConfig:
    """``config`` with the slave's ``masterAddress`` looked up in ZooKeeper when unset."""
    slave = config.slave
    if slave is None or slave.master_address or not registrar.enabled:
        return config
    addr = await registrar.master_address()
    if addr is None:
        log.error("slave: no master of broker %d registered", config.system.broker_id)
        return config
    log.info("slave: master of broker %d is %s", config.system.broker_id, addr)
    return replace(config, slave=replace(slave, master_address=addr))
