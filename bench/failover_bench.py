"""Automatic failover, repeated: kill -9 the master of a two-broker group at random moments
under load and measure how long producers wait, and whether anything acknowledged is lost.

    .venv/bin/python bench/failover_bench.py [--rounds 10] [--seed 1] [--session-ms 2000]

A real ZooKeeper (``tests/services.py``) and two broker processes of broker id 1, each the
other's synchronous slave (``syncSlave``, ``syncSlaveFailurePolicy=async`` so that the new
master takes writes while the old one is down), ``autoFailover=true``, 2 s sessions. A
producer thread writes puts (and a committed local transaction every 10th message) to
whichever broker answers as master. Each round: wait 0.5-2.5 s (random), ``kill -9`` the
master, measure the time until the producer's next acknowledgement (from the other broker),
restart the killed broker (it rejoins as a slave) and wait until the master reports its
synchronous slave in sync. At the end every acknowledged message must be on the last master
exactly once. Prints a table of failover times (p50/p99/max) and losses.
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
from tests.broker.test_transactions import read_all, stats, tput, tx
from tests.services import ZooKeeperServer
from tests.wireclient import WireClient

TOPIC = "orders"


class Producer(threading.Thread):
    """Writes to whichever of ``addrs`` takes writes; records every acknowledged body."""

    def __init__(self, addrs: list[str]):
        super().__init__(daemon=True)
        self.addrs = addrs
        self.acked: list[bytes] = []
        self.last_ack = time.monotonic()
        self.stop_flag = threading.Event()
        self.errors = 0

    def run(self) -> None:
        n = 0
        i = 0
        conn: WireClient | None = None
        while not self.stop_flag.is_set():
            addr = self.addrs[i % len(self.addrs)]
            try:
                if conn is None:
                    conn = WireClient(addr, timeout=2.0)
                body = b"m%d" % n
                if n % 10 == 9:  # a committed local transaction
                    key = f"TX:bench:{n}"
                    if tx(conn, key, "BEGIN")[0] != 200:
                        raise OSError("refused")
                    tput(conn, TOPIC, 0, body, key)
                    ok = tx(conn, key, "COMMIT_ONE_PHASE")[0] == 200
                else:
                    ok = conn.put(TOPIC, 0, body).code == 200
                if not ok:
                    raise OSError("refused")
                self.acked.append(body)
                self.last_ack = time.monotonic()
                n += 1
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
        # every acknowledged message on the last master, exactly once
        _wait(lambda: stats(master.addr).get("sync_slave_state") == "in_sync", 10)
        stored = [r.body for r in read_all(master.addr, TOPIC, 0)]
        counts: dict[bytes, int] = {}
        for body in stored:
            counts[body] = counts.get(body, 0) + 1
        lost = [x for x in prod.acked if x not in counts]
        dups = sum(1 for c in counts.values() if c > 1)
        old = a if master is b else b
        same = _wait(lambda: _segments(a) == _segments(b), 10)
        print(f"last master {master.addr}, slave {old.addr}, producer errors {prod.errors}")
        ts = sorted(times)
        p99 = ts[min(len(ts) - 1, round(0.99 * (len(ts) - 1)))]
        print()
        print("| rounds | session | failover p50 | p99 | max | acked | lost | dup | bytes equal |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        print(
            f"| {len(ts)} | {args.session_ms} ms | {statistics.median(ts):.2f} s | {p99:.2f} s "
            f"| {ts[-1]:.2f} s | {len(prod.acked)} | {len(lost)} | {dups} | {same} |"
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
