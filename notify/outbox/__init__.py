"""The transactional outbox: publish inside the application's own database transaction.

A message is a row written in the application's transaction (committed with its other
rows, or rolled back with them); a relay publishes the committed rows to the broker
exactly once, a key's messages in the order their transactions committed::

    from notify.outbox import Outbox
    outbox = Outbox(engine)                        # the application's SQLAlchemy engine
    with engine.begin() as conn:                   # the application's transaction
        conn.execute(insert(orders).values(id=42))
        outbox.send(conn, "orders", b"order 42", key="42", headers={"type": "created"})

    with connect(["127.0.0.1:8123"]) as session, outbox.relay(session):
        ...                                        # or: notify outbox relay --db URL -s HOST:PORT

The tables come from ``notify db upgrade``. Layering: this package sits below the client
(it never imports :mod:`notify.client`); it reaches the broker through the
:class:`Publisher` Protocol, which a session provides (``session.publisher()``).

Modules: :mod:`.rows` (the formats, once), :mod:`.writer` (``Outbox.send``),
:mod:`.aio` (asyncio connections: ``Outbox.send_async``),
:mod:`.plan` (the relay's pure decisions), :mod:`.relay` (the relay's threads),
:mod:`.relaydb` (its SQL: leadership, cycles, heartbeats), :mod:`.publisher` (the
Protocol), :mod:`.status`, :mod:`.half` (half-message markers), :mod:`.sql`.
"""

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .aio import is_async_connection
    from .half import HalfMarkers, HalfMessageCheckedBackError, HalfState, MarkedTransaction
    from .plan import Limits
    from .publisher import Batch, Identity, PublishAck, Publisher, PublishError
    from .relay import OutboxStateError, Relay, RelayConfig, ShardStats
    from .relaydb import FencedError
    from .rows import OutboxArgumentError, OutboxError, key_hash
    from .sql import OutboxDatabaseError, OutboxTablesMissingError
    from .status import OutboxStatus, ShardStatus
    from .writer import Outbox, OutboxConfig, OutboxSends, outbox_for

#: Where each name lives: loaded on first use (PEP 562), so that importing one module of
#: the package (the client imports :mod:`.publisher`) does not load the database drivers.
_WHERE: Final = {
    "is_async_connection": "aio",
    "HalfMarkers": "half",
    "HalfMessageCheckedBackError": "half",
    "HalfState": "half",
    "MarkedTransaction": "half",
    "Limits": "plan",
    "Batch": "publisher",
    "Identity": "publisher",
    "PublishAck": "publisher",
    "Publisher": "publisher",
    "PublishError": "publisher",
    "OutboxStateError": "relay",
    "Relay": "relay",
    "RelayConfig": "relay",
    "ShardStats": "relay",
    "FencedError": "relaydb",
    "OutboxArgumentError": "rows",
    "OutboxError": "rows",
    "key_hash": "rows",
    "OutboxDatabaseError": "sql",
    "OutboxTablesMissingError": "sql",
    "OutboxStatus": "status",
    "ShardStatus": "status",
    "Outbox": "writer",
    "OutboxConfig": "writer",
    "OutboxSends": "writer",
    "outbox_for": "writer",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Batch",
    "FencedError",
    "HalfMarkers",
    "HalfMessageCheckedBackError",
    "HalfState",
    "Identity",
    "Limits",
    "MarkedTransaction",
    "Outbox",
    "OutboxArgumentError",
    "OutboxConfig",
    "OutboxDatabaseError",
    "OutboxError",
    "OutboxSends",
    "OutboxStateError",
    "OutboxStatus",
    "OutboxTablesMissingError",
    "PublishAck",
    "PublishError",
    "Publisher",
    "Relay",
    "RelayConfig",
    "ShardStats",
    "ShardStatus",
    "is_async_connection",
    "key_hash",
    "outbox_for",
]
