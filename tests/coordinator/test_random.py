"""Randomized crash run: an application doing 2PC transactions (PostgreSQL + MariaDB +
broker) is SIGKILLed at random moments or crashpoints, the broker is killed at random
moments or its own crashpoints, and after all of it every resource agrees.

Defaults: at least 300 transactions begun and 12 kill rounds, at most 55 s of kills. Bigger:
``NOTIFY_XA_RANDOM_TXS=5000 NOTIFY_XA_RANDOM_BUDGET_S=900``; ``NOTIFY_XA_RANDOM_SEED``
replays a run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from notify.testing import BrokerProcess
from tests.coordinator.conftest import Env, MakeTM
from tests.coordinator.test_crash import COORDINATOR_POINTS, agree, run_app

TXS = int(os.environ.get("NOTIFY_XA_RANDOM_TXS", "300"))
BUDGET_S = float(os.environ.get("NOTIFY_XA_RANDOM_BUDGET_S", "55"))
MIN_ROUNDS = 12
BROKER_POINTS = ["after_prepare_record", "after_commit_record", "mid_apply", "after_apply"]


def start_broker(b: BrokerProcess) -> None:
    """Start ``b``; with a crashpoint armed it may already die while starting (the running
    application reaches the point before ``start`` sees the broker ready): that is fine."""
    try:
        b.start()
    except RuntimeError:
        if not b.env or "crashpoint" not in b.log_tail(5):
            raise


def parse_ack(path: Path) -> tuple[set[int], set[int], dict[int, str]]:
    begun, ok, failed = set(), set(), {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                k = int(parts[1])
                if parts[0] == "b":
                    begun.add(k)
                elif parts[0] == "ok":
                    ok.add(k)
                elif parts[0] == "fail" and len(parts) == 3:
                    failed[k] = parts[2]
    return begun, ok, failed


@pytest.mark.crash
@pytest.mark.slow
def test_random_kills(env3: Env, make_tm: MakeTM, tmp_path: Path) -> None:
    seed = int(os.environ.get("NOTIFY_XA_RANDOM_SEED", str(time.time_ns() % 10**9)))
    rng = random.Random(seed)
    b = env3.broker
    log, ack = tmp_path / "xa", tmp_path / "ack"
    stats: Counter[str] = Counter()
    t0 = time.monotonic()
    next_k = 0
    begun: set[int] = set()
    while (len(begun) < TXS or stats["rounds"] < MIN_ROUNDS) and (time.monotonic() - t0 < BUDGET_S):
        point = None
        if rng.random() < 0.3:
            point = rng.choice(COORDINATOR_POINTS)[0]
            stats["coordinator crashpoints"] += 1
        app = run_app(env3, log, ack, next_k, 10**6, point, threads=rng.choice([1, 2, 4]))
        run_for = rng.uniform(0.8, 2.0)
        kill_broker_at = rng.uniform(0.4, run_for) if rng.random() < 0.35 else None
        if kill_broker_at is not None:
            try:
                app.wait(kill_broker_at)
            except subprocess.TimeoutExpired:
                b.kill()
                stats["broker SIGKILLs"] += 1
                if rng.random() < 0.5:
                    b.env = {"NOTIFY_CRASHPOINTS": rng.choice(BROKER_POINTS)}
                    stats["broker crashpoints armed"] += 1
                start_broker(b)
        try:
            app.wait(max(0.0, run_for - (kill_broker_at or 0.0)))
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()
            stats["coordinator SIGKILLs"] += 1
        assert app.returncode in (-signal.SIGKILL, 0), app.returncode
        if app.returncode == -signal.SIGKILL and point is not None:
            stats["coordinator crashpoints hit"] += 1
        if b.proc is None or b.proc.poll() is not None:  # died at its crashpoint
            stats["broker crashpoints hit"] += int(bool(b.env))
            b.kill()
            b.env = {}
            b.start()
        elif b.env and rng.random() < 0.5:  # disarm a crashpoint nobody reached
            b.env = {}
            b.restart()
        begun, _, _ = parse_ack(ack)
        next_k = max(begun, default=-1) + 1
        stats["rounds"] += 1
    # the end: a broker without crashpoints, a coordinator restart that recovers everything
    if b.env or b.proc is None or b.proc.poll() is not None:
        b.env = {}
        b.restart(kill=True)
    tm = make_tm(env3, coordinator_id="app")
    assert tm.last_recovery is not None and tm.last_recovery.clean, tm.last_recovery
    rows = agree(env3)
    begun, ok, failed = parse_ack(ack)
    assert ok <= rows, "acknowledged commits lost"
    assert rows <= begun
    rolled = {k for k, why in failed.items() if why in ("RollbackError", "TransactionTimeoutError")}
    assert not rows & rolled, "reported rolled back, but committed"
    assert tm.heuristics() == []
    assert tm.decisions.decisions() == []
    print(
        f"\nseed {seed}: {len(begun)} begun, {len(rows)} committed ({len(ok)} acknowledged), "
        f"{len(failed)} failed {dict(Counter(failed.values()))}, {dict(stats)}"
        f" in {time.monotonic() - t0:.1f}s"
    )
    errors = ack.with_suffix(".err").read_text()
    assert "Traceback" not in errors, errors[-3000:]
    assert len(begun) >= min(TXS, 100)
