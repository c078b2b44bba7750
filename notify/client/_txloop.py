"""Local transactions over an asyncio connection: the loop's driver of the transaction core.

:class:`LoopTransaction` is the broker backend of :class:`~._transaction.AsyncTransaction`
(and, through :class:`LoopBackend`, of a blocking :class:`~._transaction.Transaction` that
cannot take the direct path). It does I/O only; what is sent and what each reply means is
:class:`~.core.transaction.TxCore`'s.

Nothing is sent until the first message: that send picks a partition as usual and binds the
transaction to that partition's broker and to one of the producer's own connections to it
(its transaction lane of the session's pool: no other user of the session can drop it);
BEGIN and the put are pipelined. Sends are queued and written in call order by one worker
task: what is ready goes out in one write (several for one partition as one ``mput``), and
when commit has started and nothing else is queued the COMMIT joins that write (BEGIN, puts
and ``COMMIT_ONE_PHASE msgs=<n>`` in one segment, one round trip); replies complete the
sends' futures as they arrive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, NamedTuple, Protocol

from notify.errors import ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol.frames import FrameBuilder, Response

from ._config import ClientConfig, ProducerConfig
from ._errors import ClientTransactionError, TransactionConnectionError
from ._loopthread import LoopThread
from ._message import Draft, Key, build_payload
from ._routing import TopicRouter
from .core.selectors import PartitionSelector
from .core.transaction import (
    C_AWAIT,
    C_SEND,
    K_COMMIT,
    S_ROLLING_BACK,
    Outcome,
    Resolved,
    Step,
    TxCore,
)
from .core.types import Partition, SendResult
from .transport import AsyncConnection

log = logging.getLogger("notify.client")

Future = asyncio.Future[SendResult]


class TxHost(Protocol):
    """What a transaction needs of its producer (``AsyncProducer`` implements it)."""

    router: TopicRouter
    client_config: ClientConfig
    config: ProducerConfig
    selector: PartitionSelector
    session_id: str
    #: brokers that answered ``mput`` with "unknown command"
    no_mput: set[str]

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def closed(self) -> bool: ...

    def check_open(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    async def tx_connection(self, address: str) -> AsyncConnection: ...


class _Unrouted(NamedTuple):
    """A send of the transaction waiting for its partition."""

    topic: str
    payload: bytes
    flag: int
    key: Key | None
    data: bytes
    future: Future


def outcome_of(fut: asyncio.Future[Response], tx_key: str) -> Outcome:
    """A reply future's reply, or the exception standing for it."""
    if fut.cancelled():
        return ClientTransactionError(f"send of transaction {tx_key} cancelled", tx_key)
    exc = fut.exception()
    return exc if exc is not None else fut.result()


class LoopTransaction:
    """One local transaction on the event loop (see the module docstring). All methods
    run on the producer's loop."""

    def __init__(self, host: TxHost, key: str, timeout_s: float | None = None):
        self.core: TxCore[Future] = TxCore(key, host.session_id, timeout_s, host.no_mput)
        self._host = host
        self._raise = host.config.raise_on_error
        self._conn: AsyncConnection | None = None
        self._waiting: deque[_Unrouted] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._replies: list[asyncio.Future[Response]] = []  # replies not settled yet
        self._commit_reply: tuple[asyncio.Future[Response], int] | None = None  # and opaque

    # -- sends

    def send_nowait(self, msg: Draft) -> Future:
        """Queue one message (written in call order); the future of its result."""
        topic, data, attribute, key, headers = msg
        self.core.check_open()
        self._host.check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ClientError(f"message data must be bytes, not {type(data).__name__}")
        body = bytes(data)
        payload, flag = build_payload(body, attribute, key, headers)
        fut: Future = self._host.loop.create_future()
        self._waiting.append(_Unrouted(topic, payload, flag, key, body, fut))
        if self._worker is None or self._worker.done():
            self._worker = self._host.spawn(self._work())
        return fut

    def _resolve(self, done: Resolved[Future]) -> None:
        for fut, result in done:
            if fut.done():
                continue
            if self._raise and not result.success and result.error is not None:
                fut.set_exception(result.error)
                fut.exception()  # the commit reports it too: no "never retrieved" warning
            else:
                fut.set_result(result)

    def _refuse(self, it: _Unrouted, err: Exception, misuse: bool = False) -> None:
        """``it`` fails with ``err`` (a misuse always raises); the transaction is
        rollback-only."""
        self.core.mark(err)
        if misuse and not it.future.done():
            it.future.set_exception(err)
        else:
            self._resolve([(it.future, SendResult(False, None, error=err))])

    async def _work(self) -> None:
        """Route the queued sends in order and write what is ready in one go."""
        try:
            while self._waiting:
                await self._route_queue()
                if self.core.queue:
                    commit = (
                        not self._waiting
                        and self._host.config.pipeline_commit
                        and self.core.may_pipeline_commit()
                    )
                    await self._flush(commit)
        except asyncio.CancelledError:  # the producer is closing
            while self._waiting:
                self._refuse(self._waiting.popleft(), ClientError("producer closed"))
            raise

    async def _route_queue(self) -> None:
        core = self.core
        while self._waiting:
            it = self._waiting[0]
            refusal = core.refusal()
            if refusal is not None:
                self._waiting.popleft()
                self._resolve([(it.future, SendResult(False, None, error=refusal))])
                continue
            try:
                part = self._route_now(it)
                if part is None:
                    if core.queue:
                        return  # write what is ready before waiting
                    part = await self._route_slow(it)
                    if part is None:
                        continue  # ended while connecting: refused above
            except TransactionConnectionError as e:
                self._refuse(self._waiting.popleft(), e)
                continue
            except ClientTransactionError as e:  # misuse (wrong broker): raise
                self._refuse(self._waiting.popleft(), e, misuse=True)
                continue
            except ClientError as e:
                self._refuse(self._waiting.popleft(), e)
                continue
            self._waiting.popleft()
            core.add(it.topic, part, it.payload, it.flag, it.future)

    def _route_now(self, it: _Unrouted) -> Partition | None:
        """The partition for ``it`` without waiting, or None when routing must wait."""
        if self.core.broker is None:
            return None
        parts = self._host.router.cached(it.topic)
        if parts is None:
            return None
        return self.core.select(it.topic, parts, it.key, it.data, self._host.selector)

    async def _route_slow(self, it: _Unrouted) -> Partition | None:
        """Route ``it``, looking its topic up; the first send also binds the transaction to
        its partition's broker and a connection to it. None: the transaction ended while
        connecting."""
        core = self.core
        host = self._host
        parts = host.router.cached(it.topic) or await host.router.partitions(it.topic)
        part = core.select(it.topic, parts, it.key, it.data, host.selector)
        if core.broker is not None:
            return part
        conn = await host.tx_connection(part.address)
        if core.refusal() is not None:
            return None
        self._conn = conn
        core.bind(part.broker_id, part.address)
        return part

    async def _flush(self, commit: bool) -> None:
        """Write BEGIN (first time), the routed sends and (``commit``) COMMIT in one go."""
        conn = self._conn
        assert conn is not None
        cfg = self._host.config
        flight = self.core.flight(
            mput=cfg.use_mput and cfg.pipeline_commit, checksum=cfg.send_checksum, commit=commit
        )
        timeout = self._host.client_config.request_timeout_s
        frames = _framed(conn, flight.frames)
        try:
            futs = conn.send_many(frames, timeout)
        except ConnectionLostError as e:
            self._resolve(self.core.unsent(flight, e))
            return
        for step, fut, (_, opaque) in zip(flight.steps, futs, frames, strict=True):
            if step.kind is K_COMMIT:
                self._commit_reply = fut, opaque
                fut.add_done_callback(_retrieve)
            else:
                self._replies.append(fut)
                fut.add_done_callback(functools.partial(self._on_reply, step))
        await conn.drain()

    def _on_reply(self, step: Step[Future], fut: asyncio.Future[Response]) -> None:
        self._resolve(self.core.on_reply(step, outcome_of(fut, self.core.key)))

    async def _settle(self) -> None:
        """Wait until every queued send is written and answered."""
        while self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)
        pending = [f for f in self._replies if not f.done()]
        if pending:
            await asyncio.wait(pending)
        self._replies.clear()

    # -- end

    def commit_soon(self) -> asyncio.Future[None]:
        """Start committing now (on the loop), finish in a task: for the blocking API, so a
        COMMIT queued with the sends joins their write."""
        self.core.start_commit()
        return asyncio.ensure_future(self._commit_started())

    async def commit(self) -> None:
        """Commit (see :meth:`AsyncTransaction.commit`)."""
        self.core.start_commit()
        await self._commit_started()

    async def _commit_started(self) -> None:
        core = self.core
        try:
            while self._worker is not None and not self._worker.done():
                await asyncio.shield(self._worker)  # every queued put written
            if self._host.config.pipeline_commit and core.may_pipeline_commit():
                self._write_commit()
            await self._settle()
            conn = self._conn
            if core.begun and not core.commit_sent and (conn is None or not conn.is_open):
                core.mark(core.lost())  # dropped: the broker rolled it back
            step = core.commit_plan()
            if step is C_SEND:
                core.on_commit_reply(await self._request(core.commit_frame(msgs=False)))
            elif step is C_AWAIT:
                assert self._commit_reply is not None
                core.on_commit_reply(await self._wait(*self._commit_reply))
            if core.state is S_ROLLING_BACK:
                await self._send_rollback()
            core.conclude()
        finally:
            core.settle_failed()

    def _write_commit(self) -> None:
        """Write COMMIT_ONE_PHASE msgs=<n> behind the puts (their replies not in yet)."""
        conn = self._conn
        if conn is None or not conn.is_open:
            return
        opaque = conn.next_opaque()
        try:
            fut = conn.send(self.core.commit_frame(msgs=True)(opaque), opaque)
        except ConnectionLostError:
            return  # the puts' replies say so: rolled back
        self._commit_reply = fut, opaque
        self.core.commit_sent = True
        fut.add_done_callback(_retrieve)

    async def _request(self, frame: FrameBuilder) -> Outcome:
        conn = self._conn
        assert conn is not None
        try:
            return await conn.request(frame, self._host.client_config.request_timeout_s)
        except (ConnectionLostError, RequestTimeoutError) as e:
            return e

    async def _wait(self, fut: asyncio.Future[Response], opaque: int) -> Outcome:
        conn = self._conn
        assert conn is not None
        try:
            return await conn.wait(fut, opaque, self._host.client_config.request_timeout_s)
        except (ConnectionLostError, RequestTimeoutError) as e:
            return e

    async def rollback(self) -> None:
        """Roll back (see :meth:`AsyncTransaction.rollback`)."""
        core = self.core
        if not core.start_rollback():
            return
        try:
            await self._settle()
            await self._send_rollback()
            core.rolled_back()
        finally:
            core.settle_failed()

    async def _send_rollback(self) -> None:
        frame = self.core.rollback_frame()
        conn = self._conn
        if frame is None or conn is None or not conn.is_open:
            return  # never begun, or the broker rolled it back when the connection dropped
        self.core.on_rollback_reply(await self._request(frame))


def _framed(conn: AsyncConnection, frames: list[FrameBuilder]) -> list[tuple[bytes, int]]:
    out: list[tuple[bytes, int]] = []
    for build in frames:
        o = conn.next_opaque()
        out.append((build(o), o))
    return out


def _retrieve(fut: asyncio.Future[Response]) -> None:
    if not fut.cancelled():
        fut.exception()


class LoopBackend:
    """A blocking transaction run on the session's loop thread (the loop path): the
    :class:`~._txbackend.SyncBackend` over a :class:`LoopTransaction`."""

    def __init__(self, tx: LoopTransaction, lt: LoopThread):
        self.tx = tx
        self.core = tx.core
        self._lt = lt

    def send_future(self, msg: Draft) -> concurrent.futures.Future[SendResult]:
        tx = self.tx
        return self._lt.call(lambda: tx.send_nowait(msg))

    def commit(self, timeout_s: float | None) -> None:
        self._lt.run_call(self.tx.commit_soon, timeout_s)

    def rollback(self, timeout_s: float | None) -> None:
        self._lt.run(self.tx.rollback(), timeout_s)
