"""Half messages (Notify's transactional messages): a message prepared at the broker before
the application's local transaction, committed or rolled back after it, and settled by the
producer group's checker when the producer cannot say (it died, or answered UNKNOWN).

Two ways to send one, both on a transactional producer
(``session.create_transactional_producer(group, checker)``)::

    def checker(msg: Message) -> LocalTxState:          # asked when the outcome is unknown
        return LocalTxState.COMMIT if order_exists(msg.data) else LocalTxState.ROLLBACK

    with producer.half_message("orders", b"order-1", key="user-7") as half:
        half.prepared()                 # optional: wait for PREPARE's acknowledgement
        save_order_in_my_database()
    # normal exit: PREPARE's ack awaited, then COMMIT; an exception: ROLLBACK (re-raised)

    result = producer.send_in_transaction("orders", b"order-2", local_tx)   # callback API

Both pipeline BEGIN, the put and PREPARE on one of the producer's registered connections
(:class:`~.core.transaction.TxCore` builds and reads them, as for every transaction).
``half_message`` does not wait for their replies before the block runs: on a normal exit it
waits for PREPARE's acknowledgement (raising when the message was not prepared), then sends
COMMIT_TWO_PHASE; on an exception it sends ROLLBACK (once PREPARE is answered) and the
exception propagates. A block whose database commit must not happen without the message
calls ``half.prepared()`` before it. ``send_in_transaction`` waits for the PREPARE first,
then runs ``local_tx(msg)`` and sends COMMIT_TWO_PHASE or ROLLBACK for its answer, nothing
for UNKNOWN. When ``local_tx`` raises, the state is UNKNOWN (a raised exception does not prove
the local transaction did not commit, e.g. a lost reply of the database's COMMIT) and the
exception propagates; the broker checks back later (RocketMQ does the same). A COMMIT or
ROLLBACK that cannot be delivered is left to the check-back too (``error`` of the result,
``half.error``), never retried on another message.

The seam for the application's side (:class:`LocalSide`): a block made with a local side
gives the block what ``begin(half)`` returns (e.g. the application's database connection,
its transaction begun and the half message's marker row written), runs ``commit`` after
PREPARE's acknowledgement and before COMMIT_TWO_PHASE, and ``rollback`` on an exception or
when the message was not prepared; by default there is none and the block gets the
:class:`HalfMessage` handle. A database-backed side (the outbox's marker table, read by the
check-back) plugs in there: ``AsyncHalfMessageBlock(start, local.begin, local)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from notify.errors import ClientError, ConnectionLostError, RequestTimeoutError

from ._config import ClientConfig, ProducerConfig
from ._errors import ClientTransactionError, TransactionConnectionError
from ._facade import Delegated
from ._loopthread import LoopThread
from ._message import Draft, Key, Message, build_payload
from ._routing import TopicRouter
from .core.selectors import PartitionSelector
from .core.states import TxState
from .core.transaction import Kind, Outcome, Step, TxCore
from .core.types import Partition, SendResult
from .transport import AsyncConnection

log = logging.getLogger("notify.client")
T = TypeVar("T")


class LocalTxState(enum.Enum):
    """The outcome of a local transaction (RocketMQ's LocalTransactionState)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


#: ``checker(msg) -> LocalTxState`` (may be ``async def``).
TransactionChecker = Callable[[Message], "LocalTxState | Awaitable[LocalTxState]"]
#: ``local_tx(msg) -> LocalTxState`` (may be ``async def`` in the asyncio API).
LocalTransaction = Callable[[Message], "LocalTxState | Awaitable[LocalTxState]"]


def as_state(value: object, tx_key: str) -> LocalTxState:
    """Accept a LocalTxState (or its name); anything else counts as UNKNOWN."""
    if isinstance(value, LocalTxState):
        return value
    if isinstance(value, str) and value.upper() in LocalTxState.__members__:
        return LocalTxState[value.upper()]
    log.warning("transaction %s: %r is not a LocalTxState: taken as UNKNOWN", tx_key, value)
    return LocalTxState.UNKNOWN


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


class Drafted(NamedTuple):
    """A half message checked and built, not yet routed (:meth:`HalfMessage.draft`)."""

    topic: str
    key: Key | None
    body: bytes
    payload: bytes
    flag: int


class HalfHost(Protocol):
    """What a half message needs of its producer (``AsyncProducer`` implements it)."""

    router: TopicRouter
    client_config: ClientConfig
    config: ProducerConfig
    selector: PartitionSelector
    session_id: str

    def check_open(self) -> None: ...

    def next_tx_key(self) -> str: ...

    async def tx_connection(self, address: str) -> AsyncConnection: ...

    def ready_tx_connection(self, address: str) -> AsyncConnection | None: ...

    def track_second_phase(self, fut: asyncio.Future[Any]) -> None: ...

    def spawn(self, coro: Any) -> asyncio.Task[None]: ...


class LocalSide(Protocol):
    """The application's side of a half message (see the module docstring)."""

    def begin(self, half: HalfMessage) -> object: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


class HalfMessage:
    """One half message on its way (asyncio; the blocking API runs it on its loop).

    ``tx_key`` names it; once :meth:`prepared`, ``result`` and ``message`` carry its id.
    ``state`` follows the client transaction's states; ``error`` is a COMMIT or ROLLBACK
    that could not be delivered (left to the check-back).
    """

    tx_key = Delegated[str]("core.key", "The half message's transaction key.")
    state = Delegated[TxState]("core.state", "Where its transaction is.")

    def __init__(
        self,
        host: HalfHost,
        core: TxCore[None],
        conn: AsyncConnection,
        msg: Message,
        replies: list[tuple[Step[None], asyncio.Future[Any]]],
    ):
        self._host = host
        self.core = core
        self._conn = conn
        self.message = msg
        self.result = SendResult(True, msg.partition, -1, -1)
        self.error: Exception | None = None
        self._replies = replies  # BEGIN's, the put's and PREPARE's, in flight
        self._prepare: Exception | bool | None = False  # False: not awaited yet

    @staticmethod
    def draft(host: HalfHost, msg: Draft) -> Drafted:
        """Check ``msg`` and build its payload (no I/O; any thread): raises what a send of
        it would raise before anything is written."""
        topic, data, attribute, key, headers = msg
        host.check_open()
        if host.config.producer_group is None:
            raise ClientTransactionError(
                "half messages need a producer group: "
                "session.create_transactional_producer(group, checker)"
            )
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ClientError(f"message data must be bytes, not {type(data).__name__}")
        body = bytes(data)
        payload, flag = build_payload(body, attribute, key, headers)
        return Drafted(topic, key, body, payload, flag)

    @classmethod
    async def send(cls, host: HalfHost, msg: Draft, timeout: float | None) -> HalfMessage:
        """Write BEGIN, the put and PREPARE on a registered connection (replies not
        awaited). Raises when the message cannot be sent at all."""
        return await cls.send_drafted(host, cls.draft(host, msg), timeout, host.next_tx_key())

    @classmethod
    async def send_drafted(
        cls, host: HalfHost, d: Drafted, timeout: float | None, tx_key: str
    ) -> HalfMessage:
        """:meth:`send` of a message :meth:`draft` built, as transaction ``tx_key``."""
        parts = host.router.cached(d.topic) or await host.router.partitions(d.topic)
        part = host.selector(d.topic, parts, d.key, d.body)
        conn = await host.tx_connection(part.address)
        return cls._write(host, conn, part, d, timeout, tx_key)

    @classmethod
    def send_now(
        cls, host: HalfHost, d: Drafted, timeout: float | None, tx_key: str
    ) -> HalfMessage | None:
        """:meth:`send` of a drafted message without waiting (on the loop): None when the
        topic's route or the producer's registered connection is not there yet (then
        :meth:`send` does it, waiting for them)."""
        parts = host.router.cached(d.topic)
        if not parts:
            return None
        part = host.selector(d.topic, parts, d.key, d.body)
        conn = host.ready_tx_connection(part.address)
        if conn is None:
            return None
        return cls._write(host, conn, part, d, timeout, tx_key)

    @classmethod
    def _write(
        cls,
        host: HalfHost,
        conn: AsyncConnection,
        part: Partition,
        d: Drafted,
        timeout: float | None,
        tx_key: str,
    ) -> HalfMessage:
        core: TxCore[None] = TxCore(tx_key, host.session_id, timeout)
        core.bind(part.broker_id, part.address)
        core.add(d.topic, part, d.payload, d.flag, None)
        flight = core.flight(mput=False, checksum=host.config.send_checksum, prepare=True)
        frames = []
        for build in flight.frames:
            o = conn.next_opaque()
            frames.append((build(o), o))
        try:
            futs = conn.send_many(frames, host.client_config.request_timeout_s)
        except ConnectionLostError as e:
            raise TransactionConnectionError(f"half message {core.key}: {e}", core.key) from e
        for fut in futs:
            fut.add_done_callback(_retrieve)
        message = Message(d.topic, part, -1, -1, d.flag, d.payload)
        return cls(host, core, conn, message, list(zip(flight.steps, futs, strict=True)))

    async def prepared(self) -> SendResult:
        """Wait for PREPARE's acknowledgement: the half message's result (its id, offset
        -1). Raises when it was not prepared (:class:`TransactionConnectionError` when no
        reply came: if it was prepared after all, the check-back settles it)."""
        if self._prepare is False:
            self._prepare = await self._settle_prepare()
        if isinstance(self._prepare, Exception):
            raise self._prepare
        return self.result

    async def _settle_prepare(self) -> Exception | None:
        await asyncio.wait([fut for _step, fut in self._replies])
        err = self._settle_replies()
        if self.core.state is TxState.ROLLING_BACK:  # PREPARE refused: nothing to keep
            await self._roll_back_refused()
        return err

    def _settle_replies(self) -> Exception | None:
        """Read the replies of BEGIN, the put and PREPARE (all in): the error of PREPARE
        (None: prepared); the state is ROLLING_BACK when a ROLLBACK must follow."""
        core = self.core
        prepare: Outcome = ClientError("no PREPARE")
        for step, fut in self._replies:
            outcome = _done_outcome(fut)
            if step.kind is Kind.PREPARE:
                prepare = outcome
                continue
            for _none, result in core.on_reply(step, outcome):
                if result.success:
                    self.result = result
                    self.message = self.message._replace(msg_id=result.msg_id)
        return core.on_prepare_reply(prepare)

    async def _roll_back_refused(self) -> None:
        with contextlib.suppress(ClientError):
            await self._request(self.core.rollback_frame())
        self.core.rolled_back()

    def on_prepared(self, done: Callable[[Exception | None], None]) -> None:
        """Call ``done(error)`` on the loop once PREPARE is settled as :meth:`prepared`
        settles it (``error`` None: prepared), without a task: from the replies' callbacks."""
        left = len(self._replies)

        def one(_fut: asyncio.Future[Any]) -> None:
            nonlocal left
            left -= 1
            if left:
                return
            try:
                err = self._settle_replies()
            except Exception as e:  # a reply nobody could read: not prepared
                err = e
            self._prepare = err
            if self.core.state is TxState.ROLLING_BACK:
                task = asyncio.ensure_future(self._roll_back_refused())
                task.add_done_callback(lambda _t: done(err))
                return
            done(err)

        for _step, fut in self._replies:
            fut.add_done_callback(one)

    async def finish(self, commit: bool) -> Exception | None:
        """COMMIT_TWO_PHASE (``commit``) or ROLLBACK of the prepared message; the error when
        it could not be delivered (then the broker checks back)."""
        return await self._second_phase(self.core.second_phase(commit))

    def finish_later(self, commit: bool) -> asyncio.Future[Any] | None:
        """:meth:`finish` without waiting (on the loop): the COMMIT_TWO_PHASE or ROLLBACK
        is written now and its reply read by a callback (an error is logged and kept in
        ``error``: the broker checks back). The future of the reply, for a caller that
        keeps track (None when nothing could be written: ``error`` says why)."""
        frame = self.core.second_phase(commit)
        conn = self._conn
        if not conn.is_open:  # a prepared transaction may end on any connection
            return asyncio.ensure_future(self._second_phase(frame))
        o = conn.next_opaque()
        try:
            fut = conn.send_many([(frame(o), o)], self._host.client_config.request_timeout_s)[0]
        except ConnectionLostError as e:
            self._second_phase_outcome(e)
            return None
        fut.add_done_callback(lambda f: self._second_phase_outcome(_done_outcome(f)))
        return fut

    async def _second_phase(self, frame: Any) -> Exception | None:
        conn = self._conn
        if not conn.is_open:
            try:
                conn = self._conn = await self._host.tx_connection(conn.address)
            except ClientError as e:
                return self._second_phase_outcome(e)
        return self._second_phase_outcome(await self._request(frame))

    def _second_phase_outcome(self, outcome: Outcome) -> Exception | None:
        err = self.core.on_second_phase_reply(outcome)
        return self._left(err) if err is not None else None

    def _left(self, err: Exception) -> Exception:
        verb = "COMMIT_TWO_PHASE" if self.core.state is not TxState.ROLLED_BACK else "ROLLBACK"
        log.warning("half message %s: %s failed (%s): left to check-back", self.tx_key, verb, err)
        self.error = err
        return err

    async def close(self, failed: bool, local: LocalSide | None = None) -> None:
        """End the ``half_message`` block: on success wait for PREPARE's acknowledgement
        (raising when not prepared: ``local`` rolls back), commit ``local``, then COMMIT;
        on failure roll back ``local`` and the message."""
        if failed:
            try:
                if local is not None:
                    local.rollback()
            finally:
                if await self._settle_quietly():
                    await self.finish(False)
            return
        try:
            await self.prepared()
        except BaseException:
            if local is not None:
                local.rollback()
            raise
        if local is not None:
            local.commit()  # the application's transaction first: then the message
        await self.finish(True)

    async def _settle_quietly(self) -> bool:
        """Whether the message was prepared (errors of PREPARE are not raised here)."""
        try:
            await self.prepared()
        except ClientError as e:
            log.info("half message %s not prepared: %s", self.tx_key, e)
            return False
        return True

    async def _request(self, frame: Any) -> Outcome:
        try:
            return await self._conn.request(frame, self._host.client_config.request_timeout_s)
        except (ConnectionLostError, RequestTimeoutError) as e:
            return e


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _done_outcome(fut: asyncio.Future[Any]) -> Outcome:
    """A done reply future's outcome: the reply, or the connection's error (cancelled:
    the connection's error too, as no reply came; anything else raises)."""
    if fut.cancelled():
        return ConnectionLostError("request cancelled")
    exc = fut.exception()
    if exc is None:
        return fut.result()  # type: ignore[no-any-return]
    if isinstance(exc, ConnectionLostError | RequestTimeoutError):
        return exc
    raise exc


async def run_local(half: HalfMessage, local_tx: LocalTransaction) -> LocalTxState:
    """``local_tx(msg)`` (plain or ``async def``) as a state; raises what it raises (the
    outcome is then UNKNOWN: left to the check-back)."""
    try:
        res: object = local_tx(half.message)
        if inspect.isawaitable(res):
            res = await res
    except BaseException as e:
        local_tx_raised(half, e)
        raise
    return as_state(res, half.tx_key)


def local_tx_raised(half: HalfMessage, e: BaseException) -> None:
    """Say that ``local_tx`` raised: the outcome is UNKNOWN, left to the check-back."""
    log.warning("local transaction of %s raised %r: UNKNOWN, left to check-back", half.tx_key, e)


async def decide(half: HalfMessage, state: LocalTxState) -> TransactionSendResult:
    """Second phase for the local transaction's ``state`` (nothing for UNKNOWN)."""
    err = None
    if state is LocalTxState.UNKNOWN:
        log.info("half message %s left UNKNOWN: the broker will check back", half.tx_key)
    else:
        err = await half.finish(state is LocalTxState.COMMIT)
    return TransactionSendResult(half.tx_key, state, half.result, err)


class AsyncHalfMessageBlock(Generic[T]):
    """``async with producer.half_message(...) as half:`` (see the module docstring).

    ``enter(half)`` is what the block gets (the :class:`HalfMessage` itself by default;
    a :class:`LocalSide`'s ``begin`` for a database-backed one, whose ``commit`` and
    ``rollback`` the block's end then runs)."""

    def __init__(
        self,
        start: Callable[[], Coroutine[Any, Any, HalfMessage]],
        enter: Callable[[HalfMessage], T],
        local: LocalSide | None = None,
    ):
        self._start = start
        self._enter = enter
        self._local = local
        self.half: HalfMessage | None = None

    async def __aenter__(self) -> T:
        self.half = await self._start()
        return self._enter(self.half)

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        assert self.half is not None
        await self.half.close(exc_type is not None, self._local)


class SyncHalfMessage:
    """The blocking API's view of a :class:`HalfMessage` (what ``half_message`` yields)."""

    tx_key = Delegated[str]("half.core.key", "The half message's transaction key.")
    state = Delegated[TxState]("half.core.state", "Where its transaction is.")
    message = Delegated[Message]("half.message", "The message (its id once prepared).")
    error = Delegated[Exception | None](
        "half.error", "A COMMIT or ROLLBACK that could not be delivered (left to check-back)."
    )

    def __init__(self, half: HalfMessage, lt: LoopThread):
        self.half = half
        self._lt = lt

    def prepared(self, timeout_s: float | None = None) -> SendResult:
        """Wait for PREPARE's acknowledgement (see :meth:`HalfMessage.prepared`)."""
        return self._lt.run(self.half.prepared(), timeout_s)


class HalfMessageBlock(Generic[T]):
    """``with producer.half_message(...) as half:`` (blocking API; see the module
    docstring): the half message runs on the session's loop thread; ``enter`` as for
    :class:`AsyncHalfMessageBlock` (by default the :class:`SyncHalfMessage` view)."""

    def __init__(
        self,
        start: Callable[[], Coroutine[Any, Any, HalfMessage]],
        lt: LoopThread,
        enter: Callable[[HalfMessage], T],
        local: LocalSide | None = None,
    ):
        self._start = start
        self._lt = lt
        self._enter = enter
        self._local = local
        self.half: HalfMessage | None = None

    def __enter__(self) -> T:
        self.half = self._lt.run(self._start())
        return self._enter(self.half)

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        assert self.half is not None
        self._lt.run(self.half.close(exc_type is not None, self._local))
