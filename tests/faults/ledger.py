"""What clients were told, and an independent checker of what the broker serves.

The load generators (``tests/faults/load.py``) write only what the broker acknowledged into
a :class:`Ledger`: plain puts with their (partition, offset, id), and each transaction's
state as far as its client knows it. :func:`check` then reads every partition from offset
0 with raw ``get`` frames (every record CRC-checked by the decoder) and compares, without
using any broker code path but the wire:

* no acknowledged message lost (present at its offset with its id and body);
* no message stored twice (bodies are unique; ids too);
* no transaction partly visible (each message carries ``<i>/<k>`` of its transaction);
* nothing of a rolled-back (or never committed) transaction visible, all of a committed one;
* what a consumer was served before a crash, and what an earlier check saw, never changes;
* no record that no client ever sent (phantoms).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from notify.protocol import records
from tests.helpers import WireClient

TOPICS: dict[str, int] = {"fa": 4, "fb": 2}

# transaction states, as the client knows them
OPEN = "open"  # BEGIN sent, no decision sent (local: rolled back at restart)
COMMIT_SENT = "commit_sent"  # outcome unknown: all or nothing
COMMITTED = "committed"  # commit acknowledged: all
ROLLBACK_SENT = "rollback_sent"  # nothing
ROLLED_BACK = "rolled_back"  # nothing
PREPARE_SENT = "prepare_sent"  # XA: prepared after restart (RECOVER lists it) or nothing
PREPARED = "prepared"  # XA: PREPARE acknowledged: must come back prepared


@dataclass
class TxInfo:
    key: str
    xa: bool
    count: int
    state: str


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: body -> (topic, partition, offset, msg id) of every acknowledged plain put
    acked: dict[bytes, tuple[str, int, int, int]] = field(default_factory=dict)
    #: bodies of every plain put ever sent (acknowledged or not)
    sent: set[bytes] = field(default_factory=set)
    txs: dict[str, TxInfo] = field(default_factory=dict)
    #: (topic, partition, offset) -> (msg id, body): served to a consumer, or seen by a check
    known: dict[tuple[str, int, int], tuple[int, bytes]] = field(default_factory=dict)
    served: int = 0
    unexpected: list[str] = field(default_factory=list)

    def tx_state(self, key: str, state: str, xa: bool = False, count: int = 0) -> None:
        with self.lock:
            info = self.txs.get(key)
            if info is None:
                self.txs[key] = TxInfo(key, xa, count, state)
            else:
                info.state = state
                if count:
                    info.count = count

    def error(self, what: str) -> None:
        with self.lock:
            self.unexpected.append(what)


def plain_body(producer: str, seq: int, pad: int) -> bytes:
    return b"P|%s|%d|" % (producer.encode(), seq) + b"p" * pad


def tx_body(key: str, i: int, k: int, pad: int) -> bytes:
    return b"T|%s|%d|%d|" % (key.encode(), i, k) + b"t" * pad


def read_partition(c: WireClient, topic: str, part: int) -> list[records.Record]:
    out: list[records.Record] = []
    off = 0
    for _ in range(1_000_000):
        r = c.call(b"get %s chk %d %d 1048576 1\r\n" % (topic.encode(), part, off))
        if r.code == 404:
            return out
        if r.kind != "value":
            raise AssertionError(f"get {topic}-{part}@{off}: {r.code} {r.body[:200]!r}")
        recs, used = records.decode_all(r.body, off)  # raises on a bad CRC
        if used <= 0:
            raise AssertionError(f"get {topic}-{part}@{off}: no whole record in the window")
        out += recs
        off += used
    raise AssertionError("read_partition did not end")


@dataclass
class CheckResult:
    records: int = 0
    plain_checked: int = 0
    tx_checked: int = 0
    violations: list[str] = field(default_factory=list)
    visible_tx: dict[str, int] = field(default_factory=dict)


def check(addr: str, ledger: Ledger, prepared: set[str]) -> CheckResult:
    """Compare everything the broker serves with the ledger. ``prepared``: the XA keys
    RECOVER lists (they must show nothing yet)."""
    res = CheckResult()
    v = res.violations
    by_body: dict[bytes, tuple[str, int, int, int]] = {}
    ids: dict[int, tuple[str, int, int]] = {}
    tx_seen: dict[str, list[int]] = {}
    with WireClient(addr, timeout=30) as c:
        for topic, n in TOPICS.items():
            for part in range(n):
                for r in read_partition(c, topic, part):
                    res.records += 1
                    where = (topic, part, r.offset)
                    if r.body in by_body:
                        v.append(f"duplicate: {r.body[:60]!r} at {where} and {by_body[r.body]}")
                    by_body[r.body] = (topic, part, r.offset, r.msg_id)
                    if r.msg_id in ids:
                        v.append(f"duplicate id {r.msg_id} at {where} and {ids[r.msg_id]}")
                    ids[r.msg_id] = where
                    seen = ledger.known.get(where)
                    if seen is not None and seen != (r.msg_id, r.body):
                        v.append(f"record at {where} changed: was {seen[1][:60]!r} id {seen[0]}")
                    ledger.known[where] = (r.msg_id, r.body)
                    if r.body.startswith(b"T|"):
                        _, kb, i, k, _pad = r.body.split(b"|", 4)
                        tkey = kb.decode()
                        tx_seen.setdefault(tkey, []).append(int(i))
                        tinfo = ledger.txs.get(tkey)
                        if tinfo is not None and tinfo.count != int(k):
                            v.append(f"transaction {tkey}: record says {int(k)} messages")
                    elif r.body not in ledger.sent:
                        v.append(f"phantom record {r.body[:60]!r} at {where}")
    # what consumers (and earlier checks) saw is still there
    for where, (mid, body) in ledger.known.items():
        got = by_body.get(body)
        if got is None or got[:3] != where or got[3] != mid:
            v.append(f"record seen earlier at {where} ({body[:60]!r}) is gone or moved: {got}")
    for body, (topic, part, off, mid) in ledger.acked.items():
        res.plain_checked += 1
        got = by_body.get(body)
        if got is None:
            v.append(f"LOST acknowledged message {body[:60]!r} ({topic}-{part}@{off})")
        elif got != (topic, part, off, mid):
            v.append(f"acknowledged message {body[:60]!r} at {got}, acked at {off} id {mid}")
    for key, info in ledger.txs.items():
        res.tx_checked += 1
        idx = sorted(tx_seen.get(key, []))
        n = len(idx)
        res.visible_tx[key] = n
        if n and idx != list(range(info.count)):
            v.append(f"transaction {key} PARTLY visible: messages {idx} of {info.count}")
            continue
        must_all = info.state == COMMITTED
        must_none = info.state in (OPEN, ROLLBACK_SENT, ROLLED_BACK) or key in prepared
        if info.state == PREPARED and key not in prepared:
            v.append(f"XA transaction {key}: PREPARE was acknowledged but RECOVER lost it")
        if must_all and n != info.count:
            v.append(f"committed transaction {key} ({info.state}) shows {n}/{info.count}")
        if must_none and n:
            v.append(f"transaction {key} ({info.state}) shows {n}/{info.count} messages")
    for key in tx_seen:
        if key not in ledger.txs:
            v.append(f"phantom transaction {key}")
    return res


def settle(ledger: Ledger, result: CheckResult, prepared: set[str]) -> None:
    """After a check: unknown outcomes become what the store shows (they must never change
    again), so later checks hold the broker to them."""
    for key, info in ledger.txs.items():
        if key in prepared:
            info.state = PREPARED
            continue
        n = result.visible_tx.get(key, 0)
        if info.state in (COMMIT_SENT, PREPARE_SENT, PREPARED, OPEN):
            info.state = COMMITTED if n == info.count and n else ROLLED_BACK
