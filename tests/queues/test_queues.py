"""Queue subscriptions against real broker processes: sharing beyond the partition count,
redelivery, dead letters, departure, SIGKILL durability and hostile clients."""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
import time
from pathlib import Path

from notify.client import AsyncMessageSessionFactory, QueueMessage, connect
from notify.protocol import queuelog
from notify.protocol.frames import Response, decode_qbatch
from notify.protocol.records import HEADER, HEADER_SIZE
from notify.testing import BrokerProcess
from notify.txlog import TxLog, TxLogConfig
from tests.helpers import WireClient, queue_stats, timing

QUEUES_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "queues.md"


def _publish(addr: str, topic: str, n: int, parts: int, prefix: bytes = b"m") -> None:
    with WireClient(addr) as c:
        c.send(b"".join(
            b"put %s %d %d 0 %d\r\n%s" % (topic.encode(), i % parts, len(prefix) + len(b"%d" % i),
                                          i + 1, prefix + b"%d" % i)
            for i in range(n)
        ))
        assert all(r.code == 200 for r in c.replies(n))


_stats = queue_stats  # the name earlier tests import from here

def _pushes(c: WireClient, n: int) -> list[Response]:
    got = c.replies(n)
    assert all(r.kind == "qmsg" for r in got), got
    return got


def test_competing_consumers_beyond_partitions_share_the_work(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path, topics={"work": 2}) as b:
        _publish(b.addr, "work", 300, 2)

        async def main() -> dict[int, list[bytes]]:
            seen: dict[int, list[bytes]] = {}
            async with AsyncMessageSessionFactory([b.addr]) as s:
                done = asyncio.Event()
                total = [0]

                def make(i: int):  # one listener per consumer: who got what
                    async def listener(msg: QueueMessage) -> None:
                        seen.setdefault(i, []).append(msg.data)
                        await asyncio.sleep(0.002)  # a slow listener: parallelism matters
                        total[0] += 1
                        if total[0] >= 300:
                            done.set()
                    return listener

                for i in range(6):  # 6 consumers, 2 partitions
                    await s.create_queue_consumer("work", "jobs", credit=4, listener=make(i))
                await asyncio.wait_for(done.wait(), 30)
                await asyncio.sleep(0.2)
            return seen

        seen = asyncio.run(main())
        assert len(seen) == 6, {k: len(v) for k, v in seen.items()}  # every consumer worked
        everything = [d for v in seen.values() for d in v]
        assert sorted(everything) == sorted(b"m%d" % i for i in range(300))  # once each
        st = queue_stats(b.addr)["work/jobs"]
        assert st["redelivered"] == "0" and st["tracked"] == "0"


def test_poison_message_is_dead_lettered_while_the_rest_flow(tmp_path: Path) -> None:
    sysc = {"queueLockTimeout": 300, "queueMaxDeliveries": 3}
    with BrokerProcess(tmp_path, topics={"work": 1}, system=sysc) as b:
        _publish(b.addr, "work", 50, 1)
        with connect([b.addr]) as s:
            ok: list[bytes] = []
            attempts: list[int] = []

            def listener(msg: QueueMessage) -> None:
                if msg.data == b"m7":
                    attempts.append(msg.delivery_count)
                    raise RuntimeError("poison")
                ok.append(msg.data)

            s.create_queue_consumer("work", "g", credit=8, listener=listener)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (len(ok) < 49 or len(attempts) < 3):
                time.sleep(0.05)
            time.sleep(0.3)
        assert sorted(ok) == sorted(b"m%d" % i for i in range(50) if i != 7)
        assert attempts == [1, 2, 3]
        st = queue_stats(b.addr)["work/g"]
        assert st["dead_letters"] == "1", st


def test_dropped_consumer_messages_go_to_another_at_once(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path, topics={"work": 3}, system={"queueLockTimeout": 60000}) as b:
        _publish(b.addr, "work", 6, 3)
        a = WireClient(b.addr)
        assert a.call(b"qsub work g 4 earliest 1\r\n").body == b"4"
        held = _pushes(a, 4)
        other = WireClient(b.addr)
        assert other.call(b"qsub work g 10 earliest 2\r\n").code == 200
        first = _pushes(other, 2)  # the two a had no credit for
        t0 = time.monotonic()
        a.close()  # gone with 4 acquired messages: they return at once (not after 60 s)
        again = _pushes(other, 4)  # (a 10 s socket timeout: not after the 60 s lock)
        took = time.monotonic() - t0
        timing(took < 5, f"a dropped consumer's messages went to another in {took:.2f} s")
        assert {(r.partition, r.offset) for r in again} == {(r.partition, r.offset) for r in held}
        assert all(r.code == 2 for r in again)  # second delivery
        assert len({(r.partition, r.offset) for r in first + again}) == 6
        other.close()


def test_hostile_clients_bogus_acks_never_acking_and_huge_credit(tmp_path: Path) -> None:
    sysc = {"queueMaxCredit": 50, "queueMaxInFlight": 100}
    with BrokerProcess(tmp_path, topics={"work": 2}, system=sysc) as b:
        _publish(b.addr, "work", 400, 2)
        greedy = WireClient(b.addr)
        r = greedy.call(b"qsub work g 2000000000 earliest 1\r\n")
        assert r.body == b"50"  # clamped to queueMaxCredit
        got = _pushes(greedy, 50)
        # the never-acking consumer holds 50; the window holds at most 100 messages
        st = queue_stats(b.addr)["work/g"]
        assert int(st["tracked"]) <= 100 and st["acquired"] == "50", st
        # bogus acks: offsets it does not hold, another group's, garbage; nothing changes
        liar = WireClient(b.addr)
        assert liar.call(b"qsub work g 1 earliest 2\r\n").code == 200
        liar_msg = _pushes(liar, 1)[0]
        items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in got[:5])
        items += b"A 0 999999\nX 9 0\nR 0 0 -5\nQ 1 1\nnonsense\n"
        # range forms: a negative end (malformed), an empty range, an unknown partition
        items += b"a 1 0 -1\na 0 5 3\nx 7 0 100\n"
        rep = liar.call(b"qack work g %d 3\r\n" % len(items) + items)
        assert rep.code == 200 and rep.body.split(b"\n")[0] == b"0 13", rep
        assert liar.call(b"qack work other 8 4\r\nA 0 0\n\n\n").code == 404  # not subscribed
        # the real holder still holds them: its accept works
        items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in got[:5])
        greedy.send(b"qack work g %d 5\r\n" % len(items) + items)
        out = greedy.replies(6)  # the answer (after the fsync) and 5 pushes: credit came back
        (rep,) = [r for r in out if r.kind == "result"]
        assert rep.body.split(b"\n")[0] == b"5 0"
        assert sum(r.kind == "qmsg" for r in out) == 5
        st = queue_stats(b.addr)["work/g"]
        assert st["refused_acks"] == "13" and int(st["tracked"]) <= 100, st
        assert liar_msg.kind == "qmsg"
        # bad verbs keep the connection
        assert liar.call(b"qsub work g 0 earliest 6\r\n").code == 400
        assert liar.call(b"qsub work g 1 sideways 7\r\n").code == 400
        assert liar.call(b"qsub nope g 1 earliest 8\r\n").code == 404
        assert liar.call(b"qsub __delay g 1 earliest 9\r\n").code == 403
        assert liar.call(b"version 10\r\n").code == 200
        greedy.close()
        liar.close()


def test_accepted_state_survives_sigkill(tmp_path: Path) -> None:
    sysc = {"queueLockTimeout": 2000, "queueCheckpointInterval": 300}
    with BrokerProcess(tmp_path, topics={"work": 2}, system=sysc) as b:
        _publish(b.addr, "work", 200, 2)
        c = WireClient(b.addr)
        assert c.call(b"qsub work g 20 earliest 1\r\n").code == 200
        accepted: set[tuple[int, int]] = set()
        opaque = 10
        msgs = _pushes(c, 20)
        while len(accepted) < 120:
            items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in msgs)
            opaque += 1
            c.send(b"qack work g %d %d\r\n" % (len(items), opaque) + items)
            out = c.replies(21)  # the answer (once durable) and 20 new pushes
            (rep,) = [r for r in out if r.kind == "result"]
            assert rep.body.split(b"\n")[0] == b"20 0", rep
            accepted |= {(m.partition, m.offset) for m in msgs}
            msgs = [r for r in out if r.kind == "qmsg"]
            if len(accepted) == 60:
                time.sleep(0.6)  # let a checkpoint happen: recovery = checkpoint + records
        # 20 more acquired, not accepted, when the broker dies
        held = {(m.partition, m.offset) for m in msgs}
        b.kill()
        c.close()
        b.start()
        c2 = WireClient(b.addr)
        assert c2.call(b"qsub work g 100 earliest 1\r\n").code == 200
        rest = _pushes(c2, 80)
        got = {(m.partition, m.offset) for m in rest}
        assert not got & accepted  # no accepted message is delivered again
        assert held <= got  # the ones in flight at the crash come back
        assert len(got | accepted) == 200  # none lost
        c2.close()


def test_queue_guide_example_runs(tmp_path: Path) -> None:
    """The queue guide's first example, in this process: every job handled once."""
    code = re.search(r"```python\n(.*?)```", QUEUES_GUIDE.read_text(), re.S)
    assert code is not None
    with BrokerProcess(tmp_path, topics={"jobs": 2}) as b:
        src = code.group(1).replace("127.0.0.1:8123", b.addr)
        ns: dict[str, object] = {}
        exec(compile(src, "docs/guides/queues.md", "exec"), ns)
        handled = ns["handled"]
        assert isinstance(handled, list)
        assert sorted(handled) == [b"job 0", b"job 1", b"job 2"]


def test_async_listener_runs_in_its_own_task(tmp_path: Path) -> None:
    """An async listener is a task of its own: asyncio.timeout works in it and a context
    variable it sets does not leak into the next message's listener."""
    seen_var = contextvars.ContextVar("seen", default="")
    with BrokerProcess(tmp_path, topics={"ctx": 1}) as b:
        _publish(b.addr, "ctx", 5, 1)

        async def main() -> list[str]:
            leaks: list[str] = []
            done = asyncio.Event()
            count = [0]

            async def listener(msg: QueueMessage) -> None:
                leaks.append(seen_var.get())
                seen_var.set(msg.data.decode())
                async with asyncio.timeout(5):  # needs a current task
                    await asyncio.sleep(0)
                count[0] += 1
                if count[0] == 5:
                    done.set()

            async with AsyncMessageSessionFactory([b.addr]) as s:
                await s.create_queue_consumer("ctx", "w", credit=10, listener=listener)
                await asyncio.wait_for(done.wait(), 20)
                await asyncio.sleep(0.3)
            return leaks

        assert asyncio.run(main()) == [""] * 5
        st = queue_stats(b.addr)["ctx/w"]
        assert st["redelivered"] == "0" and st["tracked"] == "0", st


def _batch_msgs(out: list[Response]) -> list[tuple[int, int, int, int]]:
    """``(partition, offset, next offset, count)`` of the messages of ``qbatch`` frames."""
    got = []
    for r in out:
        if r.kind != "qbatch":
            continue
        for p, count, n, first, pos in decode_qbatch(r.body):
            off = first
            for _ in range(n):
                size = HEADER_SIZE + HEADER.unpack_from(r.body, pos)[0]
                got.append((p, off, off + size, count))
                off += size
                pos += size
    return got


def test_batched_pushes_and_range_acks_survive_sigkill(tmp_path: Path) -> None:
    """``qbsub``: messages come in ``qbatch`` frames; accepted in ranges (with holes kept
    held), checkpointed as ranges, then ``kill -9``: nothing accepted comes back, nothing
    is lost, the held ones come back."""
    sysc = {"queueLockTimeout": 5000, "queueCheckpointInterval": 200}
    with BrokerProcess(tmp_path, topics={"work": 2}, system=sysc) as b:
        _publish(b.addr, "work", 300, 2)
        c = WireClient(b.addr)
        assert c.call(b"qbsub work g 40 earliest 1\r\n").body == b"40"
        accepted: set[tuple[int, int]] = set()
        held: set[tuple[int, int]] = set()
        opaque = 10
        msgs = _batch_msgs(c.replies(1))
        while len(accepted) < 200:
            # keep every 7th message held; accept the rest as ranges of consecutive records
            held |= {(p, o) for p, o, _, _ in msgs if o % 7 == 0}
            items = b""
            for p, o, nx, _ in msgs:
                if (p, o) not in held:
                    items += b"a %d %d %d\n" % (p, o, nx)
                    accepted.add((p, o))
            opaque += 1
            c.send(b"qack work g %d %d\r\n" % (len(items), opaque) + items)
            msgs = []
            while True:  # the answer (once durable) and the pushes its freed credit made
                (r,) = c.replies(1)
                if r.kind == "qbatch":
                    msgs += _batch_msgs([r])
                    continue
                assert r.opaque == opaque and r.body.split(b"\n")[0].endswith(b" 0"), r
                break
            if not msgs:
                msgs = _batch_msgs(c.replies(1))
            if opaque == 13:
                time.sleep(0.4)  # a checkpoint (ranges in its exceptions) before the crash
        held |= {(p, o) for p, o, _, _ in msgs}
        b.kill()
        c.close()
        b.start()
        c2 = WireClient(b.addr)
        assert c2.call(b"qbsub work g 300 earliest 1\r\n").code == 200
        got: set[tuple[int, int]] = set()
        while len(got) < 300 - len(accepted):
            got |= {(p, o) for p, o, _, _ in _batch_msgs(c2.replies(1))}
        assert not got & accepted  # no accepted message is delivered again
        assert held <= got  # the held ones (and those in flight at the crash) come back
        assert len(got | accepted) == 300  # none lost
        c2.close()


def test_batch_listener_accepts_or_releases_the_whole_batch(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path, topics={"work": 2}) as b:
        _publish(b.addr, "work", 40, 2)

        async def run() -> tuple[list[tuple[int, int]], list[int]]:
            seen: list[tuple[int, int]] = []
            batches: list[int] = []
            done = asyncio.Event()

            async def listener(msgs: list[QueueMessage]) -> None:
                batches.append(len(msgs))
                seen.extend((m.offset, m.delivery_count) for m in msgs)
                if len(batches) == 1:
                    raise RuntimeError("first batch fails: released")
                if sum(d == 1 for _, d in seen) >= 40 and len(seen) >= 40 + batches[0]:
                    done.set()

            async with AsyncMessageSessionFactory([b.addr]) as s:
                c = await s.create_queue_consumer("work", "g", credit=100, batch_listener=listener)
                await asyncio.wait_for(done.wait(), 10)
                await asyncio.sleep(0.2)
                await c.close()
            return seen, batches

        seen, batches = asyncio.run(run())
        assert batches[0] > 1  # a pushed frame holds many messages
        firsts = {o for o, d in seen[: batches[0]]}
        again = {o for o, d in seen[batches[0] :] if d == 2}
        assert firsts and firsts <= again  # the failed batch came back, count 2
        st = queue_stats(b.addr)["work/g"]
        assert st["acquired"] == "0" and st["tracked"] == "0"  # the rest were all accepted
        assert st["dead_letters"] == "0"


def test_queue_log_written_before_range_records_is_recovered(tmp_path: Path) -> None:
    """A log of the earlier format (per-message DONE and DELIVER records) still recovers:
    accepted ones are not delivered again, counts go on."""
    with BrokerProcess(tmp_path, topics={"work": 1}) as b:
        _publish(b.addr, "work", 4, 1)
        c = WireClient(b.addr)
        assert c.call(b"qsub work probe 10 earliest 1\r\n").code == 200
        offs = sorted((m.offset, len(m.body)) for m in _pushes(c, 4))
        c.close()
    qlog = TxLog.open(b.data_dir / "queues", TxLogConfig())
    qlog.append(queuelog.GROUP, queuelog.encode_group("work", "g", {0: 0}))
    done = [queuelog.DoneItem(0, o, o + ln, queuelog.ACKNOWLEDGED, 1, 0)
            for o, ln in (offs[0], offs[2])]
    qlog.append(queuelog.DONE, queuelog.encode_done("work", "g", done))
    qlog.append(queuelog.DELIVER, queuelog.encode_deliver("work", "g", [(0, offs[1][0], 2)]))
    qlog.sync()
    qlog.close()
    with b:
        c = WireClient(b.addr)
        assert c.call(b"qbsub work g 10 earliest 1\r\n").code == 200
        got = _batch_msgs(c.replies(1))
        if len(got) < 2:
            got += _batch_msgs(c.replies(1))
        assert [(o, n) for _, o, _, n in got] == [(offs[1][0], 3), (offs[3][0], 1)]
        c.close()


def test_sync_session_batch_listener_runs_on_a_thread(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path, topics={"work": 2}) as b:
        _publish(b.addr, "work", 10, 2)
        seen: list[bytes] = []
        threads: set[str] = set()
        done = threading.Event()

        def listener(msgs: list[QueueMessage]) -> None:
            threads.add(threading.current_thread().name)
            seen.extend(m.data for m in msgs)
            if len(seen) >= 10:
                done.set()

        with connect([b.addr]) as session:
            c = session.create_queue_consumer("work", "g", credit=50, batch_listener=listener)
            assert done.wait(10)
            deadline = time.monotonic() + 5
            while queue_stats(b.addr)["work/g"]["tracked"] != "0" and time.monotonic() < deadline:
                time.sleep(0.05)
            c.close()
        assert sorted(seen) == sorted(b"m%d" % i for i in range(10))
        assert queue_stats(b.addr)["work/g"]["tracked"] == "0"  # all accepted
        assert "MainThread" not in threads
