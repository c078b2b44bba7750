"""Queue verbs (``qsub``, ``qack``, ``qunsub``, ``qdlq``, ``qdel``): gated here, run by the
:class:`~notify.broker.queues.QueueManager` (README "Queues")."""

from __future__ import annotations

from notify.broker.connection import Connection
from notify.broker.context import BrokerContext
from notify.protocol.frames import (
    QueueAck,
    QueueDeadLetters,
    QueueDelete,
    QueueSubscribe,
    QueueUnsubscribe,
)

QueueRequest = QueueSubscribe | QueueAck | QueueUnsubscribe | QueueDeadLetters | QueueDelete


class QueueVerbs:
    """Queue subscription verbs: enabled, not fenced, then the queue manager's."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def queue(self, conn: Connection, r: QueueRequest) -> None:
        ctx = self.ctx
        if ctx.queues is None:
            ctx.error(conn, 500, r.opaque, "queues are not enabled on this broker")
        elif (fenced := ctx.queue_fence(conn)) is not None:  # automatic failover
            ctx.error(conn, 503, r.opaque, fenced)
        else:
            ctx.queues.handle(conn, r, ctx.role)

    def dead_letters_denied(self, conn: Connection, r: QueueDeadLetters) -> None:
        """``qdlq`` without the admin role."""
        self.ctx.denied(conn, r.opaque, f"qdlq {r.action}", "admin")

    def delete_denied(self, conn: Connection, r: QueueDelete) -> None:
        """``qdel`` without the admin role."""
        self.ctx.denied(conn, r.opaque, "qdel", "admin")
