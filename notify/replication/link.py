"""Connections from this broker to another one (master <-> slave), on :mod:`notify.transport`:
pipelined requests, replies matched by opaque, ``auth`` with the broker's own ``authSecret``
first on every connect, TLS when a context is given."""

from __future__ import annotations

import ssl

from notify.transport import AsyncConnection, TransportOptions, open_connection

#: A replication link is a plain transport connection.
BrokerLink = AsyncConnection

CONNECT_TIMEOUT_S = 3.0


async def connect_link(
    addr: str, secret: str = "", tls: ssl.SSLContext | None = None
) -> AsyncConnection:
    """Open a link to the broker at ``addr`` (authenticated with ``secret`` when set).

    Raises :class:`~notify.errors.ConnectionLostError`,
    :class:`~notify.transport.AuthenticationError` or :class:`~notify.transport.TLSError`
    (all :class:`~notify.errors.NotifyError`)."""
    return await open_connection(addr, TransportOptions(secret or None, tls, CONNECT_TIMEOUT_S))
