"""Deterministic simulation of the broker core (after FoundationDB's simulation testing and
TigerBeetle's VOPR).

One seed = one world: a :class:`~notify.sim.disk.SimFileSystem` (a write is durable only
after the fsync that covers it; a crash drops every unsynced byte, optionally tearing the last
write), a :class:`~notify.sim.clock.SimClock`, and the *real* core on top: the
:class:`~notify.store.manager.MessageStore` with its partitions, the redo
:class:`~txlog.TxLog`, the :class:`~notify.core.apply.Applier`, the
:class:`~notify.core.transactions.TxEngine` and the :class:`~notify.broker.delay.DelayQueue`.
A seeded random scheduler interleaves many clients' work one action at a time:

* plain puts and batches (group commit: acknowledged when a flush round covers them),
* local transactions (commit, rollback, oversized puts that make them rollback-only, owners
  that vanish), XA transactions (prepare, commit or roll back from another owner, left
  prepared across crashes), half messages whose producer dies and whose check-back another
  producer of the group answers, delayed messages (inside transactions too),
* redo-log forces, partition flush rounds, clock advances with timeouts and check-backs,
  delay moves, checkpoints of both logs,

and crashes the machine at effect boundaries: at a random file-system operation (the
real code is interrupted between any two of its writes, fsyncs or renames) or at one of the
core's named crash points. The restart runs the real recovery code (partition scans, txlog
replay, transaction re-apply, delay recovery). After every restart the checker asserts:

* every acknowledged put and every message of an acknowledged commit is present with
  identical bytes, id and offset, exactly once;
* a committed transaction is all or nothing; a rolled-back, refused or never-decided one is
  never visible (a commit whose reply was lost may land either way, but whole);
* an acknowledged PREPARE is still prepared (XA) unless it was decided since;
* each partition decodes from its first offset to its end without a gap or a CRC failure;
* an acknowledged delayed message is delivered exactly once, never before it is due.

Replay a seed: ``python -m notify.sim --seed N [--verbose]``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from notify.broker.delay import DELAY_TOPIC, DelayQueue, delay_topic_config, encode_envelope
from notify.config import default_topic, parse_config
from notify.core.apply import Applier
from notify.core.effects import Applied, Complete, Defer, Effect, Force, Reply, SendCheck, Ticket
from notify.core.transactions import TxEngine, TxLimits, TxPut
from notify.errors import NotifyError
from notify.protocol import records
from notify.protocol.frames import Transaction
from notify.protocol.idgen import IdGenerator
from notify.sim.clock import SimClock
from notify.sim.disk import SimCrash, SimFileSystem
from notify.sim.readers import Readers
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.store.segment import Segment
from notify.txlog import TxLog, TxLogConfig

ROOT = PurePosixPath("/broker")
TOPICS = (("a", 2), ("b", 1))
#: the ``mixed`` variant adds a topic that is not under group commit (visible at append)
PLAIN_TOPIC = ("c", 1)
#: with held puts: two such partitions (a transaction's shares deferred in both, one of them
#: behind a held put)
HELD_PLAIN_TOPIC = ("c", 2)
MAX_TX_SIZE = 600
CORE_POINTS = (
    "after_append_msg",
    "after_commit_record",
    "mid_apply",
    "after_apply",
    "after_prepare_record",
    "after_move_intent",
    "mid_move",
    "after_move",
)


class SimFailure(AssertionError):
    """An invariant did not hold; the message names the seed and how to replay it."""


@dataclass(eq=False)
class Owner:
    """A client connection as the core sees it."""

    name: str
    closed: bool = False

    def __repr__(self) -> str:
        return self.name


@dataclass
class TxRecord:
    """What the model knows of one transaction."""

    key: str
    msgs: list[tuple[str, int, int, bytes]] = field(default_factory=list)  # topic, p, id, body
    delayed: list[tuple[int, str, int, bytes, int]] = field(default_factory=list)
    outcome: str = "open"  # open, commit_sent, committed, rolled_back, prepared, half_committed
    #: a half message: the application's decision, once it made one (what its checker says)
    db: bool | None = None
    half: bool = False
    placements: dict[int, tuple[str, int, int]] = field(default_factory=dict)


class Core:
    """The real core of one broker incarnation on the simulated disk."""

    def __init__(self, world: WorldState) -> None:
        self.world = world
        fs = world.fs
        self.config = world.config
        self.store = MessageStore(self.config, fs)
        self.store.open()
        self.out: list[Effect] = []
        self.flush_wanted: dict[Partition, None] = {}
        self.applier = Applier(self.store, self._after_append, world.crashpoint)
        self.log = TxLog.open(ROOT / "tx", TxLogConfig(flush_at_commit=1), fs=fs)
        self.engine = TxEngine(
            self.log,
            self.store,
            self.applier,
            world.clock,
            world.ids,
            TxLimits(
                max_tx_size=MAX_TX_SIZE,
                check_back_delay_ms=2000,
                check_back_max_times=3,
                half_early_ack=world.seed % 2 == 0,  # both ways of answering a half COMMIT
            ),
            self.out,
            world.crashpoint,
        )
        self.delay: DelayQueue | None = None
        self.store.add_topic(delay_topic_config(default_topic(self.config.system, "")))
        self.engine.recover()
        self.out.clear()  # recovery's Applied effects: the delay queue re-indexes by scanning
        self.delay = DelayQueue(
            self.store,
            self.config.system,
            self.applier,
            world.clock,
            lambda: True,
            fs=fs,
            crash=world.crashpoint,
            before_delete=self.log.sync,
        )
        self.delay.open()

    def _after_append(self, part: Partition, _count: int) -> None:
        self.flush_wanted[part] = None


class WorldState:
    """A world's state and plumbing: the disk, the clock, the model, the core; the
    failure report. :class:`World` adds the clients' scripts and the run."""

    #: set by :meth:`World.run`: the producers' connections, delayed puts' targets by id
    producers: list[Owner]
    delay_targets: dict[int, tuple[int, str, int, bytes]]

    def __init__(
        self,
        seed: int,
        steps: int = 60,
        crashes: int = 2,
        verbose: bool = False,
        segment_size: int | None = None,
        delay_heavy: bool = False,
        mixed: bool = False,
        held: bool = False,
    ):
        self.seed = seed
        self.segment_size = segment_size
        #: a topic without group commit too, and flush rounds as the broker runs them (every
        #: partition asking joins the next round; a round's fsyncs all end before any of its
        #: partitions shows more): then a plain put must be visible when its round ends
        self.mixed = mixed
        plain = HELD_PLAIN_TOPIC if held else PLAIN_TOPIC
        self.topics = TOPICS + ((plain,) if mixed else ())
        #: plain puts held for a synchronous slave's confirmation (``refuse``): confirmed in
        #: push order, some refused and taken back (their own random stream)
        self.held = held
        self.hold_rng = random.Random(seed ^ 0x401D)
        self.holds: deque[tuple[Partition, int]] = deque()
        self.unconfirmed: set[tuple[int, int]] = set()
        #: mostly delayed puts, some of them far in the future (delivered-set trimming)
        self.delay_heavy = delay_heavy
        self.rng = random.Random(seed)
        self.fs = SimFileSystem(random.Random(seed ^ 0x5EED))
        self.clock = SimClock()
        self.steps = steps
        self.crashes = crashes
        self.verbose = verbose
        self.ids = IdGenerator(1, self.clock.time)
        ini = (
            f"[system]\ndataPath={ROOT}/data\nunflushThreshold=0\ndelayMaxDelivered=2\n"
            + "".join(f"[topic={t}]\nnumPartitions={n}\n" for t, n in TOPICS)
            + (f"[topic={plain[0]}]\nnumPartitions={plain[1]}\nunflushThreshold=1000\n" * mixed)
        )
        self.config = parse_config(ini)
        if segment_size is not None:  # tiny segments: rolls, compaction and deletion often
            self.config = replace(
                self.config, system=replace(self.config.system, max_segment_size=segment_size)
            )
        self.trace: list[str] = []
        self._armed_point: str | None = None
        # the model
        self.acked_puts: dict[int, tuple[str, int, int, bytes]] = {}  # id -> topic, p, off, body
        self.txs: dict[str, TxRecord] = {}
        self.delayed_acked: dict[int, tuple[int, str, int, bytes]] = {}  # id -> due, t, p, body
        #: (partition, end, placed, start of its held append or -1)
        self.waiting_puts: list[
            tuple[Partition, int, list[tuple[int, str, int, int, bytes]], int]
        ] = []
        self.replies: dict[int, tuple[int, bytes]] = {}
        self.tickets: dict[int, Ticket] = {}
        self.checks: list[SendCheck] = []
        self._opaque = 0
        self._n = 0
        #: message id -> key of the transaction it belongs to (delayed ones excluded)
        self.msg_tx: dict[int, str] = {}
        #: where each applied transaction's shares went (Applied effects)
        self.applied: dict[str, tuple[tuple[str, int, int, int], ...]] = {}
        #: the flush round in flight (``mixed``): partition, target, segment
        self._round: list[tuple[Partition, int, Segment]] | None = None
        self.core = Core(self)
        #: consumers on their own connections; their own random stream, so a seed's
        #: schedule is the same with or without them
        self.readers = Readers(
            random.Random(seed ^ 0x7EAD),
            self._readable,
            self.msg_tx.get,
            self._tx_messages,
            self.fail,
            self.log,
        )

    def _readable(self) -> dict[tuple[str, int], Partition]:
        return {k: p for k, p in self.core.store.partitions.items() if k[0] != DELAY_TOPIC}

    def _tx_messages(self, key: str) -> list[tuple[str, int, int]]:
        return [(t, p, mid) for t, p, mid, _b in self.txs[key].msgs]

    def add_msg(self, rec: TxRecord, topic: str, p: int, mid: int, body: bytes) -> None:
        rec.msgs.append((topic, p, mid, body))
        self.msg_tx[mid] = rec.key

    # ------------------------------------------------------------------ plumbing

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"[{self.seed}] {msg}")
        self.trace.append(msg)
        del self.trace[:-200]

    def crashpoint(self, name: str) -> None:
        if name == self._armed_point:
            self._armed_point = None
            self.log(f"crash at core point {name}")
            raise SimCrash(name)

    def opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    def drain(self) -> None:
        core = self.core
        out = core.out
        while out:
            batch = out[:]
            out.clear()
            for e in batch:
                if isinstance(e, Reply):
                    self.replies[e.opaque] = (e.code, e.body)
                elif isinstance(e, Defer):
                    self.tickets[e.ticket.opaque] = e.ticket
                    for opaque, code, body in e.ticket.head or ():
                        self.replies[opaque] = (code, body)
                elif isinstance(e, Complete):
                    pass  # the ticket itself carries code and body
                elif isinstance(e, Force):
                    pass  # forces are run by the schedule (``force`` action)
                elif isinstance(e, SendCheck):
                    self.checks.append(e)
                elif isinstance(e, Applied):
                    self.applied[e.key] = tuple(
                        (pl.topic, pl.partition, pl.offset, pl.nbytes) for pl in e.placements
                    )
                    self.log(f"{e.key} placed at {self.applied[e.key]}")
                    if core.delay is not None:
                        for off, data in e.delayed:
                            core.delay.index_appended(off, data)

    def answer(self, opaque: int) -> tuple[int, bytes] | None:
        """The reply to ``opaque`` if it is known yet."""
        r = self.replies.pop(opaque, None)
        if r is not None:
            return r
        t = self.tickets.get(opaque)
        if t is not None and t.done:
            del self.tickets[opaque]
            return t.code, t.body
        return None

    def body(self) -> bytes:
        self._n += 1
        return b"%d:" % self._n + self.rng.randbytes(self.rng.randrange(1, 90))

    def pick_partition(self) -> tuple[str, int]:
        t, n = self.rng.choice(self.topics)
        return t, self.rng.randrange(n)

    def check_readable(self, key: str) -> None:
        """An acknowledged commit is readable, in every partition, on every connection."""
        for topic, p, off, nbytes in self.applied.get(key, ()):
            part = self.core.store.get(topic, p)
            if part is not None and part.visible_end < off + nbytes:
                self.fail(
                    f"{key} acknowledged but its share in {topic}-{p} at {off} is not "
                    f"readable (visible end {part.visible_end})"
                )
    # ------------------------------------------------------------------ the checker's report

    def fail(self, why: str) -> None:
        tail = "\n  ".join(self.trace[-40:])
        raise SimFailure(
            f"seed {self.seed}: {why}\n  replay: python -m notify.sim --seed {self.seed} "
            f"{self.variant_args()}--verbose\n  last steps:\n  {tail}"
        )

    def variant_args(self) -> str:
        """The command-line options that select this world's variant."""
        out = f"--steps {self.steps} --crashes {self.crashes} "
        if self.segment_size is not None:
            out += f"--segment-size {self.segment_size} "
        if self.delay_heavy:
            out += "--delay-heavy "
        if self.mixed:
            out += "--mixed "
        if self.held:
            out += "--held "
        return out


class ClientScripts(WorldState):
    """The clients' scripts: generators the scheduler steps one action at a time."""

    # ------------------------------------------------------------------ clients (scripts)

    def plain_put(self) -> Generator[None, None, None]:
        topic, p = self.pick_partition()
        part = self.core.store.get(topic, p)
        assert part is not None
        count = self.rng.choice((1, 1, 1, 3))
        items = []
        chunks = []
        for _ in range(count):
            b = self.body()
            mid = self.ids.next()
            chunks.append(records.encode(mid, 0, b))
            items.append((mid, b))
        data = b"".join(chunks)
        hold = self.held and self.hold_rng.random() < 0.5
        off = part.append(data, hold=hold)
        placed = []
        pos = off
        for (mid, b), rec in zip(items, chunks, strict=True):
            placed.append((mid, topic, p, pos, b))
            pos += len(rec)
        self.core.flush_wanted[part] = None
        self.waiting_puts.append((part, pos, placed, off if hold else -1))
        if hold:
            self.holds.append((part, off))
            self.unconfirmed.add((id(part), off))
        self.log(f"put {topic}-{p} x{count} at {off}" + (" held" if hold else ""))
        if not self.held and not part.group_commit and part.visible_end < pos:
            self.fail(f"plain put to {topic}-{p} at {off} not visible at once (no group commit)")
        yield

    def delayed_put(self) -> Generator[None, None, None]:
        topic, p = self.pick_partition()
        dpart = self.core.store.get(DELAY_TOPIC, 0)
        assert dpart is not None and self.core.delay is not None
        b = self.body()
        due = int(self.clock.time() * 1000) + self.rng.randrange(0, 4000)
        if self.delay_heavy and self.rng.random() < 0.1:
            due += 3_600_000  # far future: pending through the whole run
        mid = self.ids.next()
        rec = records.encode(mid, 0, encode_envelope(topic, p, due, b))
        off = dpart.append(rec)
        self.core.delay.add(off, due)
        self.core.flush_wanted[dpart] = None
        # acknowledged once __delay is flushed, like any put
        self.waiting_puts.append((dpart, off + len(rec), [(mid, DELAY_TOPIC, due, -1, b)], -1))
        self.delay_targets[mid] = (due, topic, p, b)
        self.log(f"dput {topic}-{p} due {due}")
        yield

    def transaction(self, xa: bool) -> Generator[None, None, None]:
        owner = Owner(f"c{self._n}")
        self._n += 1
        key = f"XID:1:{self._n:04x}:0b:q" if xa else f"TX:{owner.name}:{self._n}"
        rec = self.txs[key] = TxRecord(key)
        engine = self.core.engine
        o = self.opaque()
        engine.handle(
            owner, Transaction(key, "s", "BEGIN", self.rng.choice((None, 2, 30)), None, o)
        )
        self.drain()
        r = self.answer(o)
        if r is None or r[0] != 200:
            rec.outcome = "rolled_back"
            return
        yield
        for _ in range(self.rng.randrange(1, 4)):
            topic, p = self.pick_partition()
            size = self.rng.choice((20, 60, 400)) if not xa else 30
            b = self.body() + b"x" * size
            o = self.opaque()
            if self.rng.random() < 0.2:
                due = int(self.clock.time() * 1000) + self.rng.randrange(0, 3000)
                env = encode_envelope(topic, p, due, b)
                self.core.engine.put(
                    owner, key, DELAY_TOPIC, 0, 0, env, records.checksum(env), o, p
                )
                self.drain()
                r = self.answer(o)
                if r is not None and r[0] == 200:
                    rec.delayed.append((int(r[1].split()[0]), topic, p, b, due))
            else:
                self.core.engine.put(owner, key, topic, p, 0, b, records.checksum(b), o)
                self.drain()
                r = self.answer(o)
                if r is not None and r[0] == 200:
                    self.add_msg(rec, topic, p, int(r[1].split()[0]), b)
            self.log(f"{key} put -> {r and r[0]}")
            yield
        fate = self.rng.random()
        if fate < 0.1:
            owner.closed = True
            self.core.engine.owner_lost(owner)  # the client vanishes
            self.drain()
            self.log(f"{key} owner lost")
            return
        if fate < 0.2:
            self.log(f"{key} left to time out")
            return
        if xa:
            for verb in ("END", "PREPARE"):
                o = self.opaque()
                engine.handle(owner, Transaction(key, "s", verb, None, None, o))
                self.drain()
                while (r := self.answer(o)) is None:
                    yield
                if r[0] != 200:
                    rec.outcome = "rolled_back"
                    return
            if r is not None and r[1] == b"0" and rec.outcome == "open":
                rec.outcome = "prepared"
            self.log(f"{key} prepared")
            yield
            if self.rng.random() < 0.3:
                return  # left prepared (maybe across a crash); a later "decide" resolves it
            yield from self.decide(key, self.rng.random() < 0.7)
            return
        verb = "COMMIT_ONE_PHASE" if self.rng.random() < 0.8 else "ROLLBACK"
        o = self.opaque()
        if verb == "ROLLBACK":
            rec.outcome = "rolled_back"
        else:
            rec.outcome = "commit_sent"
        engine.handle(owner, Transaction(key, "s", verb, None, None, o))
        self.drain()
        while (r := self.answer(o)) is None:
            yield
        if verb == "COMMIT_ONE_PHASE":
            rec.outcome = "committed" if r[0] == 200 else "rolled_back"
            self.log(f"{key} commit -> {r[0]}")
            if r[0] == 200:
                self.check_readable(key)

    def oneshot(self) -> Generator[None, None, None]:
        """BEGIN, puts (some as one ``mput``) and COMMIT_ONE_PHASE arriving in one read: the
        engine's one-unit path (one redo write for the APPEND_MSGs and the COMMIT)."""
        owner = Owner(f"c{self._n}")
        self._n += 1
        key = f"TX:{owner.name}:{self._n}"
        rec = self.txs[key] = TxRecord(key)
        puts: list[TxPut] = []
        bodies: dict[int, list[tuple[str, int, bytes]]] = {}
        count = 0
        for _ in range(self.rng.randrange(1, 4)):
            topic, p = self.pick_partition()
            o = self.opaque()
            if self.rng.random() < 0.3:
                bs = [self.body() for _ in range(self.rng.randrange(1, 4))]
                buf = bytearray(b"".join(records.encode(0, 0, b, records.checksum(b)) for b in bs))
                puts.append(TxPut(topic, p, o, buf, len(bs)))
            else:
                bs = [self.body() + b"x" * self.rng.choice((20, 60, 400))]
                puts.append(TxPut(topic, p, o, bs[0], 0, 0, records.checksum(bs[0])))
            bodies[o] = [(topic, p, b) for b in bs]
            count += len(bs)
        rec.outcome = "commit_sent"
        oc = self.opaque()
        begin = Transaction(key, "s", "BEGIN", self.rng.choice((None, 2, 30)), None, self.opaque())
        commit = Transaction(key, "s", "COMMIT_ONE_PHASE", None, None, oc, count)
        if not self.core.engine.oneshot(owner, begin, puts, commit):
            rec.outcome = "rolled_back"  # refused before anything was written
            self.log(f"{key} oneshot refused")
            return
        self.drain()
        for o, sent in bodies.items():
            r = self.answer(o)
            assert r is not None and r[0] == 200, (key, r)
            first = int(r[1].split()[0])
            for i, (t, q, b) in enumerate(sent):
                self.add_msg(rec, t, q, first + i, b)
        self.log(f"{key} oneshot {count} messages")
        while (r := self.answer(oc)) is None:
            yield
        rec.outcome = "committed" if r[0] == 200 else "unknown"
        self.log(f"{key} oneshot commit -> {r[0]}")
        if r[0] == 200:
            self.check_readable(key)

    def decide(
        self, key: str, commit: bool, owner: Owner | None = None
    ) -> Generator[None, None, None]:
        """Commit or roll back a prepared transaction from another owner (a coordinator,
        or a producer answering a check-back: ``owner``, a member of the group)."""
        rec = self.txs[key]
        tx = self.core.engine.txs.get(key)
        if tx is None or tx.state.value != "PREPARED" or rec.outcome.endswith("_sent"):
            return
        if owner is None:
            owner = Owner(f"admin{self._n}")
            self._n += 1
        o = self.opaque()
        verb = "COMMIT_TWO_PHASE" if commit else "ROLLBACK"
        rec.outcome = "commit_sent" if commit else "rollback_sent"
        self.core.engine.handle(owner, Transaction(key, "s", verb, None, None, o))
        self.drain()
        while (r := self.answer(o)) is None:
            yield
        if r[0] == 200 and commit and rec.half and self.core.engine.limits.half_early_ack:
            # acknowledged once logged; applied (readable) once its COMMIT is forced
            # (otherwise, as every commit, durable and readable when acknowledged)
            rec.outcome = "half_committed"
        elif r[0] == 200:
            rec.outcome = "committed" if commit else "rolled_back"
            if commit:
                self.check_readable(key)
        else:
            rec.outcome = "unknown"
        self.log(f"{key} {verb} -> {r[0]}")

    def half_message(self) -> Generator[None, None, None]:
        producer = Owner(f"p{self._n}")
        self._n += 1
        engine = self.core.engine
        engine.register(producer, "shop", self.opaque())
        if not any(o for o in self.producers if not o.closed):
            backup = Owner(f"p{self._n}b")
            engine.register(backup, "shop", self.opaque())
            self.producers.append(backup)
        self.drain()
        key = f"TX:{producer.name}:1"
        rec = self.txs[key] = TxRecord(key, half=True)
        o = self.opaque()
        engine.handle(producer, Transaction(key, "s", "BEGIN", 30, None, o))
        self.drain()
        yield
        topic, p = self.pick_partition()
        b = self.body()
        o = self.opaque()
        engine.put(producer, key, topic, p, 0, b, records.checksum(b), o)
        self.drain()
        r = self.answer(o)
        if r is not None and r[0] == 200:
            self.add_msg(rec, topic, p, int(r[1].split()[0]), b)
        o = self.opaque()
        engine.handle(producer, Transaction(key, "s", "PREPARE", None, None, o))
        self.drain()
        while (r := self.answer(o)) is None:
            yield
        if r == (200, b"0") and rec.outcome == "open":
            rec.outcome = "prepared"
        if rec.outcome == "prepared" and self.rng.random() < 0.5:
            rec.db = self.rng.random() < 0.7  # the local transaction ran: the producer decides
            self.log(f"{key} half decided by its producer: {rec.db}")
            yield from self.decide(key, rec.db, producer)
            return
        producer.closed = True
        engine.owner_lost(producer)  # dies before deciding: the check-back decides
        self.drain()
        self.log(f"{key} half prepared, producer gone")

    def answer_checks(self) -> Generator[None, None, None]:
        checks, self.checks = self.checks, []
        for c in checks:
            rec = self.txs.get(c.key)
            if rec is None or self.rng.random() < 0.3:
                continue  # no answer: asked again later
            if rec.db is None:  # the application's database decides, once
                rec.db = self.rng.random() < 0.6
            yield from self.decide(c.key, rec.db, None if c.owner.closed else c.owner)


class World(ClientScripts):
    """One seed's world: the disk, the clock, the model, the clients, the schedule."""

    # ------------------------------------------------------------------ system actions

    def force(self) -> None:
        core = self.core
        if not core.engine.pending_force:
            return
        core.log.sync()
        core.engine.forced(core.log.end_position)
        self.drain()

    def flush_round(self) -> None:
        if self.mixed:
            return self._broker_round()
        core = self.core
        parts = list(core.flush_wanted)
        self.rng.shuffle(parts)
        if not parts:
            return
        take = parts[: self.rng.randrange(1, len(parts) + 1)]
        for part in take:
            core.flush_wanted.pop(part, None)
            target = part.end
            part.begin_sync()
            part.active.sync()
            part.mark_flushed(target)
        self.drain()
        self._ack_flushed()

    def _broker_round(self) -> None:
        """The broker's flush rounds, one half at a time: start a round of every partition
        that asked (their ends now are its targets), or end the round in flight (every fsync
        first, then every partition's mark). When a round ends, every plain put it covers
        is readable: no transaction may hold one back."""
        core = self.core
        if self._round is None:
            if core.flush_wanted:
                self._round = [(p, p.end, p.active) for p in core.flush_wanted]
                for p in core.flush_wanted:
                    p.begin_sync()
                core.flush_wanted.clear()
            return
        rnd, self._round = self._round, None
        for part, _target, seg in rnd:
            (seg if seg is part.active else part.active).sync()
        for part, target, _seg in rnd:
            part.mark_flushed(target)
        self.drain()
        targets = {part: target for part, target, _seg in rnd}
        for part, end, _placed, _h in self.waiting_puts:
            if self.held:  # a confirmation elsewhere may hold it back (README "Status")
                break
            if targets.get(part, -1) >= end and part.visible_end < end:
                self.fail(
                    f"a plain put to {part.topic}-{part.index} ending at {end} is flushed "
                    f"but not readable (visible end {part.visible_end}): held back"
                )
        self._ack_flushed()

    def flush_all(self) -> None:
        """Finish the round in flight and run one more (or one legacy round)."""
        self.flush_round()
        if self.mixed:
            self.flush_round()
            self.flush_round()

    def _ack_flushed(self) -> None:
        keep = []
        for part, end, placed, hold in self.waiting_puts:
            if part.flushed_end >= end and (id(part), hold) not in self.unconfirmed:
                for mid, topic, p, off, b in placed:
                    if topic == DELAY_TOPIC:
                        self.delayed_acked[mid] = self.delay_targets[mid]
                    else:
                        self.acked_puts[mid] = (topic, p, off, b)
            else:
                keep.append((part, end, placed, hold))
        self.waiting_puts = keep

    def confirm_one(self) -> None:
        """The synchronous slave answers the oldest push of a held put: confirmed, or (one
        in ten) refused: taken back with every held put after it in that partition, unless
        something another log covers follows (then kept, as the broker does)."""
        while self.holds:
            part, start = self.holds.popleft()
            if (id(part), start) in self.unconfirmed:
                break
        else:
            return
        if self.hold_rng.random() < 0.1 and part.held_from(start):
            part.drop_from(start)
            gone = {k for k in self.unconfirmed if k[0] == id(part) and k[1] >= start}
            self.unconfirmed -= gone
            self.waiting_puts = [
                w for w in self.waiting_puts if not (w[0] is part and w[3] >= start)
            ]
            self.log(f"refused {part.topic}-{part.index} from {start}: taken back")
        else:
            self.unconfirmed.discard((id(part), start))
            part.confirm(start)
            self.log(f"confirmed {part.topic}-{part.index} at {start}")
        self.drain()
        self._ack_flushed()

    def tick(self) -> None:
        self.clock.advance(self.rng.choice((0.05, 0.5, 1.0, 2.5)))
        core = self.core
        core.engine.expire()
        core.engine.check_backs()
        for key in core.engine.stats.exhausted:
            rec = self.txs.get(key)
            if rec is not None and rec.outcome == "prepared":
                rec.outcome = "rolled_back"
        core.engine.retry_applies()
        assert core.delay is not None
        core.delay.move_due()
        self.drain()

    def checkpoint(self) -> None:
        core = self.core
        core.log.checkpoint(core.engine.checkpoint_position())
        assert core.delay is not None
        core.delay.compact()  # as the mover does before each checkpoint
        core.delay.trim_delivered()
        core.delay._checkpoint()

    # ------------------------------------------------------------------ the run

    generation = 0

    def run(self) -> None:
        self.producers: list[Owner] = []
        self.delay_targets: dict[int, tuple[int, str, int, bytes]] = {}
        for cycle in range(self.crashes + 1):
            scripts: list[Generator[None, None, None]] = []
            armed = cycle < self.crashes
            if armed:
                if self.rng.random() < 0.5:
                    self.fs.arm_crash(self.rng.randrange(5, 400))
                else:
                    self._armed_point = self.rng.choice(CORE_POINTS)
            try:
                for _ in range(self.steps):
                    self.step(scripts)
                # quiesce: finish what is pending so the check has acknowledged work to see
                for _ in range(3):
                    while self.holds:
                        self.confirm_one()
                    self.force()
                    self.flush_all()
                    self.force()
                self.check_answered()
            except SimCrash:
                pass
            self.fs.disarm_crash()
            self._armed_point = None
            tear = self.rng.random() < 0.5
            self.log(f"--- crash (tear={tear}) and restart")
            self.fs.crash(tear=tear, writeback=self.rng.random() < 0.3)
            self.restart()
            self.check()
        # finally: let time pass so every acknowledged delayed message is due, and deliver
        self.clock.advance(10)
        assert self.core.delay is not None
        self.core.delay.move_due()
        self.drain()
        self.check(final=True)

    def step(self, scripts: list[Generator[None, None, None]]) -> None:
        self._step(scripts)
        while self.held and self.hold_rng.random() < 0.35:
            self.confirm_one()
        rr = self.readers.rng
        while rr.random() < 0.6:
            self.readers.step()

    def _step(self, scripts: list[Generator[None, None, None]]) -> None:
        rng = self.rng
        x = rng.random()
        if x < 0.25 or not scripts:
            kind = rng.random()
            if self.delay_heavy and kind < 0.6:
                g = self.delayed_put()
            elif kind < 0.3:
                g = self.plain_put()
            elif kind < 0.47:
                g = self.transaction(xa=False)
            elif kind < 0.55:
                g = self.oneshot()
            elif kind < 0.7:
                g = self.transaction(xa=True)
            elif kind < 0.8:
                g = self.half_message()
            elif kind < 0.9:
                g = self.delayed_put()
            else:
                prepared = [k for k, t in self.txs.items() if t.outcome == "prepared"]
                g = (
                    self.decide(rng.choice(prepared), rng.random() < 0.6)
                    if prepared
                    else self.plain_put()
                )
            scripts.append(g)
        elif x < 0.6:
            g = rng.choice(scripts)
            try:
                next(g)
            except StopIteration:
                scripts.remove(g)
        elif x < 0.72:
            self.force()
        elif x < 0.84:
            self.flush_round()
        elif x < 0.94:
            self.tick()
        elif x < 0.97:
            scripts.append(self.answer_checks())
        else:
            self.checkpoint()

    def check_answered(self) -> None:
        """Every round run, every held put confirmed, every force done: no request may
        still wait for its answer (a commit waiting for a gate that never opens)."""
        waiting = [t.opaque for t in self.tickets.values() if not t.done]
        if waiting:
            self.fail(f"{len(waiting)} requests never answered (opaques {waiting[:5]})")

    def restart(self) -> None:
        self.generation += 1
        self.waiting_puts = []  # unacknowledged puts: the client never got an answer
        self.tickets.clear()
        self.replies.clear()
        self.checks.clear()
        self._round = None
        self.readers.reset()
        self.holds.clear()  # a restarted broker holds nothing back
        self.unconfirmed.clear()
        for rec in self.txs.values():
            if rec.outcome in ("commit_sent", "rollback_sent"):
                rec.outcome = "unknown"  # the reply was lost: either way, but whole
            elif rec.outcome == "open":
                rec.outcome = "rolled_back"  # no decision logged: rolled back by recovery
        for o in self.producers:
            o.closed = True
        self.producers = []
        try:
            self.core = Core(self)
        except NotifyError as e:
            self.fail(f"restart failed: {e}")
        # half messages come back prepared; XA prepared come back prepared; local prepared
        # without a group are rolled back by recovery
        for key, rec in self.txs.items():
            tx = self.core.engine.txs.get(key)
            if rec.outcome == "half_committed":
                # its unforced COMMIT may be lost: then it is prepared again and the check-back
                # recommits it (rec.db is True); else recovery applied it
                prepared = tx is not None and tx.state.value == "PREPARED"
                rec.outcome = "prepared" if prepared else "committed"
            if rec.outcome == "prepared" and (tx is None or tx.state.value != "PREPARED"):
                self.fail(f"acknowledged PREPARE of {key} lost by the restart")

    # ------------------------------------------------------------------ the checker

    def read_all(self) -> dict[int, tuple[str, int, int, bytes]]:
        """Every record of every partition (``__delay`` checked for readability only: its
        envelopes carry the ids their messages get when delivered)."""
        found: dict[int, tuple[str, int, int, bytes]] = {}
        for (topic, p), part in self.core.store.partitions.items():
            if topic == DELAY_TOPIC:
                self._scan(topic, p, part, {})
                continue
            self._scan(topic, p, part, found)
        return found

    def _scan(
        self, topic: str, p: int, part: Partition, found: dict[int, tuple[str, int, int, bytes]]
    ) -> None:
        off = part.min_offset
        while off < part.end:
            data = part.read_raw(off, 1 << 20)
            try:
                recs, used = records.decode_all(data, off)
            except NotifyError as e:
                self.fail(f"{topic}-{p}: unreadable at {off}: {e}")
            if not recs:
                self.fail(f"{topic}-{p}: gap or torn record at {off} (end {part.end})")
            for r in recs:
                if topic == DELAY_TOPIC:
                    continue  # compaction re-puts records with their ids: checked elsewhere
                if r.msg_id in found:
                    self.fail(f"message {r.msg_id} stored twice ({found[r.msg_id]}, {topic}-{p})")
                found[r.msg_id] = (topic, p, r.offset, r.payload)
            off += used

    def check(self, final: bool = False) -> None:
        found = self.read_all()
        for mid, (topic, p, off, b) in self.acked_puts.items():
            got = found.get(mid)
            if got != (topic, p, off, b):
                self.fail(f"acknowledged put {mid} at {topic}-{p}@{off}: found {got and got[:3]}")
        for key, rec in self.txs.items():
            present = [m for m in rec.msgs if m[2] in found]
            for topic, p, mid, b in present:
                g = found[mid]
                if (g[0], g[1], g[3]) != (topic, p, b):
                    self.fail(f"{key}: message {mid} changed: {g[:3]}")
            if rec.outcome == "committed":
                if len(present) != len(rec.msgs):
                    self.fail(f"acknowledged commit {key}: {len(present)}/{len(rec.msgs)} visible")
                # a share in a partition without group commit may move when the crash took
                # the unflushed bytes before it (recovery appends it again, lower)
                placed = {m[2]: found[m[2]][:3] for m in present if m[0] != PLAIN_TOPIC[0]}
                if rec.placements and rec.placements != placed:
                    self.fail(f"{key}: offsets changed {rec.placements} -> {placed}")
                rec.placements = placed
            elif rec.outcome == "half_committed":
                if present and len(present) != len(rec.msgs):
                    self.fail(f"half commit of {key} partly visible ({len(present)})")
                if final and not present and rec.msgs:
                    self.fail(f"acknowledged half commit {key} never applied")
            elif rec.outcome == "unknown":
                if present and len(present) != len(rec.msgs):
                    self.fail(f"commit of {key} partly visible ({len(present)}/{len(rec.msgs)})")
            elif rec.outcome == "rolled_back" and present:
                tx = self.core.engine.txs.get(key)
                if tx is None or tx.state.value not in ("COMMITTING",):
                    self.fail(f"rolled-back or undecided {key} is visible: {present[:2]}")
            elif rec.outcome == "prepared" and present:
                self.fail(f"prepared {key} is visible before its commit")
        # delayed messages: never early, exactly once, all of them in the end
        now_ms = int(self.clock.time() * 1000)
        for mid, (due, topic, p, b) in self.delayed_acked.items():
            got = found.get(mid)
            in_target = got is not None and got[0] == topic
            if got is not None and in_target and (got[1], got[3]) != (p, b):
                self.fail(f"delayed {mid} delivered wrong: {got[:2]}")
            if in_target and due > now_ms:
                self.fail(f"delayed {mid} delivered before it was due ({due} > {now_ms})")
            if final and due <= now_ms - 1000 and not in_target:
                self.fail(f"acknowledged delayed message {mid} (due {due}) never delivered")
        for key, rec in self.txs.items():
            for mid, topic, _p, _b, due in rec.delayed:
                got = found.get(mid)
                in_target = got is not None and got[0] == topic
                if in_target and rec.outcome not in ("committed", "unknown", "commit_sent"):
                    tx = self.core.engine.txs.get(key)
                    if tx is None or tx.state.value != "COMMITTING":
                        self.fail(f"delayed {mid} of {key} ({rec.outcome}) delivered")
                if in_target and due > now_ms:
                    self.fail(f"delayed {mid} of {key} delivered before it was due")
                if final and rec.outcome == "committed" and not in_target:
                    self.fail(f"delayed {mid} of committed {key} never delivered")
