"""Queue consumers in ZooKeeper (README "Queues", cluster mode): a consumer whose session
ends while its TCP connection stays open (SIGSTOP) is dropped by the broker, and what it
held goes to another consumer at once, long before the lock timeout; thawed, it registers
and subscribes again by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kazoo.client import KazooClient

from notify.client import ClientConfig, connect
from tests.cluster.conftest import SESSION_S, ZkBrokers
from tests.helpers import WireClient, timing, wait_until


def _lines(path: Path) -> set[tuple[int, int]]:
    if not path.exists():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        p, o = line.split()
        out.add((int(p), int(o)))
    return out


def test_frozen_queue_consumer_is_removed_when_its_session_ends(
    zk_brokers: ZkBrokers, kz: KazooClient, tmp_path: Path
) -> None:
    b = zk_brokers.start(1, {"jobs": 2}, queueLockTimeout=60000)  # the lock cannot do it
    cfg = ClientConfig(zk_session_timeout_s=SESSION_S)
    with WireClient(b.addr) as w:
        w.send(b"".join(b"put jobs %d 2 0 %d\r\nj%d" % (i % 2, i + 1, i) for i in range(10)))
        assert all(r.code == 200 for r in w.replies(10))
    # a qsub naming a consumer id nobody registered is refused
    with WireClient(b.addr) as w:
        r = w.call(b"qsub jobs workers 4 earliest nobody_h-1-2-3 7\r\n")
        assert r.code == 409 and b"queue-ids/jobs/nobody_h-1-2-3" in r.body, r

    out = tmp_path / "frozen.txt"
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.queue_worker", zk_brokers.url, "jobs", "workers",
         "4", str(out)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        wait_until(lambda: len(_lines(out)) == 4, 10)
        held = _lines(out)
        ids = kz.get_children(f"{zk_brokers.root}/consumers/workers/queue-ids/jobs")
        assert len(ids) == 1 and ids[0].startswith("workers_"), ids
        with connect(zk=zk_brokers.url, config=cfg) as session:
            c = session.create_queue_consumer("jobs", "workers", credit=100)
            got: dict[tuple[int, int], float] = {}

            def drain(until: float) -> None:
                while time.monotonic() < until and len(got) < 10:
                    m = c.get(0.05)
                    if m is not None:
                        got[(m.partition, m.offset)] = time.monotonic()
                        assert m.ack()

            drain(time.monotonic() + 1.0)
            assert len(got) == 6 and not set(got) & held  # the frozen one's share is held
            os.kill(worker.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            drain(t0 + 4 * SESSION_S + 2)
            assert held <= set(got) and len(got) == 10, sorted(got)
            took = max(got[k] for k in held) - t0
            print(f"frozen consumer's messages redelivered after {took:.2f} s")
            # session timeout plus ZooKeeper's expiry tick (the drain above ends far below
            # the 60 s lock)
            timing(took < 2 * SESSION_S + 1.5, f"redelivered {took:.2f} s after the freeze")
        with WireClient(b.addr) as w:
            body = w.call(b"stats queues 3\r\n").body.decode()
        assert "zk_removed=1" in body, body
        # thawed, it registers again (a new session) and is served again by itself
        os.kill(worker.pid, signal.SIGCONT)
        with WireClient(b.addr) as w:
            w.send(b"".join(b"put jobs %d 2 0 %d\r\nk%d" % (i % 2, i, i) for i in range(3)))
            assert all(r.code == 200 for r in w.replies(3))
        t1 = time.monotonic()
        wait_until(lambda: len(_lines(out)) == 4 + 3, 15)
        print(f"thawed consumer served again after {time.monotonic() - t1:.2f} s")
    finally:
        worker.kill()  # frozen or not: nothing to shut down gracefully
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
