"""A producer's own connections for transactions, and the check-backs of its group.

Each producer keeps its transaction connections in its own lane of the session's pool (one
per broker address; no other user of the session can drop them). With a producer group,
every such connection ``register``s the group before first use, routes the broker's
``check`` frames to the producer's checker and is kept open (reconnected with the pool's
backoff) so check-backs can reach this producer. The checker (for a producer made with
``db=``, the marker table's :meth:`~notify.outbox.HalfMarkers.check`) runs on an executor
of ``ProducerConfig.check_threads`` threads (an ``async def`` checker runs on the loop), one at
a time per transaction; COMMIT and ROLLBACK are answered with ``transaction <txKey>
<sessionId> COMMIT_TWO_PHASE|ROLLBACK``, UNKNOWN (or a checker that raised) with nothing,
so the broker asks again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final, Protocol

from notify.errors import ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol import records as rec
from notify.protocol.frames import Response, encode_line

from ._config import ClientConfig, ProducerConfig
from ._connection import ConnectionPool
from ._halfmsg import LocalTxState, TransactionChecker, as_state
from ._message import Message
from ._routing import StaticBrokerDirectory, TopicRouter
from .core import wire
from .core.types import Partition
from .transport import AsyncConnection

if TYPE_CHECKING:
    from notify.outbox.half import HalfMarkers

log = logging.getLogger("notify.client")

#: Check-backs being answered at once per producer beyond which new ones are dropped (the
#: broker asks again later).
MAX_PENDING_CHECKS: Final = 1024
#: Pause between attempts to (re)register with a broker after a non-connection failure.
REGISTER_RETRY_S: Final = 1.0


class ChannelHost(Protocol):
    """What the channel needs of its producer (``AsyncProducer`` implements it)."""

    pool: ConnectionPool
    router: TopicRouter
    client_config: ClientConfig
    config: ProducerConfig
    session_id: str
    checker: TransactionChecker | None
    markers: HalfMarkers | None

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class TxChannel:
    """A producer's transaction connections (see the module docstring)."""

    def __init__(self, host: ChannelHost):
        self._host = host
        self.pool = host.pool
        self.lane = f"tx:{host.session_id}"
        self.group = host.config.producer_group
        self._registering: dict[AsyncConnection, asyncio.Task[None]] = {}
        self._kept: set[str] = set()
        self._checking: set[str] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self.checks_answered = 0
        #: replies to second phases written without waiting (``half_message`` with ``db=``)
        self._second: set[asyncio.Future[Any]] = set()

    def ready(self, address: str) -> AsyncConnection | None:
        """The open connection to ``address``, registered with the group, if there is one
        (no I/O; else :meth:`get`)."""
        conn = self.pool.cached(address, self.lane)
        if conn is None or (self.group is not None and conn.producer_group != self.group):
            return None
        return conn

    def track(self, fut: asyncio.Future[Any]) -> None:
        """Keep the reply future of a second phase written without waiting, so that
        :meth:`settled` (the producer's ``flush`` and ``close``) waits for it."""
        if not fut.done():
            self._second.add(fut)
            fut.add_done_callback(self._second.discard)

    async def settled(self) -> None:
        """Wait for the replies of the second phases written so far (each is bounded by
        the request timeout)."""
        while self._second:
            await asyncio.wait(list(self._second))

    async def get(self, address: str) -> AsyncConnection:
        """An open connection to ``address``, registered with the group if there is one."""
        conn = await self.pool.get(address, self.lane)
        if self.group is None or conn.producer_group == self.group:
            return conn
        task = self._registering.get(conn)
        if task is None:
            task = self._host.loop.create_task(self._register(conn, self.group))
            self._registering[conn] = task
            task.add_done_callback(functools.partial(self._registered, conn))
        await asyncio.shield(task)
        self.keep_registered(address)
        return conn

    def _registered(self, conn: AsyncConnection, task: asyncio.Task[None]) -> None:
        self._registering.pop(conn, None)
        if not task.cancelled() and task.exception() is not None:
            self.pool.discard(conn, self.lane)

    async def _register(self, conn: AsyncConnection, group: str) -> None:
        conn.check_handler = self._on_check
        secret = self._host.config.producer_group_secret
        words = (group, secret) if secret else (group,)
        r = await conn.request(
            lambda o: encode_line("register", *words, o),
            self._host.client_config.request_timeout_s,
        )
        if r.code != 200:
            raise ClientError(
                f"broker {conn.address} refused to register producer group {group!r}: "
                f"{r.code} {r.body.decode('utf-8', 'replace')}"
            )
        conn.producer_group = group
        log.debug("registered producer group %s on %s", group, conn.address)

    def start(self) -> None:
        """Register with every broker the directory lists (a static one) right away."""
        directory = self._host.router.directory
        if isinstance(directory, StaticBrokerDirectory):
            for address in directory.brokers.values():
                self.keep_registered(address)

    def keep_registered(self, address: str) -> None:
        if self.group is None or address in self._kept or self._closed:
            return
        self._kept.add(address)
        self._host.spawn(self._keep(address))

    async def _keep(self, address: str) -> None:
        while not self._closed:
            try:
                conn = await self.get(address)
            except ConnectionLostError as e:  # the pool waits out its backoff next time
                log.debug("producer group %s: %s", self.group, e)
                await asyncio.sleep(self._host.client_config.reconnect_backoff_min_s)
                continue
            except ClientError as e:
                if self._closed:
                    return
                log.warning("producer group %s on %s: %s", self.group, address, e)
                await asyncio.sleep(REGISTER_RETRY_S)
                continue
            await asyncio.shield(conn.closed_future)

    # -- check-backs

    def _on_check(self, conn: AsyncConnection, r: Response) -> None:
        key = r.tx_key or ""
        if key in self._checking:
            return  # still answering the previous check of it
        if len(self._checking) >= MAX_PENDING_CHECKS or self._closed:
            log.info("check-back of %s dropped: %d pending", key, len(self._checking))
            return
        try:
            recs, _ = rec.decode_all(r.body)
        except ValueError as e:
            log.error("check-back of %s: unreadable records: %s", key, e)
            return
        if not recs:
            log.error("check-back of %s carries no message", key)
            return
        topic = r.topic or ""
        part = Partition(self._broker_id(conn.address, topic), r.partition, conn.address)
        first = recs[0]
        msg = Message(topic, part, -1, first.msg_id, first.flag, first.payload)
        self._checking.add(key)
        self._host.spawn(self._answer(conn, key, msg))

    def _broker_id(self, address: str, topic: str) -> int:
        for p in self._host.router.cached(topic) or ():
            if p.address == address:
                return p.broker_id
        directory = self._host.router.directory
        if isinstance(directory, StaticBrokerDirectory):
            for bid, a in directory.brokers.items():
                if a == address:
                    return bid
        return -1

    async def _answer(self, conn: AsyncConnection, key: str, msg: Message) -> None:
        try:
            state = await self._ask(key, msg)
            if state is LocalTxState.UNKNOWN:
                return
            verb = wire.COMMIT_TWO_PHASE if state is LocalTxState.COMMIT else wire.ROLLBACK
            target = conn if conn.is_open else self.pool.cached(conn.address, self.lane)
            if target is None:
                log.info("check-back of %s: no connection left to answer %s", key, verb)
                return
            try:
                r = await target.request(
                    wire.command(key, self._host.session_id, verb),
                    self._host.client_config.request_timeout_s,
                )
            except (ConnectionLostError, RequestTimeoutError) as e:
                log.info("check-back of %s: %s not delivered: %s", key, verb, e)
                return
            self.checks_answered += 1
            if r.code != 200:
                log.info("check-back of %s: %s answered %s", key, verb, r.body[:200])
        finally:
            self._checking.discard(key)

    async def _ask(self, key: str, msg: Message) -> LocalTxState:
        markers = self._host.markers
        if markers is not None:  # db=: the marker table decides, from any producer
            loop = self._host.loop
            try:
                found = await loop.run_in_executor(self._pool_executor(), markers.check, key)
            except Exception:
                log.exception("check-back of %s from the marker table failed: UNKNOWN", key)
                return LocalTxState.UNKNOWN
            return LocalTxState[found.name]
        checker = self._host.checker
        if checker is None:
            log.warning("check-back of %s but producer has no checker: UNKNOWN", key)
            return LocalTxState.UNKNOWN
        try:
            res: object
            if inspect.iscoroutinefunction(checker):
                res = await checker(msg)
            else:
                loop = self._host.loop
                res = await loop.run_in_executor(self._pool_executor(), checker, msg)
                if inspect.isawaitable(res):
                    res = await res
        except Exception:
            log.exception("transaction checker failed for %s: UNKNOWN (asked again later)", key)
            return LocalTxState.UNKNOWN
        return as_state(res, key)

    def _pool_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(1, self._host.config.check_threads),
                thread_name_prefix="notify-tx-check",
            )
        return self._executor

    async def close(self) -> None:
        self._closed = True
        await self.settled()
        await self.pool.close_lane(self.lane)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
