"""Blocking one-shot requests for admin commands (``notify stats``, ``notify config reload``,
``notify tx commit --server``): one :class:`~notify.client.transport.BlockingConnection`, one
request, one reply."""

from __future__ import annotations

from notify.client.transport import BlockingConnection, TransportOptions
from notify.errors import BrokerError
from notify.protocol.frames import FrameBuilder, Response


def request(
    addr: str,
    build: FrameBuilder,
    options: TransportOptions | None = None,
    timeout: float = 10.0,
) -> Response:
    """Send the frame ``build(opaque)`` to ``addr`` (after ``auth`` when ``options`` has a
    secret) and return the reply; raise :class:`~notify.errors.BrokerError` on non-200 and
    :class:`~notify.errors.ConnectionLostError` / ``RequestTimeoutError`` /
    :class:`~notify.client.transport.AuthenticationError` /
    :class:`~notify.client.transport.TLSError`."""
    opts = options or TransportOptions()
    with BlockingConnection(addr, opts, request_timeout_s=timeout) as conn:
        reply = conn.request(build)
    if reply.code != 200:
        raise BrokerError(reply.code, reply.body.decode("utf-8", "replace"))
    return reply
