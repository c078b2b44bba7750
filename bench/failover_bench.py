"""Automatic failover, repeated: kill -9 the master of a two-broker group at random moments
under load and measure how long producers wait, and whether anything acknowledged is lost.

    .venv/bin/python bench/failover_bench.py [--rounds 10] [--seed 1] [--session-ms 2000]

A real ZooKeeper (``tests/services.py``) and two broker processes of broker id 1, each the
other's synchronous slave (``syncSlave``, ``syncSlaveFailurePolicy=async`` so that the new
master takes writes while the old one is down), ``autoFailover=true``, 2 s sessions. A
producer thread writes a mixed load to whichever broker answers as master: puts, a
committed local transaction every 10th message and an XA transaction (two-phase) every 10th
+ 5, committed once three newer branches are prepared (so a kill usually finds some
acknowledged prepared); as the XA coordinator it commits on the new master every branch it
saw acknowledged prepared and had not committed (and rolls back those whose PREPARE was not
answered). Each round: wait 0.5-2.5 s (random), ``kill -9`` the
master, measure the time until the producer's next acknowledgement (from the other broker),
restart the killed broker (it rejoins as a slave) and wait until the master reports its
synchronous slave in sync. At the end every acknowledged message must be on the last master
exactly once (an XA COMMIT answered XAER_NOTA after a failover counts as lost unless its
message is there) and RECOVER on it must list no branch. Prints a table of failover times
(p50/p99/max), the XA branches (committed; of them, prepared before a kill and committed on
the new master), losses, duplicates and branches left in doubt.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, read_all, stats, tput, tx, xid
from tests.services import ZooKeeperServer

TOPIC = "orders"
#: prepared XA branches the coordinator holds before committing the oldest
XA_HELD = 3


class Producer(threading.Thread):
    """Writes to whichever of ``addrs`` takes writes; records every acknowledged body.

    Mixed load: puts, a committed local transaction every 10th message and an XA
    transaction (BEGIN, put, END, PREPARE, COMMIT_TWO_PHASE) every 10th + 5. It is also the
    XA coordinator: a branch whose PREPARE was acknowledged but whose COMMIT was not
    answered (the master died) is committed on whichever broker takes writes next; one
    whose PREPARE was not answered is rolled back there."""

    def __init__(self, addrs: list[str]):
        super().__init__(daemon=True)
        self.addrs = addrs
        self.acked: list[bytes] = []
        self.last_ack = time.monotonic()
        self.stop_flag = threading.Event()
        self.errors = 0
        #: XA branches acknowledged prepared whose COMMIT is not answered yet: xid -> body
        self.to_commit: dict[str, bytes] = {}
        #: branches whose PREPARE was not answered (outcome unknown): roll back
        self.to_rollback: set[str] = set()
        self.xa_committed = 0
        self.xa_resolved_after_failover = 0
        #: COMMIT answered XAER_NOTA after a failover: in doubt until the end's check
        self.xa_in_doubt: list[bytes] = []
        self.local_committed = 0

    def _resolve(self, conn: WireClient) -> None:
        """The coordinator's recovery on the broker taking writes now."""
        for key, body in list(self.to_commit.items()):
            code, reply = tx(conn, key, "COMMIT_TWO_PHASE")
            if code == 200:
                self.acked.append(body)
                self.xa_resolved_after_failover += 1
            elif b"code=-4" in reply:  # XAER_NOTA: committed before, or lost
                self.xa_in_doubt.append(body)
            else:
                raise OSError("refused")
            del self.to_commit[key]
        for key in list(self.to_rollback):
            code, reply = tx(conn, key, "ROLLBACK")
            if code != 200 and b"code=-4" not in reply:
                raise OSError("refused")
            self.to_rollback.discard(key)

    def _xa(self, conn: WireClient, key: str, body: bytes) -> bool:
        """One branch to PREPARE; the coordinator commits a branch once ``XA_HELD`` newer
        ones are prepared (so a kill usually finds some acknowledged prepared)."""
        if tx(conn, key, "BEGIN", " 60")[0] != 200:
            return False
        tput(conn, TOPIC, 0, body, key)
        if tx(conn, key, "END")[0] != 200:
            return False
        self.to_rollback.add(key)
        if tx(conn, key, "PREPARE") != (200, b"0"):
            return False
        self.to_rollback.discard(key)
        self.to_commit[key] = body
        while len(self.to_commit) > XA_HELD:
            old = next(iter(self.to_commit))
            if tx(conn, old, "COMMIT_TWO_PHASE")[0] != 200:
                return False
            self.acked.append(self.to_commit.pop(old))
            self.xa_committed += 1
        return True

    def finish(self, addr: str) -> None:
        """The coordinator commits the branches still prepared at the end."""
        with WireClient(addr) as conn:
            for key, body in list(self.to_commit.items()):
                if tx(conn, key, "COMMIT_TWO_PHASE")[0] == 200:
                    self.acked.append(body)
                    self.xa_committed += 1
                    del self.to_commit[key]

    def run(self) -> None:
        n = 0
        i = 0
        conn: WireClient | None = None
        while not self.stop_flag.is_set():
            addr = self.addrs[i % len(self.addrs)]
            try:
                if conn is None:
                    conn = WireClient(addr, timeout=2.0)
                    if self.to_commit or self.to_rollback:  # after a failure: recovery
                        self._resolve(conn)
                body = b"m%d" % n
                k, n = n, n + 1  # a body (and xid) is never reused, acknowledged or not
                if k % 10 == 9:  # a committed local transaction
                    key = f"TX:bench:{k}"
                    if tx(conn, key, "BEGIN")[0] != 200:
                        raise OSError("refused")
                    tput(conn, TOPIC, 0, body, key)
                    ok = tx(conn, key, "COMMIT_ONE_PHASE")[0] == 200
                    self.local_committed += ok
                elif k % 10 == 4:  # an XA transaction, two-phase
                    ok = self._xa(conn, xid(k, "bench"), body)
                else:
                    ok = conn.put(TOPIC, 0, body).code == 200
                if not ok:
                    raise OSError("refused")
                if k % 10 != 4:  # an XA message counts once committed
                    self.acked.append(body)
                self.last_ack = time.monotonic()
                time.sleep(0.002)
            except (OSError, AssertionError, ValueError):
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                i += 1  # try the other broker
                time.sleep(0.02)
        if conn is not None:
            conn.close()


def _wait(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():  # type: ignore[operator]
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    zk = ZooKeeperServer(tmp / "zk").start()
    procs: list[BrokerProcess] = []
    try:
        pa, pb = free_port(), free_port()
        zkc = {
            "zkEnable": True,
            "zkConnect": zk.connect,
            "zkRoot": "/bench",
            "zkSessionTimeoutMs": args.session_ms,
            "zkConnectionTimeoutMs": 5000,
        }
        common = {
            "brokerId": 1,
            "replicationSecret": "bench-rs",
            "autoFailover": "true",
            "syncSlaveTimeout": 1000,
            "syncSlaveFailurePolicy": "async",
        }
        a = BrokerProcess(
            tmp / "a",
            topics={TOPIC: 1},
            log_level=args.log_level,
            system={**common, "syncSlave": f"127.0.0.1:{pb}"},
            zookeeper=zkc,
        )
        a.port = pa
        b = BrokerProcess(
            tmp / "b",
            topics={TOPIC: 1},
            log_level=args.log_level,
            system={**common, "syncSlave": f"127.0.0.1:{pa}"},
            slave={"slaveId": 1, "masterAddress": f"127.0.0.1:{pa}", "slaveMaxDelayInMills": 100},
            zookeeper=zkc,
        )
        b.port = pb
        procs += [a, b]
        a.start()
        b.start()
        master = a
        if not _wait(lambda: stats(a.addr).get("sync_slave_state") == "in_sync", 20):
            raise SystemExit("the group did not get in sync")
        prod = Producer([a.addr, b.addr])
        prod.start()
        times: list[float] = []
        for rnd in range(args.rounds):
            time.sleep(rng.uniform(0.5, 2.5))
            other = b if master is a else a
            before = len(prod.acked)
            t_kill = time.monotonic()
            master.kill()
            def moved(t: float = t_kill, n: int = before) -> bool:
                return prod.last_ack > t and len(prod.acked) > n + 1  # +1: an ack in flight

            if not _wait(moved, 30):
                raise SystemExit(f"round {rnd}: no failover within 30 s")
            took = prod.last_ack - t_kill
            times.append(took)
            epoch = stats(other.addr).get("failover_epoch")
            print(f"round {rnd + 1}: failover {took:.2f}s (epoch {epoch})", flush=True)
            master.start()  # rejoins as a slave of `other`
            old, master = master, other
            addr = master.addr
            synced = _wait(lambda a=addr: stats(a).get("sync_slave_state") == "in_sync", 30)
            if not synced or stats(old.addr).get("role") != "slave":
                raise SystemExit(f"round {rnd}: the restarted broker did not rejoin in sync")
        prod.stop_flag.set()
        prod.join(10)
        prod.finish(master.addr)
        # every acknowledged message on the last master, exactly once
        _wait(lambda: stats(master.addr).get("sync_slave_state") == "in_sync", 10)
        stored = [r.body for r in read_all(master.addr, TOPIC, 0)]
        counts: dict[bytes, int] = {}
        for body in stored:
            counts[body] = counts.get(body, 0) + 1
        lost = [x for x in prod.acked if x not in counts]
        # a COMMIT answered XAER_NOTA after a failover: fine if the branch's message is there
        lost += [x for x in prod.xa_in_doubt if x not in counts]
        dups = sum(1 for c in counts.values() if c > 1)
        with WireClient(master.addr) as c:  # every prepared branch resolved by the coordinator
            r = c.call(b"transaction null s9 RECOVER bench 4\r\n")
            left = len([x for x in r.body.split(b"\r\n") if x]) if r.code == 200 else -1
        old = a if master is b else b
        same = _wait(lambda: _segments(a) == _segments(b), 10)
        print(f"last master {master.addr}, slave {old.addr}, producer errors {prod.errors}")
        print(
            f"load: {len(prod.acked)} acknowledged ({prod.local_committed} local tx, "
            f"{prod.xa_committed + prod.xa_resolved_after_failover} XA committed, of which "
            f"{prod.xa_resolved_after_failover} prepared before a failure and committed on the "
            f"new master; {len(prod.xa_in_doubt)} answered XAER_NOTA); prepared branches left "
            f"in RECOVER: {left}; unresolved at the end: {len(prod.to_commit)}"
        )
        ts = sorted(times)
        p99 = ts[min(len(ts) - 1, round(0.99 * (len(ts) - 1)))]
        print()
        print(
            "| rounds | session | failover p50 | p99 | max | acked | XA | XA by recovery "
            "| lost | dup | prepared left | bytes equal |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        print(
            f"| {len(ts)} | {args.session_ms} ms | {statistics.median(ts):.2f} s | {p99:.2f} s "
            f"| {ts[-1]:.2f} s | {len(prod.acked)} "
            f"| {prod.xa_committed + prod.xa_resolved_after_failover} "
            f"| {prod.xa_resolved_after_failover} | {len(lost)} | {dups} "
            f"| {left + len(prod.to_commit)} | {same} |"
        )
        if lost:
            print("lost (first 10):", lost[:10])
    finally:
        for bp in procs:
            bp.kill()
        zk.close()


def _segments(bp: BrokerProcess) -> bytes:
    d = bp.data_dir / f"{TOPIC}-0"
    return b"".join(p.read_bytes() for p in sorted(d.iterdir()) if re.search(r"\.meta$", p.name))


if __name__ == "__main__":
    main()
