"""What the HTTP layer needs from the broker it serves.

``notify.http`` is started *by* the broker (:mod:`notify.broker.app`), so it must not import
that module back; it types the broker as :class:`BrokerHost`, a structural protocol that
:class:`notify.broker.app.Broker` satisfies. Everything the HTTP handlers, views and metrics
read or call on the broker is listed here, and nothing else.
"""

from __future__ import annotations

import ssl
from typing import Protocol

from notify.broker.service import BrokerService
from notify.config import ServerConfig
from notify.replication.slave import SlaveReplicator
from notify.store.flusher import Flusher
from notify.store.manager import MessageStore
from notify.store.retention import RetentionResult

__all__ = ["BrokerHost"]


class BrokerHost(Protocol):
    """The running broker as the HTTP layer sees it."""

    config: ServerConfig
    store: MessageStore
    service: BrokerService | None
    flusher: Flusher | None
    slave: SlaveReplicator | None
    host: str
    port: int
    tls: ssl.SSLContext | None

    def reload(self, new: ServerConfig | None = None) -> str:
        """Apply ``new`` (or re-read server.ini); return a summary of what changed."""
        ...

    async def run_retention(self, topic: str) -> list[RetentionResult]:
        """Apply ``topic``'s delete policy now."""
        ...
