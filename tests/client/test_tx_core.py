"""The client's transaction core without a network: the table as data, then TxCore driven
by hand (frames out, replies in), as every path drives it."""

from __future__ import annotations

import pytest

from notify.client import (
    ClientTransactionError,
    Partition,
    TransactionAbortedError,
    TransactionConnectionError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    XAError,
)
from notify.client.core import wire
from notify.client.core.selectors import KeyHashSelector, RoundRobinSelector
from notify.client.core.states import (
    FINISHED,
    OPEN,
    TRANSITIONS,
    TxEvent,
    TxState,
    allowed,
    next_state,
)
from notify.client.core.transaction import CommitStep, Flight, Kind, TxCore
from notify.errors import BrokerError, ClientError, ConnectionLostError, RequestTimeoutError
from notify.protocol import records
from notify.protocol.frames import Response

P0 = Partition(0, 0, "h:1")
P1 = Partition(0, 1, "h:1")
OTHER = Partition(1, 0, "h:2")
PARTS = [P0, P1, OTHER]


def ok(body: bytes = b"") -> Response:
    return Response("result", 200, 1, body)


def xa(code: int, http: int = 500) -> Response:
    return Response("result", http, 1, b"XAException:code=%d,msg=no" % code)


def frames(flight: Flight[str]) -> list[bytes]:
    return [b(7) for b in flight.frames]


# --------------------------------------------------------------------------- the table


def test_the_table_is_the_machine() -> None:
    states = set(TxState)
    # every state but ACTIVE (where a transaction starts) is reachable
    assert {after for after in TRANSITIONS.values()} == states - {TxState.ACTIVE}
    # a finished transaction never moves again
    assert not [k for k in TRANSITIONS if k[0] in FINISHED]
    # and from every open state a transaction can end either way
    for s in OPEN:
        assert allowed(s, TxEvent.COMMIT) and allowed(s, TxEvent.ROLLBACK)
    assert next_state(TxState.ACTIVE, TxEvent.FAIL) is TxState.ROLLBACK_ONLY
    assert next_state(TxState.COMMITTING, TxEvent.UNKNOWN) is TxState.FAILED
    with pytest.raises(ClientTransactionError, match="commit is not allowed in state committed"):
        next_state(TxState.COMMITTED, TxEvent.COMMIT)
    # every event is used, no event leads two ways from one state (a dict cannot)
    assert {e for _, e in TRANSITIONS} == set(TxEvent)


# --------------------------------------------------------------------------- TxCore


def test_flight_begin_puts_mput_and_pipelined_commit() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s", timeout_s=2.5)
    part = core.select("t", PARTS, None, b"a", KeyHashSelector())
    core.bind(part.broker_id, part.address)
    core.add("t", part, b"a", 0, "h1")
    core.add("t", part, b"b", 1, "h2")
    core.add("u", P1, b"c", 0, "h3")
    core.start_commit()
    assert core.may_pipeline_commit()
    f = core.flight(mput=True, checksum=True, commit=True)
    assert [s.kind for s in f.steps] == [Kind.BEGIN, Kind.PUTS, Kind.PUTS, Kind.COMMIT]
    out = frames(f)
    assert out[0] == b"transaction TX:s:1 s BEGIN 3 7\r\n"  # timeout rounded up
    body = records.encode(0, 0, b"a") + records.encode(0, 1, b"b")
    assert out[1] == b"mput t %d %d 2 TX:s:1 7\r\n" % (part.partition, len(body)) + body
    assert out[2] == b"put u 1 1 0 %d TX:s:1 7\r\nc" % records.checksum(b"c")
    assert out[3] == b"transaction TX:s:1 s COMMIT_ONE_PHASE msgs=3 7\r\n"
    assert core.commit_sent and core.written == 3
    # replies: BEGIN, the mput (ids 10, 11), the put (id 20)
    assert core.on_reply(f.steps[0], ok()) == []
    r1 = core.on_reply(f.steps[1], ok(b"10 %d -1 2" % part.partition))
    r2 = core.on_reply(f.steps[2], ok(b"20 1 -1"))
    assert [(h, r.success, r.msg_id, r.offset) for h, r in r1 + r2] == [
        ("h1", True, 10, -1), ("h2", True, 11, -1), ("h3", True, 20, -1)
    ]
    assert core.commit_plan() is CommitStep.AWAIT
    core.on_commit_reply(ok())
    core.conclude()
    assert core.state is TxState.COMMITTED


def test_bound_transaction_refuses_another_brokers_topic() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s")
    core.bind(0, "h:1")
    with pytest.raises(ClientTransactionError, match="no partition on broker 0"):
        core.select("elsewhere", [OTHER], None, b"x", RoundRobinSelector())

    def broken(*_: object) -> Partition:
        raise ZeroDivisionError

    with pytest.raises(ClientError, match="partition selector"):
        core.select("t", PARTS, None, b"x", broken)


def test_begin_refused_explains_the_puts_and_commit_aborts() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s", no_mput=set())
    core.bind(0, "h:1")
    core.add("t", P0, b"a", 0, "h1")
    f = core.flight(mput=True, checksum=False)
    core.on_reply(f.steps[0], xa(-6))
    (res,) = core.on_reply(f.steps[1], xa(-4))
    assert isinstance(res[1].error, XAError) and res[1].error.code == -6  # BEGIN's
    assert core.state is TxState.ROLLBACK_ONLY
    assert isinstance(core.refusal(), TransactionAbortedError)


def test_commit_with_a_failed_send_rolls_back_and_raises() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s")
    core.bind(0, "h:1")
    core.add("t", P0, b"a", 0, "h1")
    f = core.flight(mput=True, checksum=False)
    core.on_reply(f.steps[0], ok())
    (res,) = core.on_reply(f.steps[1], Response("result", 413, 1, b"too large"))
    assert isinstance(res[1].error, BrokerError)
    refusal = core.refusal()
    assert isinstance(refusal, TransactionAbortedError) and refusal.cause is res[1].error
    core.start_commit()
    assert core.commit_plan() is CommitStep.ROLLBACK and core.state is TxState.ROLLING_BACK
    rollback = core.rollback_frame()
    assert rollback is not None and rollback(3) == b"transaction TX:s:1 s ROLLBACK 3\r\n"
    core.on_rollback_reply(xa(-4))  # already gone at the broker: quiet
    with pytest.raises(TransactionAbortedError) as ei:
        core.conclude()
    assert ei.value.cause is res[1].error and ei.value.__cause__ is res[1].error
    assert core.state is TxState.ROLLED_BACK


def test_pipelined_commit_refused_after_a_failed_put() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s")
    core.bind(0, "h:1")
    core.add("t", P0, b"a", 0, "h1")
    core.start_commit()
    f = core.flight(mput=True, checksum=False, commit=True)
    core.on_reply(f.steps[0], ok())
    core.on_reply(f.steps[1], Response("result", 413, 1, b"too large"))
    core.on_commit_reply(xa(100))  # XA_RBROLLBACK: msgs=<n> did not match
    assert core.state is TxState.ROLLING_BACK  # the driver sends ROLLBACK, then
    with pytest.raises(TransactionAbortedError):
        core.conclude()


@pytest.mark.parametrize(
    ("reply", "state", "error"),
    [
        (xa(106), TxState.ROLLED_BACK, TransactionTimeoutError),
        (xa(-3), TxState.FAILED, XAError),
        (ConnectionLostError("gone"), TxState.FAILED, TransactionOutcomeUnknownError),
        (RequestTimeoutError("slow"), TxState.FAILED, TransactionOutcomeUnknownError),
    ],
)
def test_commit_outcomes(reply: object, state: TxState, error: type[Exception]) -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s")
    core.bind(0, "h:1")
    core.add("t", P0, b"a", 0, "h1")
    f = core.flight(mput=True, checksum=False)
    core.on_reply(f.steps[0], ok())
    core.on_reply(f.steps[1], ok(b"5 0 -1"))
    core.start_commit()
    assert core.commit_plan() is CommitStep.SEND
    assert core.commit_frame(msgs=False)(9) == b"transaction TX:s:1 s COMMIT_ONE_PHASE 9\r\n"
    core.on_commit_reply(reply)  # type: ignore[arg-type]
    with pytest.raises(error):
        core.conclude()
    assert core.state is state


def test_empty_transaction_and_lost_connection() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s")
    core.start_commit()
    assert core.commit_plan() is CommitStep.DONE and core.state is TxState.COMMITTED
    core.conclude()
    with pytest.raises(ClientTransactionError, match="already committed"):
        core.start_rollback()
    lost: TxCore[str] = TxCore("TX:s:2", "s")
    lost.bind(0, "h:1")
    lost.add("t", P0, b"a", 0, "h1")
    f = lost.flight(mput=True, checksum=False)
    (res,) = lost.unsent(f, ConnectionLostError("write failed"))
    assert isinstance(res[1].error, TransactionConnectionError) and not lost.begin_ok
    assert lost.state is TxState.ROLLBACK_ONLY and lost.open
    lost.start_commit()
    with pytest.raises(ClientTransactionError, match="committing: it takes no more"):
        lost.check_open()
    assert lost.commit_plan() is CommitStep.ROLLBACK
    with pytest.raises(TransactionConnectionError):  # the send's own error, as it was
        lost.conclude()
    assert lost.state is TxState.ROLLED_BACK


def test_rollback_is_quiet_when_the_broker_already_rolled_back() -> None:
    core: TxCore[str] = TxCore("TX:s:1", "s")
    assert core.start_rollback() and core.rollback_frame() is None  # never begun
    core.rolled_back()
    assert not core.start_rollback()  # idempotent
    other: TxCore[str] = TxCore("TX:s:2", "s")
    other.bind(0, "h:1")
    other.add("t", P0, b"a", 0, "h1")
    other.flight(mput=False, checksum=False)
    assert other.start_rollback()
    for quiet in (xa(106), xa(-4), xa(100), ConnectionLostError("x")):
        other.on_rollback_reply(quiet)
    with pytest.raises(XAError):
        other.on_rollback_reply(xa(-3))


def test_half_message_prepare_and_second_phase() -> None:
    core: TxCore[None] = TxCore("TX:s:1", "s")
    core.bind(0, "h:1")
    core.add("t", P0, b"a", 0, None)
    f = core.flight(mput=False, checksum=False, prepare=True)
    assert [s.kind for s in f.steps] == [Kind.BEGIN, Kind.PUTS, Kind.PREPARE]
    core.on_reply(f.steps[0], ok())
    core.on_reply(f.steps[1], ok(b"42 0 -1"))
    assert core.on_prepare_reply(ok(b"0")) is None and core.state is TxState.PREPARED
    assert core.second_phase(True)(1) == b"transaction TX:s:1 s COMMIT_TWO_PHASE 1\r\n"
    assert core.on_second_phase_reply(ok()) is None and core.state is TxState.COMMITTED
    # no reply to PREPARE: prepared or not, the check-back settles it
    unknown: TxCore[None] = TxCore("TX:s:2", "s")
    err = unknown.on_prepare_reply(ConnectionLostError("gone"))
    assert isinstance(err, TransactionConnectionError) and unknown.state is TxState.FAILED
    # PREPARE refused: a ROLLBACK follows
    refused: TxCore[None] = TxCore("TX:s:3", "s")
    refused.begun = True
    err = refused.on_prepare_reply(xa(-3))
    assert isinstance(err, XAError) and refused.state is TxState.ROLLING_BACK
    # the put refused: nothing is left at the broker
    put: TxCore[None] = TxCore("TX:s:4", "s")
    put.bind(0, "h:1")
    put.add("t", P0, b"a", 0, None)
    g = put.flight(mput=False, checksum=False, prepare=True)
    put.on_reply(g.steps[0], ok())
    put.on_reply(g.steps[1], Response("result", 413, 1, b"too large"))
    err = put.on_prepare_reply(ok(b"3"))
    assert isinstance(err, BrokerError) and put.state is TxState.ROLLED_BACK
    # a second phase that is not acknowledged is left to the check-back
    late: TxCore[None] = TxCore("TX:s:5", "s")
    late.fire(TxEvent.PREPARED)
    late.second_phase(False)
    assert isinstance(late.on_second_phase_reply(RequestTimeoutError("slow")), ClientError)
    assert late.state is TxState.FAILED


def test_wire_reads_acks_and_errors() -> None:
    assert wire.put_ack(ok(b"5 1 100")) == (5, 100)
    assert isinstance(wire.put_ack(ok(b"garbage")), ClientError)
    e = wire.put_ack(xa(106), "TX:a:1")
    assert isinstance(e, TransactionTimeoutError) and e.tx_key == "TX:a:1"
    busy = wire.reply_error(xa(-7, 503))
    assert isinstance(busy, XAError) and busy.retriable
    assert wire.prepare_vote(ok(b"")) == 0 and wire.prepare_vote(ok(b"3")) == 3
    with pytest.raises(ClientError, match="> 0"):
        wire.timeout_token(0)
    assert wire.timeout_token(0.2) == 1 and wire.timeout_token(None) is None
