"""A consumer never sees part of a transaction: a real broker under concurrent load, readers
tailing every partition over the wire.

Load (no crash needed): producers pipelining bursts of 1-4 plain ``put`` (random partition,
payloads of 1 B to 64 KiB), an ``mput`` producer (batches of 1-8), transactional clients
(BEGIN, 1-5 messages across partitions of a group-commit topic and of one that is not, a fifth
of them as a transactional ``mput``; then COMMIT_ONE_PHASE, ROLLBACK or a dropped connection;
some commits sent in one write with BEGIN and the puts, some XA (END, PREPARE,
COMMIT_TWO_PHASE), some half messages of a registered producer group whose COMMIT_TWO_PHASE
is answered before its force, ``halfCommitEarlyAck``). Readers tail every partition
with ``get``; whenever a ``get`` reaches a partition's served end (404) the reader checks that
every message, in that partition, of a transaction it had already been served part of has been
served to it. Before the fix each partition showed its share as soon as everything before it
in that partition was shown: a share behind a plain put still waiting for its group-commit
fsync appeared after the transaction's other shares (tens of fractured reads in 20 s).

The same readers on an asynchronous slave: it pulls each partition on its own, and shows its
readers only consistent cuts of its master (before, a share pulled in one partition was shown
before another puller brought the transaction's share in the next).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from notify.protocol import records
from notify.protocol.frames import ResponseParser, encode_get, encode_mput, encode_put
from notify.sim.readers import Reader  # (a consumer's state: the simulation's readers too)
from notify.testing import BrokerProcess, free_port
from tests.conftest import BrokerFactory
from tests.helpers import stats

#: one group-commit topic and one without group commit (visible at append)
TOPICS = {
    "t": {"numPartitions": 4, "unflushThreshold": 0},
    "u": {"numPartitions": 2, "unflushThreshold": 1000, "unflushInterval": 1000},
}
SYSTEM = {
    "unflushThreshold": 0,
    "flushTxLogAtCommit": 1,
    "maxSegmentSize": 1 << 20,
    "halfCommitEarlyAck": "true",
}
PARTS = [("t", i) for i in range(4)] + [("u", i) for i in range(2)]
#: the work to do before stopping (counted, not timed), and a bound on the wait
MIN_COMMITS = 400
MIN_SECONDS = 2.0
MAX_SECONDS = 60.0


class Link:
    """One connection: write a batch of frames, read that many replies (in order)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.r = reader
        self.w = writer
        self.parser = ResponseParser()
        self.pending: list[tuple[str, int, int, bytes]] = []

    @classmethod
    async def open(cls, addr: str) -> Link:
        host, port = addr.rsplit(":", 1)
        r, w = await asyncio.open_connection(host, int(port), limit=1 << 22)
        return cls(r, w)

    async def call(self, frames: list[bytes]) -> list[tuple[str, int, int, bytes]]:
        self.w.write(b"".join(frames))
        while len(self.pending) < len(frames):
            data = await self.r.read(1 << 20)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending += [(x.kind, x.code, x.opaque, x.body) for x in self.parser.feed(data)]
        out, self.pending = self.pending[: len(frames)], self.pending[len(frames) :]
        return out

    def drop(self) -> None:
        """The client dies: the connection is reset, nothing more is sent."""
        self.w.transport.abort()
        self.w.close()

    async def close(self) -> None:
        self.w.close()
        await self.w.wait_closed()


@dataclass
class Shared:
    """What the clients know: each transaction's messages, and what the readers saw."""

    tx_of: dict[int, str] = field(default_factory=dict)
    msgs: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)
    readers: list[Reader] = field(default_factory=list)
    fractures: list[str] = field(default_factory=list)
    plain: int = 0
    stop: bool = False

    def register(self, key: str, msgs: list[tuple[str, int, int]]) -> None:
        """Before its COMMIT is sent: the transaction's messages (a reader already served
        one of them, from a commit sent in one write, learns it belongs to ``key``)."""
        self.msgs[key] = msgs
        for _t, _p, mid in msgs:
            self.tx_of[mid] = key
        for rd in self.readers:
            if any(mid in rd.served for _t, _p, mid in msgs):
                rd.seen.add(key)


def body(rng: random.Random) -> bytes:
    """1 B to 64 KiB, log-uniform (most small, some large)."""
    return rng.randbytes(max(1, int(2 ** rng.uniform(0, 16))))


def put_frame(topic: str, p: int, data: bytes, opaque: int, key: str | None = None) -> bytes:
    return encode_put(topic, p, data, 0, opaque, records.checksum(data) if key else None, key)


async def producer(addr: str, sh: Shared, seed: int) -> None:
    rng = random.Random(seed)
    link = await Link.open(addr)
    while not sh.stop:
        frames = []
        for i in range(rng.randrange(1, 5)):
            t, p = rng.choice(PARTS)
            frames.append(put_frame(t, p, body(rng), i))
        replies = await link.call(frames)
        assert all(r[1] == 200 for r in replies), replies
        sh.plain += len(frames)
    await link.close()


async def mput_producer(addr: str, sh: Shared, seed: int) -> None:
    rng = random.Random(seed)
    link = await Link.open(addr)
    while not sh.stop:
        t, p = rng.choice(PARTS)
        n = rng.randrange(1, 9)
        recs = b"".join(records.encode(0, 0, body(rng)[:4096]) for _ in range(n))
        ((_k, code, _o, reply),) = await link.call([encode_mput(t, p, recs, n, 1)])
        assert code == 200, reply
        sh.plain += n
    await link.close()


async def tx_client(addr: str, sh: Shared, seed: int) -> None:
    rng = random.Random(seed)
    name = f"c{seed}"
    link = await Link.open(addr)
    await link.call([f"register shop{seed} 0\r\n".encode()])  # its prepared ones are halves
    seq = 0
    while not sh.stop:
        seq += 1
        fate = rng.random()
        xa = 0.5 <= fate < 0.6
        key = f"XID:1:{seed:02x}{seq:06x}:beef:q1" if xa else f"TX:{name}:{seq}"
        frames = [f"transaction {key} {name} BEGIN 30 0\r\n".encode()]
        sent: list[tuple[str, int, int]] = []  # topic, partition, count
        for i in range(rng.randrange(1, 6)):
            t, p = rng.choice(PARTS)
            if rng.random() < 0.2:
                n = rng.randrange(1, 4)
                recs = b"".join(records.encode(0, 0, rng.randbytes(rng.randrange(1, 300)))
                                for _ in range(n))  # fmt: skip
                frames.append(encode_mput(t, p, recs, n, i + 1, key))
                sent.append((t, p, n))
            else:
                frames.append(put_frame(t, p, body(rng)[:8192], i + 1, key))
                sent.append((t, p, 1))
        count = sum(n for _t, _p, n in sent)
        commit = f"transaction {key} {name} COMMIT_ONE_PHASE msgs={count} 99\r\n".encode()
        if 0.5 <= fate < 0.7:  # XA, or a half message: PREPARE, then COMMIT_TWO_PHASE
            if xa:
                frames.append(f"transaction {key} {name} END 97\r\n".encode())
            frames.append(f"transaction {key} {name} PREPARE msgs={count} 96\r\n".encode())
            replies = await link.call(frames)
            assert all(r[1] == 200 for r in replies), replies
            puts = replies[1 : 1 + len(sent)]
            sh.register(key, _messages(sent, puts))
            ((_k, code, _o, reply),) = await link.call(
                [f"transaction {key} {name} COMMIT_TWO_PHASE 95\r\n".encode()]
            )
            assert code == 200, reply
            sh.committed.append(key)
            continue
        if fate < 0.3:  # BEGIN, puts and COMMIT in one write (the client's usual way)
            replies = await link.call([*frames, commit])
            assert replies[-1][1] == 200, replies[-1]
            sh.register(key, _messages(sent, replies[1:-1]))
            sh.committed.append(key)
            continue
        replies = await link.call(frames)
        assert all(r[1] == 200 for r in replies), replies
        if fate < 0.5:
            sh.register(key, _messages(sent, replies[1:]))
            ((_k, code, _o, reply),) = await link.call([commit])
            assert code == 200, reply
            sh.committed.append(key)
        elif fate < 0.85:
            await link.call([f"transaction {key} {name} ROLLBACK 98\r\n".encode()])
        else:  # the client dies: the broker rolls it back
            link.drop()
            link = await Link.open(addr)
    await link.close()


def _messages(
    sent: list[tuple[str, int, int]], replies: list[tuple[str, int, int, bytes]]
) -> list[tuple[str, int, int]]:
    out = []
    for (t, p, n), (_k, _code, _o, ack) in zip(sent, replies, strict=True):
        first = int(ack.split()[0])
        out += [(t, p, first + i) for i in range(n)]
    return out


async def reader(addr: str, sh: Shared, rd: Reader, seed: int) -> None:
    rng = random.Random(seed)
    link = await Link.open(addr)
    while not sh.stop:
        t, p = rng.choice(PARTS)
        off = rd.offsets.get((t, p), 0)
        ((kind, code, _o, data),) = await link.call(
            [encode_get(t, "readers", p, off, 256 * 1024, 1)]
        )
        if kind == "value":
            recs, used = records.decode_all(data, off)
            for r in recs:
                rd.served.add(r.msg_id)
                key = sh.tx_of.get(r.msg_id)
                if key is not None:
                    rd.seen.add(key)
            rd.offsets[(t, p)] = off + used
            continue
        assert code == 404, (code, data)
        rd.ends += 1
        done = []
        for key in rd.seen:
            msgs = sh.msgs[key]
            missing = [m for tt, pp, m in msgs if (tt, pp) == (t, p) and m not in rd.served]
            if missing:
                got = sum(1 for m in msgs if m[2] in rd.served)
                sh.fractures.append(
                    f"{rd.name}: {got}/{len(msgs)} of {key} served, {t}-{p} at its end "
                    f"{off} without {missing}"
                )
            elif all(m[2] in rd.served for m in msgs):
                done.append(key)
        rd.seen.difference_update(done)
    await link.close()


async def run_load(addr: str, read_addr: str | None = None) -> Shared:
    """The load on the broker at ``addr``, the readers on ``read_addr`` (default: the same)."""
    sh = Shared()
    sh.readers = [Reader(f"r{i}") for i in range(2)]
    tasks = [asyncio.create_task(producer(addr, sh, i)) for i in range(3)]
    tasks.append(asyncio.create_task(mput_producer(addr, sh, 10)))
    tasks += [asyncio.create_task(tx_client(addr, sh, 20 + i)) for i in range(3)]
    raddr = read_addr or addr
    tasks += [
        asyncio.create_task(reader(raddr, sh, rd, 30 + i)) for i, rd in enumerate(sh.readers)
    ]
    t0 = time.monotonic()
    while True:
        await asyncio.sleep(0.1)
        failed = [t for t in tasks if t.done()]
        if failed:
            sh.stop = True
            failed[0].result()  # a client's failure is the test's
        took = time.monotonic() - t0
        if (len(sh.committed) >= MIN_COMMITS and took >= MIN_SECONDS) or took > MAX_SECONDS:
            break
    sh.stop = True
    await asyncio.gather(*tasks)
    return sh


def read_everything(addr: str) -> set[int]:
    """Every message id the broker serves now, from every partition."""

    async def go() -> set[int]:
        link = await Link.open(addr)
        ids: set[int] = set()
        for t, p in PARTS:
            off = 0
            while True:
                ((kind, _c, _o, data),) = await link.call(
                    [encode_get(t, "final", p, off, 1 << 20, 1)]
                )
                if kind != "value":
                    break
                recs, used = records.decode_all(data, off)
                ids.update(r.msg_id for r in recs)
                off += used
        await link.close()
        return ids

    return asyncio.run(go())


def check(sh: Shared, read_addr: str) -> None:
    ends = sum(rd.ends for rd in sh.readers)
    print(
        f"\n{len(sh.committed)} commits, {sh.plain} plain messages, {ends} served ends "
        f"checked, {len(sh.fractures)} fractured reads"
    )
    assert len(sh.committed) >= MIN_COMMITS, "too little work done to mean anything"
    assert ends > 100
    assert not sh.fractures, "\n".join(sh.fractures[:10])
    # every acknowledged commit is readable, whole
    deadline = time.monotonic() + 20
    while True:
        ids = read_everything(read_addr)
        lost = [k for k in sh.committed if any(m not in ids for _t, _p, m in sh.msgs[k])]
        if not lost or time.monotonic() > deadline:  # (a slave may still be catching up)
            break
        time.sleep(0.2)
    assert not lost, lost[:5]


def test_no_reader_is_served_part_of_a_transaction_under_load(
    broker_factory: BrokerFactory,
) -> None:
    b: BrokerProcess = broker_factory(topics=TOPICS, **SYSTEM)
    check(asyncio.run(run_load(b.addr)), b.addr)


@pytest.mark.parametrize("sync", [False, True], ids=["async-slave", "sync-slave"])
def test_no_reader_of_a_slave_is_served_part_of_a_transaction(
    tmp_path: Path, sync: bool
) -> None:
    """Readers on a slave, asynchronous (it pulls) or synchronous (the master pushes every
    batch, transactions' shares included, and waits for it under ``refuse``)."""
    master = BrokerProcess(
        tmp_path / "m", topics=TOPICS, system={**SYSTEM, "replicationSecret": "rs"}
    )
    master.port = free_port()
    slave = BrokerProcess(
        tmp_path / "s",
        topics=TOPICS,
        system={**SYSTEM, "replicationSecret": "rs"},
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
    )
    try:
        slave.start()
        if sync:
            master.system.update({"syncSlave": slave.addr, "syncSlaveTimeout": 3000})
        master.start()
        deadline = time.monotonic() + 20
        while sync and stats(master.addr).get("sync_slave_state") != "in_sync":
            assert time.monotonic() < deadline, "the synchronous slave never got in sync"
            time.sleep(0.05)
        check(asyncio.run(run_load(master.addr, slave.addr)), slave.addr)
    finally:
        slave.stop()
        master.stop()
