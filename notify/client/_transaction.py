"""Client-side transactions: local transactions and Notify-style half messages.

**Local transactions** (MetaQ's ``beginTransaction``/``commit``)::

    with producer.transaction(timeout=10):   # commit on normal exit, rollback on exception
        producer.send("orders", b"order-1")
        producer.send("audit", b"order-1 created")

    async with aproducer.transaction(timeout=10):
        await aproducer.send("orders", b"order-1")

A transaction's key is ``TX:<sessionId>:<seq>`` (``sessionId`` unique per producer
instance). Nothing is sent until the first message: that send picks a partition as usual
and binds the transaction to that partition's **broker** and to one of the producer's own
connections to it (not the session's shared pool, so no other user of the session can
drop it); BEGIN and the put are pipelined. Later sends pick among that broker's partitions
of their topic (:class:`ClientTransactionError` when it has none). Each send is a ``put``
carrying the txKey, written in call order on that connection; its
:class:`~notify.client.SendResult` has the message id and offset -1 (the message becomes
visible at commit). A failed send makes the transaction *rollback-only*: ``commit()``
then rolls back and raises. If the connection drops the broker rolls the transaction back
and the client reports :class:`TransactionConnectionError`; it never retries a transaction
on a new connection.

The current transaction is per producer and per thread (sync API) or per
:mod:`contextvars` context, i.e. per task (asyncio API): ``producer.send`` joins it only
there; other threads and tasks keep sending outside it.

**Half messages** (Notify's transactional messages) need a producer group and a checker::

    def checker(msg: Message) -> LocalTxState:          # asked when the outcome is unknown
        return LocalTxState.COMMIT if order_exists(msg.data) else LocalTxState.ROLLBACK

    producer = session.create_transactional_producer("shop-group", checker)
    result = producer.send_in_transaction("orders", b"order-1", local_tx)

``send_in_transaction`` pipelines BEGIN, the put and PREPARE, runs ``local_tx(msg)`` and
sends COMMIT_TWO_PHASE or ROLLBACK for its answer, nothing for UNKNOWN. When
``local_tx`` raises, the state is UNKNOWN (a raised exception does not prove the local
transaction did not commit, e.g. a lost reply of the database's COMMIT) and the exception
propagates; the broker checks back later. RocketMQ does the same (state UNKNOW).
Check-backs arrive as ``check`` frames on any registered connection of the group; the
checker runs on an executor of ``ProducerConfig.check_threads`` threads (an ``async def``
checker runs on the loop), one at a time per transaction; COMMIT and ROLLBACK are answered
with ``transaction <txKey> <sessionId> COMMIT_TWO_PHASE|ROLLBACK``, UNKNOWN (or a checker
that raised) with nothing, so the broker asks again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import functools
import inspect
import logging
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol

from notify.errors import (
    BrokerError,
    ClientError,
    ConnectionLostError,
    ProtocolError,
    RequestTimeoutError,
)
from notify.protocol import records as rec
from notify.protocol.frames import Response, encode_line, encode_mput, encode_put
from notify.protocol.replies import MultiPutAck, XAFailure, put_ack_msg_id
from notify.protocol.xa import XA_RBROLLBACK, XA_RBTIMEOUT, XAER_NOTA
from notify.transport import AsyncConnection

from ._config import ClientConfig, ProducerConfig
from ._connection import ConnectionPool
from ._errors import (
    ClientTransactionError,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    XAError,
)
from ._loopthread import LoopThread
from ._message import Headers, Message, SendResult, build_payload
from ._routing import Partition, StaticBrokerDirectory, TopicRouter
from ._selectors import PartitionSelector, select_in_transaction

log = logging.getLogger("notify.client")

#: Check-backs being answered at once per producer beyond which new ones are dropped (the
#: broker asks again later).
MAX_PENDING_CHECKS: Final = 1024
#: Pause between attempts to (re)register with a broker after a non-connection failure.
REGISTER_RETRY_S: Final = 1.0


class LocalTxState(enum.Enum):
    """The outcome of a local transaction (RocketMQ's LocalTransactionState)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


#: ``checker(msg) -> LocalTxState`` (may be ``async def``).
TransactionChecker = Callable[[Message], "LocalTxState | Awaitable[LocalTxState]"]
#: ``local_tx(msg) -> LocalTxState`` (may be ``async def`` in the asyncio API).
LocalTransaction = Callable[[Message], "LocalTxState | Awaitable[LocalTxState]"]


class TxProducer(Protocol):
    """What transactions need from their producer (``_producer.AsyncProducer`` implements
    it; declared here so that this module does not import the producer's)."""

    pool: ConnectionPool
    router: TopicRouter
    client_config: ClientConfig
    config: ProducerConfig
    selector: PartitionSelector
    session_id: str
    checker: TransactionChecker | None
    #: brokers that answered ``mput`` with "unknown command"
    _no_mput: set[str]

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def _check_open(self) -> None: ...

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    def _tx_ended(self, tx: AsyncTransaction) -> None: ...

    async def _tx_connection(self, address: str) -> AsyncConnection: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """Outcome of :meth:`AsyncProducer.send_in_transaction`.

    ``state`` is what the local transaction answered; ``send_result`` is the half
    message's (offset -1). ``error`` is set when the COMMIT_TWO_PHASE/ROLLBACK that followed
    could not be delivered: the broker then settles it by checking back.
    """

    tx_key: str
    state: LocalTxState
    send_result: SendResult
    error: Exception | None = None

    @property
    def msg_id(self) -> int:
        return self.send_result.msg_id

    @property
    def partition(self) -> Partition | None:
        return self.send_result.partition


def reply_error(r: Response, tx_key: str | None) -> ClientError:
    """The error of a non-200 reply: :class:`XAError` (or its timeout subclass) for
    ``XAException:code=N,msg=...`` bodies, :class:`BrokerError` otherwise."""
    try:
        failure = XAFailure.parse(r.body)
    except ProtocolError:
        failure = None
    if failure is None:
        return BrokerError(r.code, r.body.decode("utf-8", "replace"))
    cls = TransactionTimeoutError if failure.code == XA_RBTIMEOUT else XAError
    return cls(failure.code, failure.message, tx_key, r.code)


def as_state(value: object, tx_key: str) -> LocalTxState:
    """Accept a LocalTxState (or its name); anything else counts as UNKNOWN."""
    if isinstance(value, LocalTxState):
        return value
    if isinstance(value, str) and value.upper() in LocalTxState.__members__:
        return LocalTxState[value.upper()]
    log.warning("transaction %s: %r is not a LocalTxState: taken as UNKNOWN", tx_key, value)
    return LocalTxState.UNKNOWN


def _retrieve(fut: asyncio.Future[Response]) -> None:
    if not fut.cancelled():
        fut.exception()


def _put_msg_id(r: Response) -> int:
    try:
        return put_ack_msg_id(r.body)
    except ProtocolError as e:
        raise ClientError(str(e)) from None


def timeout_token(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if timeout <= 0:
        raise ClientError(f"transaction timeout must be > 0 seconds, not {timeout}")
    return max(1, math.ceil(timeout))


class _TxSend:
    __slots__ = ("data", "flag", "future", "key", "payload", "topic")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        flag: int,
        key: bytes | str | None,
        data: bytes,
        future: asyncio.Future[SendResult],
    ):
        self.topic = topic
        self.payload = payload
        self.flag = flag
        self.key = key
        self.data = data
        self.future = future


ACTIVE: Final = "active"
COMMITTING: Final = "committing"
COMMITTED: Final = "committed"
ROLLING_BACK: Final = "rolling_back"
ROLLED_BACK: Final = "rolled_back"
FAILED: Final = "failed"
_FINISHED: Final = frozenset({COMMITTED, ROLLED_BACK, FAILED})


class AsyncTransaction:
    """One local transaction of an :class:`AsyncProducer` (asyncio API).

    Get it from :meth:`AsyncProducer.transaction` / :meth:`AsyncProducer.begin_transaction`
    (which also make it the current transaction of the calling context, so
    ``producer.send`` joins it)::

        async with producer.transaction(timeout=10) as tx:
            await producer.send("orders", b"o-1")       # same as: await tx.send(...)
        # committed here; an exception in the block rolls back instead

        tx = producer.begin_transaction()
        await producer.send("orders", b"o-2")
        await tx.commit()                               # or: await tx.rollback()

    ``status`` is one of active, committing, committed, rolling_back, rolled_back, failed.
    """

    def __init__(self, producer: TxProducer, key: str, timeout: float | None = None):
        self.key = key
        self.timeout = timeout_token(timeout)
        self._p = producer
        self._status: str = ACTIVE
        self._conn: AsyncConnection | None = None
        self._broker: tuple[int, str] | None = None
        self._begin: asyncio.Future[Response] | None = None
        self._begin_lost: ClientError | None = None
        self._queue: deque[_TxSend] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._pending: list[asyncio.Future[SendResult]] = []
        self._failure: Exception | None = None
        self._written = 0  # put frames written (COMMIT's msgs=<n>)
        self._commit_sent: tuple[asyncio.Future[Response], int] | None = None
        self._chosen: dict[str, Partition] = {}  # keyless messages' partition, per topic

    def __repr__(self) -> str:
        return f"<AsyncTransaction {self.key} {self._status} broker={self.broker}>"

    @property
    def status(self) -> str:
        return self._status

    @property
    def active(self) -> bool:
        """True until commit or rollback starts."""
        return self._status == ACTIVE

    @property
    def finished(self) -> bool:
        """Committed, rolled back or failed."""
        return self._status in _FINISHED

    @property
    def broker(self) -> str | None:
        """Address of the broker the transaction is bound to (None before the first send)."""
        return None if self._broker is None else self._broker[1]

    @property
    def rollback_only(self) -> bool:
        """True when a send failed: commit() will roll back and raise."""
        return self._failure is not None

    # -- sends

    async def send(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> SendResult:
        """Send one message in the transaction and wait for the broker to record it.

        A failed send returns ``success`` False (and makes the transaction rollback-only);
        a topic without a partition on the transaction's broker raises
        :class:`ClientTransactionError`.
        """
        return await self.send_nowait(topic, data, attribute, key, headers=headers)

    def send_nowait(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue one message of the transaction (sent in call order); future of its result."""
        if not self.active:
            raise ClientTransactionError(
                f"transaction {self.key} is {self._status}: it takes no more messages", self.key
            )
        self._p._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ClientError(f"message data must be bytes, not {type(data).__name__}")
        body = bytes(data)
        payload, flag = build_payload(body, attribute, key, headers)
        fut: asyncio.Future[SendResult] = self._p.loop.create_future()
        self._queue.append(_TxSend(topic, payload, flag, key, body, fut))
        if self._worker is None or self._worker.done():
            self._worker = self._p._spawn(self._work())
        return fut

    async def _work(self) -> None:
        """Write the queued sends in order; what is ready goes out in one write."""
        try:
            await self._work_queue()
        except asyncio.CancelledError:  # the producer is closing
            while self._queue:
                it = self._queue.popleft()
                self._fail(it, None, ClientError("producer closed"))
            raise

    async def _work_queue(self) -> None:
        while self._queue:
            frames: list[tuple[bytes, int]] = []
            puts: list[tuple[_TxSend, Partition]] = []
            while self._queue:
                it = self._queue[0]
                err = self._refusal()
                if err is not None:
                    self._queue.popleft()
                    self._fail(it, None, err, mark=False)
                    continue
                try:
                    part = self._route_now(it)
                    if part is None:
                        if frames or puts:
                            break  # write what is ready before waiting
                        part = await self._route_slow(it, frames)
                        if part is None:
                            continue  # ended while connecting: refused above
                except TransactionConnectionError as e:
                    self._queue.popleft()
                    self._fail(it, None, e)
                    continue
                except ClientTransactionError as e:  # misuse (wrong broker): raise
                    self._queue.popleft()
                    self._mark(e)
                    if not it.future.done():
                        it.future.set_exception(e)
                    continue
                except ClientError as e:
                    self._queue.popleft()
                    self._fail(it, None, e)
                    continue
                self._queue.popleft()
                puts.append((it, part))
            if frames or puts:
                # commit() already started and nothing else is queued: COMMIT joins this
                # write (BEGIN, puts and COMMIT in one segment, one round trip)
                commit = not self._queue and self._pipelining_commit()
                await self._flush(frames, puts, commit)

    def _refusal(self) -> ClientTransactionError | None:
        """Why a queued send must not be written any more (None: write it)."""
        if self._status not in (ACTIVE, COMMITTING):
            return ClientTransactionError(
                f"not sent: transaction {self.key} was rolled back first", self.key
            )
        if self._failure is not None:
            return TransactionAbortedError(
                f"not sent: transaction {self.key} is rollback-only after a failed send "
                f"({self._failure})",
                self.key,
                self._failure,
            )
        return None

    def _route_now(self, it: _TxSend) -> Partition | None:
        """The partition for ``it`` without waiting, or None when routing must wait."""
        if self._broker is None:
            return None
        parts = self._p.router.cached(it.topic)
        if parts is None:
            return None
        return self._pick(it, parts)

    async def _route_slow(self, it: _TxSend, frames: list[tuple[bytes, int]]) -> Partition | None:
        """Route ``it`` (looking the topic up); the first send also binds the transaction to
        its broker and a connection and adds BEGIN to ``frames``. None: the transaction
        ended meanwhile."""
        p = self._p
        parts = p.router.cached(it.topic) or await p.router.partitions(it.topic)
        if self._broker is not None:
            return self._pick(it, parts)
        part = self._select(it, parts)
        conn = await p._tx_connection(part.address)
        if self._refusal() is not None:
            return None
        self._conn = conn
        self._broker = (part.broker_id, part.address)
        opaque = conn.next_opaque()
        line = ["transaction", self.key, p.session_id, "BEGIN"]
        if self.timeout is not None:
            line.append(str(self.timeout))
        frames.append((encode_line(*line, opaque), opaque))
        return part

    def _pick(self, it: _TxSend, parts: list[Partition]) -> Partition:
        assert self._broker is not None
        bid, addr = self._broker
        local = [x for x in parts if x.broker_id == bid and x.address == addr]
        if not local:
            raise ClientTransactionError(
                f"topic {it.topic!r} has no partition on broker {bid} ({addr}), the broker "
                f"transaction {self.key} is bound to: all messages of a transaction go to "
                "one broker",
                self.key,
            )
        return self._select(it, local)

    def _select(self, it: _TxSend, parts: list[Partition]) -> Partition:
        try:
            return select_in_transaction(
                self._p.selector, self._chosen, it.topic, parts, it.key, it.data
            )
        except ClientError:
            raise
        except Exception as e:
            raise ClientError(f"partition selector: {e}") from e

    def _put_frame(self, it: _TxSend, part: Partition) -> tuple[bytes, int]:
        conn = self._conn
        assert conn is not None
        cs = rec.checksum(it.payload) if self._p.config.send_checksum else None
        opaque = conn.next_opaque()
        frame = encode_put(
            it.topic, part.partition, it.payload, it.flag, opaque, checksum=cs, tx_key=self.key
        )
        return frame, opaque

    def _put_frames(
        self, puts: list[tuple[_TxSend, Partition]]
    ) -> list[tuple[tuple[bytes, int], list[tuple[_TxSend, Partition]]]]:
        """The frames for ``puts``: several messages for one partition go as one ``mput``
        (records in their on-disk layout; the transaction keeps each partition's order),
        a lone one as a ``put``. ``mput`` only to brokers that know it (with
        ``use_mput`` and ``pipeline_commit``, both notify extensions)."""
        conn = self._conn
        assert conn is not None
        p = self._p
        if (
            len(puts) < 2
            or not (p.config.use_mput and p.config.pipeline_commit)
            or conn.address in p._no_mput
        ):
            return [(self._put_frame(it, part), [(it, part)]) for it, part in puts]
        groups: dict[tuple[str, int], list[tuple[_TxSend, Partition]]] = {}
        for it, part in puts:
            groups.setdefault((it.topic, part.partition), []).append((it, part))
        out: list[tuple[tuple[bytes, int], list[tuple[_TxSend, Partition]]]] = []
        for (topic, partition), group in groups.items():
            if len(group) == 1:
                out.append((self._put_frame(*group[0]), group))
                continue
            body = b"".join([rec.encode(0, it.flag, it.payload) for it, _ in group])
            o = conn.next_opaque()
            out.append(((encode_mput(topic, partition, body, len(group), o, self.key), o), group))
        return out

    async def _flush(
        self,
        frames: list[tuple[bytes, int]],
        puts: list[tuple[_TxSend, Partition]],
        commit: bool = False,
    ) -> None:
        conn = self._conn
        assert conn is not None
        timeout = self._p.client_config.request_timeout_s
        has_begin = bool(frames)  # BEGIN goes first
        groups = self._put_frames(puts)
        frames.extend(f for f, _ in groups)
        if commit:
            frames.append(self._commit_frame(conn, self._written + len(puts)))
        try:
            futs = conn.send_many(frames, timeout)
        except ConnectionLostError:
            lost = self._lost()
            if self._begin is None and has_begin:
                self._begin_lost = lost
            for it, part in puts:
                self._fail(it, part, lost)
            return
        self._written += len(puts)
        if commit:
            self._commit_sent = (futs[-1], frames[-1][1])
            futs[-1].add_done_callback(_retrieve)
            del futs[-1]
        if has_begin:
            self._begin = futs[0]
            self._begin.add_done_callback(_retrieve)
        for (_, group), fut in zip(groups, futs[len(futs) - len(groups) :], strict=True):
            for it, _part in group:
                self._pending.append(it.future)
            if len(group) == 1:
                it, part = group[0]
                fut.add_done_callback(functools.partial(self._on_put_reply, it, part))
            else:
                fut.add_done_callback(functools.partial(self._on_mput_reply, group))
        await conn.drain()

    def _on_mput_reply(
        self, group: list[tuple[_TxSend, Partition]], fut: asyncio.Future[Response]
    ) -> None:
        """The reply to one transactional ``mput``: ids ``first..first+n-1`` in order."""
        exc = None if fut.cancelled() else fut.exception()
        part = group[0][1]
        err: Exception | None = self._begin_failure()
        first = -1
        if err is None:
            if fut.cancelled():
                err = ClientTransactionError(f"send of transaction {self.key} cancelled")
            elif isinstance(exc, ConnectionLostError):
                err = self._lost()
            elif exc is not None:
                err = exc if isinstance(exc, Exception) else ClientError(str(exc))
            else:
                r = fut.result()
                try:
                    if r.code == 400 and b"unknown command" in r.body.lower():
                        self._p._no_mput.add(part.address)  # later transactions: put
                    if r.code != 200:
                        raise reply_error(r, self.key)
                    ack = MultiPutAck.parse(r.body)
                    if ack.count != len(group):
                        raise ClientError(
                            f"mput reply acknowledges {ack.count} of {len(group)} messages"
                        )
                    first = ack.first_msg_id
                except ProtocolError as e:
                    err = ClientError(str(e))
                except ClientError as e:
                    err = e
        for i, (it, p) in enumerate(group):
            if err is not None:
                self._fail(it, p, err)
            elif not it.future.done():
                it.future.set_result(SendResult(True, p, -1, first + i))

    def _begin_failure(self) -> ClientError | None:
        """BEGIN's error once its reply is in (None: it succeeded or is still pending)."""
        if self._begin_lost is not None:
            return self._begin_lost
        b = self._begin
        if b is None or not b.done() or b.cancelled():
            return None
        exc = b.exception()
        if isinstance(exc, ConnectionLostError):
            return self._lost()
        if isinstance(exc, ClientError):
            return exc
        r = b.result()
        return reply_error(r, self.key) if r.code != 200 else None

    def _on_put_reply(self, it: _TxSend, part: Partition, fut: asyncio.Future[Response]) -> None:
        exc = None if fut.cancelled() else fut.exception()  # always retrieved
        err: Exception | None = self._begin_failure()  # BEGIN's error explains the put's
        msg_id = -1
        if err is None:
            if fut.cancelled():
                err = ClientTransactionError(f"send of transaction {self.key} cancelled")
            elif isinstance(exc, ConnectionLostError):
                err = self._lost()
            elif exc is not None:
                err = exc if isinstance(exc, Exception) else ClientError(str(exc))
            else:
                r = fut.result()
                try:
                    if r.code != 200:
                        raise reply_error(r, self.key)
                    msg_id = _put_msg_id(r)
                except ClientError as e:
                    err = e
        if err is not None:
            self._fail(it, part, err)
        elif not it.future.done():
            it.future.set_result(SendResult(True, part, -1, msg_id))

    def _lost(self) -> TransactionConnectionError:
        addr = self.broker
        return TransactionConnectionError(
            f"connection to {addr} dropped during transaction {self.key}: the broker rolled "
            "it back (a transaction is never moved to another connection)",
            self.key,
        )

    def _mark(self, err: Exception) -> None:
        if self._failure is None:
            self._failure = err

    def _fail(self, it: _TxSend, part: Partition | None, err: Exception, mark: bool = True) -> None:
        if mark:
            self._mark(err)
        if not it.future.done():
            it.future.set_result(SendResult(False, part, error=err))

    async def _settle(self) -> None:
        """Wait until every queued send is written and answered."""
        while self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)
        pending = [f for f in self._pending if not f.done()]
        if pending:
            await asyncio.wait(pending)
        self._pending.clear()
        if self._begin is not None and not self._begin.done():
            await asyncio.wait([self._begin])
        err = self._begin_failure()
        if err is not None:
            self._mark(err)

    # -- end

    async def _command(
        self, verb: str, sent: tuple[asyncio.Future[Response], int] | None = None
    ) -> Response:
        """Send ``verb`` and wait for its reply (``sent``: already written, just wait)."""
        conn = self._conn
        assert conn is not None
        committing = verb.startswith("COMMIT")
        if sent is None and not conn.is_open:
            raise self._lost()
        p = self._p
        try:
            if sent is None:
                r = await conn.request(
                    lambda o: encode_line("transaction", self.key, p.session_id, verb, o),
                    p.client_config.request_timeout_s,
                )
            else:
                r = await conn.wait(sent[0], sent[1], p.client_config.request_timeout_s)
        except (ConnectionLostError, RequestTimeoutError) as e:
            if committing:
                raise TransactionOutcomeUnknownError(
                    f"transaction {self.key}: no reply to {verb} ({e}): the broker may or may "
                    "not have committed it",
                    self.key,
                ) from e
            if isinstance(e, ConnectionLostError):
                raise self._lost() from e
            raise
        if r.code != 200:
            raise reply_error(r, self.key)
        return r

    async def commit(self) -> None:
        """Commit: COMMIT_ONE_PHASE right behind the puts (one round trip in all).

        The COMMIT is written as soon as every queued send is written, without waiting
        for their acknowledgements; it carries the number of messages written
        (``msgs=<n>``), so the broker rolls the transaction back when a put was refused
        (``ProducerConfig.pipeline_commit=False``: wait for the acks first, for brokers
        without this extension).

        Raises :class:`TransactionAbortedError` (rolled back because a send failed),
        :class:`TransactionTimeoutError` (the broker timed it out: rolled back),
        :class:`TransactionConnectionError` (connection dropped: rolled back),
        :class:`TransactionOutcomeUnknownError` (no reply to COMMIT) or :class:`XAError`.
        A transaction without messages commits without talking to the broker.
        """
        self._start_commit()
        await self._commit_started()

    def _start_commit(self) -> None:
        """The synchronous start of :meth:`commit` (no more sends from here on)."""
        if not self.active:
            raise ClientTransactionError(
                f"cannot commit transaction {self.key}: it is {self._status}", self.key
            )
        self._status = COMMITTING

    def _commit_soon(self) -> asyncio.Future[None]:
        """Start committing now (on the loop), finish in a task: for the blocking API, so a
        COMMIT queued with the sends joins their write."""
        self._start_commit()
        return asyncio.ensure_future(self._commit_started())

    async def _commit_started(self) -> None:
        try:
            while self._worker is not None and not self._worker.done():
                await asyncio.shield(self._worker)  # every queued put written
            sent = self._commit_sent or self._write_commit()
            await self._settle()
            if sent is not None:
                return await self._finish_pipelined(sent)
            failure = self._failure
            if failure is not None:
                await self._send_rollback()
                self._status = ROLLED_BACK
                if isinstance(failure, XAError | TransactionConnectionError):
                    raise failure.with_traceback(None)
                raise TransactionAbortedError(
                    f"transaction {self.key} rolled back instead of committed: a send failed "
                    f"({failure})",
                    self.key,
                    failure,
                ) from failure
            if self._conn is None:
                self._status = COMMITTED
                return
            try:
                await self._command("COMMIT_ONE_PHASE")
            except (TransactionTimeoutError, TransactionConnectionError) as e:
                unknown = isinstance(e, TransactionOutcomeUnknownError)
                self._status = FAILED if unknown else ROLLED_BACK
                raise
            self._status = COMMITTED
        finally:
            if self._status == COMMITTING:
                self._status = FAILED
            self._p._tx_ended(self)

    def _pipelining_commit(self) -> bool:
        """True when commit() has started and COMMIT may go behind the puts unacknowledged."""
        return (
            self._status == COMMITTING
            and self._commit_sent is None
            and self._failure is None
            and self._p.config.pipeline_commit
        )

    def _commit_frame(self, conn: AsyncConnection, written: int) -> tuple[bytes, int]:
        o = conn.next_opaque()
        sid = self._p.session_id
        verb = "COMMIT_ONE_PHASE"
        return encode_line("transaction", self.key, sid, verb, f"msgs={written}", o), o

    def _write_commit(self) -> tuple[asyncio.Future[Response], int] | None:
        """Write COMMIT_ONE_PHASE msgs=<n> behind the puts when that is safe and allowed."""
        conn = self._conn
        if conn is None or not conn.is_open or not self._pipelining_commit():
            return None
        line, o = self._commit_frame(conn, self._written)
        try:
            self._commit_sent = conn.send(line, o), o
        except ConnectionLostError:
            return None  # the puts' replies will say so: rolled back
        return self._commit_sent

    async def _finish_pipelined(self, sent: tuple[asyncio.Future[Response], int]) -> None:
        """The outcome of a pipelined COMMIT (the puts' replies are in)."""
        failure = self._failure
        try:
            await self._command("COMMIT_ONE_PHASE", sent)
        except (TransactionTimeoutError, TransactionConnectionError) as e:
            unknown = isinstance(e, TransactionOutcomeUnknownError)
            self._status = FAILED if unknown else ROLLED_BACK
            raise
        except XAError:
            if failure is None:
                raise
            # a put was refused (or BEGIN was): the broker rolled the transaction back
            # (XA_RBROLLBACK) or never had it; ROLLBACK as the unpipelined path does
            await self._send_rollback()
            self._status = ROLLED_BACK
            if isinstance(failure, XAError | TransactionConnectionError):
                raise failure.with_traceback(None) from None
            raise TransactionAbortedError(
                f"transaction {self.key} rolled back instead of committed: a send failed "
                f"({failure})",
                self.key,
                failure,
            ) from failure
        self._status = COMMITTED
        if failure is not None:  # a broker that ignored msgs=<n>: say it loudly
            log.error(
                "transaction %s committed although a send failed (%s): the broker does not "
                "check msgs=<n>; set ProducerConfig.pipeline_commit=False for it",
                self.key,
                failure,
            )

    async def rollback(self) -> None:
        """Roll back (ROLLBACK): sends not yet written are dropped, none becomes visible.

        Quiet when the broker already rolled it back (timeout, dropped connection) and a
        no-op once rolled back or after a failed commit; raises
        :class:`ClientTransactionError` after a successful commit.
        """
        if self._status in (ROLLED_BACK, FAILED):
            return
        if self._status == COMMITTED:
            raise ClientTransactionError(f"transaction {self.key} is already committed", self.key)
        if self._status != ACTIVE:
            raise ClientTransactionError(f"transaction {self.key} is {self._status}", self.key)
        self._status = ROLLING_BACK
        try:
            await self._settle()
            await self._send_rollback()
            self._status = ROLLED_BACK
        finally:
            if self._status == ROLLING_BACK:
                self._status = FAILED
            self._p._tx_ended(self)

    async def _send_rollback(self) -> None:
        conn = self._conn
        if conn is None or not conn.is_open:
            return  # never begun, or the broker rolled it back when the connection dropped
        try:
            await self._command("ROLLBACK")
        except XAError as e:
            if e.code not in (XA_RBTIMEOUT, XAER_NOTA, XA_RBROLLBACK):
                raise
        except (TransactionConnectionError, RequestTimeoutError) as e:
            # an unprepared local transaction can only end rolled back (drop or timeout)
            log.info("transaction %s: rollback not acknowledged (%s)", self.key, e)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.active:  # committed or rolled back explicitly inside the block
            return
        if exc_type is None:
            await self.commit()
            return
        try:
            await self.rollback()
        except Exception as e:  # keep the block's exception
            log.warning("transaction %s: rollback after %r failed: %s", self.key, exc, e)


class Transaction:
    """One local transaction of a synchronous :class:`Producer` (thread-safe handle).

    ::

        with producer.transaction(timeout=10) as tx:   # commit on exit, rollback on error
            producer.send("orders", b"o-1")             # joins: same producer, same thread
            tx.send("audit", b"o-1 created")            # explicit form, any thread

        tx = producer.begin_transaction(timeout=10)
        producer.send("orders", b"o-2")
        tx.commit()                                     # or tx.rollback()

    ``send_future`` pipelines: ``[tx.send_future(...) for ...]`` then ``tx.commit()``.
    See :class:`AsyncTransaction` for the semantics and errors.
    """

    def __init__(
        self,
        core: AsyncTransaction,
        lt: LoopThread,
        on_end: Callable[[Transaction], None] | None = None,
    ):
        self.core = core
        self._lt = lt
        self._on_end = on_end
        self.thread_id = threading.get_ident()

    def __repr__(self) -> str:
        return f"<Transaction {self.key} {self.status}>"

    @property
    def key(self) -> str:
        return self.core.key

    @property
    def status(self) -> str:
        return self.core.status

    @property
    def active(self) -> bool:
        return self.core.active

    @property
    def finished(self) -> bool:
        return self.core.finished

    @property
    def broker(self) -> str | None:
        return self.core.broker

    def send(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        timeout_s: float | None = None,
        *,
        headers: Headers | None = None,
    ) -> SendResult:
        """Send one message in the transaction and wait for its result (offset -1)."""
        return self.send_future(topic, data, attribute, key, headers=headers).result(timeout_s)

    def send_future(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message of the transaction (kept in call order); future of its result."""
        core = self.core
        return self._lt.call(lambda: core.send_nowait(topic, data, attribute, key, headers=headers))

    def commit(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncTransaction.commit`."""
        try:
            self._lt.run_call(self.core._commit_soon, timeout_s)
        finally:
            self._ended()

    def rollback(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncTransaction.rollback`."""
        try:
            self._lt.run(self.core.rollback(), timeout_s)
        finally:
            self._ended()

    def _ended(self) -> None:
        if self._on_end is not None and self.core.finished:
            self._on_end(self)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.active:
            return
        if exc_type is None:
            self.commit()
            return
        try:
            self.rollback()
        except Exception as e:  # keep the block's exception
            log.warning("transaction %s: rollback after %r failed: %s", self.key, exc, e)


# --------------------------------------------------------------------------- half messages


@dataclass(slots=True)
class HalfMessage:
    """A prepared half message waiting for its local transaction's outcome."""

    tx_key: str
    conn: AsyncConnection
    result: SendResult
    message: Message


class TxChannel:
    """A producer's own connections for transactions (one per broker address).

    With a producer group every connection ``register``s the group before first use, routes
    the broker's ``check`` frames to the producer's checker and is kept open (reconnected
    with the pool's backoff) so check-backs can reach this producer.
    """

    def __init__(self, producer: TxProducer):
        cc = producer.client_config
        self._p = producer
        self.pool = ConnectionPool(
            cc.connect_timeout_s,
            cc.reconnect_backoff_min_s,
            cc.reconnect_backoff_max_s,
            producer.pool.options,
        )
        self.pool.share_epochs(producer.pool)  # automatic failover: declare the epochs
        self.group = producer.config.producer_group
        self._registering: dict[AsyncConnection, asyncio.Task[None]] = {}
        self._kept: set[str] = set()
        self._checking: set[str] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self.checks_answered = 0

    async def get(self, address: str) -> AsyncConnection:
        """An open connection to ``address``, registered with the group if there is one."""
        conn = await self.pool.get(address)
        if self.group is None or conn.producer_group == self.group:
            return conn
        task = self._registering.get(conn)
        if task is None:
            task = self._p.loop.create_task(self._register(conn, self.group))
            self._registering[conn] = task
            task.add_done_callback(functools.partial(self._registered, conn))
        await asyncio.shield(task)
        self.keep_registered(address)
        return conn

    def _registered(self, conn: AsyncConnection, task: asyncio.Task[None]) -> None:
        self._registering.pop(conn, None)
        if not task.cancelled() and task.exception() is not None:
            self.pool.discard(conn)

    async def _register(self, conn: AsyncConnection, group: str) -> None:
        conn.check_handler = self._on_check
        secret = self._p.config.producer_group_secret
        words = (group, secret) if secret else (group,)
        r = await conn.request(
            lambda o: encode_line("register", *words, o), self._p.client_config.request_timeout_s
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
        directory = self._p.router.directory
        if isinstance(directory, StaticBrokerDirectory):
            for address in directory.brokers.values():
                self.keep_registered(address)

    def keep_registered(self, address: str) -> None:
        if self.group is None or address in self._kept or self._closed:
            return
        self._kept.add(address)
        self._p._spawn(self._keep(address))

    async def _keep(self, address: str) -> None:
        while not self._closed:
            try:
                conn = await self.get(address)
            except ConnectionLostError as e:  # the pool waits out its backoff next time
                log.debug("producer group %s: %s", self.group, e)
                await asyncio.sleep(self._p.client_config.reconnect_backoff_min_s)
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
        self._p._spawn(self._answer(conn, key, msg))

    def _broker_id(self, address: str, topic: str) -> int:
        for p in self._p.router.cached(topic) or ():
            if p.address == address:
                return p.broker_id
        directory = self._p.router.directory
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
            verb = "COMMIT_TWO_PHASE" if state is LocalTxState.COMMIT else "ROLLBACK"
            target = conn if conn.is_open else self.pool.cached(conn.address)
            if target is None:
                log.info("check-back of %s: no connection left to answer %s", key, verb)
                return
            sid = self._p.session_id
            try:
                r = await target.request(
                    lambda o: encode_line("transaction", key, sid, verb, o),
                    self._p.client_config.request_timeout_s,
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
        checker = self._p.checker
        if checker is None:
            log.warning("check-back of %s but producer has no checker: UNKNOWN", key)
            return LocalTxState.UNKNOWN
        try:
            res: object
            if inspect.iscoroutinefunction(checker):
                res = await checker(msg)
            else:
                loop = self._p.loop
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
                max_workers=max(1, self._p.config.check_threads),
                thread_name_prefix="notify-tx-check",
            )
        return self._executor

    async def close(self) -> None:
        self._closed = True
        await self.pool.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
