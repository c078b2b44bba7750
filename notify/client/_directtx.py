"""The synchronous producer's direct transactions: over the calling thread's own socket.

``with producer.transaction(): producer.send_future(...)`` used to hop to the session's
loop thread for every send and for the commit (queued calls, wake-ups, tasks and futures
on two threads). A :class:`DirectTransaction` instead keeps the sends in a list on the
calling thread and writes BEGIN, the puts (one ``mput`` per partition, records in their
on-disk layout) and ``COMMIT_ONE_PHASE msgs=<n>`` in one write over a blocking
:class:`~notify.transport.BlockingConnection` of that thread, then reads the replies on
the same thread: one write, one round trip, no thread hop.

A send's future completes when the transaction is flushed: at commit, or as soon as
anyone waits on a future of it (``result()``, ``exception()``, ``add_done_callback``,
``concurrent.futures.wait``/``as_completed``), which writes what is queued (BEGIN and the
puts, without COMMIT) and reads their replies first. ``send()`` therefore costs one round
trip, ``send_future`` none until commit.

The direct path is an optimisation only. A transaction takes it when its producer's
settings allow (``pipeline_commit`` and ``use_mput``, a thread-safe selector, no producer
group) and its first message can be routed and given a connection without waiting;
otherwise the whole transaction goes the loop path (:class:`Transaction`) before anything
is sent, with the same key. Semantics and errors are the loop path's: a failed put makes
the COMMIT roll back (the broker checks ``msgs=<n>``), a dropped connection rolls back, no
reply to the COMMIT is :class:`TransactionOutcomeUnknownError`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from notify.errors import ClientError, ConnectionLostError, ProtocolError, RequestTimeoutError
from notify.protocol import records as rec
from notify.protocol.frames import Response, encode_line, encode_mput, encode_put
from notify.protocol.replies import MultiPutAck, put_ack_msg_id
from notify.protocol.xa import XA_RBROLLBACK, XA_RBTIMEOUT, XAER_NOTA
from notify.transport import BlockingConnection, FrameBuilder

from ._direct import _SAFE_SELECTORS, DirectPool
from ._errors import (
    ClientTransactionError,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    XAError,
)
from ._loopthread import LoopThread
from ._message import Headers, SendResult, build_payload
from ._producer import AsyncProducer
from ._routing import Partition
from ._selectors import select_in_transaction
from ._transaction import (
    ACTIVE,
    COMMITTED,
    COMMITTING,
    FAILED,
    ROLLED_BACK,
    ROLLING_BACK,
    AsyncTransaction,
    Transaction,
    reply_error,
)

log = logging.getLogger("notify.client")

_FINISHED = frozenset({COMMITTED, ROLLED_BACK, FAILED})

# One lock per blocking connection: transactions of one thread share its connection, and a
# future may be waited on (so the transaction flushed) from another thread.
_conn_locks: weakref.WeakKeyDictionary[BlockingConnection, threading.Lock] = (
    weakref.WeakKeyDictionary()
)
_conn_locks_guard = threading.Lock()


def _lock_of(conn: BlockingConnection) -> threading.Lock:
    with _conn_locks_guard:
        lock = _conn_locks.get(conn)
        if lock is None:
            lock = _conn_locks[conn] = threading.Lock()
        return lock


def direct_eligible(core: AsyncProducer) -> bool:
    """True when the producer's settings let its transactions take the direct path."""
    cfg = core.config
    return (
        cfg.pipeline_commit
        and cfg.use_mput
        and cfg.producer_group is None
        and type(core.selector) in _SAFE_SELECTORS
    )


class _Waiters(list[Any]):
    """``Future._waiters`` of a queued send: ``concurrent.futures.wait``/``as_completed``
    install a waiter here, which flushes the transaction first (else they would wait for
    a commit that cannot come)."""

    __slots__ = ("fut",)

    def __init__(self, fut: _TxFuture):
        super().__init__()
        self.fut = fut

    def append(self, item: Any) -> None:
        super().append(item)
        self.fut.demand()


class _TxFuture(concurrent.futures.Future[SendResult]):
    """A queued send's result: waiting on it flushes its transaction first."""

    def __init__(self, tx: DirectTransaction):
        super().__init__()
        self._tx: DirectTransaction | None = tx
        self._waiters = _Waiters(self)

    def demand(self) -> None:
        tx = self._tx
        if tx is not None and not self.done():
            tx.flush()

    def result(self, timeout: float | None = None) -> SendResult:
        self.demand()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.demand()
        return super().exception(timeout)

    def add_done_callback(
        self, fn: Callable[[concurrent.futures.Future[SendResult]], object]
    ) -> None:
        self.demand()
        super().add_done_callback(fn)


class _Queued:
    __slots__ = ("flag", "future", "part", "payload", "topic")

    def __init__(self, topic: str, part: Partition, payload: bytes, flag: int, fut: _TxFuture):
        self.topic = topic
        self.part = part
        self.payload = payload
        self.flag = flag
        self.future = fut


class DirectTransaction(Transaction):
    """A :class:`Transaction` of a synchronous producer that goes over the calling thread's
    own socket (see the module docstring); same surface and semantics."""

    def __init__(
        self,
        core: AsyncTransaction,
        lt: LoopThread,
        producer: AsyncProducer,
        pool: DirectPool,
        on_end: Callable[[Transaction], None] | None = None,
    ):
        super().__init__(core, lt, on_end)
        self._p = producer
        self._pool = pool
        self._direct: bool | None = None  # None: no send yet; False: the loop path
        self._status: str = ACTIVE
        self._conn: BlockingConnection | None = None
        self._broker: tuple[int, str] | None = None
        self._begun = False  # BEGIN written
        self._queue: list[_Queued] = []
        self._local: dict[str, list[Partition]] = {}
        self._chosen: dict[str, Partition] = {}  # keyless messages' partition, per topic
        self._written = 0  # messages written (COMMIT's msgs=<n>)
        self._failure: Exception | None = None
        #: when the broker would have timed it out, had BEGIN gone with the first message
        self._deadline: float | None = None
        #: futures resolved under the lock, completed after it (_deliver)
        self._results: list[tuple[_TxFuture, SendResult]] = []
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<DirectTransaction {self.key} {self.status}>"

    @property
    def status(self) -> str:
        return self.core.status if self._direct is False else self._status

    @property
    def active(self) -> bool:
        return self.status == ACTIVE

    @property
    def finished(self) -> bool:
        return self.status in _FINISHED

    @property
    def broker(self) -> str | None:
        if self._direct is False:
            return self.core.broker
        return None if self._broker is None else self._broker[1]

    # -- sends

    def send_future(
        self,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        key: bytes | str | None = None,
        *,
        headers: Headers | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message of the transaction (kept in call order); future of its result
        (completed when the transaction is flushed: at commit or when waited on)."""
        with self._lock:
            if self._direct is False:
                return super().send_future(topic, data, attribute, key, headers=headers)
            if self._status != ACTIVE:
                raise ClientTransactionError(
                    f"transaction {self.key} is {self._status}: it takes no more messages",
                    self.key,
                )
            p = self._p
            p._check_open()
            if not isinstance(data, bytes | bytearray | memoryview):
                raise ClientError(f"message data must be bytes, not {type(data).__name__}")
            body = bytes(data)
            payload, flag = build_payload(body, attribute, key, headers)
            fut = _TxFuture(self)
            try:
                part = self._route(topic, key, body)
            except ClientTransactionError as e:  # misuse (wrong broker): raised by result()
                self._mark(e)
                fut.set_exception(e)
                return fut
            except ClientError as e:  # unknown topic, a selector's error: a failed send
                self._mark(e)
                fut.set_result(SendResult(False, None, error=e))
                return fut
            if self._direct is None:
                # the connection of the thread that began it (another thread's could be
                # closed when that thread ends)
                mine = threading.get_ident() == self.thread_id
                conn = self._pool.get(part.address) if mine else None
                # a failover group's epoch is declared by the loop path's connections
                fenced = self._pool.epoch_of is not None and (
                    self._pool.epoch_of(part.address) is not None
                )
                if conn is None or fenced or part.address in p._no_mput:
                    self._direct = False  # nothing sent yet: the loop path, same key
                    return super().send_future(topic, data, attribute, key, headers=headers)
                self._direct = True
                self._conn = conn
                self._broker = (part.broker_id, part.address)
                if self.core.timeout is not None:  # the broker's clock would start here
                    self._deadline = time.monotonic() + self.core.timeout
            self._queue.append(_Queued(topic, part, payload, flag, fut))
            return fut

    def _route(self, topic: str, key: bytes | str | None, body: bytes) -> Partition:
        p = self._p
        # this topic's partitions on the bound broker, looked up once per transaction
        parts = self._local.get(topic) or self._parts(topic)
        try:
            return select_in_transaction(p.selector, self._chosen, topic, parts, key, body)
        except ClientError:
            raise
        except Exception as e:
            raise ClientError(f"partition selector: {e}") from e

    def _parts(self, topic: str) -> list[Partition]:
        p = self._p
        parts = p.router.cached(topic)
        if parts is None:
            parts = self._lt.run(p.router.partitions(topic))
        if self._broker is not None:
            bid, addr = self._broker
            parts = [x for x in parts if x.broker_id == bid and x.address == addr]
            if not parts:
                raise ClientTransactionError(
                    f"topic {topic!r} has no partition on broker {bid} ({addr}), the "
                    f"broker transaction {self.key} is bound to: all messages of a "
                    "transaction go to one broker",
                    self.key,
                )
            self._local[topic] = parts
        return parts

    def flush(self) -> None:
        """Write the queued sends (BEGIN first) and read their replies, on this thread."""
        try:
            with self._lock:
                if not self._queue:
                    return
                if self._failure is not None or self._status not in (ACTIVE, COMMITTING):
                    self._fail_queue(self._refusal())
                    return
                self._exchange(commit=False)
        finally:
            self._deliver()

    def _refusal(self) -> ClientTransactionError:
        if self._failure is None:
            return ClientTransactionError(
                f"not sent: transaction {self.key} was rolled back first", self.key
            )
        return TransactionAbortedError(
            f"not sent: transaction {self.key} is rollback-only after a failed send "
            f"({self._failure})",
            self.key,
            self._failure,
        )

    def _frames(self, commit: bool) -> tuple[list[FrameBuilder], list[list[_Queued]]]:
        p = self._p
        key, sid = self.key, p.session_id
        builds: list[FrameBuilder] = []
        if not self._begun:
            words = ["transaction", key, sid, "BEGIN"]
            if self.core.timeout is not None:
                words.append(str(self.core.timeout))
            builds.append(lambda o: encode_line(*words, o))
        groups: dict[tuple[str, int], list[_Queued]] = {}
        for it in self._queue:
            groups.setdefault((it.topic, it.part.partition), []).append(it)
        checksum = p.config.send_checksum
        for (topic, partition), group in groups.items():
            if len(group) == 1:
                it = group[0]
                cs = rec.checksum(it.payload) if checksum else None
                builds.append(
                    functools.partial(
                        encode_put, topic, partition, it.payload, it.flag, checksum=cs, tx_key=key
                    )
                )
            else:
                body = b"".join([rec.encode(0, it.flag, it.payload) for it in group])
                builds.append(
                    functools.partial(encode_mput, topic, partition, body, len(group), tx_key=key)
                )
        if commit:
            msgs = f"msgs={self._written + len(self._queue)}"
            builds.append(
                lambda o: encode_line("transaction", key, sid, "COMMIT_ONE_PHASE", msgs, o)
            )
        return builds, list(groups.values())

    def _exchange(self, commit: bool, timeout_s: float | None = None) -> Response | None:
        """One write of BEGIN (first time), the queued puts and (``commit``) the COMMIT;
        the COMMIT's reply. Resolves the queued futures; raises what the loop path raises
        for a lost connection."""
        conn = self._conn
        assert conn is not None
        if self._begun and not conn.is_open:  # dropped: the broker rolled it back
            lost = self._lost()
            self._mark(lost)
            self._fail_queue(lost)
            if commit:
                raise lost
            return None
        had_begin = not self._begun
        builds, groups = self._frames(commit)
        self._queue = []
        timeout = self._pool.request_timeout_s
        if timeout_s is not None:
            timeout = min(timeout, timeout_s)
        try:
            with _lock_of(conn):
                replies = conn.exchange(builds, timeout)
        except (ConnectionLostError, RequestTimeoutError) as e:
            if commit:
                err: ClientError = TransactionOutcomeUnknownError(
                    f"transaction {self.key}: no reply to COMMIT_ONE_PHASE ({e}): the broker "
                    "may or may not have committed it",
                    self.key,
                )
            else:
                err = self._lost()
            for g in groups:
                for it in g:
                    self._fail(it, self._lost())
            if commit:
                raise err from e
            return None  # the sends failed; commit() raises

        except ClientError as e:  # TLS or authentication while connecting: nothing sent
            self._pool.failed(conn)
            for g in groups:
                for it in g:
                    self._fail(it, e)
            raise
        self._begun = True
        i = 0
        begin_err: Exception | None = None
        if had_begin:
            b = replies[0]
            i = 1
            if b.code != 200:
                begin_err = reply_error(b, self.key)
                self._mark(begin_err)
        for g in groups:
            r = replies[i]
            i += 1
            self._written += len(g)
            self._settle_group(g, r, begin_err)
        return replies[i] if commit else None

    def _settle_group(self, group: list[_Queued], r: Response, err: Exception | None) -> None:
        first = -1
        if err is None:
            try:
                if len(group) > 1 and r.code == 400 and b"unknown command" in r.body.lower():
                    self._p._no_mput.add(group[0].part.address)  # later transactions: loop
                if r.code != 200:
                    raise reply_error(r, self.key)
                if len(group) == 1:
                    first = put_ack_msg_id(r.body)
                else:
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
        for n, it in enumerate(group):
            if err is not None:
                self._fail(it, err)
            else:
                self._results.append((it.future, SendResult(True, it.part, -1, first + n)))

    def _lost(self) -> TransactionConnectionError:
        return TransactionConnectionError(
            f"connection to {self.broker} dropped during transaction {self.key}: the broker "
            "rolled it back (a transaction is never moved to another connection)",
            self.key,
        )

    def _mark(self, err: Exception) -> None:
        if self._failure is None:
            self._failure = err

    def _fail(self, it: _Queued, err: Exception, mark: bool = True) -> None:
        if mark:
            self._mark(err)
        self._results.append((it.future, SendResult(False, it.part, error=err)))

    def _deliver(self) -> None:
        """Complete the futures resolved meanwhile, outside the transaction's lock (a
        thread in ``concurrent.futures.wait`` holds a future's lock while it asks for the
        transaction's: completing under the latter could deadlock with it)."""
        with self._lock:
            done, self._results = self._results, []
        for fut, result in done:
            fut._tx = None  # nothing left to flush for it
            if not fut.done():  # (cancelled by its caller)
                fut.set_result(result)

    def _fail_queue(self, err: Exception) -> None:
        queue, self._queue = self._queue, []
        for it in queue:
            self._fail(it, err, mark=False)

    # -- end

    def commit(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncTransaction.commit` (BEGIN, puts and COMMIT in one write)."""
        if self._direct is False:
            return super().commit(timeout_s)
        try:
            with self._lock:
                self._commit(timeout_s)
        finally:
            self._deliver()
            self._ended()

    def _ended(self) -> None:
        if self._on_end is not None and self.finished:
            self._on_end(self)

    def _commit(self, timeout_s: float | None) -> None:
        if self._status != ACTIVE:
            raise ClientTransactionError(
                f"cannot commit transaction {self.key}: it is {self._status}", self.key
            )
        self._status = COMMITTING
        try:
            if self._conn is None and self._failure is None:  # no message: no broker
                self._status = COMMITTED
                return
            reply = None
            if self._p.closed:  # its connection would be gone on the loop path: rolled back
                self._mark(ClientError("producer closed"))
            if self._deadline is not None and time.monotonic() > self._deadline:
                # BEGIN waited for the commit, so the broker could not time it out: do it
                self._mark(
                    TransactionTimeoutError(
                        XA_RBTIMEOUT, "transaction timed out and was rolled back", self.key
                    )
                )
            if self._failure is not None:
                self._fail_queue(self._refusal())
            else:
                try:
                    reply = self._exchange(True, timeout_s)
                except TransactionOutcomeUnknownError:
                    self._status = FAILED
                    raise
                except TransactionConnectionError:
                    self._status = ROLLED_BACK
                    raise
            failure = self._failure
            if reply is not None and reply.code == 200:
                self._status = COMMITTED
                if failure is not None:  # a broker that ignored msgs=<n>: say it loudly
                    log.error(
                        "transaction %s committed although a send failed (%s): the broker "
                        "does not check msgs=<n>; set ProducerConfig.pipeline_commit=False "
                        "for it",
                        self.key,
                        failure,
                    )
                return
            if failure is None:
                assert reply is not None
                err = reply_error(reply, self.key)
                if isinstance(err, XAError) and err.code == XA_RBTIMEOUT:
                    self._status = ROLLED_BACK  # the broker timed it out
                raise err
            self._rollback_quietly()
            self._status = ROLLED_BACK
            if isinstance(failure, XAError | TransactionConnectionError):
                raise failure.with_traceback(None) from None
            raise TransactionAbortedError(
                f"transaction {self.key} rolled back instead of committed: a send failed "
                f"({failure})",
                self.key,
                failure,
            ) from failure
        finally:
            if self._status == COMMITTING:
                self._status = FAILED

    def rollback(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncTransaction.rollback` (queued sends are dropped unsent)."""
        if self._direct is False:
            return super().rollback(timeout_s)
        try:
            with self._lock:
                if self._status in (ROLLED_BACK, FAILED):
                    return
                if self._status == COMMITTED:
                    raise ClientTransactionError(
                        f"transaction {self.key} is already committed", self.key
                    )
                if self._status != ACTIVE:
                    raise ClientTransactionError(
                        f"transaction {self.key} is {self._status}", self.key
                    )
                self._status = ROLLING_BACK
                self._fail_queue(
                    ClientTransactionError(
                        f"not sent: transaction {self.key} was rolled back first", self.key
                    )
                )
                try:
                    self._rollback_quietly()
                    self._status = ROLLED_BACK
                finally:
                    if self._status == ROLLING_BACK:
                        self._status = FAILED
        finally:
            self._deliver()
            self._ended()

    def _rollback_quietly(self) -> None:
        """ROLLBACK when BEGIN went out; quiet when the broker already rolled it back."""
        conn = self._conn
        if conn is None or not self._begun or not conn.is_open:
            return  # never begun, or the broker rolled it back when the connection dropped
        key, sid = self.key, self._p.session_id
        try:
            with _lock_of(conn):
                r = conn.exchange(
                    [lambda o: encode_line("transaction", key, sid, "ROLLBACK", o)],
                    self._pool.request_timeout_s,
                )[0]
        except (ConnectionLostError, RequestTimeoutError):
            return  # an unprepared local transaction can only end rolled back
        if r.code != 200:
            err = reply_error(r, key)
            if not (
                isinstance(err, XAError) and err.code in (XA_RBTIMEOUT, XAER_NOTA, XA_RBROLLBACK)
            ):
                raise err
