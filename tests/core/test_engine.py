"""The transaction engine in-process: real redo log and partitions in a temp directory, a
hand-driven clock, effects read from the outbox. No broker process, no event loop."""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

import pytest

from notify.config import parse_config
from notify.core.apply import Applier
from notify.core.effects import Applied, Complete, Defer, Effect, Force, Reply, SendCheck
from notify.core.transactions import TxEngine, TxLimits, TxPut
from notify.protocol import records
from notify.protocol.frames import Transaction
from notify.protocol.idgen import IdGenerator
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.txlog import TxLog, TxLogConfig


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return 1.7e9 + self.t


class Owner:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Core:
    def __init__(self, root: Path, **limits: Any) -> None:
        ini = (
            f"[system]\ndataPath={root}/data\nunflushThreshold=0\n[topic=a]\nnumPartitions=2\n"
            "[topic=b]\nnumPartitions=2\nunflushThreshold=1000\n"  # visible at append
        )
        self.config = parse_config(ini)
        self.store = MessageStore(self.config)
        self.store.open()
        self.log = TxLog.open(root / "tx", TxLogConfig(flush_at_commit=1))
        self.flush_requests: list[Partition] = []
        self.applier = Applier(self.store, lambda p, n: self.flush_requests.append(p))
        self.clock = Clock()
        self.out: list[Effect] = []
        self.engine = TxEngine(
            self.log,
            self.store,
            self.applier,
            self.clock,
            IdGenerator(1),
            TxLimits(**limits),
            self.out,
        )

    def take(self) -> list[Effect]:
        got = self.out[:]
        self.out.clear()
        return got

    def cmd(self, owner: Any, key: str, verb: str, timeout: int | None = None) -> list[Effect]:
        self.engine.handle(owner, Transaction(key, "s", verb, timeout, None, 7))
        return self.take()

    def put(
        self, owner: Any, key: str, body: bytes, part: int = 0, topic: str = "a"
    ) -> list[Effect]:
        self.engine.put(owner, key, topic, part, 0, body, records.checksum(body), 3)
        return self.take()

    def force_all(self) -> list[Effect]:
        self.log.sync()
        self.engine.forced(self.log.end_position)
        return self.take()

    def commit(self, key: str, *msgs: tuple[bytes, int, str]) -> list[Effect]:
        """BEGIN, a put of each ``(body, partition, topic)``, COMMIT_ONE_PHASE, and the redo
        log's force (its effects: the apply's)."""
        o = Owner(key)
        self.cmd(o, key, "BEGIN")
        for body, part, topic in msgs:
            self.put(o, key, body, part=part, topic=topic)
        self.cmd(o, key, "COMMIT_ONE_PHASE")
        return self.force_all()

    def visible(self, part: int = 0, topic: str = "a") -> list[bytes]:
        p = self.store.get(topic, part)
        assert p is not None
        recs, _ = records.decode_all(p.read(p.min_offset, 1 << 20), p.min_offset)
        return [r.payload for r in recs]


@pytest.fixture
def core(tmp_path: Path) -> Core:
    return Core(tmp_path)


def replies(effects: list[Effect]) -> list[tuple[int, bytes]]:
    out = []
    for e in effects:
        if isinstance(e, Reply):
            out.append((e.code, e.body))
        elif isinstance(e, Complete):
            out.append((e.ticket.code, e.ticket.body))
    return out


def test_commit_forces_then_applies_and_is_visible_at_once(core: Core) -> None:
    o = Owner("c1")
    assert replies(core.cmd(o, "TX:s:1", "BEGIN")) == [(200, b"")]
    assert replies(core.put(o, "TX:s:1", b"m1"))[0][0] == 200
    assert replies(core.put(o, "TX:s:1", b"m2", part=1))[0][0] == 200
    eff = core.cmd(o, "TX:s:1", "COMMIT_ONE_PHASE")
    assert [type(e) for e in eff] == [Defer, Force]
    assert core.visible(0) == [] and core.visible(1) == []  # nothing before the force
    eff = core.force_all()
    assert [type(e) for e in eff] == [Applied, Complete]
    assert replies(eff) == [(200, b"")]
    # readable although no partition fsync has run yet (the redo log holds the messages)
    assert core.visible(0) == [b"m1"] and core.visible(1) == [b"m2"]
    assert {p.index for p in core.flush_requests} == {0, 1}


@pytest.mark.parametrize("force", [True, False])
def test_one_shot_answers_as_one_by_one_with_acks_riding_on_the_commit(
    tmp_path: Path, force: bool
) -> None:
    """BEGIN, two puts and COMMIT_ONE_PHASE as one unit: the same answers as one by one.
    With the force at commit, the BEGIN and put acks ride on the COMMIT's deferred reply
    (``Ticket.head``, written with it) instead of one Reply effect each."""
    core = Core(tmp_path, force_at_commit=force)
    o = Owner("c1")
    body = b"m1"
    puts = [
        TxPut("a", 0, 11, body, 0, 0, records.checksum(body)),
        TxPut("b", 1, 12, bytearray(records.encode(0, 0, b"m2", records.checksum(b"m2"))), 1),
    ]
    begin = Transaction("TX:s:1", "s", "BEGIN", 30, None, 10)
    commit = Transaction("TX:s:1", "s", "COMMIT_ONE_PHASE", None, None, 13, 2)
    assert core.engine.oneshot(o, begin, puts, commit)
    eff = core.take()
    if force:
        assert [type(e) for e in eff] == [Defer, Force]
        head = eff[0].ticket.head  # type: ignore[union-attr]
        assert head is not None and [(op, code) for op, code, _b in head] == [
            (10, 200), (11, 200), (12, 200)
        ]
        acks = [b for _op, _c, b in head[1:]]
        assert not core.visible(0, "a")  # nothing before the force
        eff = core.force_all()
        assert [type(e) for e in eff] == [Applied, Complete]
        assert replies(eff) == [(200, b"")]
    else:
        assert [type(e) for e in eff][:3] == [Reply, Reply, Reply]
        assert [(e.opaque, e.code) for e in eff[:3]] == [(10, 200), (11, 200), (12, 200)]  # type: ignore[union-attr]
        acks = [e.body for e in eff[1:3]]  # type: ignore[union-attr]
    # the put acks: <msgId> <partition> -1, and the mput's <firstId> <partition> -1 <count>
    assert acks[0].split()[1:] == [b"0", b"-1"]
    assert acks[1].split()[1:] == [b"1", b"-1", b"1"]
    assert core.visible(0, "a") == [b"m1"] and core.visible(1, "b") == [b"m2"]
    assert core.engine.stats.begun == 1 and core.engine.stats.committed == 1
    assert "TX:s:1" not in core.engine.txs  # committed and forgotten


def test_one_shot_refuses_what_one_by_one_must_answer(core: Core) -> None:
    """An XA key, a malformed key or a message-count mismatch: nothing done (False), so the
    requests run one by one and get their usual errors."""
    o = Owner("c1")
    body = b"m"
    put = TxPut("a", 0, 11, body, 0, 0, records.checksum(body))
    for key, expect in (("XID:1:ab:cd:q", None), ("TX:bad", None), ("TX:s:2", 5)):
        begin = Transaction(key, "s", "BEGIN", None, None, 10)
        commit = Transaction(key, "s", "COMMIT_ONE_PHASE", None, None, 13, expect)
        assert not core.engine.oneshot(o, begin, [put], commit)
        assert core.take() == [] and key not in core.engine.txs


def test_commit_waits_until_earlier_unflushed_data_is_visible(core: Core) -> None:
    o = Owner("c1")
    part = core.store.get("a", 0)
    assert part is not None
    part.append(records.encode(1, 0, b"plain"))  # a plain put waiting for its fsync round
    core.cmd(o, "TX:s:1", "BEGIN")
    core.put(o, "TX:s:1", b"m1")
    core.cmd(o, "TX:s:1", "COMMIT_ONE_PHASE")
    eff = core.force_all()
    assert replies(eff) == []  # applied, but readers cannot see it before "plain"
    assert core.visible(0) == []
    part.mark_flushed(part.end - 22)  # the plain put's round finishes
    assert replies(core.take()) == [(200, b"")]
    assert core.visible(0) == [b"plain", b"m1"]


def plain(core: Core, body: bytes, part: int = 0, topic: str = "a") -> int:
    """A plain put appended (not yet flushed); returns its end."""
    p = core.store.get(topic, part)
    assert p is not None
    p.append(records.encode(1, 0, body))
    return p.end


def test_a_transaction_appears_in_all_its_partitions_at_once(core: Core) -> None:
    """The share of a-1 (nothing pending there) waits for a-0's share, which sits behind a
    plain put waiting for its group-commit round; a plain put to a-1 after the share, in the
    same round, is readable when that round ends (not held back by the transaction)."""
    a0, a1 = core.store.get("a", 0), core.store.get("a", 1)
    assert a0 is not None and a1 is not None
    end0 = plain(core, b"before")
    eff = core.commit("TX:s:1", (b"m0", 0, "a"), (b"m1", 1, "a"))
    assert replies(eff) == []  # placed, but a-0's share is not showable yet
    assert core.visible(0) == [] and core.visible(1) == []
    end1 = plain(core, b"after", part=1)
    a1.mark_flushed(end1)  # the round covering "after" and...
    assert core.visible(1) == []  # (a round that ended first for a-1 shows nothing of it)
    a0.mark_flushed(end0)  # ...the one covering "before" (the same round: every fsync first)
    assert replies(core.take()) == [(200, b"")]
    assert core.visible(0) == [b"before", b"m0"]
    assert core.visible(1) == [b"m1", b"after"]


def test_a_share_without_group_commit_is_placed_when_the_others_can_be_shown(
    core: Core,
) -> None:
    """Topic b shows an append at once: its share is appended only when a-0's can be shown,
    so the plain puts b takes meanwhile are readable at once, before it."""
    a0 = core.store.get("a", 0)
    assert a0 is not None
    end0 = plain(core, b"before")
    assert replies(core.commit("TX:s:1", (b"m0", 0, "a"), (b"mb", 0, "b"))) == []
    plain(core, b"b-plain", topic="b")
    assert core.visible(0, "b") == [b"b-plain"]  # readable at once, nothing of the tx
    a0.mark_flushed(end0)
    eff = core.take()
    assert [type(e) for e in eff] == [Applied, Complete] and replies(eff) == [(200, b"")]
    assert core.visible(0) == [b"before", b"m0"]
    assert core.visible(0, "b") == [b"b-plain", b"mb"]


def test_a_refused_deferred_share_holds_the_transaction_until_it_is_written(
    core: Core,
) -> None:
    """b's share is appended when a-0's can be shown; b refuses it then (here: made
    read-only): nothing of the transaction is shown, it stays COMMITTING (its COMMIT record
    kept from checkpoints), and the retry job writes it once b accepts again."""
    a0, b = core.store.get("a", 0), core.store.get("b", 0)
    assert a0 is not None and b is not None
    end0 = plain(core, b"before")
    core.commit("TX:s:1", (b"m0", 0, "a"), (b"mb", 0, "b"))
    b.failed = "read-only for the test"
    a0.mark_flushed(end0)
    assert replies(core.take()) == []
    assert core.visible(0) == [b"before"] and core.visible(0, "b") == []
    assert core.engine.txs["TX:s:1"].state.value == "COMMITTING"
    core.engine.retry_applies()  # still refused
    assert core.visible(0) == [b"before"] and replies(core.take()) == []
    b.failed = None
    core.engine.retry_applies()
    assert replies(core.take()) == [(200, b"")]
    assert core.visible(0) == [b"before", b"m0"] and core.visible(0, "b") == [b"mb"]
    assert "TX:s:1" not in core.engine.txs


def test_transactions_never_wait_on_each_other_behind_held_puts(core: Core) -> None:
    """A put to b held for a synchronous slave's confirmation, between two transactions on
    a-0 and b: the second's share in b must not go before the first's (each would then wait
    for the other). Both are answered once the round and the confirmation come."""
    a0, b = core.store.get("a", 0), core.store.get("b", 0)
    assert a0 is not None and b is not None
    end0 = plain(core, b"before")
    for i, key in enumerate(("TX:s:1", "TX:s:2")):
        core.commit(key, (b"a%d" % i, 0, "a"), (b"b%d" % i, 0, "b"))
        if i == 0:
            held = b.end
            b.append(records.encode(2, 0, b"held"), hold=True)
    a0.mark_flushed(end0)
    assert replies(core.take()) == [] and core.visible(0, "b") == []
    b.confirm(held)
    assert replies(core.take()) == [(200, b"")] * 2
    assert core.visible(0) == [b"before", b"a0", b"a1"]
    assert core.visible(0, "b") == [b"held", b"b0", b"b1"]


def test_a_deferred_share_stays_hidden_while_another_waits_for_a_held_put(
    core: Core,
) -> None:
    """Two shares appended when the gate is ready, one of them behind a put held for a
    synchronous slave: the other one (in a partition that shows an append at once) stays
    hidden until the confirmation opens the gate."""
    a0, b0, b1 = core.store.get("a", 0), core.store.get("b", 0), core.store.get("b", 1)
    assert a0 is not None and b0 is not None and b1 is not None
    end0 = plain(core, b"before")
    held = b1.end
    b1.append(records.encode(2, 0, b"held"), hold=True)
    core.commit("TX:s:1", (b"m0", 0, "a"), (b"mb0", 0, "b"), (b"mb1", 1, "b"))
    a0.mark_flushed(end0)  # both deferred shares are appended now; b-1's waits for "held"
    assert replies(core.take()) == []
    assert core.visible(0, "b") == [] and core.visible(1, "b") == []
    assert core.visible(0) == [b"before"]
    b1.confirm(held)
    assert replies(core.take()) == [(200, b"")]
    assert core.visible(0) == [b"before", b"m0"]
    assert core.visible(0, "b") == [b"mb0"] and core.visible(1, "b") == [b"held", b"mb1"]


def test_transactions_queued_behind_one_round_open_in_order(core: Core) -> None:
    """Many transactions behind one pending put: all appear when its round ends, in order
    (opening one lets the next reach its share: no recursion, whatever their number)."""
    a0 = core.store.get("a", 0)
    assert a0 is not None
    end0 = plain(core, b"before")
    for i in range(2000):
        assert replies(core.commit(f"TX:s:{i}", (b"x%d" % i, 0, "a"), (b"y%d" % i, 1, "a"))) == []
    assert core.visible(1) == []
    a0.mark_flushed(end0)
    assert replies(core.take()) == [(200, b"")] * 2000
    assert core.visible(1) == [b"y%d" % i for i in range(2000)]


def test_checkpoint_keeps_applied_transactions_until_their_partitions_are_flushed(
    core: Core,
) -> None:
    o = Owner("c1")
    start = core.log.end_position
    core.cmd(o, "TX:s:1", "BEGIN")
    core.put(o, "TX:s:1", b"m1")
    core.cmd(o, "TX:s:1", "COMMIT_ONE_PHASE")
    core.force_all()
    assert core.engine.checkpoint_position() == start
    p = core.store.get("a", 0)
    assert p is not None
    p.sync()
    assert core.engine.checkpoint_position() == core.log.end_position


def test_failed_put_makes_commit_roll_back(tmp_path: Path) -> None:
    core = Core(tmp_path, max_tx_size=100)
    o = Owner("c1")
    core.cmd(o, "TX:s:1", "BEGIN")
    assert replies(core.put(o, "TX:s:1", b"x" * 60))[0][0] == 200
    code, body = replies(core.put(o, "TX:s:1", b"y" * 60))[0]
    assert code == 500 and body.startswith(b"XAException:code=-3")
    code, body = replies(core.cmd(o, "TX:s:1", "COMMIT_ONE_PHASE"))[0]
    assert code == 500 and body.startswith(b"XAException:code=100")
    core.force_all()
    assert core.visible(0) == [] and "TX:s:1" not in core.engine.txs


def test_commit_with_a_message_count_rolls_back_when_a_put_never_arrived(core: Core) -> None:
    """A COMMIT pipelined behind its puts says how many the client wrote (``msgs=<n>``):
    one refused before the engine saw it (bad checksum, unknown partition) must not
    leave the others committed."""
    o = Owner("c1")
    core.cmd(o, "TX:s:1", "BEGIN")
    core.put(o, "TX:s:1", b"m1")
    core.engine.handle(o, Transaction("TX:s:1", "s", "COMMIT_ONE_PHASE", None, None, 7, 2))
    code, body = replies(core.take())[0]
    assert code == 500 and body.startswith(b"XAException:code=100") and b"wrote 2" in body
    core.force_all()
    assert core.visible(0) == [] and "TX:s:1" not in core.engine.txs
    # the right count commits; so does PREPARE's
    core.cmd(o, "TX:s:2", "BEGIN")
    core.put(o, "TX:s:2", b"m2")
    core.put(o, "TX:s:2", b"m3")
    core.engine.handle(o, Transaction("TX:s:2", "s", "COMMIT_ONE_PHASE", None, None, 7, 2))
    assert replies(core.force_all()) == [(200, b"")]
    assert core.visible(0) == [b"m2", b"m3"]
    core.cmd(o, "TX:s:3", "BEGIN")
    core.engine.handle(o, Transaction("TX:s:3", "s", "PREPARE", None, None, 7, 1))
    code, body = replies(core.take())[0]
    assert code == 500 and body.startswith(b"XAException:code=100")


def test_timeouts_and_orphaned_prepared_local_transactions(core: Core) -> None:
    o = Owner("c1")
    core.cmd(o, "TX:s:1", "BEGIN", timeout=5)
    core.put(o, "TX:s:1", b"a")
    core.cmd(o, "TX:s:2", "BEGIN", timeout=5)
    core.put(o, "TX:s:2", b"b")
    assert replies(core.cmd(o, "TX:s:2", "PREPARE")) == []
    assert replies(core.force_all()) == [(200, b"0")]
    core.clock.t += 4
    core.engine.expire()
    assert core.engine.txs["TX:s:1"].state.value == "ACTIVE"
    core.clock.t += 2
    core.engine.expire()
    assert core.engine.txs["TX:s:1"].state.value == "ROLLED_BACK"
    assert core.engine.txs["TX:s:2"].state.value == "ROLLED_BACK"
    code, body = replies(core.cmd(o, "TX:s:2", "COMMIT_TWO_PHASE"))[0]
    assert code == 500 and body.startswith(b"XAException:code=106")
    core.clock.t += 200
    core.engine.expire()
    assert core.engine.txs == {}


def test_owner_lost_rolls_back_open_and_orphaned_prepared_but_keeps_xa_and_half(
    core: Core,
) -> None:
    o, producer = Owner("c1"), Owner("p")
    core.engine.register(producer, "shop", 1)
    core.take()
    for key, owner in (("TX:s:1", o), ("TX:s:2", o), ("XID:1:aa:bb:q", o), ("TX:p:1", producer)):
        core.cmd(owner, key, "BEGIN")
        core.put(owner, key, b"x")
    for key, owner in (("TX:s:2", o), ("XID:1:aa:bb:q", o), ("TX:p:1", producer)):
        if key.startswith("XID"):
            core.cmd(owner, key, "END")
        core.cmd(owner, key, "PREPARE")
    core.force_all()
    core.engine.owner_lost(o)
    states = {k: t.state.value for k, t in core.engine.txs.items()}
    assert states == {"XID:1:aa:bb:q": "PREPARED", "TX:p:1": "PREPARED"}
    assert core.engine.stats.abandoned == 1 and core.engine.stats.connection_rollbacks == 1


def test_half_message_check_back_then_exhaustion(tmp_path: Path) -> None:
    core = Core(tmp_path, check_back_delay_ms=1000, check_back_max_times=2)
    producer = Owner("p")
    core.engine.register(producer, "shop", 1)
    core.cmd(producer, "TX:p:1", "BEGIN")
    core.put(producer, "TX:p:1", b"half")
    core.cmd(producer, "TX:p:1", "PREPARE")
    core.force_all()
    core.engine.owner_lost(producer)  # the producer dies; a new one of the group comes
    p2 = Owner("p2")
    core.engine.register(p2, "shop", 1)
    core.take()
    sent = []
    for _ in range(4):
        core.clock.t += 6
        core.engine.check_backs()
        sent += [e for e in core.take() if isinstance(e, SendCheck)]
    assert [s.owner for s in sent] == [p2, p2]
    assert core.engine.stats.check_back_exhausted == 1 and core.engine.txs == {}


def test_recovery_reapplies_a_commit_whose_partition_lost_it(tmp_path: Path) -> None:
    core = Core(tmp_path)
    o = Owner("c1")
    core.cmd(o, "TX:s:1", "BEGIN")
    core.put(o, "TX:s:1", b"m1")
    core.cmd(o, "TX:s:1", "COMMIT_ONE_PHASE")
    core.force_all()
    core.log.sync()
    p = core.store.get("a", 0)
    assert p is not None
    p.rollback_to(0)  # what a crash before the partition's fsync does to it
    core.log.close()
    again = Core(tmp_path)
    again.engine.recover()
    assert again.visible(0) == [b"m1"]
    assert again.engine.stats.recovered_reapplied == 1
    # a second recovery finds it present and changes nothing
    again.log.close()
    third = Core(tmp_path)
    third.engine.recover()
    assert third.visible(0) == [b"m1"] and third.engine.stats.recovered_reapplied == 0


def _heap_work_per_pair(root: Path, cap: int, pairs: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """At capacity, (ROLLBACK one, BEGIN another) ``pairs`` times: the timer heap entries
    the engine rebuilt a heap of (``heapq.heapify``, what each compaction of the heap ends
    with), per pair."""
    heapified = [0, 0]  # entries, calls
    heapify = heapq.heapify

    def counting(entries: list[Any]) -> None:
        heapified[0] += len(entries)
        heapified[1] += 1
        heapify(entries)

    c = Core(root, capacity=cap)
    o = Owner("c1")
    open_keys = [f"TX:s:{i}" for i in range(cap)]
    for key in open_keys:
        c.cmd(o, key, "BEGIN", timeout=60)
    assert replies(c.cmd(o, "TX:x:1", "BEGIN", timeout=60))[0][0] == 503
    with monkeypatch.context() as m:
        m.setattr(heapq, "heapify", counting)
        for i in range(pairs):
            assert replies(c.cmd(o, open_keys[i], "ROLLBACK")) == [(200, b"")]
            open_keys.append(f"TX:n:{i}")
            assert replies(c.cmd(o, open_keys[-1], "BEGIN", timeout=60)) == [(200, b"")]
            # the heap keeps dead entries lazily, never more than about as many as live ones
            assert len(c.engine._timers) <= 2 * cap + 65
    assert replies(c.cmd(o, "TX:y:1", "BEGIN", timeout=60))[0][0] == 503  # still exact
    c.log.close()
    assert heapified[1] > 0, "no compaction: the heap is rebuilt some other way now"
    return heapified[0] / pairs


def test_end_and_begin_at_capacity_cost_does_not_grow_with_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At ``maxTxTimeoutTimerCapacity`` a client that ends one of its transactions and begins
    another made the engine compact the whole timer heap (O(capacity)) once per pair: 20,000
    open transactions cost ~40x a pair at 500. Dead entries are now dropped only once they
    outnumber the live ones (amortised O(1)): counted, the heap entries rebuilt per pair stay
    below 2 whatever the capacity (it was about the capacity itself), over enough pairs for
    both capacities to compact several times."""
    small = _heap_work_per_pair(tmp_path / "s", 100, 5000, monkeypatch)
    large = _heap_work_per_pair(tmp_path / "l", 2000, 5000, monkeypatch)
    assert small < 2 and large < 2, (small, large)
