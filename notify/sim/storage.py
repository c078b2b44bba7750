"""Storage simulation: the real message store and redo log on a simulated disk, crashed.

One seed drives one run: a :class:`~notify.store.manager.MessageStore` (1-2 partitions, 4 KiB
segments) and a :class:`~txlog.TxLog` (tiny segments, checkpoints) share a
:class:`~notify.sim.disk.SimFileSystem`. Random steps append records of random sizes, fsync,
roll back, write recovery points and checkpoints, inject ENOSPC and EIO, shut down cleanly,
and crash: between steps, or inside one at an armed crash point (between any two file
operations of the real code, recovery included), with or without a torn write and partial
writeback. After every restart through the real recovery code the run checks:

* store: each partition's segments hold whole, checksum-valid records back to back, ending on
  a record boundary, and they are exactly a prefix of what was appended (same bytes, same
  offsets) that contains every record an fsync covered (acknowledged under group commit);
* log: replay returns exactly a prefix of what was appended (positions, types, bodies) that
  contains every record a successful ``commit``/``sync``/``checkpoint`` covered; segments were
  only deleted below a kept checkpoint; the newest checkpoint is the last one that returned or
  a newer one that was under way.

A violation raises :class:`SimulationFailure` naming the seed. Replay one seed::

    python -m notify.sim.storage --seed 1234 [-v]
    pytest tests/sim/test_storage_sim.py --sim-seed=1234

Run many: ``python -m notify.sim.storage --seeds 10000 [--first 0]``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import logging
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from notify.config import ServerConfig, parse_config
from notify.errors import NotifyError, StoreError, StoreFullError, TxLogError
from notify.protocol import records
from notify.sim.disk import SimCrash, SimFileSystem
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.txlog import Position, TxLog, TxLogConfig, encode

__all__ = [
    "SimulationFailure",
    "Stats",
    "StorageSim",
    "quiet",
    "replay_command",
    "run_many",
    "run_seed",
]

log = logging.getLogger("notify.sim")

DATA: Final = Path("/sim/data")
TXLOG: Final = Path("/sim/txlog")
TOPIC: Final = "sim"
SEGMENT: Final = 4096  # the smallest maxSegmentSize the config accepts


class SimulationFailure(NotifyError):
    """An invariant of the storage simulation does not hold for a seed."""


def replay_command(seed: int) -> str:
    """The command that replays ``seed`` (with a trace of every step and file operation)."""
    return (
        f"python -m notify.sim.storage --seed {seed} -v"
        f"  (or: pytest tests/sim/test_storage_sim.py --sim-seed={seed})"
    )


@dataclass
class Stats:
    """What the runs did (summed over seeds by :func:`main`)."""

    seeds: int = 0
    steps: int = 0
    fs_ops: int = 0
    crashes: int = 0
    crash_points: int = 0
    torn: int = 0
    clean_restarts: int = 0
    store_records: int = 0
    log_records: int = 0
    checkpoints: int = 0
    rollbacks: int = 0
    enospc: int = 0
    eio: int = 0
    recovered_truncations: int = 0

    def add(self, other: Stats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _PartModel:
    """What we appended to one partition: ``(offset, record bytes)`` in order."""

    hist: list[tuple[int, bytes]] = field(default_factory=list)
    acked: int = 0  # hist[:acked] was covered by an fsync

    @property
    def end(self) -> int:
        return self.hist[-1][0] + len(self.hist[-1][1]) if self.hist else 0


_CONFIGS: dict[int, ServerConfig] = {}


def _server_config(partitions: int) -> ServerConfig:
    cfg = _CONFIGS.get(partitions)
    if cfg is None:
        cfg = _CONFIGS[partitions] = parse_config(
            f"[system]\ndataPath={DATA}\nmaxSegmentSize={SEGMENT}\n"
            f"[topic={TOPIC}]\nnumPartitions={partitions}\nunflushThreshold=0\n"
        )
    return cfg


class StorageSim:
    """One seeded run; :meth:`run` raises :class:`SimulationFailure` on a violation."""

    def __init__(self, seed: int, steps: int = 50, verbose: bool = False) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.fs = SimFileSystem(random.Random(rng.getrandbits(64)))
        if verbose:
            self.fs.trace = lambda line: print(f"    {line}")
        self.steps = steps
        self.verbose = verbose
        self.stats = Stats(seeds=1)
        self.config = _server_config(rng.choice((1, 2)))
        self.log_config = TxLogConfig(
            segment_bytes=rng.choice((256, 1024, 8192)),
            flush_at_commit=rng.choice((0, 1)),
            max_checkpoints=rng.randint(1, 3),
            max_record_bytes=4096,
        )
        self.big = rng.random() < 0.3  # runs with records near or above a segment
        self.store: MessageStore | None = None
        self.log: TxLog | None = None
        self.parts = [_PartModel() for _ in range(self.config.topics[TOPIC].num_partitions)]
        #: redo log records appended: (position, type, body); loghist[:log_acked] is durable
        self.loghist: list[tuple[Position, int, bytes]] = []
        self.log_acked = 0
        #: checkpoints asked for, in order; ckpt_done: index of the last one that returned
        self.ckpts: list[tuple[Position, bytes]] = []
        self.ckpt_done: int | None = None
        self.next_id = 1
        self.step_no = 0

    # ------------------------------------------------------------------ helpers

    def _say(self, msg: str) -> None:
        if self.verbose:
            print(f"[seed {self.seed} step {self.step_no} op {self.fs.ops}] {msg}")

    def fail(self, msg: str) -> SimulationFailure:
        return SimulationFailure(
            f"seed {self.seed}, step {self.step_no}: {msg}\n  replay: {replay_command(self.seed)}"
        )

    def _record(self) -> bytes:
        rng = self.rng
        if self.big and rng.random() < 0.15:
            size = rng.randint(SEGMENT // 2, SEGMENT + 200)
        else:
            size = int(rng.expovariate(1 / 120))
        msg_id = self.next_id
        self.next_id += 1
        return records.encode(msg_id, 0, rng.randbytes(size))

    def _body(self) -> bytes:
        rng = self.rng
        limit = self.log_config.segment_bytes * 2 if self.big else 300
        return rng.randbytes(min(4096, int(rng.expovariate(1 / 60)), limit))

    # ------------------------------------------------------------------ open / check

    def open(self) -> None:
        """Open store and log through their recovery; crash inside it sometimes."""
        rng = self.rng
        for attempt in range(6):
            if attempt < 5 and rng.random() < 0.08:
                self.fs.arm_crash(rng.randint(1, 12))
                self.stats.crash_points += 1
            try:
                store = MessageStore(self.config, self.fs)
                store.open()
                txlog = TxLog.open(TXLOG, self.log_config, fs=self.fs)
            except SimCrash:
                self._say("crash during recovery")
                self._power_cut()
                continue
            except NotifyError as e:
                raise self.fail(f"recovery refused to open the data: {e}") from e
            self.fs.disarm_crash()
            self.store, self.log = store, txlog
            self.stats.recovered_truncations += sum(r.truncated_bytes > 0 for r in store.reports)
            self.stats.recovered_truncations += txlog.recovery.truncated_bytes > 0
            self.check()
            return
        raise self.fail("recovery crashed six times in a row")  # unreachable: 5 armed at most

    def _power_cut(self) -> None:
        tear = self.rng.random() < 0.5
        writeback = self.rng.random() < 0.3
        self.fs.crash(tear=tear, writeback=writeback)
        self.stats.crashes += 1
        self.stats.torn += self.fs.last_tear is not None
        self._say(f"power cut tear={tear} writeback={writeback} torn={self.fs.last_tear}")
        self.store = None
        self.log = None

    def check(self) -> None:
        """The invariants after a (re)open; then the model becomes what was recovered."""
        assert self.store is not None and self.log is not None
        for i, model in enumerate(self.parts):
            part = self.store.get(TOPIC, i)
            if part is None:
                raise self.fail(f"partition {i} missing after recovery")
            self._check_partition(i, part, model)
        self._check_log(self.log)

    def _check_partition(self, i: int, part: Partition, model: _PartModel) -> None:
        data = b"".join(seg.read(0, seg.size) for seg in part.segments)
        if part.min_offset != 0:
            raise self.fail(f"partition {i} starts at {part.min_offset}, not 0")
        valid, why = records.scan(data)
        if why is not None:
            raise self.fail(
                f"partition {i}: recovered data is not whole valid records: {why} at {valid} "
                f"of {len(data)}"
            )
        if not part.end == part.visible_end == part.flushed_end == len(data):
            raise self.fail(
                f"partition {i}: marks end={part.end} visible={part.visible_end} "
                f"flushed={part.flushed_end}, data {len(data)} bytes"
            )
        got: list[tuple[int, bytes]] = []
        pos = 0
        while pos < len(data):
            n = records.first_record_size(data[pos : pos + 4])
            assert n is not None
            got.append((pos, data[pos : pos + n]))
            pos += n
        if got != model.hist[: len(got)]:
            raise self.fail(
                f"partition {i}: recovered records are not a prefix of what was appended: "
                f"record {_first_diff(got, model.hist)}"
            )
        if len(got) < model.acked:
            lost = model.hist[len(got)]
            raise self.fail(
                f"partition {i}: acknowledged record at offset {lost[0]} lost: {len(got)} "
                f"records recovered, {model.acked} were fsynced"
            )
        model.hist = got
        model.acked = len(got)

    def _check_log(self, txlog: TxLog) -> None:
        first = txlog.first_position
        try:
            got = [(r.position, int(r.type), r.body) for r in txlog.replay(first)]
        except TxLogError as e:
            raise self.fail(f"redo log replay failed after recovery: {e}") from e
        tail = [h for h in self.loghist if h[0] >= first]
        if got != tail[: len(got)]:
            raise self.fail(
                f"redo log: replay from {first} is not a prefix of what was appended "
                f"(first difference at record {_first_diff(got, tail)})"
            )
        dropped_acked = [h for h in self.loghist[: self.log_acked] if h[0] < first]
        acked_tail = self.log_acked - len(dropped_acked)
        if len(got) < acked_tail:
            raise self.fail(
                f"redo log: durable record at {tail[len(got)][0]} lost: {len(got)} records "
                f"recovered from {first}, {acked_tail} were synced"
            )
        cps = txlog.checkpoints()
        latest = cps[-1] if cps else None
        if dropped_acked and (latest is None or dropped_acked[-1][0] >= cps[0].position):
            raise self.fail(
                f"redo log: segments up to {first} deleted although durable record "
                f"{dropped_acked[-1][0]} is not before the oldest kept checkpoint"
            )
        if self.ckpt_done is not None:
            newer = self.ckpts[self.ckpt_done :]
            if latest is None or (latest.position, latest.state) not in newer:
                raise self.fail(
                    f"redo log: newest checkpoint after recovery {latest and latest.position} "
                    f"is not the last completed one {self.ckpts[self.ckpt_done][0]} or newer"
                )
        elif latest is not None and (latest.position, latest.state) not in self.ckpts:
            raise self.fail(f"redo log: unknown checkpoint {latest.position} recovered")
        self.loghist = got
        self.log_acked = len(got)
        self.ckpts = [(latest.position, latest.state)] if latest is not None else []
        self.ckpt_done = 0 if latest is not None else None

    # ------------------------------------------------------------------ steps

    def _part(self) -> tuple[Partition, _PartModel]:
        assert self.store is not None
        i = self.rng.randrange(len(self.parts))
        part = self.store.get(TOPIC, i)
        assert part is not None
        return part, self.parts[i]

    def _append(self, part: Partition, model: _PartModel, recs: list[bytes]) -> int:
        data = b"".join(recs)
        start = model.end
        pending = [(start, recs[0])]
        for r in recs[1:]:
            pending.append((pending[-1][0] + len(pending[-1][1]), r))
        try:
            offset = part.append(data)
        except SimCrash:
            model.hist += pending  # may have reached the file, whole or in part
            raise
        if offset != start:
            raise self.fail(f"append returned offset {offset}, expected {start}")
        model.hist += pending
        self.stats.store_records += len(recs)
        return offset

    def op_store_append(self) -> None:
        part, model = self._part()
        self._append(part, model, [self._record() for _ in range(self.rng.randint(1, 4))])

    def op_store_sync(self) -> None:
        part, model = self._part()
        n = len(model.hist)
        part.sync()
        model.acked = n

    def op_store_rollback(self) -> None:
        part, model = self._part()
        n = len(model.hist)
        offset = self._append(part, model, [self._record() for _ in range(self.rng.randint(1, 3))])
        part.rollback_to(offset)  # a crash inside leaves the rolled-back records possible
        del model.hist[n:]
        self.stats.rollbacks += 1

    def op_recovery_points(self) -> None:
        assert self.store is not None
        self.store.write_recovery_points(force=True)

    def op_store_enospc(self) -> None:
        part, model = self._part()
        self.fs.capacity = self.fs.used + self.rng.randint(0, 400)
        try:
            self._append(part, model, [self._record() for _ in range(self.rng.randint(1, 2))])
        except StoreFullError:
            self.stats.enospc += 1
        except StoreError as e:  # a roll that could not create the next segment
            if "cannot roll" not in str(e):
                raise
            self.stats.enospc += 1
        finally:
            self.fs.capacity = None

    def op_store_eio(self) -> None:
        """An fsync fails: the flusher makes the partition read-only until a restart."""
        part, _model = self._part()
        self.fs.fail_fsync(1, errno.EIO, drop_dirty=True)
        try:
            part.sync()
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            self.stats.eio += 1
            self._say("store fsync EIO: restart")
            self._power_cut()
            return
        # an fsync with nothing to do still reports the error in the simulation
        raise self.fail("an injected fsync error was not reported by Partition.sync")

    def _log_write(self, items: list[tuple[int, bytes]], call: Callable[[], object]) -> None:
        """Run a log append/commit of ``items`` (written with one write). Where they land is
        predicted first: on a crash inside the call they may be on disk, so they join the
        history; on success the returned positions must match."""
        assert self.log is not None
        end = self.log.end_position
        sizes = [len(encode(t, b, max_record_bytes=self.log_config.max_record_bytes))
                 for t, b in items]
        if end.offset > 0 and end.offset + sum(sizes) > self.log_config.segment_bytes:
            end = Position(end.file_no + 1, 0)  # the log rolls first
        predicted = []
        off = end.offset
        for (t, b), n in zip(items, sizes, strict=True):
            predicted.append((Position(end.file_no, off), t, b))
            off += n
        try:
            result = call()
        except SimCrash:
            self.loghist += predicted
            raise
        got = result if isinstance(result, list) else [result]
        if got != [p for p, _t, _b in predicted]:
            raise self.fail(f"redo log wrote at {got}, expected {[p for p, _, _ in predicted]}")
        self.loghist += predicted
        self.stats.log_records += len(items)

    def op_log_append(self) -> None:
        log_ = self.log
        assert log_ is not None
        rtype, body = self.rng.randint(1, 255), self._body()
        self._log_write([(rtype, body)], lambda: log_.append(rtype, body))

    def op_log_append_many(self) -> None:
        log_ = self.log
        assert log_ is not None
        items = [(self.rng.randint(1, 255), self._body()) for _ in range(self.rng.randint(1, 5))]
        self._log_write(items, lambda: log_.append_many(items))

    def op_log_commit(self) -> None:
        log_ = self.log
        assert log_ is not None
        rtype, body = self.rng.randint(1, 255), self._body()
        self._log_write([(rtype, body)], lambda: log_.commit(rtype, body))
        if self.log_config.flush_at_commit == 1:
            self.log_acked = len(self.loghist)

    def op_log_sync(self) -> None:
        assert self.log is not None
        n = len(self.loghist)
        self.log.sync()
        self.log_acked = n

    def op_log_checkpoint(self) -> None:
        assert self.log is not None
        first = self.log.first_position
        cands = [h[0] for h in self.loghist if h[0] >= first]
        latest = self.log.latest_checkpoint()
        if latest is not None:
            cands = [p for p in cands if p >= latest.position]
        cands.append(self.log.end_position)
        oldest_live = self.rng.choice(cands)
        state = self.rng.randbytes(self.rng.randint(0, 40))
        self.ckpts.append((oldest_live, state))
        n = len(self.loghist)
        self.log.checkpoint(oldest_live, state)
        self.ckpt_done = len(self.ckpts) - 1
        self.log_acked = n
        self.stats.checkpoints += 1

    def op_log_enospc(self) -> None:
        assert self.log is not None
        self.fs.capacity = self.fs.used + self.rng.randint(0, 100)
        try:
            self.op_log_commit()
        except TxLogError:
            self.stats.enospc += 1
        finally:
            self.fs.capacity = None

    def op_log_eio(self) -> None:
        """An fsync of the redo log fails: restart (the only safe answer, see the README)."""
        assert self.log is not None
        self.op_log_append()
        self.fs.fail_fsync(1, errno.EIO, drop_dirty=True)
        try:
            self.log.sync()
        except TxLogError:
            self.stats.eio += 1
            self._say("redo log fsync EIO: restart")
            self._power_cut()
            return
        raise self.fail("an injected fsync error was not reported by TxLog.sync")

    def op_clean_restart(self) -> None:
        assert self.store is not None and self.log is not None
        self.store.close()
        self.log.close()
        for model in self.parts:
            model.acked = len(model.hist)
        self.log_acked = len(self.loghist)
        self.stats.clean_restarts += 1
        self.store = self.log = None
        self.open()

    def op_crash(self) -> None:
        self._power_cut()

    # ------------------------------------------------------------------ run

    def run(self) -> Stats:
        """Run the seed; raise SimulationFailure on a violated invariant."""
        ops: list[tuple[Callable[[], None], int]] = [
            (self.op_store_append, 30),
            (self.op_store_sync, 10),
            (self.op_store_rollback, 3),
            (self.op_recovery_points, 3),
            (self.op_store_enospc, 2),
            (self.op_store_eio, 1),
            (self.op_log_append, 15),
            (self.op_log_append_many, 5),
            (self.op_log_commit, 12),
            (self.op_log_sync, 5),
            (self.op_log_checkpoint, 4),
            (self.op_log_enospc, 1),
            (self.op_log_eio, 1),
            (self.op_clean_restart, 1),
            (self.op_crash, 2),
        ]
        funcs = [f for f, _ in ops]
        cum = list(itertools.accumulate(w for _, w in ops))
        rng = self.rng
        self.open()
        for step in range(1, self.steps + 1):
            self.step_no = step
            self.stats.steps += 1
            op = rng.choices(funcs, cum_weights=cum)[0]
            if rng.random() < 0.05:
                self.fs.arm_crash(rng.randint(1, 6))
                self.stats.crash_points += 1
            self._say(op.__name__)
            try:
                op()
            except SimCrash:
                self._say("crash point fired")
                self._power_cut()
            if self.store is None:
                self.open()
            else:
                self.fs.disarm_crash()
        if self.store is not None:
            self._power_cut()
            self.open()
        self.stats.fs_ops = self.fs.ops
        return self.stats


def _first_diff(a: Sequence[tuple[object, ...]], b: Sequence[tuple[object, ...]]) -> str:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"{j}: got {_short(x)}, appended {_short(y)}"
    return f"{min(len(a), len(b))}: {len(a)} records recovered, {len(b)} appended"


def _short(rec: tuple[object, ...]) -> str:
    return "(" + ", ".join(f"{len(v)} B" if isinstance(v, bytes) else str(v) for v in rec) + ")"


def run_seed(seed: int, steps: int = 50, verbose: bool = False) -> Stats:
    """Run one seed; any failure (a violated invariant or an unexpected exception from the
    code under test) raises :class:`SimulationFailure` naming the seed."""
    sim = StorageSim(seed, steps, verbose)
    try:
        return sim.run()
    except SimulationFailure:
        raise
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise sim.fail(
            f"unexpected {type(e).__name__}: {e} (at {where.filename}:{where.lineno})"
        ) from e


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the store's and the log's warnings (thousands of expected torn tails)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def run_many(
    seeds: Iterable[int], steps: int = 50, max_failures: int = 10
) -> tuple[Stats, list[SimulationFailure]]:
    """Run ``seeds`` quietly; the summed stats and the first ``max_failures`` failures."""
    total = Stats()
    failures: list[SimulationFailure] = []
    with quiet():
        for seed in seeds:
            try:
                total.add(run_seed(seed, steps))
            except SimulationFailure as e:
                failures.append(e)
                if len(failures) >= max_failures:
                    break
    return total, failures


def main(argv: list[str] | None = None) -> int:
    """``python -m notify.sim.storage``: run seeds, print failures and their replay command."""
    ap = argparse.ArgumentParser(prog="python -m notify.sim.storage", description=__doc__)
    ap.add_argument("--seed", type=int, help="run this one seed")
    ap.add_argument("--seeds", type=int, default=2000, help="how many seeds (default 2000)")
    ap.add_argument("--first", type=int, default=0, help="first seed of the range")
    ap.add_argument("--steps", type=int, default=50, help="steps per seed (default 50)")
    ap.add_argument("-v", "--verbose", action="store_true", help="trace each step")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    t0 = time.perf_counter()
    c0 = time.process_time()
    if args.verbose:
        logging.basicConfig(level=logging.INFO)
        total = Stats()
        failures: list[SimulationFailure] = []
        for seed in seeds:
            try:
                total.add(run_seed(seed, args.steps, verbose=True))
            except SimulationFailure as e:
                failures.append(e)
    else:
        total, failures = run_many(seeds, args.steps, max_failures=len(seeds))
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    n = len(seeds)
    print(
        f"{n} seeds in {dt:.2f}s wall, {cpu:.2f}s CPU ({n / cpu:.0f} seeds per CPU second), "
        f"{len(failures)} failed; {total}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
