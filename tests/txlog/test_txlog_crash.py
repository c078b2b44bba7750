"""A real crash: SIGKILL a committing process, reopen, check every acknowledged record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crash_writer import body_for

from notify.txlog import Position, TxLog, TxLogConfig, encode

WRITER = Path(__file__).with_name("crash_writer.py")
CONFIG = TxLogConfig(segment_bytes=1 << 20, flush_at_commit=1)


Acked = dict[Position, tuple[str, int]]


def run_and_kill(logdir: Path, run: str, acks_wanted: int) -> tuple[Acked, int]:
    """Start the writer, SIGKILL it after ``acks_wanted`` acknowledgements.

    Returns the acknowledgements and the bytes the writer's recovery truncated on open.
    """
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(logdir), run, "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    acked: Acked = {}
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 20
        first = proc.stdout.readline()
        assert first.startswith(b"OPEN"), first + (proc.stderr.read() if proc.stderr else b"")
        truncated = int(first.split()[1])
        while len(acked) < acks_wanted and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            _, file_no, offset, key, size = line.split()
            acked[Position(int(file_no), int(offset))] = (key.decode(), int(size))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest, err = proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    for line in rest.splitlines(keepends=True):
        if line.endswith(b"\n"):  # complete lines were acknowledged before the kill
            _, file_no, offset, key, size = line.split()
            acked[Position(int(file_no), int(offset))] = (key.decode(), int(size))
    assert len(acked) >= acks_wanted // 2, err.decode()
    return acked, truncated


def check(logdir: Path, acked: Acked) -> None:
    """Every acknowledged record is replayed intact; everything replayed is well-formed."""
    with TxLog.open(logdir, CONFIG) as log:
        replayed: dict[Position, tuple[str, int]] = {}
        for pos, rtype, body in log.replay():
            run, thread, seq, _ = body.split(b":", 3)
            key = b":".join((run, thread, seq)).decode()
            size = len(body) - len(key) - 1
            assert rtype == 3
            assert body == body_for(key, size), f"damaged record at {pos}"
            replayed[pos] = (key, size)
        assert len(set(replayed.values())) == len(replayed)
        for pos, (key, size) in acked.items():
            assert replayed.get(pos) == (key, size), f"acknowledged {key} lost at {pos}"


@pytest.mark.crash
def test_sigkill_loses_no_acknowledged_record(logdir: Path) -> None:
    first, _ = run_and_kill(logdir, "a", 400)
    check(logdir, first)
    # a SIGKILL leaves the page cache intact; add what a power loss could leave: a torn frame
    last = max(logdir.glob("redo.*"), key=lambda p: int(p.suffix[1:]))
    with last.open("ab") as f:
        f.write(encode(3, body_for("torn:0:0", 5000))[:3000])
    # recovery (cutting the torn frame), appends after it, another crash
    second, truncated = run_and_kill(logdir, "b", 400)
    assert truncated == 3000
    check(logdir, first | second)
