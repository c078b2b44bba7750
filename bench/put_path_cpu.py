"""The broker's per-request work on the put path, in process, without sockets.

    .venv/bin/python bench/put_path_cpu.py                                 # this tree
    .venv/bin/python bench/put_path_cpu.py --tree ../old --tree . --rounds 3
    .venv/bin/python bench/put_path_cpu.py --ops --tree ../old --tree .    # bytecode count

A broker (``notify.broker.app.Broker``, default flush policy, data in a temp directory) runs
in a child process of this one, one per tree and load, with its own code on ``PYTHONPATH``;
its connections sit on transports that only count what they were sent, so the figures are
the broker's own handling: parsing, dispatch, batching, appends (real ``pwrite``), the
transaction engine, the redo log's fdatasync, replies. Loads:

- ``pipe``: one connection, chunks of 500 single 100 B puts;
- ``sync``: ten connections, one 100 B put each per loop turn (as ten synchronous producers);
- ``sync1``: the same ten, one connection's put per loop turn;
- ``tx``: thirty-two connections, BEGIN + one 100 B put + COMMIT_ONE_PHASE each per turn.

Default: process CPU time per request, the least of ``--reps`` repetitions of ``--n`` rounds
(a shared machine only ever adds time). ``--ops``: Python bytecode instructions and calls per
request, counted with a trace function over two run lengths (their difference: start-up and
warm-up cancel out); deterministic, so a change in it is a change in the work done, whatever
the machine's load (C-level work such as a system call or a CRC counts for nothing there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

LOADS = ("pipe", "sync", "sync1", "tx")
CONNS = {"pipe": 1, "sync": 10, "sync1": 10, "tx": 32}
BODY = b"p" * 100
CRC = zlib.crc32(BODY) & 0x7FFFFFFF


# ---------------------------------------------------------------------------- the child


class _Transport:
    """Enough of an asyncio transport for a broker connection; counts replies."""

    def __init__(self) -> None:
        self.replies = 0
        self.ok = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.replies += data.count(b"\r\n")
        self.ok += data.count(b"result 200 ")

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _frame(load: str, k: int, i: int) -> bytes:
    if load == "tx":
        key = b"TX:c%d:%d" % (k, i)
        return (
            b"transaction %s c%d BEGIN 30 1\r\n" % (key, k)
            + b"put bench4 %d 100 0 %d %s 2\r\n%b" % (k % 4, CRC, key, BODY)
            + b"transaction %s c%d COMMIT_ONE_PHASE 3\r\n" % (key, k)
        )
    return b"put bench4 %d 100 0 %d %d\r\n%b" % (k % 4, CRC, i, BODY)


async def _child(
    load: str, rounds: int, reps: int, trace: Callable[[bool], None]
) -> dict[str, Any]:
    from notify.broker.app import Broker
    from notify.broker.connection import Connection
    from notify.config import load_config

    work = Path(tempfile.mkdtemp(prefix="notify-putcpu-"))
    ini = work / "server.ini"
    ini.write_text(
        f"[system]\ndataPath={work / 'data'}\nserverPort=0\nhostName=127.0.0.1\n"
        "configWatchInterval=0\ndashboardHttpPort=0\nunflushThreshold=1000\n"
        "unflushInterval=10000\nflushTxLogAtCommit=1\n"
        "[topic=bench]\nnumPartitions=1\n[topic=bench4]\nnumPartitions=4\n"
    )
    broker = Broker(load_config(ini))
    await broker.start()
    assert broker.service is not None
    conns = []
    for _ in range(CONNS[load]):
        c = Connection(broker.service)
        t = _Transport()
        c.connection_made(cast(Any, t))
        conns.append((c, t))
    per = 3 if load == "tx" else 1
    chunk = b"".join(b"put bench 0 100 0 %d %d\r\n%b" % (CRC, i, BODY) for i in range(500))

    async def until(done: Callable[[], bool]) -> None:
        while not done():
            await asyncio.sleep(0)

    async def run(n: int) -> int:
        if load == "pipe":
            c, t = conns[0]
            for _ in range(n):
                want = t.replies + 500
                c.data_received(chunk)
                await until(lambda: t.replies >= want)  # noqa: B023 - awaited at once
            return n * 500
        for i in range(n):
            if load == "sync1":
                for k, (c, t) in enumerate(conns):
                    want = t.replies + per
                    c.data_received(_frame(load, k, i))
                    await until(lambda: t.replies >= want)  # noqa: B023
            else:
                wants = [t.replies + per for _c, t in conns]
                for k, (c, _t) in enumerate(conns):
                    c.data_received(_frame(load, k, i))
                await until(
                    lambda: all(t.replies >= w for (_c, t), w in zip(conns, wants, strict=True))  # noqa: B023
                )
        return n * len(conns)

    try:
        await run(max(1, rounds // 10))  # warm-up
        cpu: list[float] = []
        count = 0
        trace(True)
        for _ in range(reps):
            t0 = time.process_time()
            count = await run(rounds)
            cpu.append((time.process_time() - t0) / count)
        trace(False)
        bad = sum(t.replies - t.ok for _c, t in conns)
        if bad:
            raise RuntimeError(f"{bad} error replies")
        return {"cpu_us": min(cpu) * 1e6, "count": count}
    finally:
        for c, _t in conns:
            c.connection_lost(None)
        await broker.stop()
        shutil.rmtree(work, ignore_errors=True)


def child_main(load: str, rounds: int, reps: int, ops: bool) -> None:
    import uvloop

    counts = [0, 0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[0] += 1
        return local

    def glob(frame: Any, event: str, arg: Any) -> Any:
        counts[1] += 1
        frame.f_trace_opcodes = True
        return local

    def trace(on: bool) -> None:
        if ops:
            sys.settrace(glob if on else None)

    result = uvloop.run(_child(load, rounds, reps, trace))
    result["ops"], result["calls"] = counts
    print(json.dumps(result))


# ---------------------------------------------------------------------------- the parent


def measure(tree: Path, load: str, rounds: int, reps: int, ops: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", load, str(rounds), str(reps), str(int(ops))],
        env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _label(tree: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        head = "?"
    return f"{tree.name}@{head}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        load, rounds, reps, ops = sys.argv[2:6]
        child_main(load, int(rounds), int(reps), ops == "1")
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tree", action="append", default=None, help="a source tree (repeat)")
    ap.add_argument("--only", action="append", choices=LOADS, help="run only these loads")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the trees")
    ap.add_argument("--n", type=int, default=0, help="loop rounds per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; the least CPU counts")
    ap.add_argument("--ops", action="store_true", help="count bytecode instead of CPU time")
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in (args.tree or [Path(__file__).resolve().parents[1]])]
    loads = args.only or list(LOADS)
    default_n = {"pipe": 200, "sync": 1000, "sync1": 300, "tx": 200}
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S')}, loadavg {_loadavg()}", flush=True)
    rows: dict[tuple[str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for load in loads:
            order = trees if rnd % 2 == 0 else trees[::-1]
            for tree in order:
                n = args.n or (default_n[load] // 10 if args.ops else default_n[load])
                if args.ops:  # two lengths: their difference is the steady state
                    a = measure(tree, load, n, 1, True)
                    b = measure(tree, load, 2 * n, 1, True)
                    per = b["count"] - a["count"]
                    value = (b["ops"] - a["ops"]) / per
                    extra = f"{(b['calls'] - a['calls']) / per:6.1f} calls/req"
                else:
                    r = measure(tree, load, n, args.reps, False)
                    value = r["cpu_us"]
                    extra = ""
                rows.setdefault((load, _label(tree)), []).append(value)
                unit = "ops/req" if args.ops else "us CPU/req"
                print(f"round {rnd + 1} {load:<6} {_label(tree):<24} {value:9.1f} {unit} {extra}",
                      flush=True)  # fmt: skip
    print(f"ended {time.strftime('%Y-%m-%d %H:%M:%S')}, loadavg {_loadavg()}")
    print()
    unit = "bytecode/req" if args.ops else "CPU us/req"
    print(f"| {'load':<6} | {'tree':<24} | {unit + ' (least)':>20} | {'all rounds':<30} |")
    print(f"|{'-' * 8}|{'-' * 26}|{'-' * 22}|{'-' * 32}|")
    for (load, label), vals in rows.items():
        shown = " ".join(f"{v:.1f}" for v in vals)
        print(f"| {load:<6} | {label:<24} | {min(vals):>20.1f} | {shown:<30} |")


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
