"""Durability: group commit across threads and asyncio, flush policies, injected failures."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from txlog_helpers import FsyncCounter, fail_times

from notify.txlog import Position, RecordType, TxLog, TxLogConfig, TxLogError
from tests.helpers import timing, wait_until


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_sync_makes_durable_and_is_free_when_already_durable(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(flush_at_commit=0)) as log:
        counter = FsyncCounter(log)
        a = log.append(1, b"a")
        b = log.append(1, b"b")
        assert log.durable_position == Position(0, 0)
        log.sync(a)
        assert counter.calls == 1
        assert log.durable_position == log.end_position
        log.sync(a)
        log.sync(b)
        log.sync(log.end_position)
        log.sync()
        assert counter.calls == 1
        with pytest.raises(TxLogError, match="beyond"):
            log.sync(Position(9, 0))


def test_group_commit_threads_share_fsyncs(logdir: Path) -> None:
    threads, per_thread = 32, 200
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        writes = [0]
        real_pwrite = log._pwrite

        def counting_pwrite(fd: int, data: memoryview, offset: int) -> int:
            writes[0] += 1
            return real_pwrite(fd, data, offset)

        log._pwrite = counting_pwrite  # type: ignore[method-assign]
        acked: list[list[Position]] = [[] for _ in range(threads)]
        errors: list[BaseException] = []
        start = threading.Barrier(threads)

        def worker(i: int) -> None:
            try:
                start.wait()
                for j in range(per_thread):
                    pos = log.commit(RecordType.COMMIT, f"{i}:{j}".encode())
                    assert log.durable_position > pos
                    acked[i].append(pos)
            except BaseException as exc:
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not errors
        total = threads * per_thread
        assert counter.calls < total // 4, counter.calls  # typically a few hundred
        assert writes[0] < total // 4, writes[0]  # queued commits are written together
        assert sorted(p for a in acked for p in a) == [r.position for r in log.replay()]


def test_group_commit_asyncio_tasks_share_fsyncs(logdir: Path) -> None:
    tasks, per_task = 64, 50

    async def main(log: TxLog) -> list[Position]:
        async def one(i: int) -> list[Position]:
            out = []
            for j in range(per_task):
                pos = await log.commit_async(RecordType.COMMIT, f"{i}:{j}".encode())
                assert log.durable_position > pos
                out.append(pos)
            return out

        results = await asyncio.gather(*(one(i) for i in range(tasks)))
        return [p for r in results for p in r]

    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        acked = asyncio.run(main(log))
        assert counter.calls < tasks * per_task // 4, counter.calls
        assert sorted(acked) == [r.position for r in log.replay()]


def test_asyncio_coalesces_behind_one_inflight_fsync(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        counter.before = lambda: time.sleep(0.05)

        async def main() -> None:
            await asyncio.gather(*(log.commit_async(1, b"x%d" % i) for i in range(100)))

        asyncio.run(main())
        assert counter.calls <= 3  # one in flight, one queued behind it (+1 slack)
        assert log.durable_position == log.end_position


def test_sync_async_does_not_block_the_loop(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        release = threading.Event()
        counter.before = lambda: release.wait(10)

        async def main() -> int:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    if ticks == 20:
                        release.set()
                    await asyncio.sleep(0.001)

            t = asyncio.create_task(ticker())
            await log.commit_async(1, b"x")
            t.cancel()
            return ticks

        assert asyncio.run(main()) >= 20


def test_threads_and_asyncio_together(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        stop = threading.Event()
        thread_acks: list[Position] = []

        def thread_worker() -> None:
            while not stop.is_set():
                thread_acks.append(log.commit(1, b"thread"))

        pool = [threading.Thread(target=thread_worker) for _ in range(4)]
        for t in pool:
            t.start()

        async def main() -> list[Position]:
            async def one() -> list[Position]:
                return [await log.commit_async(2, b"task") for _ in range(30)]

            return [p for r in await asyncio.gather(*(one() for _ in range(16))) for p in r]

        try:
            task_acks = asyncio.run(main())
        finally:
            stop.set()
            for t in pool:
                t.join()
        acked = len(task_acks) + len(thread_acks)
        assert counter.calls < acked
        replayed = {r.position for r in log.replay()}
        assert set(task_acks) | set(thread_acks) == replayed
        assert log.durable_position == log.end_position


def test_flush_at_commit_0_never_syncs(logdir: Path) -> None:
    log = TxLog.open(logdir, TxLogConfig(flush_at_commit=0))
    counter = FsyncCounter(log)
    for i in range(50):
        log.commit(3, b"%d" % i)
    asyncio.run(log.commit_async(3, b"async"))
    assert counter.calls == 0
    assert log.durable_position == Position(0, 0)
    log.close()  # the final fsync on close is the only one
    assert counter.calls == 1


def test_flush_at_commit_1_syncs_every_commit(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(flush_at_commit=1)) as log:
        counter = FsyncCounter(log)
        for i in range(10):
            pos = log.commit(3, b"%d" % i)
            assert log.durable_position > pos
        assert counter.calls == 10
        pos = asyncio.run(log.commit_async(4, b"async"))
        assert log.durable_position > pos
        assert counter.calls == 11
        log.append(1, b"plain append: no fsync")
        assert counter.calls == 11


def test_flush_at_commit_2_background_timer(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(flush_at_commit=2, flush_interval_s=0.2)) as log:
        counter = FsyncCounter(log)
        positions = [log.commit(3, b"%d" % i) for i in range(100)]
        positions.append(asyncio.run(log.commit_async(3, b"async")))
        wait_until(lambda: log.durable_position > positions[-1])
        assert counter.calls >= 1
        assert counter.calls < 20
        quiet = counter.calls
        time.sleep(0.5)  # nothing appended: the timer does not fsync for nothing
        assert counter.calls == quiet


def test_flush_at_commit_2_default_interval_within_about_a_second(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(flush_at_commit=2)) as log:
        t0 = time.monotonic()
        pos = log.commit(3, b"x")
        assert log.durable_position <= pos
        wait_until(lambda: log.durable_position > pos, timeout=10)
        took = time.monotonic() - t0
        timing(took < 5, f"the background flush made a commit durable after {took:.2f} s (~1)")


def test_fsync_failure_raises_and_the_log_refuses_writes_until_reopened(logdir: Path) -> None:
    """Fail-stop after a failed fsync (the kernel may have dropped the pages it could not
    write): every later commit, append and sync raises, and reopening recovers from disk."""
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        ok = log.commit(1, b"before")
        counter.fail = fail_times(1, enospc)
        with pytest.raises(TxLogError) as info:
            log.commit(1, b"fsync fails")
        assert isinstance(info.value.__cause__, OSError)
        assert info.value.__cause__.errno == errno.ENOSPC
        assert log.durable_position > ok
        assert log.failed is not None and "No space left" in log.failed
        with pytest.raises(TxLogError, match="reopen"):
            log.commit(1, b"refused")
        with pytest.raises(TxLogError, match="reopen"):
            asyncio.run(log.commit_async(1, b"refused async"))
        with pytest.raises(TxLogError, match="reopen"):
            log.sync()
    with TxLog.open(logdir) as log:
        assert log.failed is None
        assert log.recovery.truncated_bytes == 0
        bodies = [r.body for r in log.replay()]
        # the record whose fsync failed was written: its outcome is "unknown", not lost data
        assert bodies == [b"before", b"fsync fails"]
        log.commit(1, b"after")
        assert [r.body for r in log.replay()][-1] == b"after"


def test_failed_fsync_is_reported_to_the_followers_it_covered(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        entered, release = threading.Event(), threading.Event()

        def gate() -> None:
            entered.set()
            release.wait(10)

        counter.before = gate
        counter.fail = fail_times(1, enospc)
        follower_pos = log.append(1, b"follower")  # appended before the leader's snapshot
        results: dict[str, BaseException | None] = {}

        def run(name: str, fn: object) -> None:
            try:
                fn()  # type: ignore[operator]
                results[name] = None
            except BaseException as exc:
                results[name] = exc

        leader = threading.Thread(target=run, args=("leader", lambda: log.commit(1, b"leader")))
        leader.start()
        assert entered.wait(10)
        follower = threading.Thread(target=run, args=("follower", lambda: log.sync(follower_pos)))
        follower.start()
        wait_until(lambda: len(log._coord._waiters) == 1)
        counter.before = lambda: None
        release.set()
        leader.join()
        follower.join()
        assert isinstance(results["leader"], TxLogError)
        assert isinstance(results["follower"], TxLogError)
        with pytest.raises(TxLogError, match="reopen"):  # fail-stop until reopened
            log.commit(1, b"refused")


@pytest.mark.parametrize("partial", [True, False])
def test_write_failure_leaves_no_partial_frame(logdir: Path, partial: bool) -> None:
    with TxLog.open(logdir) as log:
        first = log.commit(1, b"first")
        size = log.end_position.offset
        real = log._pwrite

        def failing(fd: int, data: memoryview, offset: int) -> int:
            if partial:
                real(fd, data[: len(data) // 2], offset)  # half of it reaches the file
            raise enospc()

        log._pwrite = failing  # type: ignore[method-assign]
        with pytest.raises(TxLogError, match="nothing was appended") as info:
            log.commit(1, b"x" * 1000)
        assert isinstance(info.value.__cause__, OSError)
        assert (logdir / "redo.0").stat().st_size == size
        assert log.end_position == Position(0, size)
        log._pwrite = real  # type: ignore[method-assign]
        second = log.commit(1, b"second")
        assert second == Position(0, size)
        assert [r.position for r in log.replay()] == [first, second]
    with TxLog.open(logdir) as log:
        assert log.recovery.truncated_bytes == 0
        assert [r.body for r in log.replay()] == [b"first", b"second"]


def test_short_writes_are_completed(logdir: Path) -> None:
    with TxLog.open(logdir) as log:
        real = log._pwrite
        log._pwrite = lambda fd, data, offset: real(fd, data[:7], offset)  # type: ignore[method-assign]
        pos = log.append_many([(1, b"a" * 100), (2, b"b" * 50)])
        assert [r.body for r in log.replay()] == [b"a" * 100, b"b" * 50]
        assert [r.position for r in log.replay()] == pos


def test_fsync_failure_during_roll(logdir: Path) -> None:
    with TxLog.open(logdir, TxLogConfig(segment_bytes=100, flush_at_commit=0)) as log:
        counter = FsyncCounter(log)
        log.append(1, b"a" * 80)
        counter.fail = fail_times(1, enospc)
        with pytest.raises(TxLogError, match="roll"):
            log.append(1, b"b" * 80)
        assert log.end_position == Position(0, 89)
        with pytest.raises(TxLogError, match="reopen"):  # fail-stop: the unsynced tail may be gone
            log.append(1, b"c" * 80)
    with TxLog.open(logdir, TxLogConfig(segment_bytes=100, flush_at_commit=0)) as log:
        assert log.append(1, b"c" * 80) == Position(1, 0)
        assert [r.body[:1] for r in log.replay()] == [b"a", b"c"]


def test_commit_async_after_close(logdir: Path) -> None:
    log = TxLog.open(logdir)
    pos = log.append(1, b"x")
    log.close()
    asyncio.run(log.sync_async(pos))  # durable by close: returns at once
    with pytest.raises(TxLogError, match="closed"):
        asyncio.run(log.commit_async(1, b"y"))


def test_failed_batch_write_fails_its_committers_only(logdir: Path) -> None:
    """Commits queued behind a flush are written as one batch; if that write fails, every
    committer in it gets the error and nothing of it is in the log, while a syncer leading
    the batch still gets its own (already written) record synced."""
    with TxLog.open(logdir) as log:
        counter = FsyncCounter(log)
        entered, release = threading.Event(), threading.Event()

        def gate() -> None:
            entered.set()
            release.wait(10)

        counter.before = gate
        results: dict[str, BaseException | Position | None] = {}

        def run(name: str, fn: Callable[[], Position | None]) -> None:
            try:
                results[name] = fn()
            except BaseException as exc:
                results[name] = exc

        first = threading.Thread(target=run, args=("first", lambda: log.commit(1, b"first")))
        first.start()
        assert entered.wait(10)
        counter.before = lambda: None
        appended = log.append(2, b"appended")  # written directly, after "first"
        syncer = threading.Thread(target=run, args=("syncer", lambda: log.sync(appended)))
        syncer.start()
        wait_until(lambda: len(log._coord._waiters) == 1)
        committers = [
            threading.Thread(target=run, args=(f"c{i}", lambda i=i: log.commit(3, b"c%d" % i)))
            for i in range(3)
        ]
        for t in committers:
            t.start()
        wait_until(lambda: len(log._coord._waiters) == 4)
        real = log._pwrite

        def failing(fd: int, data: memoryview, offset: int) -> int:
            raise enospc()

        log._pwrite = failing  # type: ignore[method-assign]
        release.set()
        for t in [first, syncer, *committers]:
            t.join()
        log._pwrite = real  # type: ignore[method-assign]
        assert isinstance(results["first"], Position)
        assert results["syncer"] is None
        assert log.durable_position > appended
        for i in range(3):
            err = results[f"c{i}"]
            assert isinstance(err, TxLogError), err
            assert "nothing was appended" in str(err)
            assert isinstance(err.__cause__, OSError)
        assert [r.body for r in log.replay()] == [b"first", b"appended"]
        log.commit(1, b"usable")
    with TxLog.open(logdir) as log:
        assert log.recovery.truncated_bytes == 0
        assert [r.body for r in log.replay()] == [b"first", b"appended", b"usable"]
