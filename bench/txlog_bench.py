"""Micro benchmark of txlog commit rates against a bare append+fdatasync loop.

Usage: ``python bench/txlog_bench.py [--dir DIR] [--seconds S]`` (data goes to a temporary
directory inside DIR, default the system temp dir; use a directory on the disk you care about).
Each case runs for about S seconds (default 3); the whole run stays under ~30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from notify.txlog import RecordType, TxLog, TxLogConfig

BODY = b"x" * 91  # 9 bytes of framing + 91 = a 100-byte record
fdatasync = getattr(os, "fdatasync", os.fsync)


class Result:
    def __init__(self, name: str, ops: int, seconds: float, fsyncs: int | None) -> None:
        self.name, self.ops, self.seconds, self.fsyncs = name, ops, seconds, fsyncs

    @property
    def rate(self) -> float:
        return self.ops / self.seconds


def bare(directory: Path, seconds: float) -> Result:
    fd = os.open(directory / "bare", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    record = b"y" * 100
    ops = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    try:
        while time.perf_counter() < deadline:
            os.write(fd, record)
            fdatasync(fd)
            ops += 1
    finally:
        os.close(fd)
    return Result("bare append+fdatasync", ops, time.perf_counter() - t0, ops)


def counted(log: TxLog) -> Callable[[], int]:
    calls = [0]
    real = log._fsync

    def fsync(fd: int) -> None:
        calls[0] += 1
        real(fd)

    log._fsync = fsync  # type: ignore[method-assign]
    return lambda: calls[0]


def threaded(directory: Path, name: str, policy: int, threads: int, seconds: float) -> Result:
    with TxLog.open(directory / name, TxLogConfig(flush_at_commit=policy)) as log:
        fsyncs = counted(log)
        counts = [0] * threads
        stop = threading.Event()
        start = threading.Barrier(threads + 1)

        def worker(i: int) -> None:
            start.wait()
            n = 0
            while not stop.is_set():
                log.commit(RecordType.COMMIT, BODY)
                n += 1
            counts[i] = n

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - t0
        label = f"commit flush_at_commit={policy}, {threads} thread{'s' * (threads > 1)}"
        return Result(label, sum(counts), elapsed, fsyncs())


def tasks(directory: Path, name: str, ntasks: int, seconds: float) -> Result:
    with TxLog.open(directory / name, TxLogConfig(flush_at_commit=1)) as log:
        fsyncs = counted(log)

        async def main() -> int:
            deadline = time.perf_counter() + seconds

            async def one() -> int:
                n = 0
                while time.perf_counter() < deadline:
                    await log.commit_async(RecordType.COMMIT, BODY)
                    n += 1
                return n

            return sum(await asyncio.gather(*(one() for _ in range(ntasks))))

        t0 = time.perf_counter()
        ops = asyncio.run(main())
        label = f"commit_async flush_at_commit=1, {ntasks} tasks"
        return Result(label, ops, time.perf_counter() - t0, fsyncs())


def merge(parts: list[Result]) -> Result:
    fsyncs = [r.fsyncs for r in parts]
    total = None if None in fsyncs else sum(f for f in fsyncs if f is not None)
    return Result(parts[0].name, sum(r.ops for r in parts), sum(r.seconds for r in parts), total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="parent directory of the test data")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each case")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (disk drift)")
    args = parser.parse_args()
    secs, rounds = args.seconds, max(1, args.rounds)
    with tempfile.TemporaryDirectory(prefix="txlog-bench-", dir=args.dir) as tmp:
        d = Path(tmp)
        # the fsync-bound cases run interleaved in short slices, so that a disk whose speed
        # drifts over time is compared with itself
        parts: list[list[Result]] = [[], [], [], []]
        for i in range(rounds):
            slice_s = secs / rounds
            parts[0].append(bare(d, slice_s))
            parts[1].append(threaded(d, f"p1t1-{i}", 1, 1, slice_s))
            parts[2].append(threaded(d, f"p1t32-{i}", 1, 32, slice_s))
            parts[3].append(tasks(d, f"p1a32-{i}", 32, slice_s))
        results = [merge(p) for p in parts]
        results.append(threaded(d, "p2t1", 2, 1, secs))
        results.append(threaded(d, "p0t1", 0, 1, secs))
    base = results[0].rate
    single = results[1].rate
    print(f"txlog bench: 100-byte records, {secs:g} s per case, data in {tmp}")
    print(f"{'case':<42} {'ops':>9} {'ops/s':>10} {'fsyncs':>8} {'vs bare':>8}")
    for r in results:
        fs = "-" if r.fsyncs is None else str(r.fsyncs)
        print(f"{r.name:<42} {r.ops:>9} {r.rate:>10.0f} {fs:>8} {r.rate / base:>7.2f}x")
    checks = [
        ("flush_at_commit=1 single thread >= 60% of bare", single >= 0.6 * base),
        ("32 threads >= 4x single thread", results[2].rate >= 4 * single),
        ("flush_at_commit=2 >= 10,000 commits/s", results[4].rate >= 10_000),
    ]
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")


if __name__ == "__main__":
    main()
