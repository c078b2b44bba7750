"""The blocking producer's direct path: ``Producer.send()`` over the caller's own socket.

``Producer.send()`` one message at a time would hop to the session's loop thread and back for
every message (a queued call, a wake-up, a task, two futures and GIL hand-offs): about a
quarter of a bare round trip. When nothing else of the producer is in flight, the message
instead goes as one ``put`` over a blocking connection of the calling thread (the session
pool's ``send`` lane: one per thread and broker, opened on first use with the session's
secret and TLS settings), and the reply is read on the same thread (by
:mod:`.core.wire`, as every put ack).

The direct path is an optimisation only: :meth:`DirectSender.plan` takes a message only
when it can give exactly the loop path's result (routed already, a built-in selector,
neither ordered nor idempotent, nothing of the producer in flight, a connection at hand);
a connection problem or any reply but 200 sends the message the usual way, which routes,
retries and reports. A connection failure also sends the address's messages the usual way
for a while (the pool's ``SKIP_AFTER_FAILURE_S``), so a dead broker costs the loop path's
backoff only, not a blocking connect per message.
"""

from __future__ import annotations

from typing import Final

from notify.errors import ClientError, RequestTimeoutError

from ._connection import ConnectionPool, epoch_frame
from ._directtx import SAFE_SELECTORS
from ._message import Draft, build_payload
from ._producer import AsyncProducer
from .core import wire
from .core.types import Partition, SendResult
from .transport import BlockingConnection

#: The pool lane of the direct sends' blocking connections.
SEND_LANE: Final = "send"


#: A message the direct path takes: ``(topic, partition, payload, flag, connection)``.
DirectPlan = tuple[str, Partition, bytes, int, BlockingConnection]


class DirectSender:
    """``send()`` over the calling thread's blocking connection (see the module docstring)."""

    def __init__(self, core: AsyncProducer, pool: ConnectionPool):
        self.core = core
        self.pool = pool
        cfg = core.config
        #: the producer's settings allow it at all
        self.able = not (cfg.ordered or cfg.idempotent) and type(core.selector) in SAFE_SELECTORS

    def plan(self, msg: Draft) -> DirectPlan | None:
        """Where the message goes over this thread's socket; None when it must take the
        loop path (nothing is sent then). The caller guarantees that none of its earlier
        messages is still in flight."""
        topic, data, attribute, key, headers = msg
        core = self.core
        if not self.able or core.closed or type(data) is not bytes:
            return None
        parts = core.router.cached(topic)
        if parts is None:
            return None
        if attribute is None and key is None and not headers:
            payload, flag = data, 0
        else:
            payload, flag = build_payload(data, attribute, key, headers)
        try:
            part = core.selector(topic, parts, key, payload)
        except ClientError:
            return None
        conn = self.pool.blocking(part.address, SEND_LANE)
        if conn is None:
            return None
        return topic, part, payload, flag, conn

    def send(self, plan: DirectPlan, timeout_s: float | None) -> SendResult | None:
        """Send the planned message; its result, or None when it must go through the loop
        thread instead (nothing was stored then, or a retry of the loop path may store it
        again exactly as after a lost acknowledgement). Raises ``TimeoutError`` when
        ``timeout_s`` elapsed without a reply (as ``send()`` does)."""
        pool = self.pool
        topic, part, payload, flag, conn = plan
        limit = pool.request_timeout_s
        if timeout_s is not None:
            limit = min(timeout_s, limit)
        put = wire.put(topic, part.partition, payload, flag, self.core.config.send_checksum)
        epoch = pool.owed_epoch(conn)
        try:  # (the send lane's connection is this thread's alone: no lock)
            if epoch is None:
                r = conn.request(put, limit)
            else:
                declared, r = conn.exchange([epoch_frame(*epoch), put], limit)
                if declared.code != 200:  # a stale master: the loop path finds the new one
                    return None
                pool.blocking_declared[conn] = epoch[1]
        except RequestTimeoutError:
            pool.blocking_failed(conn)
            if timeout_s is not None and timeout_s <= pool.request_timeout_s:
                raise TimeoutError(f"no acknowledgement within {timeout_s:g} s") from None
            return None
        except ClientError:  # connection lost or refused, TLS, authentication
            pool.blocking_failed(conn)
            return None
        ack = wire.put_ack(r)
        if isinstance(ack, ClientError):
            if r.code == 200:  # a broken reply: this socket is not trusted any more
                pool.blocking_failed(conn)
            return None
        return SendResult(True, part, ack[1], ack[0])
