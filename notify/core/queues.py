"""Queue subscriptions (Notify-style push delivery) as a pure core: per-message state.

A *queue group* ``(topic, group)`` tracks, for every message of every partition of the
topic, where its delivery stands; live consumers of the group get messages pushed up to
their credit, whatever the partition count. No sockets, clock or files here: the shell
(:mod:`notify.broker.queues`) feeds records read from the store, the current time, consumer
arrivals and departures and acknowledgements, and gets back deliveries to push and
*finished* items to make durable.

Message states, one transition table (tested as data in ``tests/core/test_queues.py``)::

    AVAILABLE ──acquire──▶ ACQUIRED(consumer, deadline)      delivery_count += 1
    ACQUIRED ──renew──▶ ACQUIRED                            (deadline moved)
    ACQUIRED ──accept──▶ ACKNOWLEDGED                        (durable; finished)
    ACQUIRED ──reject──▶ REJECTED                            (durable; dead-letter queue)
    ACQUIRED ──release|lock_expired|consumer_gone──▶ AVAILABLE
    ACQUIRED ──exhausted──▶ DEAD      (release/expiry/departure with delivery_count at
                                       maxDeliveries: durable; dead-letter queue)
    AVAILABLE ──exhausted──▶ DEAD     (recovered with delivery_count at maxDeliveries:
                                       its deliveries before a crash used up the limit)
    REJECTED|DEAD ──replay──▶ AVAILABLE                      (an admin's replay)

Compact form (what a checkpoint stores): per partition the *low-water offset* (every message
below it is finished: acknowledged, rejected or dead) plus the *exceptions*, the finished
messages above it, each with the offset of the record after it (so the low-water offset can
advance over them without reading the store) and the replayed messages below it.

Bounds: a group tracks at most ``max_in_flight`` messages between its low-water offsets and
its read frontiers (acquired, available for redelivery, or finished above the low-water
offset); a poison message at the low-water offset cannot make that window grow, it only
stops the group reading further until the message is finished (it is, after at most
``max_deliveries`` lock timeouts). A consumer's credit is clamped to ``max_credit``; the
dead-letter queue keeps the newest ``max_dead_letters`` entries.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from notify.core.ports import Clock
from notify.errors import NotifyError
from notify.protocol import queuelog
from notify.protocol.records import HEADER, HEADER_SIZE
from notify.transitions import TransitionTable


class QueueError(NotifyError):
    """A queue operation that cannot be done (bad state change, unknown message)."""


class MsgState(Enum):
    """Where one message's delivery to one queue group stands."""

    AVAILABLE = "AVAILABLE"
    ACQUIRED = "ACQUIRED"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    REJECTED = "REJECTED"
    DEAD = "DEAD"

    #: members are singletons: identity hash (C) instead of Enum's hash of the name, on
    #: the per-message path (transition lookups, FINISHED membership)
    __hash__ = object.__hash__


class MsgEvent(Enum):
    """What can happen to a message of a queue group."""

    ACQUIRE = "acquire"
    RENEW = "renew"
    ACCEPT = "accept"
    REJECT = "reject"
    RELEASE = "release"
    LOCK_EXPIRED = "lock_expired"
    CONSUMER_GONE = "consumer_gone"
    EXHAUSTED = "exhausted"
    REPLAY = "replay"

    __hash__ = object.__hash__


S, E = MsgState, MsgEvent
TRANSITIONS: Final[dict[tuple[MsgState, MsgEvent], MsgState]] = {
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
#: states in which a message is done with (durable; the low-water offset may pass it)
FINISHED: Final = frozenset({S.ACKNOWLEDGED, S.REJECTED, S.DEAD})
#: events that return an acquired message to the pool (or, at the limit, kill it)
RETURNS: Final = frozenset({E.RELEASE, E.LOCK_EXPIRED, E.CONSUMER_GONE})


#: finished states <-> their codes in the queue log (:mod:`notify.protocol.queuelog`)
STATE_CODES: Final = {
    S.ACKNOWLEDGED: queuelog.ACKNOWLEDGED,
    S.REJECTED: queuelog.REJECTED,
    S.DEAD: queuelog.DEAD,
}
CODE_STATES: Final = {v: k for k, v in STATE_CODES.items()}


_TABLE: Final = TransitionTable(TRANSITIONS, QueueError)
#: The state after ``event``; :class:`QueueError` when the event is not allowed.
next_state = _TABLE.next_state
#: Whether ``event`` may happen in ``state``.
allowed = _TABLE.allowed
#: The table's answer for the per-message push (looked up once, not per message).
_ACQUIRED_FROM_AVAILABLE: Final = next_state(S.AVAILABLE, E.ACQUIRE)
_ACCEPTED: Final = next_state(S.ACQUIRED, E.ACCEPT)


#: acknowledgement kinds on the wire (``qack`` items) and the event each one is
ACK_EVENTS: Final = {
    "A": E.ACCEPT,
    "R": E.RELEASE,
    "X": E.REJECT,
    "N": E.RENEW,
}


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The settings of a queue group (README "Configuration reference", ``queue*``)."""

    lock_ms: int = 30_000
    max_deliveries: int = 5
    max_in_flight: int = 10_000
    max_credit: int = 1000
    max_dead_letters: int = 10_000
    max_release_delay_ms: int = 3_600_000


class Entry:
    """One tracked message: where it is and how often it was delivered."""

    __slots__ = ("consumer", "count", "deadline", "length", "offset", "partition", "state")

    def __init__(self, partition: int, offset: int, length: int, state: MsgState, count: int):
        self.partition = partition
        self.offset = offset
        self.length = length  # whole record, header included
        self.state = state
        self.count = count
        self.consumer = 0
        self.deadline = 0.0  # lock deadline when ACQUIRED, not-before when AVAILABLE

    @property
    def next_offset(self) -> int:
        return self.offset + self.length


@dataclass(slots=True)
class Delivery:
    """Push message ``(partition, offset)`` (``length`` bytes) to ``consumer``."""

    consumer: int
    partition: int
    offset: int
    length: int
    count: int


class Run:
    """Messages of one partition pushed to one consumer together, at consecutive offsets
    (each record right after the previous one) with the same delivery count."""

    __slots__ = ("consumer", "count", "entries", "partition")

    def __init__(self, consumer: int, partition: int, count: int, entries: list[Entry]):
        self.consumer = consumer
        self.partition = partition
        self.count = count
        self.entries = entries

    @property
    def start(self) -> int:
        """Offset of the first record."""
        return self.entries[0].offset

    @property
    def end(self) -> int:
        """Offset after the last record."""
        return self.entries[-1].next_offset


@dataclass(slots=True)
class Finished:
    """A message reached a finished state: log it (``state`` ACKNOWLEDGED/REJECTED/DEAD)."""

    partition: int
    offset: int
    next_offset: int
    state: MsgState
    count: int


@dataclass(slots=True)
class DeadLetter:
    """An entry of the group's dead-letter queue."""

    partition: int
    offset: int
    length: int
    count: int
    reason: MsgState  # REJECTED or DEAD
    at_ms: int


@dataclass(slots=True)
class PartState:
    """One partition of a queue group: low-water offset, read frontier, tracked messages."""

    frontier: int
    #: tracked messages from the low-water offset up to the frontier, in offset order
    entries: dict[int, Entry] = field(default_factory=dict)
    #: recovered finished messages not yet read again: offset -> (next offset, state, count)
    skip: dict[int, tuple[int, MsgState, int]] = field(default_factory=dict)
    #: replayed dead letters below the low-water offset, by offset
    replayed: dict[int, Entry] = field(default_factory=dict)
    #: recovered delivery counts of unfinished messages not yet read again: offset -> count
    counts: dict[int, int] = field(default_factory=dict)

    @property
    def low_water(self) -> int:
        return next(iter(self.entries)) if self.entries else self.frontier


@dataclass(slots=True)
class Consumer:
    credit: int
    #: messages it holds (acquired by it); they are found by ``Entry.consumer``
    held: int = 0


@dataclass(slots=True)
class AckResult:
    """What one ``qack`` item did: ``applied`` or a ``refused`` reason; ``finished`` when
    the message must be made durable before the acknowledgement is answered."""

    applied: bool
    refused: str = ""
    finished: Finished | None = None


def record_spans(data: bytes | memoryview, base: int, room: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the whole records at the start of ``data`` (read at offset
    ``base``; at most ``room``); a trailing partial record is left for the next read."""
    out: list[tuple[int, int]] = []
    pos, n = 0, len(data)
    size = HEADER_SIZE
    unpack = HEADER.unpack_from
    while n - pos >= size and len(out) < room:
        length = unpack(data, pos)[0]
        end = pos + size + length
        if length < 0 or end > n:
            break
        out.append((base + pos, size + length))
        pos = end
    return out


def _unreachable(e: Entry) -> None:
    raise QueueError(f"message {e.partition}:{e.offset} appended to no run")


class GroupState:
    """A queue group's state and its compact form: partitions, tracked messages, dead
    letters, consumers' holdings, and what a checkpoint stores and recovery restores
    (:meth:`compact`, :meth:`restore`, :meth:`note_finished`, ...). :class:`QueueGroup`
    adds delivery, locks and acknowledgements on top of it."""

    def __init__(
        self, topic: str, group: str, limits: QueueLimits, clock: Clock | None = None
    ) -> None:
        self.topic = topic
        self.group = group
        self.limits = limits
        #: the wall clock dead letters are stamped with (None: ``now_ms`` is taken as one,
        #: for callers that drive time by hand); deadlines use ``now_ms``, never this
        self.clock = clock
        self.parts: dict[int, PartState] = {}
        self.consumers: dict[int, Consumer] = {}
        self._rr: deque[int] = deque()  # consumers in round-robin order
        self.available: deque[Entry] = deque()
        self._delayed: list[tuple[float, int, Entry]] = []  # (not_before, seq, entry)
        # (deadline, seq, entries): the locks taken together (one dispatch or a renew)
        # share one heap item; entries no longer locked with that deadline are skipped
        # lazily (popped from the batch's front), so a lock costs no heap operation
        self._locks: list[tuple[float, int, deque[Entry]]] = []
        self._seq = 0
        self.tracked = 0  # entries in every PartState.entries and .replayed
        self._exhausted: list[Finished] = []  # died in dispatch (recovered at the limit)
        self.dead: OrderedDict[tuple[int, int], DeadLetter] = OrderedDict()
        self.dead_dropped = 0
        self.delivered = 0
        self.redelivered = 0
        self.refused_acks = 0
        #: retention deleted the store below these offsets (partition -> offset)
        self._floors: dict[int, int] = {}
        self.retention_dropped = 0  # tracked messages whose record retention deleted
        self.retention_skipped_bytes = 0  # unread bytes retention deleted

    def add_partition(self, partition: int, start: int) -> None:
        """Track ``partition`` from offset ``start`` (a new group or a new partition)."""
        if partition not in self.parts:
            self.parts[partition] = PartState(start)

    def restore(
        self,
        partition: int,
        low_water: int,
        finished: list[tuple[int, int, MsgState, int]],
    ) -> None:
        """Recovery: ``partition`` resumes at ``low_water``; ``finished`` holds
        ``(offset, next_offset, state, count)`` of finished messages above it (those below
        are ignored: replayed log records older than the checkpoint are idempotent)."""
        ps = self.parts.get(partition)
        if ps is None:
            ps = self.parts[partition] = PartState(low_water)
        elif low_water > ps.frontier:
            ps.frontier = low_water
        for off, nxt, state, count in finished:
            if off < ps.frontier < nxt:  # a range of records reaching over the frontier
                off = ps.frontier
            if off >= ps.frontier:
                ps.skip[off] = (nxt, state, count)
        self._skip_finished(ps)

    @staticmethod
    def _skip_finished(ps: PartState) -> None:
        """Advance an idle partition's frontier over recovered finished messages (a skip
        may be a range of several records); recovered counts it passed are dropped."""
        moved = False
        while not ps.entries and ps.frontier in ps.skip:
            ps.frontier = ps.skip.pop(ps.frontier)[0]
            moved = True
        if moved and ps.counts:
            ps.counts = {o: c for o, c in ps.counts.items() if o >= ps.frontier}

    def room(self) -> int:
        """How many more messages the group may track (``max_in_flight`` window)."""
        return max(0, self.limits.max_in_flight - self.tracked)

    def free_credit(self) -> int:
        """Deliveries the live consumers could take now."""
        return sum(max(0, c.credit - c.held) for c in self.consumers.values())

    def _add_dead(self, d: DeadLetter) -> None:
        self.dead[(d.partition, d.offset)] = d
        self.dead.move_to_end((d.partition, d.offset))
        while len(self.dead) > self.limits.max_dead_letters:
            self.dead.popitem(last=False)
            self.dead_dropped += 1

    def _advance(self, ps: PartState) -> None:
        """Drop finished messages at the low-water offset (the window shrinks)."""
        entries = ps.entries
        gone = []
        for off, e in entries.items():  # one pass, deletions after it
            if e.state not in FINISHED:
                break
            gone.append(off)
        for off in gone:
            del entries[off]
        self.tracked -= len(gone)
        if not entries:
            self._skip_finished(ps)

    def _entry(self, partition: int, offset: int) -> Entry | None:
        ps = self.parts.get(partition)
        if ps is None:
            return None
        return ps.entries.get(offset) or ps.replayed.get(offset)

    def replay(self, partition: int, offset: int) -> bool:
        """Move a dead letter back to available (an admin's replay); False if unknown."""
        d = self.dead.pop((partition, offset), None)
        if d is None:
            return False
        ps = self.parts.get(partition)
        if ps is None:
            return False
        e = ps.entries.get(offset)
        if e is None and offset >= ps.frontier:  # recovered, not read again yet
            ps.skip.pop(offset, None)
            ps.counts.pop(offset, None)
            return True
        if e is None:
            e = Entry(partition, offset, d.length, d.reason, 0)
            ps.replayed[offset] = e
            self.tracked += 1
        e.state = next_state(e.state, E.REPLAY)
        e.count = 0
        self.available.append(e)
        return True

    def note_finished(
        self, partition: int, offset: int, next_offset: int, state: MsgState, count: int,
        at_ms: int,
    ) -> None:
        """Recovery: a logged finished message, or for an accepted range (ACKED record)
        every message whose record starts in ``[offset, next_offset)`` (idempotent; below the
        low-water offset it changes nothing but the dead-letter queue)."""
        key = (partition, offset)
        if state is S.ACKNOWLEDGED:
            self.dead.pop(key, None)
        else:
            self._add_dead(DeadLetter(partition, offset, next_offset - offset, count, state,
                                      at_ms))
        ps = self.parts.get(partition)
        if ps is None:
            return
        ps.counts.pop(offset, None)
        if ps.replayed:  # a range (ACKED records) may hold several replayed messages
            for o in [o for o in ps.replayed if offset <= o < next_offset]:
                ps.replayed.pop(o).state = state
                self.tracked -= 1
        if offset < ps.frontier < next_offset:  # a range reaching over the frontier
            offset = ps.frontier
        if offset >= ps.frontier:
            ps.skip[offset] = (next_offset, state, count)
            self._skip_finished(ps)

    def restore_replayed(self, partition: int, offset: int, length: int) -> None:
        """Recovery: a dead letter an admin replayed is available again."""
        self.dead.pop((partition, offset), None)
        ps = self.parts.get(partition)
        if ps is None:
            return
        if offset >= ps.frontier:
            ps.skip.pop(offset, None)  # read and delivered again
            ps.counts.pop(offset, None)  # from delivery count 0
            return
        if offset in ps.replayed:
            return
        e = Entry(partition, offset, length, S.AVAILABLE, 0)
        ps.replayed[offset] = e
        self.tracked += 1
        self.available.append(e)

    def restore_count(self, partition: int, offset: int, count: int) -> None:
        """Recovery: message ``(partition, offset)`` was delivered ``count`` times (a logged
        delivery). Finished messages ignore it; the count of a message not read yet waits
        for the read (:meth:`add_records`)."""
        ps = self.parts.get(partition)
        if ps is None:
            return
        e = ps.replayed.get(offset) or ps.entries.get(offset)
        if e is not None:
            if e.state not in FINISHED:
                e.count = max(e.count, count)
        elif offset >= ps.frontier and offset not in ps.skip:
            ps.counts[offset] = max(ps.counts.get(offset, 0), count)

    def delivery_counts(self) -> list[tuple[int, int, int]]:
        """``(partition, offset, count)`` of unfinished messages delivered at least once
        (what a checkpoint keeps so that counts survive a restart)."""
        out = []
        for p, ps in self.parts.items():
            for e in (*ps.entries.values(), *ps.replayed.values()):
                if e.count and e.state not in FINISHED:
                    out.append((p, e.offset, e.count))
            out += [(p, o, c) for o, c in ps.counts.items()]
        return out

    def replayed_entries(self) -> list[tuple[int, int, int]]:
        """Replayed dead letters below the low-water offsets not finished yet."""
        return [
            (p, e.offset, e.length)
            for p, ps in self.parts.items()
            for e in ps.replayed.values()
        ]

    def compact(self) -> dict[int, tuple[int, list[tuple[int, int, MsgState, int]]]]:
        """Per partition: (low-water offset, finished messages above it: ``(offset, next,
        state, count)``, accepted ones in a row as one range up to ``next``)."""
        out = {}
        ack = S.ACKNOWLEDGED
        for p, ps in self.parts.items():
            fin: list[tuple[int, int, MsgState, int]] = []
            for e in ps.entries.values():
                if e.state not in FINISHED:
                    continue
                if e.state is ack and fin and fin[-1][2] is ack and fin[-1][1] == e.offset:
                    fin[-1] = (fin[-1][0], e.next_offset, ack, 0)  # accepted in a row: a range
                else:
                    fin.append((e.offset, e.next_offset, e.state, e.count))
            fin += [(o, v[0], v[1], v[2]) for o, v in ps.skip.items()]
            out[p] = (ps.low_water, fin)
        return out

    def holds_nothing(self, ends: dict[int, int]) -> bool:
        """True when deleting the group loses nothing: no consumer, no dead letter, nothing
        tracked (acquired, available, delayed or finished above a low-water offset), and
        every partition read and finished up to ``ends[partition]`` (the store's visible
        end): its consumers have nothing pending. A group behind its topic's end holds
        those messages for its consumers, however long they are away."""
        if self.consumers or self.dead or self.tracked or self.available or self._delayed:
            return False
        for p, ps in self.parts.items():
            if ps.entries or ps.skip or ps.replayed or ps.frontier < ends.get(p, 0):
                return False
        return all(p in self.parts or not end for p, end in ends.items())

    def held_by(self, cid: int) -> int:
        c = self.consumers.get(cid)
        return c.held if c is not None else 0

    def counts(self) -> dict[str, int]:
        """Figures for ``stats``."""
        acquired = sum(c.held for c in self.consumers.values())
        return {
            "consumers": len(self.consumers),
            "tracked": self.tracked,
            "available": len(self.available),
            "acquired": acquired,
            "dead_letters": len(self.dead),
            "dead_dropped": self.dead_dropped,
            "delivered": self.delivered,
            "redelivered": self.redelivered,
            "refused_acks": self.refused_acks,
            "retention_dropped": self.retention_dropped,
            "retention_skipped_bytes": self.retention_skipped_bytes,
        }


class QueueGroup(GroupState):
    """The delivery state of one queue group over the partitions of its topic."""

    # ------------------------------------------------------------------ reading partitions

    def wants_records(self) -> bool:
        """True when reading more of the store would let a delivery happen."""
        return bool(self.consumers) and not self.available and self.room() > 0 and (
            self.free_credit() > 0
        )

    def add_records(self, partition: int, recs: list[tuple[int, int]]) -> int:
        """Records read from the store at the partition's frontier, ``(offset, length)`` in
        order; takes as many as the window has room for and returns how many it took."""
        ps = self.parts[partition]
        room = self.limits.max_in_flight - self.tracked
        if not ps.skip and not ps.counts and recs and recs[0][0] == ps.frontier:
            # the usual case (nothing recovered to skip or count): records are contiguous
            # (one read), so only the first needs checking against the frontier
            entries, avail, available = ps.entries, self.available, S.AVAILABLE
            take = recs[: max(0, room)]
            for off, length in take:
                e = Entry(partition, off, length, available, 0)
                entries[off] = e
                avail.append(e)
            if take:
                ps.frontier = take[-1][0] + take[-1][1]
                self.tracked += len(take)
            return len(take)
        taken = 0
        for off, length in recs:
            if off != ps.frontier:
                raise QueueError(f"record at {off} is not at the frontier {ps.frontier}")
            if self.tracked >= self.limits.max_in_flight:
                break
            skipped = ps.skip.pop(off, None)
            if skipped is not None:  # finished before a restart: not delivered again
                ps.frontier = off + length
                if skipped[0] > ps.frontier:  # a range: the rest is skipped too
                    ps.skip[ps.frontier] = skipped
                if ps.counts:
                    ps.counts.pop(off, None)
                taken += 1
                if ps.entries:  # behind an unfinished message: keep it as an exception
                    e = Entry(partition, off, length, skipped[1], skipped[2])
                    ps.entries[off] = e
                    self.tracked += 1
                continue
            e = Entry(partition, off, length, S.AVAILABLE, ps.counts.pop(off, 0))
            ps.entries[off] = e
            ps.frontier = off + length
            self.tracked += 1
            self.available.append(e)
            taken += 1
        return taken

    def add_span(self, partition: int, data: bytes | memoryview, base: int, room: int) -> int:
        """:meth:`add_records` for the whole records at the start of ``data``, read from the
        store at offset ``base`` (at most ``room`` of them; a trailing partial record is
        left); parses and tracks them in one pass in the usual case. Returns how many."""
        ps = self.parts[partition]
        limit = min(room, self.limits.max_in_flight - self.tracked)
        if ps.skip or ps.counts or base != ps.frontier:
            return self.add_records(partition, record_spans(data, base, max(0, room)))
        entries, append, available = ps.entries, self.available.append, S.AVAILABLE
        unpack = HEADER.unpack_from
        size = HEADER_SIZE
        pos, n, k = 0, len(data), 0
        while k < limit and n - pos >= size:
            length = unpack(data, pos)[0] + size
            if length < size or pos + length > n:
                break
            off = base + pos
            e = entries[off] = Entry(partition, off, length, available, 0)
            append(e)
            pos += length
            k += 1
        ps.frontier = base + pos
        self.tracked += k
        return k

    def skip_to(self, partition: int, offset: int) -> int:
        """The store no longer holds what lies below ``offset`` (retention): move an idle
        frontier there; returns how many bytes were skipped."""
        ps = self.parts[partition]
        if offset <= ps.frontier or ps.entries:
            return 0
        gap = offset - ps.frontier
        ps.frontier = offset
        # a recovered range reaching over the new frontier keeps its part above it
        ps.skip = {max(o, offset): v for o, v in ps.skip.items() if v[0] > offset}
        ps.counts = {o: c for o, c in ps.counts.items() if o >= offset}
        return gap

    def needed(self, partition: int) -> int | None:
        """The lowest offset of ``partition`` the group may still read (unfinished or
        replayed messages, or its read frontier); None for an unknown partition."""
        ps = self.parts.get(partition)
        if ps is None:
            return None
        low = ps.low_water
        return min(low, min(ps.replayed)) if ps.replayed else low

    def set_floor(self, partition: int, offset: int) -> None:
        """Retention deleted ``partition`` below ``offset``: unread messages there are
        skipped (bytes counted); tracked unfinished ones are dead-lettered instead of
        delivered when their turn comes (counted; their record is gone, a replay of them
        answers unknown). Acquired ones may still be acknowledged."""
        ps = self.parts.get(partition)
        if ps is None or offset <= self._floors.get(partition, 0):
            return
        self._floors[partition] = offset
        if not ps.entries and ps.frontier < offset:
            self.retention_skipped_bytes += self.skip_to(partition, offset)

    def _below_floor(self, e: Entry) -> bool:
        return e.offset < self._floors.get(e.partition, 0)

    # ------------------------------------------------------------------ consumers

    def add_consumer(self, cid: int, credit: int) -> int:
        """A live consumer with ``credit`` (clamped to 1..max_credit); returns the credit
        granted."""
        granted = max(1, min(credit, self.limits.max_credit))
        if cid in self.consumers:
            self.consumers[cid].credit = granted
        else:
            self.consumers[cid] = Consumer(granted)
            self._rr.append(cid)
        return granted

    def remove_consumer(self, cid: int, now_ms: float) -> list[Finished]:
        """The consumer is gone: what it held returns to available at once (or dies at the
        delivery limit). Returns the finished items to log."""
        c = self.consumers.pop(cid, None)
        if c is None:
            return []
        if cid in self._rr:
            self._rr.remove(cid)
        out: list[Finished] = []
        if not c.held:
            return out
        acquired = S.ACQUIRED
        mine = [
            e
            for ps in self.parts.values()
            for src in (ps.entries, ps.replayed)
            for e in src.values()
            if e.consumer == cid and e.state is acquired
        ]
        # returned to the front of the available ones: the last first, so they go out again
        # in offset order (runs of consecutive records)
        mine.sort(key=lambda e: (e.partition, e.offset), reverse=True)
        for e in mine:
            f = self._return(e, E.CONSUMER_GONE, now_ms, 0)
            if f is not None:
                out.append(f)
        c.held = 0
        return out

    # ------------------------------------------------------------------ delivery

    def dispatch(self, now_ms: float) -> list[Delivery]:
        """Acquire available messages for consumers with free credit, round robin (one
        :class:`Delivery` per message: :meth:`dispatch_runs` unrolled)."""
        return [
            Delivery(r.consumer, e.partition, e.offset, e.length, r.count)
            for r in self.dispatch_runs(now_ms)
            for e in r.entries
        ]

    def dispatch_runs(self, now_ms: float) -> list[Run]:
        """Acquire available messages for consumers with free credit, round robin; the
        messages come in :class:`Run` s (what the shell pushes as one piece)."""
        out: list[Run] = []
        n = 0
        self._wake_delayed(now_ms)
        rr = self._rr
        avail = self.available
        lock = self.limits.lock_ms
        max_deliveries = self.limits.max_deliveries
        batch: deque[Entry] = deque()
        batch_append = batch.append
        popleft = avail.popleft
        acquired = _ACQUIRED_FROM_AVAILABLE
        available = S.AVAILABLE
        while avail and rr:
            progressed = False
            for _ in range(len(rr)):
                if not avail:
                    break
                cid = rr[0]
                rr.rotate(-1)
                c = self.consumers[cid]
                free = c.credit - c.held
                if free <= 0:
                    continue
                # rend -1: the first message opens a run
                run_append: Callable[[Entry], None] = _unreachable
                rp = rc = rend = -1
                deadline = now_ms + lock
                # up to a few messages for this consumer in a row (fewer rotations), still
                # spread: at most a fair share of what is available
                take = min(free, 1 + len(avail) // len(rr), 64)
                got = 0
                while got < take and avail:
                    e = popleft()
                    if e.state is not available:  # replayed twice, or already finished
                        continue
                    count = e.count
                    if count >= max_deliveries or (
                        self._floors and self._below_floor(e)
                    ):  # delivered up to the limit (before a crash), or its record is gone
                        if count < max_deliveries:
                            self.retention_dropped += 1
                        self._exhausted.append(self._finish(e, E.EXHAUSTED, now_ms))
                        progressed = True
                        continue
                    got += 1
                    count += 1
                    e.state = acquired
                    e.count = count
                    e.consumer = cid
                    e.deadline = deadline
                    batch_append(e)
                    if count > 1:
                        self.redelivered += 1
                    off = e.offset
                    if off == rend and count == rc and e.partition == rp:
                        run_append(e)
                    else:
                        run = [e]
                        run_append = run.append
                        rp, rc = e.partition, count
                        out.append(Run(cid, rp, rc, run))
                    rend = off + e.length
                if got:
                    c.held += got
                    n += got
                    progressed = True
            if not progressed:
                break
        if batch:
            self._seq += 1
            heapq.heappush(self._locks, (now_ms + lock, self._seq, batch))
        self.delivered += n
        return out

    def take_exhausted(self) -> list[Finished]:
        """Messages :meth:`dispatch` found at the delivery limit (counts recovered from the
        log: deliveries before a crash) and killed instead of delivering: log them."""
        out, self._exhausted = self._exhausted, []
        return out

    def next_wakeup(self) -> float | None:
        """Earliest lock deadline or delayed release (ms), or None."""
        times = []
        while self._locks and not self._lock_live(self._locks[0]):
            heapq.heappop(self._locks)
        if self._locks:
            times.append(self._locks[0][0])
        if self._delayed:
            times.append(self._delayed[0][0])
        return min(times) if times else None

    @staticmethod
    def _lock_live(item: tuple[float, int, deque[Entry]]) -> bool:
        """Whether a lock of the batch is still held with its deadline (drops the ones in
        front that are not: each entry is looked at once here)."""
        deadline, _, batch = item
        acquired = S.ACQUIRED
        while batch:
            e = batch[0]
            if e.state is acquired and e.deadline == deadline:
                return True
            batch.popleft()
        return False

    def expire(self, now_ms: float) -> list[Finished]:
        """Locks past their deadline return to available (or die at the limit)."""
        out: list[Finished] = []
        locks = self._locks
        acquired = S.ACQUIRED
        while locks and locks[0][0] <= now_ms:
            deadline, _, batch = heapq.heappop(locks)
            for e in reversed(batch):  # put back in front in the order they were delivered
                if e.state is not acquired or e.deadline != deadline:
                    continue
                c = self.consumers.get(e.consumer)
                if c is not None:
                    c.held -= 1
                f = self._return(e, E.LOCK_EXPIRED, now_ms, 0)
                if f is not None:
                    out.append(f)
        self._wake_delayed(now_ms)
        return out

    def _wake_delayed(self, now_ms: float) -> None:
        d = self._delayed
        while d and d[0][0] <= now_ms:
            at, _, e = heapq.heappop(d)
            if e.state is S.AVAILABLE and e.deadline == at:
                self.available.append(e)

    def _return(
        self, e: Entry, event: MsgEvent, now_ms: float, delay_ms: int
    ) -> Finished | None:
        """An acquired message comes back (release, expiry, departure)."""
        if e.count >= self.limits.max_deliveries:
            return self._finish(e, E.EXHAUSTED, now_ms)
        e.state = next_state(e.state, event)
        e.consumer = 0
        if delay_ms > 0:
            e.deadline = now_ms + delay_ms
            self._seq += 1
            heapq.heappush(self._delayed, (e.deadline, self._seq, e))
        else:
            e.deadline = 0.0
            self.available.appendleft(e)  # redeliveries go first
        return None

    def _finish(
        self, e: Entry, event: MsgEvent, now_ms: float, advance: bool = True
    ) -> Finished:
        e.state = next_state(e.state, event)
        e.consumer = 0
        if e.state is not S.ACKNOWLEDGED:
            at = int(self.clock.time() * 1000) if self.clock is not None else int(now_ms)
            self._add_dead(DeadLetter(e.partition, e.offset, e.length, e.count, e.state, at))
        f = Finished(e.partition, e.offset, e.next_offset, e.state, e.count)
        ps = self.parts[e.partition]
        if ps.replayed and ps.replayed.pop(e.offset, None) is not None:
            self.tracked -= 1
        if advance:
            self._advance(ps)
        return f

    # ------------------------------------------------------------------ acknowledgements

    def ack(
        self, cid: int, kind: str, partition: int, offset: int, delay_ms: int, now_ms: float
    ) -> AckResult:
        """Apply one acknowledgement item from consumer ``cid``. Only the consumer holding
        the message's lock may acknowledge it; anything else is refused (and counted)."""
        event = ACK_EVENTS.get(kind)
        if event is None:
            return self._refuse(f"unknown acknowledgement kind {kind!r}")
        e = self._entry(partition, offset)
        c = self.consumers.get(cid)
        if e is None or c is None or e.state is not S.ACQUIRED or e.consumer != cid:
            return self._refuse(f"{partition}:{offset} is not held by this consumer")
        if event is E.RENEW:
            e.state = next_state(e.state, E.RENEW)
            e.deadline = now_ms + self.limits.lock_ms
            self._seq += 1
            heapq.heappush(self._locks, (e.deadline, self._seq, deque((e,))))
            return AckResult(True)
        if event is E.RELEASE and not 0 <= delay_ms <= self.limits.max_release_delay_ms:
            return self._refuse(
                f"release delay {delay_ms} outside 0..{self.limits.max_release_delay_ms} ms"
            )
        c.held -= 1
        if event is E.RELEASE:
            return AckResult(True, finished=self._return(e, E.RELEASE, now_ms, delay_ms))
        return AckResult(True, finished=self._finish(e, event, now_ms))

    def ack_many(
        self,
        cid: int,
        items: list[tuple[str, int, int, int, int]],
        now_ms: float,
        max_reasons: int = 16,
    ) -> tuple[int, int, list[str], list[Finished], list[tuple[int, int, int]]]:
        """:meth:`ack` for the items of one ``qack`` frame, ``(kind, partition, offset, end,
        delay_ms)``: ``end`` -1 names the one message at ``offset``, else the item covers
        every message whose record starts in ``[offset, end)`` (a range). Returns
        ``(applied, refused, the first max_reasons refusal reasons, finished items to log,
        accepted ranges to log)``: the accepted messages as ``(partition, from, to)``
        ranges of consecutive records. Accepts, the bulk of them, take a short path; the
        low-water offsets advance once per frame. Bounded whatever the ranges say: the
        walk over messages a range names but this consumer does not hold stops after
        ``max(max_credit, 1024)`` of them per frame (the rest of each range is refused as
        one span)."""
        c = self.consumers.get(cid)
        parts = self.parts
        acquired = S.ACQUIRED
        accepted = _ACCEPTED
        applied = 0
        refused: list[str] = []
        nrefused = 0
        budget = max(self.limits.max_credit, 1024)

        def refuse(why: str) -> None:
            nonlocal nrefused
            nrefused += 1
            self.refused_acks += 1
            if len(refused) < max_reasons:
                refused.append(why)

        fins: list[Finished] = []
        acked: list[list[int]] = []
        touched: set[int] = set()
        for kind, p, off, end, delay in items:
            ps = parts.get(p)
            if end < 0:  # one message
                e = None
                if kind == "A" and c is not None and ps is not None:
                    e = ps.entries.get(off) or ps.replayed.get(off)
                if e is not None and e.state is acquired and e.consumer == cid:
                    assert c is not None and ps is not None
                    e.state = accepted
                    e.consumer = 0
                    c.held -= 1
                    if ps.replayed and ps.replayed.pop(off, None) is not None:
                        self.tracked -= 1
                    _extend_run(acked, p, off, e.offset + e.length)
                    touched.add(p)
                    applied += 1
                    continue
                res = self.ack(cid, kind, p, off, delay, now_ms)
                if res.applied:
                    applied += 1
                    if res.finished is not None:
                        fins.append(res.finished)
                else:
                    self.refused_acks -= 1  # counted again by refuse()
                    refuse(res.refused)
                continue
            if kind not in ACK_EVENTS:
                refuse(f"unknown acknowledgement kind {kind!r}")
                continue
            if c is None or ps is None or end <= off or budget <= 0:
                refuse(f"{p}:{off}..{end} is not held by this consumer")
                continue
            entries, replayed = ps.entries, ps.replayed
            o = off
            later: list[int] = []  # released at once: returned last first (offset order)
            if kind == "A":  # the bulk: a run this consumer holds, accepted in one sweep
                get = entries.get
                k = 0
                while o < end:
                    e = get(o)
                    if e is None or e.state is not acquired or e.consumer != cid:
                        break
                    e.state = accepted
                    e.consumer = 0
                    o += e.length
                    k += 1
                if k:
                    c.held -= k
                    applied += k
                    touched.add(p)
                    _extend_run(acked, p, off, o)
            while o < end:
                e = entries.get(o)
                if e is None and replayed:
                    e = replayed.get(o)
                if e is None:  # not a tracked record start: finished below the low water?
                    low = ps.low_water
                    hi = min(low, end) if o < low else end
                    stop = hi
                    if replayed:
                        budget -= len(replayed)
                        stop = min((k for k in replayed if o <= k < hi), default=hi)
                    if stop > o:
                        refuse(f"{p}:{o}..{stop} is not held by this consumer")
                    o = stop
                    if budget <= 0 and o < end:
                        refuse(f"{p}:{o}..{end} is not held by this consumer")
                        break
                    continue
                if e.state is acquired and e.consumer == cid:
                    if kind == "A":
                        e.state = accepted
                        e.consumer = 0
                        c.held -= 1
                        if replayed and replayed.pop(o, None) is not None:
                            self.tracked -= 1
                        _extend_run(acked, p, o, o + e.length)
                        touched.add(p)
                        applied += 1
                    elif kind == "R" and delay == 0:
                        later.append(o)
                    else:
                        res = self.ack(cid, kind, p, o, delay, now_ms)
                        if res.applied:
                            applied += 1
                            if res.finished is not None:
                                fins.append(res.finished)
                        else:
                            self.refused_acks -= 1  # counted again by refuse()
                            refuse(res.refused)
                    o += e.length
                    continue
                refuse(f"{p}:{o} is not held by this consumer")
                o += e.length
                budget -= 1
                if budget <= 0 and o < end:
                    refuse(f"{p}:{o}..{end} is not held by this consumer")
                    break
            for o in reversed(later):
                res = self.ack(cid, kind, p, o, 0, now_ms)
                if res.applied:
                    applied += 1
                    if res.finished is not None:
                        fins.append(res.finished)
                else:  # cannot happen: held a moment ago
                    self.refused_acks -= 1  # counted again by refuse()
                    refuse(res.refused)
        for p in touched:
            self._advance(parts[p])
        return applied, nrefused, refused, fins, [(p, a, b) for p, a, b in acked]

    def _refuse(self, why: str) -> AckResult:
        self.refused_acks += 1
        return AckResult(False, why)


def _extend_run(acked: list[list[int]], p: int, start: int, end: int) -> None:
    """Add accepted bytes ``start..end`` of partition ``p`` to ``acked``, the runs of an
    acknowledgement batch (``[partition, from, to]``), extending the last run when it ends
    where this one starts."""
    if acked and acked[-1][2] == start and acked[-1][0] == p:
        acked[-1][2] = end
    else:
        acked.append([p, start, end])
