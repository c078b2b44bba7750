"""One client-side broker transaction, sans-IO: its sends, the frames that carry them, what
each reply means, its state and its failure. No sockets, no event loop, no threads.

Every way the client runs a broker transaction drives this one core: the asyncio path
(:class:`notify.client.AsyncTransaction` over an asyncio connection), the blocking direct path
(``notify.client._directtx``, over the calling thread's own socket), half messages
(``notify.client._halfmsg``) and the XA broker participant
(:mod:`notify.xa.resources.broker`). A driver only moves bytes: it asks the core for a
:class:`Flight` (the frames to write in one go and what each one is), writes them, and hands
each reply back (or the exception standing for it: ``ConnectionLostError`` when the
connection dropped); the core resolves the sends it covers (``(handle, SendResult)`` pairs
the driver completes) and changes state through the one table of :mod:`.states`. At the end
the state says what the driver does next (h11's habit: the machine decides, the driver
performs)::

    flight        [BEGIN <timeout>] PUTS... [COMMIT_ONE_PHASE msgs=<n> | PREPARE]
    PUTS          a lone send as ``put``; several for one partition as one ``mput`` (when the
                  broker knows it), in call order within each partition
    commit        commit_plan(): DONE (nothing was sent) | ROLLBACK (a send failed) | SEND
                  (write commit_frame()) | AWAIT (COMMIT went with the puts); then
                  on_commit_reply(); when the state is ROLLING_BACK, roll back; conclude()
                  raises what the commit ends with

Failure rules (the same on every path): a failed send makes the transaction rollback-only
and commit then rolls back and raises (:class:`TransactionAbortedError`, or the send's own
:class:`XAError` / :class:`TransactionConnectionError`); BEGIN's error explains the puts
written with it; a dropped connection means the broker rolled the transaction back; no reply
to COMMIT is :class:`TransactionOutcomeUnknownError`; ROLLBACK of a transaction the broker
already rolled back or forgot is quiet.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum
from typing import Any, Final, Generic, NamedTuple, TypeVar

from notify.client._errors import (
    ClientTransactionError,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    XAError,
)
from notify.errors import ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol.frames import FrameBuilder, Response
from notify.protocol.replies import MultiPutAck
from notify.protocol.xa import XA_RBROLLBACK, XA_RBTIMEOUT, XA_RDONLY, XAER_NOTA

from . import wire
from .selectors import PartitionSelector, select_in_transaction
from .states import FINISHED, OPEN, TxEvent, TxState, allowed, next_state
from .types import Partition, SendResult

log = logging.getLogger("notify.client")

H = TypeVar("H")

#: ROLLBACK answers meaning "already rolled back or unknown": quiet
_ROLLED_BACK_CODES: Final = (XA_RBTIMEOUT, XAER_NOTA, XA_RBROLLBACK)
#: what stands for a reply that did not come
Outcome = Response | BaseException


class Send(NamedTuple, Generic[H]):
    """One routed message of the transaction; ``handle`` is the driver's (its future)."""

    topic: str
    part: Partition
    payload: bytes
    flag: int
    handle: H


class Kind(Enum):
    """What one frame of a flight is."""

    BEGIN = "begin"
    PUTS = "puts"
    COMMIT = "commit"
    PREPARE = "prepare"


class Step(NamedTuple, Generic[H]):
    """One frame of a flight: its kind and the sends its reply settles (PUTS only)."""

    kind: Kind
    sends: list[Send[H]]


class Flight(NamedTuple, Generic[H]):
    """Frames to write in one go, in order, and what each one is."""

    frames: list[FrameBuilder]
    steps: list[Step[H]]


_new = tuple.__new__  # a named tuple without its Python-level __new__ (per frame, per send)
_NO_SENDS: Final[list[Any]] = []


class CommitStep(Enum):
    """What :meth:`TxCore.commit_plan` asks of the driver."""

    DONE = "done"  # nothing was sent: committed without the broker
    ROLLBACK = "rollback"  # a send failed: roll back, then raise abort()
    SEND = "send"  # write commit_frame() and pass its reply to on_commit_reply()
    AWAIT = "await"  # COMMIT went with the puts: pass its reply to on_commit_reply()


Resolved = list[tuple[H, SendResult]]


# Enum members as module globals for the per-transaction paths: on CPython 3.11 reading a
# member through its class costs about eight times reading a global.
C_AWAIT: Final = CommitStep.AWAIT
C_DONE: Final = CommitStep.DONE
C_ROLLBACK: Final = CommitStep.ROLLBACK
C_SEND: Final = CommitStep.SEND
K_BEGIN: Final = Kind.BEGIN
K_COMMIT: Final = Kind.COMMIT
K_PREPARE: Final = Kind.PREPARE
K_PUTS: Final = Kind.PUTS
E_COMMIT: Final = TxEvent.COMMIT
E_COMMITTED: Final = TxEvent.COMMITTED
E_ERROR: Final = TxEvent.ERROR
E_FAIL: Final = TxEvent.FAIL
E_PREPARED: Final = TxEvent.PREPARED
E_READ_ONLY: Final = TxEvent.READ_ONLY
E_ROLLBACK: Final = TxEvent.ROLLBACK
E_ROLLED_BACK: Final = TxEvent.ROLLED_BACK
E_UNKNOWN: Final = TxEvent.UNKNOWN
S_ACTIVE: Final = TxState.ACTIVE
S_COMMITTED: Final = TxState.COMMITTED
S_COMMITTING: Final = TxState.COMMITTING
S_FAILED: Final = TxState.FAILED
S_PREPARED: Final = TxState.PREPARED
S_ROLLED_BACK: Final = TxState.ROLLED_BACK
S_ROLLING_BACK: Final = TxState.ROLLING_BACK


class TxCore(Generic[H]):
    """One transaction's client-side state (see the module docstring).

    ``key`` is the transaction key (``TX:<sessionId>:<n>`` or an XA key), ``session_id`` the
    producer's; ``timeout_s`` is sent with BEGIN (rounded up; None: the broker's cap).
    ``no_mput``, when given, is the set of broker addresses known not to speak ``mput``: the
    core adds the address of a broker that answers one with "unknown command".
    """

    __slots__ = (
        "_begin_error",
        "_chosen",
        "_error",
        "_local",
        "_prepared",
        "begun",
        "broker",
        "commit_sent",
        "failure",
        "key",
        "no_mput",
        "queue",
        "session_id",
        "state",
        "timeout",
        "written",
    )

    def __init__(
        self,
        key: str,
        session_id: str,
        timeout_s: float | None = None,
        no_mput: set[str] | None = None,
    ):
        self.key = key
        self.session_id = session_id
        self.timeout = None if timeout_s is None else wire.timeout_token(timeout_s)
        self.no_mput = no_mput
        self.state = S_ACTIVE
        #: the first error of a send (or of BEGIN): the transaction is rollback-only
        self.failure: Exception | None = None
        #: ``(broker id, address)`` the transaction is bound to by its first send
        self.broker: tuple[int, str] | None = None
        self.begun = False  # BEGIN is in a flight
        self.written = 0  # messages in flights (COMMIT's msgs=<n>)
        self.commit_sent = False  # COMMIT went in a flight
        self._prepared = False  # PREPARE was acknowledged (COMMIT is the second phase)
        self.queue: list[Send[H]] = []
        self._begin_error: ClientError | None = None
        self._error: ClientError | None = None  # what commit ends with (conclude)
        self._chosen: dict[str, Partition] = {}  # keyless messages' partition, per topic
        self._local: dict[str, list[Partition]] = {}  # the bound broker's partitions

    def __repr__(self) -> str:
        return f"<TxCore {self.key} {self.state.value} broker={self.address}>"

    # -- state

    def fire(self, event: TxEvent) -> TxState:
        """Apply ``event`` (the table refuses what it does not allow)."""
        self.state = next_state(self.state, event)
        return self.state

    @property
    def open(self) -> bool:
        """Takes messages (active, or rollback-only: they are refused one by one)."""
        return self.state in OPEN

    @property
    def finished(self) -> bool:
        """Committed, rolled back or failed."""
        return self.state in FINISHED

    @property
    def address(self) -> str | None:
        """The bound broker's address (None before the first send)."""
        return None if self.broker is None else self.broker[1]

    def check_open(self) -> None:
        """Raise :class:`ClientTransactionError` unless the transaction takes messages."""
        if self.state not in OPEN:
            raise ClientTransactionError(
                f"transaction {self.key} is {self.state.value}: it takes no more messages",
                self.key,
            )

    def mark(self, err: Exception) -> None:
        """A send failed: remember the first error, the transaction is rollback-only."""
        if self.failure is None:
            self.failure = err
        if allowed(self.state, E_FAIL):
            self.fire(E_FAIL)

    def lost(self) -> TransactionConnectionError:
        """The error of a send on the dropped connection (the broker rolled it back)."""
        return TransactionConnectionError(
            f"connection to {self.address} dropped during transaction {self.key}: the broker "
            "rolled it back (a transaction is never moved to another connection)",
            self.key,
        )

    def refusal(self) -> ClientTransactionError | None:
        """Why a queued send must not be written any more (None: write it)."""
        if self.failure is not None:
            return TransactionAbortedError(
                f"not sent: transaction {self.key} is rollback-only after a failed send "
                f"({self.failure})",
                self.key,
                self.failure,
            )
        if self.state not in (S_ACTIVE, S_COMMITTING):
            return ClientTransactionError(
                f"not sent: transaction {self.key} was rolled back first", self.key
            )
        return None

    # -- routing

    def select(
        self,
        topic: str,
        partitions: Sequence[Partition],
        key: bytes | str | None,
        data: bytes,
        selector: PartitionSelector,
    ) -> Partition:
        """The partition of one message: among the bound broker's partitions of ``topic``
        once the transaction is bound (:class:`ClientTransactionError` when there is none),
        the selector's choice before. A selector's own exception is a :class:`ClientError`."""
        parts = partitions if self.broker is None else self._local_partitions(topic, partitions)
        try:
            return select_in_transaction(selector, self._chosen, topic, parts, key, data)
        except ClientError:
            raise
        except Exception as e:
            raise ClientError(f"partition selector: {e}") from e

    def _local_partitions(self, topic: str, partitions: Sequence[Partition]) -> list[Partition]:
        local = self._local.get(topic)
        if local is not None:
            return local
        assert self.broker is not None
        bid, addr = self.broker
        local = [p for p in partitions if p.broker_id == bid and p.address == addr]
        if not local:
            raise ClientTransactionError(
                f"topic {topic!r} has no partition on broker {bid} ({addr}), the broker "
                f"transaction {self.key} is bound to: all messages of a transaction go to "
                "one broker",
                self.key,
            )
        self._local[topic] = local
        return local

    def bind(self, broker_id: int, address: str) -> None:
        """Bind the transaction to a broker (its first send's)."""
        if self.broker is None:
            self.broker = (broker_id, address)

    # -- sends and flights

    def add(self, topic: str, part: Partition, payload: bytes, flag: int, handle: H) -> None:
        """Queue one routed message for the next flight."""
        self.queue.append(_new(Send, (topic, part, payload, flag, handle)))

    def refuse_queue(self, err: Exception) -> Resolved[H]:
        """Fail every queued send with ``err`` (not written; the failure is not new)."""
        queue, self.queue = self.queue, []
        return [(s.handle, SendResult(False, s.part, error=err)) for s in queue]

    def may_pipeline_commit(self) -> bool:
        """COMMIT may go right behind the puts: commit started, not sent, no failure."""
        return (
            self.state is S_COMMITTING and not self.commit_sent and self.failure is None
        )

    def flight(
        self, *, mput: bool, checksum: bool, commit: bool = False, prepare: bool = False
    ) -> Flight[H]:
        """The next frames: BEGIN (the first time), the queued sends, then COMMIT
        (``commit``: ``msgs=<n>``, every message written) or PREPARE (``prepare``).

        ``mput``: several sends for one partition go as one ``mput`` (unless the bound
        broker is known not to speak it); ``checksum``: lone ``put``s carry one."""
        frames: list[FrameBuilder] = []
        steps: list[Step[H]] = []
        key = self.key
        if not self.begun:
            self.begun = True
            frames.append(wire.begin(key, self.session_id, self.timeout))
            steps.append(_new(Step, (K_BEGIN, _NO_SENDS)))
        queue, self.queue = self.queue, []
        self.written += len(queue)
        if mput and len(queue) > 1 and not (self.no_mput and self.address in self.no_mput):
            groups: dict[tuple[str, int], list[Send[H]]] = {}
            for s in queue:
                groups.setdefault((s.topic, s.part.partition), []).append(s)
            for sends in groups.values():
                frames.append(self._batch_frame(sends, checksum))
                steps.append(_new(Step, (K_PUTS, sends)))
        else:
            for s in queue:
                frames.append(wire.put(s.topic, s.part.partition, s.payload, s.flag, checksum, key))
                steps.append(_new(Step, (K_PUTS, [s])))
        if commit:
            self.commit_sent = True
            frames.append(self.commit_frame(msgs=True))
            steps.append(_new(Step, (K_COMMIT, _NO_SENDS)))
        if prepare:
            frames.append(wire.command(key, self.session_id, wire.PREPARE))
            steps.append(_new(Step, (K_PREPARE, _NO_SENDS)))
        return _new(Flight, (frames, steps))

    def _batch_frame(self, sends: list[Send[H]], checksum: bool) -> FrameBuilder:
        """One partition's sends: a ``put`` for a lone one, else an ``mput`` (records in
        runs of one flag)."""
        first = sends[0]
        if len(sends) == 1:
            return wire.put(
                first.topic, first.part.partition, first.payload, first.flag, checksum, self.key
            )
        runs: list[tuple[int, list[bytes]]] = []
        for s in sends:
            if runs and runs[-1][0] == s.flag:
                runs[-1][1].append(s.payload)
            else:
                runs.append((s.flag, [s.payload]))
        body = wire.records_body(runs)
        return wire.mput(first.topic, first.part.partition, body, len(sends), self.key)

    def on_reply(self, step: Step[H], outcome: Outcome) -> Resolved[H]:
        """The reply to a BEGIN or PUTS step (or the exception standing for it); the sends
        it resolves. COMMIT and PREPARE replies go to their own methods."""
        if step.kind is K_BEGIN:
            if isinstance(outcome, Response):
                if outcome.code == 200:
                    return []
                err: ClientError | None = wire.reply_error(outcome, self.key)
            else:
                err = self._error_of(outcome)
            if err is not None:
                self._begin_error = err
                self.mark(err)
            return []
        if step.kind is not K_PUTS:
            raise ValueError(f"{step.kind.value} replies go to their own method")
        sends = step.sends
        err = self._begin_error  # BEGIN's error explains the puts'
        if err is None and not isinstance(outcome, Response):
            err = self._error_of(outcome)
        first = -1
        if err is None:
            assert isinstance(outcome, Response)
            if len(sends) == 1:
                ack = wire.put_ack(outcome, self.key)
                if isinstance(ack, ClientError):
                    err = ack
                else:
                    first = ack[0]
            else:
                if wire.unknown_command(outcome) and self.no_mput is not None:
                    self.no_mput.add(sends[0].part.address)  # later transactions: puts
                mack = wire.mput_ack(outcome, len(sends), self.key)
                if isinstance(mack, MultiPutAck):
                    first = mack.first_msg_id
                else:
                    err = mack
        if err is not None:
            self.mark(err)
            return [(s.handle, SendResult(False, s.part, error=err)) for s in sends]
        if len(sends) == 1:
            s = sends[0]
            return [(s.handle, _new(SendResult, (True, s.part, -1, first, None, False)))]
        return [
            (s.handle, _new(SendResult, (True, s.part, -1, first + i, None, False)))
            for i, s in enumerate(sends)
        ]

    def unsent(self, flight: Flight[H], exc: BaseException) -> Resolved[H]:
        """``flight`` could not be written (``exc``): its sends fail, COMMIT did not go."""
        out: Resolved[H] = []
        for step in flight.steps:
            if step.kind is K_COMMIT:
                self.commit_sent = False
            elif step.kind is not K_PREPARE:
                out += self.on_reply(step, exc)
        return out

    def _error_of(self, outcome: Outcome) -> ClientError | None:
        """The error standing for a reply that did not come (None: ``outcome`` is one)."""
        if isinstance(outcome, Response):
            return None
        if isinstance(outcome, ConnectionLostError):
            return self.lost()
        if isinstance(outcome, ClientError):
            return outcome
        return ClientError(str(outcome) or type(outcome).__name__)

    # -- commit

    def start_commit(self) -> None:
        """Commit begins: no more sends. Raises :class:`ClientTransactionError` unless the
        transaction is open (or, for a prepared one, PREPARED)."""
        if self.state not in OPEN and self.state is not S_PREPARED:
            raise ClientTransactionError(
                f"cannot commit transaction {self.key}: it is {self.state.value}", self.key
            )
        self.state = next_state(self.state, E_COMMIT)

    def commit_frame(self, msgs: bool) -> FrameBuilder:
        """COMMIT_ONE_PHASE (with ``msgs=<n>`` when ``msgs``: the broker rolls back when it
        recorded fewer of the transaction's messages); COMMIT_TWO_PHASE once prepared."""
        if self.state is S_COMMITTING and self._prepared:
            return wire.command(self.key, self.session_id, wire.COMMIT_TWO_PHASE)
        if msgs:
            return wire.command(
                self.key, self.session_id, wire.COMMIT_ONE_PHASE, f"msgs={self.written}"
            )
        return wire.command(self.key, self.session_id, wire.COMMIT_ONE_PHASE)

    @property
    def begin_ok(self) -> bool:
        """BEGIN went out and was not refused (nor lost) as far as the replies tell."""
        return self.begun and self._begin_error is None

    def commit_plan(self) -> CommitStep:
        """What commit does now that every send is settled (see :class:`CommitStep`)."""
        if self.commit_sent:
            return C_AWAIT
        if self.failure is not None:
            self.fire(E_ROLLBACK)
            return C_ROLLBACK
        if not self.begun:
            self.fire(E_COMMITTED)
            return C_DONE
        return C_SEND

    def on_commit_reply(self, outcome: Outcome) -> None:
        """The reply to COMMIT. Leaves COMMITTED, ROLLING_BACK (a send had failed: the
        driver rolls back), ROLLED_BACK (the broker timed it out) or FAILED (no reply: the
        outcome is unknown; or another error); :meth:`conclude` raises accordingly."""
        if not isinstance(outcome, Response):
            if isinstance(outcome, ConnectionLostError | RequestTimeoutError):
                self.fire(E_UNKNOWN)
                self._error = TransactionOutcomeUnknownError(
                    f"transaction {self.key}: no reply to COMMIT ({outcome}): the broker may "
                    "or may not have committed it",
                    self.key,
                )
                self._error.__cause__ = outcome
                return
            self.fire(E_ERROR)
            self._error = self._error_of(outcome)
            return
        if outcome.code == 200:
            self.state = next_state(self.state, E_COMMITTED)
            if self.failure is not None:  # a broker that ignored msgs=<n>: say it loudly
                log.error(
                    "transaction %s committed although a send failed (%s): the broker does "
                    "not check msgs=<n>; set ProducerConfig.pipeline_commit=False for it",
                    self.key,
                    self.failure,
                )
            return
        if self.failure is not None:  # the broker refused a put: it rolled back (or never had it)
            self.fire(E_ROLLBACK)
            return
        err = wire.reply_error(outcome, self.key)
        if isinstance(err, XAError) and err.code == XA_RBTIMEOUT:
            self.fire(E_ROLLED_BACK)  # the broker timed it out
        else:
            self.fire(E_ERROR)
        self._error = err

    def conclude(self) -> None:
        """Raise what the commit ends with: nothing once COMMITTED; after the rollback a
        failed send forced (state ROLLING_BACK), :meth:`abort`'s error; else the error
        :meth:`on_commit_reply` found."""
        if self.state is S_ROLLING_BACK:
            raise self.abort()
        err, self._error = self._error, None
        if err is not None:
            raise err

    def abort(self) -> ClientError:
        """After the rollback a failed send forced: ROLLED_BACK, and the error to raise (the
        send's own :class:`XAError` / :class:`TransactionConnectionError`, else
        :class:`TransactionAbortedError` caused by it)."""
        self.fire(E_ROLLED_BACK)
        failure = self.failure
        assert failure is not None
        if isinstance(failure, XAError | TransactionConnectionError):
            failure.__traceback__ = None
            failure.__cause__ = None
            failure.__suppress_context__ = True
            return failure
        err = TransactionAbortedError(
            f"transaction {self.key} rolled back instead of committed: a send failed "
            f"({failure})",
            self.key,
            failure,
        )
        err.__cause__ = failure
        return err

    def settle_failed(self) -> None:
        """A commit or rollback that ended without a decision (an exception in the driver)
        is FAILED."""
        if self.state in (S_COMMITTING, S_ROLLING_BACK):
            self.fire(E_ERROR)

    # -- rollback

    def start_rollback(self) -> bool:
        """Rollback begins; False when there is nothing to do (rolled back or failed
        already). Raises :class:`ClientTransactionError` after a commit or while one runs."""
        if self.state in (S_ROLLED_BACK, S_FAILED):
            return False
        if self.state is S_COMMITTED:
            raise ClientTransactionError(f"transaction {self.key} is already committed", self.key)
        if self.state is S_COMMITTING or self.state is S_ROLLING_BACK:
            raise ClientTransactionError(
                f"transaction {self.key} is {self.state.value}", self.key
            )
        self.fire(E_ROLLBACK)
        return True

    def rollback_frame(self) -> FrameBuilder | None:
        """ROLLBACK, or None when BEGIN never went out (nothing to roll back)."""
        if not self.begun:
            return None
        return wire.command(self.key, self.session_id, wire.ROLLBACK)

    def on_rollback_reply(self, outcome: Outcome) -> None:
        """The reply to ROLLBACK: quiet when the broker already rolled the transaction back
        or does not know it, or when no reply came (an unprepared local transaction can only
        end rolled back); raises the reply's error otherwise."""
        if not isinstance(outcome, Response):
            log.info("transaction %s: rollback not acknowledged (%s)", self.key, outcome)
            return
        if outcome.code == 200:
            return
        err = wire.reply_error(outcome, self.key)
        if isinstance(err, XAError) and err.code in _ROLLED_BACK_CODES:
            return
        raise err

    def rolled_back(self) -> None:
        """The rollback is done."""
        self.fire(E_ROLLED_BACK)

    # -- two phases (half messages)

    def on_prepare_reply(self, outcome: Outcome) -> ClientError | None:
        """The reply to a PREPARE sent behind BEGIN and the put. None: PREPARED. Else the
        error to raise; the state is FAILED when no reply came (prepared or not: if it was,
        the broker's check-back settles it), ROLLED_BACK when nothing is left at the broker
        (BEGIN or the put refused: PREPARE voted read-only), ROLLING_BACK when a ROLLBACK
        must follow (PREPARE refused)."""
        if not isinstance(outcome, Response):
            self.fire(E_UNKNOWN)
            return TransactionConnectionError(
                f"half message {self.key}: no reply to PREPARE ({outcome}); if it was "
                "prepared, the broker asks the producer group's checker",
                self.key,
            )
        if self.failure is not None:
            self.fire(E_ROLLED_BACK)
            if isinstance(self.failure, ClientError):
                return self.failure
            return ClientError(str(self.failure))
        vote = wire.prepare_vote(outcome, self.key)
        if isinstance(vote, ClientError):
            self.fire(E_ROLLBACK)
            return vote
        if vote == XA_RDONLY:
            self.fire(E_READ_ONLY)
            return ClientTransactionError(f"half message {self.key} was not recorded", self.key)
        self._prepared = True
        self.fire(E_PREPARED)
        return None

    def second_phase(self, commit: bool) -> FrameBuilder:
        """COMMIT_TWO_PHASE (``commit``) or ROLLBACK of a prepared transaction."""
        if commit:
            self.start_commit()
            return self.commit_frame(msgs=False)
        self.fire(E_ROLLBACK)
        return wire.command(self.key, self.session_id, wire.ROLLBACK)

    def on_second_phase_reply(self, outcome: Outcome) -> ClientError | None:
        """The reply to :meth:`second_phase`: None when acknowledged (COMMITTED or
        ROLLED_BACK), else the error (FAILED: the broker's check-back settles it)."""
        committing = self.state is S_COMMITTING
        err = self._error_of(outcome)
        if err is None:
            assert isinstance(outcome, Response)
            if outcome.code == 200:
                self.fire(E_COMMITTED if committing else E_ROLLED_BACK)
                return None
            err = wire.reply_error(outcome, self.key)
        self.fire(E_ERROR)
        return err
