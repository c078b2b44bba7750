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
:mod:`.plan` (the relay's pure decisions), :mod:`.relay` (the relay's threads),
:mod:`.relaydb` (its SQL: leadership, cycles, heartbeats), :mod:`.publisher` (the
Protocol), :mod:`.status`, :mod:`.half` (half-message markers), :mod:`.sql`.
"""

from .half import HalfMarkers, HalfState, MarkedTransaction
from .plan import Limits
from .publisher import Batch, Identity, PublishAck, Publisher, PublishError
from .relay import OutboxStateError, Relay, RelayConfig, ShardStats
from .relaydb import FencedError
from .rows import OutboxArgumentError, OutboxError, key_hash
from .sql import OutboxDatabaseError, OutboxTablesMissingError
from .status import OutboxStatus, ShardStatus
from .writer import Outbox, OutboxConfig, OutboxSends, outbox_for

__all__ = [
    "Batch",
    "FencedError",
    "HalfMarkers",
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
    "key_hash",
    "outbox_for",
]
