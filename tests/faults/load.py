"""Load generators for the kill -9 test: raw wire clients in threads, each bounded by a stop
event, a deadline and a count, recording into a :class:`~tests.faults.ledger.Ledger` only
what the broker acknowledged. Any socket error (the broker died) ends a generator."""

from __future__ import annotations

import random
import threading
import time

from notify.protocol import records
from tests.faults.ledger import (
    COMMIT_SENT,
    COMMITTED,
    OPEN,
    PREPARE_SENT,
    PREPARED,
    ROLLBACK_SENT,
    ROLLED_BACK,
    TOPICS,
    Ledger,
    plain_body,
    tx_body,
)
from tests.helpers import WireClient, crc

MAX_SECONDS = 30.0
_TARGETS = [(t, p) for t, n in TOPICS.items() for p in range(n)]


class Generator(threading.Thread):
    def __init__(self, name: str, addr: str, ledger: Ledger, stop: threading.Event, seed: int):
        super().__init__(name=name, daemon=True)
        self.addr = addr
        self.ledger = ledger
        self.stop_event = stop
        self.rnd = random.Random(seed)
        self.ops = 0
        self.started_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            conn = WireClient(self.addr, timeout=5)
        except OSError:
            return
        try:
            while not self.stop_event.is_set() and time.monotonic() - self.started_at < MAX_SECONDS:
                self.step(conn)
                self.ops += 1
        except (OSError, ConnectionError):
            pass  # the broker is gone
        finally:
            conn.close()

    def step(self, conn: WireClient) -> None:
        raise NotImplementedError


class PlainProducer(Generator):
    """Pipelined bursts of plain puts to random partitions; records the acknowledged ones."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.seq = 0

    def step(self, conn: WireClient) -> None:
        burst = self.rnd.randint(1, 40)
        frames = []
        sent: dict[int, tuple[str, int, bytes]] = {}
        for _ in range(burst):
            self.seq += 1
            topic, part = self.rnd.choice(_TARGETS)
            body = plain_body(self.name, self.seq, self.rnd.randint(0, 200))
            sent[self.seq] = (topic, part, body)
            with self.ledger.lock:
                self.ledger.sent.add(body)
            frames.append(
                b"put %s %d %d 0 %d %d\r\n%b"
                % (topic.encode(), part, len(body), crc(body), self.seq, body)
            )
        conn.send(b"".join(frames))
        for r in conn.replies(burst):
            topic, part, body = sent[r.opaque]
            if r.code != 200:
                self.ledger.error(f"put {topic}-{part}: {r.code} {r.body[:200]!r}")
                continue
            mid, p, off = (int(x) for x in r.body.split())
            with self.ledger.lock:
                self.ledger.acked[body] = (topic, p, off, mid)


class LocalTxProducer(Generator):
    """BEGIN, 1-4 puts over random partitions, COMMIT_ONE_PHASE (75 %) or ROLLBACK, pipelined
    in one write; the decision is recorded as sent before the write."""

    def __init__(self, *a: object, session: str, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.session = session
        self.seq = 0

    def step(self, conn: WireClient) -> None:
        self.seq += 1
        key = f"TX:{self.session}:{self.seq}"
        k = self.rnd.randint(1, 4)
        commit = self.rnd.random() < 0.75
        kb = key.encode()
        sb = self.session.encode()
        frames = [b"transaction %s %s BEGIN 30 1\r\n" % (kb, sb)]
        for i in range(k):
            topic, part = self.rnd.choice(_TARGETS)
            body = tx_body(key, i, k, self.rnd.randint(0, 100))
            frames.append(
                b"put %s %d %d 0 %d %s 2\r\n%b"
                % (topic.encode(), part, len(body), crc(body), kb, body)
            )
        verb = b"COMMIT_ONE_PHASE" if commit else b"ROLLBACK"
        frames.append(b"transaction %s %s %s 3\r\n" % (kb, sb, verb))
        self.ledger.tx_state(key, OPEN, count=k)
        self.ledger.tx_state(key, COMMIT_SENT if commit else ROLLBACK_SENT)
        conn.send(b"".join(frames))
        replies = conn.replies(k + 2)
        bad = [r for r in replies if r.code != 200]
        if bad:
            self.ledger.error(f"{key}: {bad[0].code} {bad[0].body[:200]!r}")
            return
        self.ledger.tx_state(key, COMMITTED if commit else ROLLED_BACK)


class XaProducer(Generator):
    """XA: BEGIN, puts, END, PREPARE; then COMMIT_TWO_PHASE (50 %), ROLLBACK (25 %) or
    nothing (left prepared for the checker to resolve after the next restart)."""

    def __init__(self, *a: object, prefix: int, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.prefix = prefix
        self.seq = 0

    def step(self, conn: WireClient) -> None:
        self.seq += 1
        key = f"XID:1:{self.prefix:08x}{self.seq:08x}:beef:fq"
        kb = key.encode()
        k = self.rnd.randint(1, 3)
        frames = [b"transaction %s xa BEGIN 30 1\r\n" % kb]
        for i in range(k):
            topic, part = self.rnd.choice(_TARGETS)
            body = tx_body(key, i, k, self.rnd.randint(0, 100))
            frames.append(
                b"put %s %d %d 0 %d %s 2\r\n%b"
                % (topic.encode(), part, len(body), crc(body), kb, body)
            )
        frames.append(b"transaction %s xa END 3\r\n" % kb)
        frames.append(b"transaction %s xa PREPARE 4\r\n" % kb)
        self.ledger.tx_state(key, OPEN, xa=True, count=k)
        self.ledger.tx_state(key, PREPARE_SENT)
        conn.send(b"".join(frames))
        replies = conn.replies(k + 3)
        bad = [r for r in replies if r.code != 200]
        if bad:
            self.ledger.error(f"{key}: {bad[0].code} {bad[0].body[:200]!r}")
            return
        if replies[-1].body != b"0":
            self.ledger.error(f"{key}: PREPARE voted {replies[-1].body!r}")
            return
        self.ledger.tx_state(key, PREPARED)
        x = self.rnd.random()
        if x < 0.25:
            return  # stays prepared
        commit = x < 0.75
        verb = b"COMMIT_TWO_PHASE" if commit else b"ROLLBACK"
        self.ledger.tx_state(key, COMMIT_SENT if commit else ROLLBACK_SENT)
        conn.send(b"transaction %s xa %s 5\r\n" % (kb, verb))
        (r,) = conn.replies(1)
        if r.code != 200:
            self.ledger.error(f"{key} {verb.decode()}: {r.code} {r.body[:200]!r}")
            return
        self.ledger.tx_state(key, COMMITTED if commit else ROLLED_BACK)


class Consumer(Generator):
    """Reads every partition from where it got to; records what it was served."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.pos = dict.fromkeys(_TARGETS, 0)

    def step(self, conn: WireClient) -> None:
        got = 0
        for topic, part in _TARGETS:
            off = self.pos[(topic, part)]
            conn.send(b"get %s load %d %d 65536 9\r\n" % (topic.encode(), part, off))
            (r,) = conn.replies(1)
            if r.code == 404:
                continue
            if r.kind != "value":
                self.ledger.error(f"get {topic}-{part}@{off}: {r.code} {r.body[:200]!r}")
                continue
            recs, used = records.decode_all(r.body, off)
            with self.ledger.lock:
                for rec in recs:
                    self.ledger.known[(topic, part, rec.offset)] = (rec.msg_id, rec.body)
                self.ledger.served += len(recs)
            self.pos[(topic, part)] = off + used
            got += len(recs)
        if not got:
            time.sleep(0.005)
