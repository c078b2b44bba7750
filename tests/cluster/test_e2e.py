"""The cluster end to end: real ZooKeeper, broker processes, consumer-group members in
their own processes, one producer; brokers join, crash and return, ZooKeeper restarts,
the group goes 1 -> 4 -> 2 members (one graceful leave, one kill -9).

Checked: no acknowledged message is lost; duplicates are counted and come only from the
killed member's uncommitted work; a new broker is used within seconds and a dead one
avoided within its session timeout; rebalances finish within ~2 s of a graceful leave and
within session timeout + 2 s of a crash; everything is registered again after ZooKeeper
restarts; per-key placement is stable while the partition set is unchanged.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from notify.client import ClientConfig, ProducerConfig, connect
from tests.cluster.conftest import SESSION_S, ZkBrokers, zk_clients
from tests.helpers import timing, wait_until
from tests.services import ZooKeeperServer, _die_with_parent

pytestmark = [pytest.mark.slow, pytest.mark.crash]

TOPIC = "orders"
GROUP = "billing"
PARTS = 4


@dataclass
class Sent:
    at: float  # when the send began (the partition was chosen)
    payload: str
    key: str
    broker: int
    partition: str
    layout: tuple[str, ...]
    ok: bool


@dataclass
class LoadProducer:
    """One synchronous producer in a thread, resending failed messages until acked."""

    url: str
    sends: list[Sent] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        cfg = ClientConfig(
            zk_session_timeout_s=SESSION_S,
            request_timeout_s=2.0,
            connect_timeout_s=0.5,
            reconnect_backoff_max_s=0.5,
        )
        try:
            with connect(zk=self.url, config=cfg) as session:
                producer = session.create_producer(
                    ProducerConfig(retries=1, retry_backoff_s=0.05, raise_on_error=False)
                )
                n = 0
                while not self.stop.is_set():
                    payload, key = f"p{n}", f"k{n % 64}"
                    while not self.stop.is_set():
                        layout = tuple(str(p) for p in session.partitions(TOPIC))
                        began = time.monotonic()
                        r = producer.send(TOPIC, payload.encode(), key=key)
                        if tuple(str(p) for p in session.partitions(TOPIC)) != layout:
                            layout = ()  # the set changed during the send: not comparable
                        part = r.partition
                        self.sends.append(
                            Sent(
                                began,
                                payload,
                                key,
                                -1 if part is None else part.broker_id,
                                str(part),
                                layout,
                                r.success,
                            )
                        )
                        if r.success:
                            self.acked.add(payload)
                            break
                        time.sleep(0.01)
                    n += 1
                    time.sleep(0.002)
        except BaseException as e:  # reported by the test
            self.error.append(e)


class Worker:
    """A consumer_worker subprocess (dies with the test process)."""

    spawned: list[Worker] = []

    def __init__(self, tmp: Path, url: str, name: str):
        self.name = name
        self.out = tmp / f"{name}.out"
        self.log = tmp / f"{name}.log"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in reap
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.cluster.consumer_worker",
                url,
                GROUP,
                TOPIC,
                str(self.out),
                str(tmp / f"{name}.data"),
                name,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
            preexec_fn=_die_with_parent(signal.SIGKILL),
        )
        Worker.spawned.append(self)

    @property
    def tag(self) -> str:
        return f"-{self.proc.pid}-"

    def terminate(self, wait: bool = True) -> None:
        self.proc.send_signal(signal.SIGTERM)
        if wait:
            self.wait()

    def wait(self) -> None:
        assert self.proc.wait(20) == 0, self.log.read_text()[-3000:]
        self._log.close()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(autouse=True)
def _reap_workers() -> Iterator[None]:
    yield
    while Worker.spawned:
        Worker.spawned.pop().reap()


def owners(kz: KazooClient, root: str) -> dict[str, str]:
    base = f"{root}/consumers/{GROUP}/owners/{TOPIC}"
    out = {}
    for p in kz.get_children(base) if kz.exists(base) else []:
        try:
            out[p] = kz.get(f"{base}/{p}")[0].decode()
        except Exception:
            continue
    return out


def balanced(kz: KazooClient, root: str, brokers: list[int], workers: list[Worker]) -> bool:
    want = {f"{b}-{p}" for b in brokers for p in range(PARTS)}
    own = owners(kz, root)
    if set(own) != want:
        return False
    holders = collections.Counter(
        next((w.name for w in workers if w.tag in o), "?") for o in own.values()
    )
    if "?" in holders or set(holders) != {w.name for w in workers}:
        return False
    per, extra = divmod(len(want), len(workers))
    return sorted(holders.values()) == sorted([per + 1] * extra + [per] * (len(workers) - extra))


def registered(kz: KazooClient, root: str, brokers: list[int], workers: list[Worker]) -> bool:
    ids = f"{root}/consumers/{GROUP}/ids"
    members = kz.get_children(ids) if kz.exists(ids) else []
    return all(kz.exists(f"{root}/brokers/ids/{b}/master") for b in brokers) and all(
        any(w.tag in m for m in members) for w in workers
    )


def test_cluster_end_to_end(
    tmp_path: Path, zk_brokers: ZkBrokers, zookeeper: ZooKeeperServer, kz: KazooClient
) -> None:
    root = zk_brokers.root
    topics = {TOPIC: PARTS}
    brokers = {b: zk_brokers.start(b, topics) for b in range(3)}
    load = LoadProducer(zk_brokers.url)
    thread = threading.Thread(target=load.run, name="load-producer", daemon=True)
    workers: list[Worker] = []
    figures: dict[str, float] = {}
    try:
        workers.append(Worker(tmp_path, zk_brokers.url, "c1"))
        thread.start()
        wait_until(lambda: balanced(kz, root, [0, 1, 2], workers), 20)
        # 1 -> 4 members
        workers += [Worker(tmp_path, zk_brokers.url, f"c{i}") for i in (2, 3, 4)]
        figures["join_s"] = wait_until(lambda: balanced(kz, root, [0, 1, 2], workers), 20)

        # a broker joins under load: the producer uses it within seconds
        t_spawn = time.monotonic()
        brokers[3] = zk_brokers.start(3, topics)
        t_ready = time.monotonic()
        wait_until(lambda: any(s.ok and s.broker == 3 for s in load.sends[-500:]), 10)
        first = min(s.at for s in load.sends if s.ok and s.broker == 3)
        figures["new_broker_start_s"] = t_ready - t_spawn
        figures["new_broker_used_s"] = first - t_ready  # from the broker being ready
        wait_until(lambda: balanced(kz, root, [0, 1, 2, 3], workers), 15)

        # a broker dies: after its session expires the producer stops choosing it
        t_kill = time.monotonic()
        brokers[1].kill()
        wait_until(lambda: not kz.exists(f"{root}/brokers/ids/1/master"), SESSION_S + 5)
        wait_until(lambda: balanced(kz, root, [0, 2, 3], workers), 15)
        time.sleep(1.0)
        tried = [s.at for s in load.sends if s.broker == 1 and s.at > t_kill]
        figures["dead_broker_last_try_s"] = (max(tried) - t_kill) if tried else 0.0
        figures["failed_sends"] = sum(1 for s in load.sends if not s.ok)
        timing(figures["dead_broker_last_try_s"] < SESSION_S + 2.0, f"dead broker: {figures}")
        brokers[1].start()  # back with its data: consumers drain what it holds
        wait_until(lambda: balanced(kz, root, [0, 1, 2, 3], workers), 15)

        # ZooKeeper restarts mid-run: every registration is there again, work goes on
        n_before = len(load.acked)
        zookeeper.restart()
        clients = 4 + len(workers) + 2  # brokers, members, the producer, this test
        figures["zk_reconnected_s"] = wait_until(lambda: zk_clients(zookeeper) >= clients, 20)
        figures["zk_reregistered_s"] = wait_until(
            lambda: registered(kz, root, [0, 1, 2, 3], workers), 20
        )
        wait_until(lambda: balanced(kz, root, [0, 1, 2, 3], workers), 20)
        wait_until(lambda: len(load.acked) > n_before + 100, 20)

        # 4 -> 3 (graceful) -> 2 (kill -9)
        leaver, crasher = workers[3], workers[2]
        t0 = time.monotonic()
        leaver.terminate(wait=False)
        workers.remove(leaver)
        wait_until(lambda: balanced(kz, root, [0, 1, 2, 3], workers), 10)
        figures["graceful_rebalance_s"] = time.monotonic() - t0
        leaver.wait()
        t0 = time.monotonic()
        crasher.kill()
        workers.remove(crasher)
        wait_until(lambda: balanced(kz, root, [0, 1, 2, 3], workers), SESSION_S + 10)
        figures["crash_rebalance_s"] = time.monotonic() - t0
        time.sleep(0.5)
    finally:
        load.stop.set()
        thread.join(30)
    try:
        assert not load.error, load.error
        acked = load.acked
        seen: dict[str, list[tuple[str, str, int]]] = collections.defaultdict(list)

        def read_all() -> None:
            seen.clear()
            for f in tmp_path.glob("c*.out"):
                for line in f.read_text().splitlines():
                    name, part, off, payload = line.split()
                    seen[payload].append((name, part, int(off)))

        def all_seen() -> bool:
            read_all()
            return acked <= seen.keys()

        wait_until(all_seen, 30, 0.2)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.reap()
    read_all()
    deliveries = collections.Counter(
        (part, off) for recs in seen.values() for _n, part, off in recs
    )
    dup_keys = {k for k, n in deliveries.items() if n > 1}
    receivers: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    for recs in seen.values():
        for name, part, off in recs:
            if (part, off) in dup_keys:
                receivers[(part, off)].add(name)
    lost_sessions = [w for w in ("c1", "c2", "c3", "c4") if "session lost" in _log(tmp_path, w)]
    report = {
        **{k: round(v, 2) for k, v in figures.items()},
        "acked": len(acked),
        "delivered": sum(deliveries.values()),
        "duplicates": sum(n - 1 for n in deliveries.values()),
        "producer_duplicates": sum(1 for p in acked if len({(q, o) for _, q, o in seen[p]}) > 1),
        "sessions_lost": len(lost_sessions),
    }
    print("cluster e2e:", report)
    if os.environ.get("E2E_DEBUG"):
        by_part = collections.Counter((k[0], tuple(sorted(v))) for k, v in receivers.items())
        print("dups by partition/receivers:", sorted(by_part.items()))
        print("sizes", {f.name: len(f.read_text().splitlines()) for f in tmp_path.glob("c*.out")})
        for name in ("c1", "c2", "c3", "c4"):
            bad = [
                ln
                for ln in _log(tmp_path, name).splitlines()
                if "kazoo" not in ln and "Connection" not in ln
            ]
            print(name, bad[:5])
    assert acked <= seen.keys()  # nothing acknowledged is lost
    # duplicates only across a rebalance: the killed member's uncommitted work, taken over
    # by another member (or a member that lost its session and claimed again)
    for key, names in receivers.items():
        assert "c3" in names or set(names) & set(lost_sessions), (key, names)
    assert report["duplicates"] < 2000, report
    timing(figures["new_broker_used_s"] < 3.0, f"new broker used: {figures}")
    timing(figures["graceful_rebalance_s"] < 2.0, f"graceful rebalance: {figures}")
    timing(figures["crash_rebalance_s"] < SESSION_S + 2.5, f"crash rebalance: {figures}")
    # per-key placement is stable while the partition set is unchanged
    placement: dict[tuple[str, tuple[str, ...]], set[str]] = collections.defaultdict(set)
    for s in load.sends:
        if s.ok and s.layout:
            placement[(s.key, s.layout)].add(s.partition)
    unstable = {k: v for k, v in placement.items() if len(v) > 1}
    assert not unstable, list(unstable.items())[:3]


def _log(tmp: Path, name: str) -> str:
    try:
        return (tmp / f"{name}.log").read_text(errors="replace")
    except OSError:
        return ""
