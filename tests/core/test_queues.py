"""The queue-group core (notify.core.queues): the transition table as data, and the
bookkeeping (low-water offset, window bound, credit, redelivery, dead letters) in-process."""

from __future__ import annotations

import pytest

from notify.core.queues import (
    FINISHED,
    TRANSITIONS,
    MsgEvent,
    MsgState,
    QueueError,
    QueueGroup,
    QueueLimits,
    allowed,
    next_state,
)
from notify.protocol import queuelog
from notify.protocol.records import encode

S, E = MsgState, MsgEvent

EXPECTED = {
    (S.AVAILABLE, E.ACQUIRE): S.ACQUIRED,
    (S.ACQUIRED, E.RENEW): S.ACQUIRED,
    (S.ACQUIRED, E.ACCEPT): S.ACKNOWLEDGED,
    (S.ACQUIRED, E.REJECT): S.REJECTED,
    (S.ACQUIRED, E.RELEASE): S.AVAILABLE,
    (S.ACQUIRED, E.LOCK_EXPIRED): S.AVAILABLE,
    (S.ACQUIRED, E.CONSUMER_GONE): S.AVAILABLE,
    (S.ACQUIRED, E.EXHAUSTED): S.DEAD,
    (S.AVAILABLE, E.EXHAUSTED): S.DEAD,
    (S.REJECTED, E.REPLAY): S.AVAILABLE,
    (S.DEAD, E.REPLAY): S.AVAILABLE,
}


def test_table_is_exactly_the_documented_machine() -> None:
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize("state", list(MsgState))
@pytest.mark.parametrize("event", list(MsgEvent))
def test_every_pair_is_allowed_or_refused(state: MsgState, event: MsgEvent) -> None:
    if (state, event) in EXPECTED:
        assert allowed(state, event)
        assert next_state(state, event) is EXPECTED[(state, event)]
    else:
        assert not allowed(state, event)
        with pytest.raises(QueueError):
            next_state(state, event)


def test_finished_states_only_leave_by_replay() -> None:
    for (state, event), _ in TRANSITIONS.items():
        if state in FINISHED:
            assert event is E.REPLAY
    assert not any(s is S.ACKNOWLEDGED for s, _ in TRANSITIONS)  # an accept is final


def _group(**kw: int) -> QueueGroup:
    g = QueueGroup("t", "g", QueueLimits(**kw))
    g.add_partition(0, 0)
    g.add_partition(1, 0)
    return g


def _recs(start: int, n: int, size: int = 30) -> list[tuple[int, int]]:
    return [(start + i * size, size) for i in range(n)]


def test_spread_over_consumers_beyond_partitions_and_credit_bound() -> None:
    g = _group()
    for cid in (1, 2, 3, 4, 5):
        assert g.add_consumer(cid, 2) == 2
    g.add_records(0, _recs(0, 20))
    out = g.dispatch(0)
    assert len(out) == 10  # 5 consumers x credit 2, although there are 2 partitions
    assert {d.consumer for d in out} == {1, 2, 3, 4, 5}
    assert g.dispatch(0) == []  # no credit left
    held_by_1 = [d for d in out if d.consumer == 1]
    res = g.ack(1, "A", held_by_1[0].partition, held_by_1[0].offset, 0, 1)
    assert res.applied and res.finished is not None
    assert res.finished.state is S.ACKNOWLEDGED
    again = g.dispatch(2)
    assert [d.consumer for d in again] == [1]


def test_huge_credit_is_clamped() -> None:
    g = _group(max_credit=7)
    assert g.add_consumer(1, 10**9) == 7
    assert g.add_consumer(2, 0) == 1


def test_window_bound_holds_whatever_the_backlog() -> None:
    g = _group(max_in_flight=5)
    g.add_consumer(1, 100)
    assert g.add_records(0, _recs(0, 50)) == 5
    assert g.tracked == 5 and g.room() == 0
    assert len(g.dispatch(0)) == 5
    assert not g.wants_records()  # the window is full: nothing more is read


def test_only_the_holder_may_acknowledge() -> None:
    g = _group()
    g.add_consumer(1, 1)
    g.add_consumer(2, 1)
    g.add_records(0, _recs(0, 1))
    (d,) = g.dispatch(0)
    other = 2 if d.consumer == 1 else 1
    for kind in "ARXN":
        assert not g.ack(other, kind, 0, d.offset, 0, 0).applied
    assert not g.ack(d.consumer, "A", 0, d.offset + 1, 0, 0).applied  # not a message
    assert not g.ack(d.consumer, "A", 7, 0, 0, 0).applied  # no such partition
    assert not g.ack(d.consumer, "Z", 0, d.offset, 0, 0).applied
    assert g.refused_acks == 7
    assert g.ack(d.consumer, "A", 0, d.offset, 0, 0).applied
    assert not g.ack(d.consumer, "A", 0, d.offset, 0, 0).applied  # twice


def test_lock_timeout_redelivers_then_dead_letters_at_the_limit() -> None:
    g = _group(lock_ms=100, max_deliveries=3)
    g.add_consumer(1, 10)
    g.add_records(0, _recs(0, 2))
    now = 0.0
    first = g.dispatch(now)
    assert len(first) == 2
    g.ack(1, "A", 0, 30, 0, now)  # the second one is fine
    for attempt in (2, 3):
        assert g.next_wakeup() == now + 100
        now += 100
        assert g.expire(now) == []
        (d,) = g.dispatch(now)
        assert d.offset == 0 and d.count == attempt
    now += 100
    (fin,) = g.expire(now)
    assert fin.state is S.DEAD and fin.count == 3
    assert list(g.dead) == [(0, 0)]
    assert g.parts[0].low_water == 60  # both finished: the low-water offset passed them
    assert g.tracked == 0


def test_renew_moves_the_deadline_and_release_with_delay_waits() -> None:
    g = _group(lock_ms=100)
    g.add_consumer(1, 10)
    g.add_records(0, _recs(0, 1))
    (d,) = g.dispatch(0)
    assert g.ack(1, "N", 0, 0, 0, 90).applied
    assert g.expire(150) == [] and g.dispatch(150) == []  # still held
    assert g.ack(1, "R", 0, 0, 500, 160).applied
    assert g.dispatch(600) == []
    (d,) = g.dispatch(660)
    assert d.count == 2
    assert not g.ack(1, "R", 0, 0, 10**10, 700).applied  # delay over the limit


def test_consumer_gone_returns_its_messages_at_once() -> None:
    g = _group()
    g.add_consumer(1, 5)
    g.add_records(0, _recs(0, 3))
    assert len(g.dispatch(0)) == 3
    assert g.remove_consumer(1, 1) == []
    g.add_consumer(2, 5)
    assert {d.consumer for d in g.dispatch(1)} == {2}


def test_reject_goes_to_the_dead_letter_queue_and_replay_brings_it_back() -> None:
    g = _group()
    g.add_consumer(1, 5)
    g.add_records(1, _recs(0, 1))
    (d,) = g.dispatch(0)
    fin = g.ack(1, "X", 1, 0, 0, 0).finished
    assert fin is not None and fin.state is S.REJECTED
    assert g.dead[(1, 0)].reason is S.REJECTED
    assert g.replay(1, 0)
    (d,) = g.dispatch(1)
    assert (d.partition, d.offset, d.count) == (1, 0, 1)
    assert not g.dead


def test_compact_form_round_trips_through_the_log_codec() -> None:
    g = _group()
    g.add_consumer(1, 10)
    g.add_records(0, _recs(0, 4))
    ds = g.dispatch(0)
    g.ack(1, "A", 0, 30, 0, 0)  # above the low-water offset: an exception
    g.ack(1, "X", 0, 90, 0, 0)
    comp = g.compact()
    assert comp[0][0] == 0
    assert [(o, s) for o, _, s, _ in comp[0][1]] == [(30, S.ACKNOWLEDGED), (90, S.REJECTED)]
    assert len(ds) == 4
    # restore into a fresh group: the finished ones are skipped when read again
    h = _group()
    h.restore(0, comp[0][0], comp[0][1])
    h.add_consumer(9, 10)
    h.add_records(0, _recs(0, 4))
    assert sorted(d.offset for d in h.dispatch(0)) == [0, 60]
    snap = queuelog.GroupSnapshot("t", "g", {0: (0, [(30, 60, 1, 1), (90, 120, 2, 1)])},
                                  [(0, 90, 30, 1, 2, 5)], [(1, 0, 30)])
    assert queuelog.decode_snapshot(queuelog.encode_snapshot([snap])) == [snap]


def test_recovered_delivery_counts_resume_and_the_limit_holds() -> None:
    """Counts logged before a crash (restore_count) go on from where they were; a message
    recovered at the limit is dead-lettered, never delivered again."""
    g = _group(max_deliveries=3)
    g.restore(0, 0, [])
    g.restore_count(0, 0, 2)
    g.restore_count(0, 30, 3)
    g.restore_count(0, 30, 1)  # an older record: the highest count wins
    g.restore_count(0, 60, 1)
    g.note_finished(0, 60, 90, S.ACKNOWLEDGED, 1, 0)  # then accepted: no count kept
    g.add_consumer(1, 10)
    g.add_records(0, _recs(0, 4))
    out = g.dispatch(0)
    assert [(d.offset, d.count) for d in out] == [(0, 3), (90, 1)]
    (dead,) = g.take_exhausted()
    assert (dead.offset, dead.state, dead.count) == (30, S.DEAD, 3)
    assert g.dead[(0, 30)].reason is S.DEAD and g.take_exhausted() == []
    # the counts of unfinished messages are what a checkpoint keeps
    assert sorted(g.delivery_counts()) == [(0, 0, 3), (0, 90, 1)]
    snap = queuelog.GroupSnapshot("t", "g", {0: (0, [])}, counts=[(0, 0, 3), (1, 90, 1)])
    old = queuelog.GroupSnapshot("u", "h", {1: (5, [])})
    assert queuelog.decode_snapshot(queuelog.encode_snapshot([old, snap])) == [old, snap]
    # a checkpoint written before counts existed (no trailer) still decodes
    legacy = queuelog.encode_snapshot([old])[:-4]
    assert queuelog.decode_snapshot(legacy) == [old]
    body = queuelog.encode_deliver("t", "g", [(0, 30, 70000)])
    assert queuelog.decode_deliver(body) == ("t", "g", [(0, 30, 65535)])


def test_runs_group_consecutive_records_per_consumer() -> None:
    g = _group()
    g.add_consumer(1, 100)
    g.add_records(0, _recs(0, 10))
    g.add_records(1, _recs(0, 5))
    runs = g.dispatch_runs(0)
    assert [(r.consumer, r.partition, r.count, r.start, r.end) for r in runs] == [
        (1, 0, 1, 0, 300),
        (1, 1, 1, 0, 150),
    ]
    assert g.held_by(1) == 15 and g.delivered == 15


def test_range_accepts_refuse_what_is_not_held_and_log_ranges() -> None:
    g = _group()
    g.add_consumer(1, 4)
    g.add_consumer(2, 4)
    g.add_records(0, _recs(0, 8))
    out = g.dispatch(0)
    mine = sorted(d.offset for d in out if d.consumer == 1)
    assert mine == [0, 30, 60, 90]  # a consumer takes a run in a row
    applied, n, refused, fins, acked = g.ack_many(1, [("A", 0, 0, 180, 0)], 1)
    # its four accepted as one range; the two of consumer 2 in the span refused by name
    assert applied == 4 and n == 2 and fins == [] and acked == [(0, 0, 120)]
    assert refused == ["0:120 is not held by this consumer", "0:150 is not held by this consumer"]
    assert g.held_by(1) == 0 and g.held_by(2) == 4
    # again: everything there is finished and below the low-water offset now -> one span
    applied, _, refused, _, acked = g.ack_many(1, [("A", 0, 0, 120, 0)], 2)
    assert applied == 0 and acked == [] and refused == ["0:0..120 is not held by this consumer"]
    # a range release with a delay and a range reject by consumer 2
    applied, _, refused, fins, _ = g.ack_many(
        2, [("R", 0, 120, 180, 50), ("X", 0, 180, 240, 0)], 3
    )
    assert applied == 4 and refused == [] and [f.state for f in fins] == [S.REJECTED] * 2
    assert g.dispatch(10) == []  # released with a delay
    assert sorted(d.offset for d in g.dispatch(60)) == [120, 150]


def test_compact_keeps_accepted_runs_as_ranges_and_restores_them() -> None:
    g = _group()
    g.add_consumer(1, 100)
    g.add_records(0, _recs(0, 10))
    g.dispatch(0)
    # 0 stays held (the low-water offset), 30..150 accepted in a row, 150 held, 180.. accepted
    g.ack_many(1, [("A", 0, 30, 150, 0), ("A", 0, 180, 300, 0)], 1)
    low, fin = g.compact()[0]
    assert low == 0
    assert fin == [(30, 150, S.ACKNOWLEDGED, 0), (180, 300, S.ACKNOWLEDGED, 0)]
    h = _group()
    h.restore(0, low, fin)
    h.restore_count(0, 60, 2)  # a count logged inside an accepted range: dropped on the read
    h.add_consumer(1, 100)
    h.add_records(0, _recs(0, 10))
    assert [(d.offset, d.count) for d in h.dispatch(0)] == [(0, 1), (150, 1)]
    assert h.parts[0].counts == {}
    # a range reaching over the frontier is clipped to it (recovery after the frontier moved)
    k = _group()
    k.restore(0, 90, [(30, 150, S.ACKNOWLEDGED, 0)])
    assert k.parts[0].frontier == 150
    k.note_finished(0, 120, 240, S.ACKNOWLEDGED, 0, 0)
    assert k.parts[0].frontier == 240


def test_add_span_parses_whole_records_up_to_the_window() -> None:
    rec = encode(0, 0, b"x" * 10)
    g = _group(max_in_flight=3)
    g.add_consumer(1, 10)
    data = rec * 2 + rec[:7]  # a partial record at the end stays unread
    assert g.add_span(0, data, 0, 10) == 2
    assert g.parts[0].frontier == 2 * len(rec)
    assert g.add_span(1, rec * 5, 0, 10) == 1  # the window (max_in_flight 3) is full
    assert [(d.partition, d.offset) for d in g.dispatch(0)] == [(0, 0), (0, len(rec)), (1, 0)]


def test_a_hostile_range_costs_a_bounded_walk_and_bounded_reasons() -> None:
    g = _group(max_in_flight=5000, max_credit=10)
    g.add_consumer(1, 1)
    g.add_records(0, _recs(0, 3000))
    assert [d.offset for d in g.dispatch(0)] == [0]
    before = g.refused_acks
    applied, n, why, _, acked = g.ack_many(1, [("A", 0, 0, 2**62, 0)] * 3, 1, max_reasons=16)
    # its one message accepted; 1024 messages it does not hold walked and refused one by
    # one, then the rest of that range and the two other ranges refused as spans unwalked
    assert applied == 1 and acked == [(0, 0, 30)]
    assert n == 1024 + 1 + 2 and len(why) == 16 and g.refused_acks - before == n
    assert g.tracked == 2999 and g.held_by(1) == 0


def test_retention_skip_keeps_the_part_of_an_accepted_range_above_it() -> None:
    g = _group()
    g.restore(0, 0, [(60, 300, S.ACKNOWLEDGED, 0)])  # recovered: 60..300 accepted, 0..60 not
    assert g.skip_to(0, 120) == 120  # retention deleted below 120 unread
    g.add_consumer(1, 100)
    g.add_records(0, _recs(120, 8))  # 120..360: only 300 and 330 were never accepted
    assert [d.offset for d in g.dispatch(0)] == [300, 330]


def test_returned_messages_go_out_again_in_offset_order() -> None:
    """A range release, an expired lock batch and a departed consumer put their messages
    back so that they are delivered again as runs of consecutive records."""
    g = _group(lock_ms=100)
    g.add_consumer(1, 10)
    g.add_records(0, _recs(0, 6))
    g.dispatch(0)
    g.ack_many(1, [("R", 0, 0, 90, 0)], 1)
    (r,) = g.dispatch_runs(2)
    assert [e.offset for e in r.entries] == [0, 30, 60] and r.count == 2
    g.expire(200)  # every lock ran out
    runs = g.dispatch_runs(201)
    assert [[e.offset for e in r.entries] for r in runs] == [[0, 30, 60], [90, 120, 150]]
    g.add_consumer(2, 10)
    g.remove_consumer(1, 202)
    assert [e.offset for r in g.dispatch_runs(203) for e in r.entries] == [0, 30, 60, 90, 120,
                                                                          150]
