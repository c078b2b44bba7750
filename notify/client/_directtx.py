"""The blocking producer's direct transactions: over the calling thread's own socket.

``with producer.transaction(): producer.send_future(...)`` would hop to the session's loop
thread for every send and for the commit (queued calls, wake-ups, tasks and futures on two
threads). :class:`DirectBackend` instead keeps the sends in the transaction core on the
calling thread and writes BEGIN, the puts (one ``mput`` per partition, records in their
on-disk layout) and ``COMMIT_ONE_PHASE msgs=<n>`` in one write over a blocking connection
of that thread (the pool's transaction lane), then reads the replies on the same thread:
one write, one round trip, no thread hop. What is written and what each reply means is
:class:`~.core.transaction.TxCore`'s, as on the loop path.

A send's future completes when the transaction is flushed: at commit, or as soon as
anyone waits on a future of it (``result()``, ``exception()``, ``add_done_callback``,
``concurrent.futures.wait``/``as_completed``), which writes what is queued (BEGIN and the
puts, without COMMIT) and reads their replies first. ``send()`` therefore costs one round
trip, ``send_future`` none until commit.

The direct path is an optimisation only. A transaction takes it when its producer's
settings allow (:func:`direct_eligible`) and its first message can be routed and given a
connection of the thread that began it without waiting, while none of the producer's other
messages is in flight (a broker group that fails over automatically, or one without
``mput``, is left to the loop path); otherwise the whole
transaction goes the loop path (:class:`~._txloop.LoopBackend`) before anything is sent,
with the same key, and a send that failed before carries over. The broker cannot time out
a transaction whose BEGIN waits for the commit, so the commit checks the timeout itself.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from notify.errors import ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol.xa import XA_RBTIMEOUT

from ._connection import ConnectionPool
from ._errors import ClientTransactionError, TransactionTimeoutError
from ._loopthread import LoopThread
from ._message import Draft, build_payload
from ._txbackend import SyncBackend
from ._txloop import TxHost
from .core.selectors import KeyHashSelector, RoundRobinSelector
from .core.transaction import (
    C_AWAIT,
    K_COMMIT,
    S_ACTIVE,
    S_COMMITTED,
    S_ROLLING_BACK,
    Outcome,
    Resolved,
    Send,
    TxCore,
)
from .core.types import Partition, SendResult
from .transport import BlockingConnection

_new = tuple.__new__  # a named tuple without its Python-level __new__ (per send)
#: The pool lane of the direct transactions' blocking connections.
TX_LANE = "tx"
#: Selectors known to be thread-safe (a user's selector only ever runs on the loop thread).
SAFE_SELECTORS = (KeyHashSelector, RoundRobinSelector)


def direct_eligible(host: TxHost) -> bool:
    """True when the producer's settings let its transactions take the direct path."""
    cfg = host.config
    return (
        cfg.pipeline_commit
        and cfg.use_mput
        and cfg.producer_group is None
        and type(host.selector) in SAFE_SELECTORS
    )


class _Waiters(list[Any]):
    """``Future._waiters`` of a queued send: ``concurrent.futures.wait``/``as_completed``
    install a waiter here, which flushes the transaction first (else they would wait for
    a commit that cannot come)."""

    __slots__ = ("fut",)

    def __init__(self, fut: TxFuture):
        super().__init__()
        self.fut = fut

    def append(self, item: Any) -> None:
        super().append(item)
        self.fut.demand()


class TxFuture(concurrent.futures.Future[SendResult]):
    """A queued send's result: waiting on it flushes its transaction first."""

    def __init__(self, tx: DirectBackend):
        super().__init__()
        self.tx: DirectBackend | None = tx
        self._waiters = _Waiters(self)

    def demand(self) -> None:
        tx = self.tx
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


class DirectBackend:
    """A blocking transaction over the calling thread's own socket (see the module
    docstring); a :class:`~._txbackend.SyncBackend`.

    ``fallback(failure)`` makes the loop path's backend (same key) when the first message
    cannot go direct; ``failure`` is a send that failed before, which it must carry.
    ``quiet()`` tells whether none of the producer's other messages is in flight: the
    transaction binds to this thread's socket only then, so it cannot overtake them."""

    def __init__(
        self, host: TxHost, key: str, timeout_s: float | None, pool: ConnectionPool, lt: LoopThread,
        fallback: Callable[[Exception | None], SyncBackend],
        quiet: Callable[[], bool] = lambda: True,
    ):
        self._core: TxCore[TxFuture] = TxCore(key, host.session_id, timeout_s, host.no_mput)
        #: the transaction's core: this path's own, or the loop path's once it took over
        self.core: TxCore[Any] = self._core
        self._host = host
        self._pool = pool
        self._lt = lt
        self._make_fallback = fallback
        self._quiet = quiet
        self._loop_path: SyncBackend | None = None
        self._raise = host.config.raise_on_error
        self._conn: BlockingConnection | None = None
        #: when the broker would have timed it out, had BEGIN gone with the first message
        self._deadline: float | None = None
        #: futures resolved under the lock, completed after it (_deliver)
        self._results: Resolved[TxFuture] = []
        self._lock = threading.RLock()
        self.thread_id = threading.get_ident()

    # -- SyncBackend

    def send_future(self, msg: Draft) -> concurrent.futures.Future[SendResult]:
        """Queue one message of the transaction (kept in call order); future of its result
        (completed when the transaction is flushed: at commit or when waited on)."""
        with self._lock:
            if self._loop_path is not None:
                return self._loop_path.send_future(msg)
            topic, data, attribute, key, headers = msg
            core = self._core
            if core.state is not S_ACTIVE:
                core.check_open()  # (rollback-only: open, its sends are refused)
            if self._host.closed:
                self._host.check_open()
            if not isinstance(data, bytes | bytearray | memoryview):
                raise ClientError(f"message data must be bytes, not {type(data).__name__}")
            body = bytes(data)
            payload, flag = build_payload(body, attribute, key, headers)
            fut = TxFuture(self)
            try:
                parts = self._host.router.cached(topic) or self._partitions(topic)
                part = core.select(topic, parts, key, body, self._host.selector)
            except ClientTransactionError as e:  # misuse (wrong broker): raised by result()
                core.mark(e)
                fut.tx = None
                fut.set_exception(e)
                return fut
            except ClientError as e:  # unknown topic, a selector's error: a failed send
                core.mark(e)
                self._results.append((fut, SendResult(False, None, error=e)))
                self._deliver()
                return fut
            if core.broker is None and not self._bind(part):
                # nothing sent yet: the loop path, same key (with a failure so far)
                self._loop_path = self._make_fallback(core.failure)
                self.core = self._loop_path.core
                return self._loop_path.send_future(msg)
            core.queue.append(_new(Send, (topic, part, payload, flag, fut)))
            return fut

    def _partitions(self, topic: str) -> list[Partition]:
        """``topic``'s partitions, looked up by the loop thread (not routed yet)."""
        return self._lt.run(self._host.router.partitions(topic))

    def _bind(self, part: Partition) -> bool:
        """Bind to ``part``'s broker over this thread's connection; False: the loop path."""
        if threading.get_ident() != self.thread_id:
            return False  # another thread's connection could be closed when it ends
        if not self._quiet():
            return False  # earlier messages in flight: commit behind them, on the loop
        address = part.address
        if self._pool.epoch_of(address) is not None or address in self._host.no_mput:
            return False  # a failover group's epoch is declared by the loop's connections
        conn = self._pool.blocking(address, TX_LANE)
        if conn is None:
            return False
        self._conn = conn
        self._core.bind(part.broker_id, address)
        if self._core.timeout is not None:  # the broker's clock would start here
            self._deadline = time.monotonic() + self._core.timeout
        return True

    def flush(self) -> None:
        """Write the queued sends (BEGIN first) and read their replies, on this thread."""
        try:
            with self._lock:
                core = self._core
                if not core.queue:
                    return
                refusal = core.refusal()
                if refusal is not None:
                    self._results += core.refuse_queue(refusal)
                    return
                self._exchange(commit=False)
        finally:
            self._deliver()

    def _exchange(self, commit: bool, timeout_s: float | None = None) -> Outcome | None:
        """One write of BEGIN (first time), the queued puts and (``commit``) the COMMIT;
        the outcome of the COMMIT (None without it). Resolves the sends."""
        core = self._core
        conn = self._conn
        assert conn is not None
        if core.begun and (not conn.is_open or conn.peer_closed()):
            # dropped (or closed by the broker before this write): it rolled the
            # transaction back, and a COMMIT written now could not reach it
            lost = core.lost()
            core.mark(lost)
            self._results += core.refuse_queue(lost)
            return None
        cfg = self._host.config
        flight = core.flight(mput=True, checksum=cfg.send_checksum, commit=commit)
        timeout = self._pool.request_timeout_s
        if timeout_s is not None:
            timeout = min(timeout, timeout_s)
        outcomes: Sequence[Outcome]
        try:
            with conn.lock:
                outcomes = conn.exchange(flight.frames, timeout)
        except (ConnectionLostError, RequestTimeoutError) as e:
            # the socket is dropped either way: the broker rolls the transaction back
            gone = e if isinstance(e, ConnectionLostError) else ConnectionLostError(str(e))
            outcomes = [e if s.kind is K_COMMIT else gone for s in flight.steps]
        except ClientError as e:  # TLS or authentication while connecting: nothing sent
            self._pool.blocking_failed(conn)
            self._results += core.unsent(flight, e)
            raise
        reply: Outcome | None = None
        for step, outcome in zip(flight.steps, outcomes, strict=True):
            if step.kind is K_COMMIT:
                reply = outcome
            else:
                self._results += core.on_reply(step, outcome)
        return reply

    def _deliver(self) -> None:
        """Complete the futures resolved meanwhile, outside the transaction's lock (a
        thread in ``concurrent.futures.wait`` holds a future's lock while it asks for the
        transaction's: completing under the latter could deadlock with it)."""
        with self._lock:
            done, self._results = self._results, []
        for fut, result in done:
            fut.tx = None  # nothing left to flush for it
            if fut.done():  # (cancelled by its caller)
                continue
            if self._raise and not result.success and result.error is not None:
                fut.set_exception(result.error)
            else:
                fut.set_result(result)

    def commit(self, timeout_s: float | None) -> None:
        """Commit: BEGIN, puts and COMMIT in one write (see ``AsyncTransaction.commit``)."""
        if self._loop_path is not None:
            return self._loop_path.commit(timeout_s)
        try:
            with self._lock:
                self._commit(timeout_s)
        finally:
            self._deliver()

    def _commit(self, timeout_s: float | None) -> None:
        core = self._core
        core.start_commit()
        try:
            if self._host.closed:  # its connection would be gone on the loop path
                core.mark(ClientError("producer closed"))
            if self._deadline is not None and time.monotonic() > self._deadline:
                # BEGIN waited for the commit, so the broker could not time it out: do it
                core.mark(
                    TransactionTimeoutError(
                        XA_RBTIMEOUT, "transaction timed out and was rolled back", core.key
                    )
                )
            reply: Outcome | None = None
            refusal = core.refusal() if core.failure is not None else None
            if refusal is not None:
                self._results += core.refuse_queue(refusal)
            elif core.begun or core.queue:
                reply = self._exchange(True, timeout_s)
            if core.commit_plan() is C_AWAIT:
                assert reply is not None
                core.on_commit_reply(reply)
            if core.state is S_COMMITTED:
                return
            if core.state is S_ROLLING_BACK:
                self._rollback_quietly()
            core.conclude()
        except BaseException:
            core.settle_failed()
            raise

    def rollback(self, timeout_s: float | None) -> None:
        """Roll back (queued sends are dropped unsent)."""
        if self._loop_path is not None:
            return self._loop_path.rollback(timeout_s)
        try:
            with self._lock:
                core = self._core
                if not core.start_rollback():
                    return
                try:
                    self._results += core.refuse_queue(
                        ClientTransactionError(
                            f"not sent: transaction {core.key} was rolled back first", core.key
                        )
                    )
                    self._rollback_quietly()
                    core.rolled_back()
                finally:
                    core.settle_failed()
        finally:
            self._deliver()

    def _rollback_quietly(self) -> None:
        """ROLLBACK when BEGIN went out; quiet when the broker already rolled it back."""
        conn = self._conn
        frame = self._core.rollback_frame()
        if frame is None or conn is None or not conn.is_open:
            return  # never begun, or the broker rolled it back when the connection dropped
        try:
            with conn.lock:
                outcome: Outcome = conn.request(frame, self._pool.request_timeout_s)
        except (ConnectionLostError, RequestTimeoutError) as e:
            outcome = e
        self._core.on_rollback_reply(outcome)
