"""The synchronous producer's direct path: ``Producer.send()`` over the caller's own socket.

``Producer.send()`` one message at a time used to hop to the session's loop thread and back
for every message (a queued call, a wake-up, a task, two futures and GIL hand-offs): about a
quarter of a bare round trip. When nothing else of the producer is in flight, the message
instead goes as one ``put`` over a blocking :class:`~notify.transport.BlockingConnection`
owned by the calling thread (one per thread and broker, opened on first use, with the
session's secret and TLS settings), and the reply is read on the same thread.

The direct path is an optimisation only: whenever it cannot give exactly the loop path's
result (partitions not routed yet, a custom selector, ordered or idempotent mode, messages
of this producer still in flight, a connection problem, any reply but 200) the message goes
the usual way, which routes, retries and reports. A connection failure also sends the
address's messages the usual way for :data:`SKIP_AFTER_FAILURE_S`, so a dead broker costs
the loop path's backoff only, not a blocking connect per message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from notify.errors import ClientError, ProtocolError, RequestTimeoutError
from notify.protocol import records as rec
from notify.protocol.frames import encode_line, encode_put
from notify.protocol.replies import PutAck
from notify.transport import BlockingConnection, TransportOptions

from ._message import Headers, SendResult, build_payload
from ._producer import AsyncProducer
from ._selectors import KeyHashSelector, RoundRobinSelector

#: Seconds an address is left to the loop path after a direct request to it failed.
SKIP_AFTER_FAILURE_S: Final = 1.0

# Selectors known to be thread-safe (a user's selector only ever runs on the loop thread).
_SAFE_SELECTORS = (KeyHashSelector, RoundRobinSelector)


class DirectPool:
    """Blocking connections of the calling threads, one per (thread, broker address).

    Owned by a :class:`~notify.client.MessageSessionFactory`, closed with it. Connections of
    threads that ended are closed when another thread opens one, so their number stays
    bounded by the live threads times the brokers.
    """

    def __init__(
        self,
        options: TransportOptions,
        request_timeout_s: float,
        epoch_of: Callable[[str], tuple[int, int] | None] | None = None,
    ):
        self.options = options
        self.request_timeout_s = request_timeout_s
        #: automatic failover: (group, epoch) to declare to an address (the session's
        #: pool knows), and the epoch each connection declared (README "Protocol notes")
        self.epoch_of = epoch_of
        self.declared: dict[BlockingConnection, int] = {}
        self._by_thread: dict[int, dict[str, BlockingConnection]] = {}
        self._skip_until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, address: str) -> BlockingConnection | None:
        """This thread's connection to ``address`` (not connected yet when new); None when
        the pool is closed or the address recently failed."""
        conns = self._by_thread.get(threading.get_ident())
        c = conns.get(address) if conns is not None else None
        if c is not None:
            return c
        until = self._skip_until.get(address)
        if until is not None and until > time.monotonic():
            return None
        try:
            c = BlockingConnection(address, self.options, self.request_timeout_s)
        except ClientError:  # an address the loop path will report on
            return None
        with self._lock:
            if self._closed:
                return None
            self._prune()
            self._by_thread.setdefault(threading.get_ident(), {})[address] = c
        return c

    def failed(self, conn: BlockingConnection) -> None:
        """``conn`` failed: drop it, leave its address to the loop path for a while."""
        conn.drop()
        self.declared.pop(conn, None)
        self._skip_until[conn.address] = time.monotonic() + SKIP_AFTER_FAILURE_S

    def _prune(self) -> None:
        alive = {t.ident for t in threading.enumerate()}
        for ident in [i for i in self._by_thread if i not in alive]:
            for c in self._by_thread.pop(ident).values():
                self.declared.pop(c, None)
                c.close()

    def close(self) -> None:
        """Close every connection (a send using one then goes the loop path's way)."""
        with self._lock:
            self._closed = True
            conns = [c for d in self._by_thread.values() for c in d.values()]
            self._by_thread.clear()
        for c in conns:
            c.close()


def send_direct(
    core: AsyncProducer,
    pool: DirectPool,
    topic: str,
    data: bytes,
    attribute: str | None,
    key: bytes | str | None,
    headers: Headers | None,
    timeout_s: float | None,
) -> SendResult | None:
    """Send one message over the calling thread's blocking connection; its result, or None
    when it must go through the loop thread instead (nothing was stored then, or a retry of
    the loop path may store it again exactly as after a lost acknowledgement).

    The caller guarantees that none of its earlier messages is still in flight. Raises
    ``TimeoutError`` when ``timeout_s`` elapsed without a reply (as ``send()`` does)."""
    cfg = core.config
    if (
        core.closed
        or core.outstanding
        or cfg.ordered
        or cfg.idempotent
        or type(core.selector) not in _SAFE_SELECTORS
        or type(data) is not bytes
    ):
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
    conn = pool.get(part.address)
    if conn is None:
        return None
    cs = rec.checksum(payload) if cfg.send_checksum else None
    limit = pool.request_timeout_s if timeout_s is None else min(timeout_s, pool.request_timeout_s)
    partition = part.partition
    epoch = pool.epoch_of(part.address) if pool.epoch_of is not None else None
    try:
        if epoch is not None and pool.declared.get(conn, 0) < epoch[1]:
            declared, r = conn.exchange(
                [
                    lambda o: encode_line("epoch", epoch[0], epoch[1], o),
                    lambda o: encode_put(topic, partition, payload, flag, o, cs),
                ],
                limit,
            )
            if declared.code != 200:  # a stale master: the loop path finds the new one
                return None
            pool.declared[conn] = epoch[1]
        else:
            r = conn.request(lambda o: encode_put(topic, partition, payload, flag, o, cs), limit)
    except RequestTimeoutError:
        pool.failed(conn)
        if timeout_s is not None and timeout_s <= pool.request_timeout_s:
            raise TimeoutError(f"no acknowledgement within {timeout_s:g} s") from None
        return None
    except ClientError:  # connection lost or refused, TLS, authentication
        pool.failed(conn)
        return None
    if r.code != 200:
        return None
    try:
        ack = PutAck.parse(r.body)
    except ProtocolError:
        pool.failed(conn)
        return None
    return SendResult(True, part, ack.offset, ack.msg_id)
