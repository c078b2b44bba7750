"""The broker's plain put path, A/B: three raw-wire loads against brokers of one or more trees.

    .venv/bin/python bench/put_path_bench.py                                   # this tree
    .venv/bin/python bench/put_path_bench.py --tree ../old --tree . --rounds 3 # A/B alternated

Loads (raw wire clients in this process on uvloop, no notify client in the way; a fresh
broker child process per load, default flush policy, data in a temp directory):

- ``pipelined put``: one connection sends single ``put`` frames of 100 B (what MetaQ's Java
  client sends), at most 20,000 in flight, to one partition;
- ``10 sync producers``: ten connections, each sends one 100 B ``put`` and waits for its
  reply before the next, over 4 partitions;
- ``32 tx clients``: thirty-two connections, each loops BEGIN, one 100 B put,
  COMMIT_ONE_PHASE (one write) and waits for the three replies (``flushTxLogAtCommit=1``).

Each tree's broker runs with that tree's own ``.venv/bin/python -m notify broker start`` (a
tree without one, e.g. from ``git archive``, runs with this interpreter and ``PYTHONPATH``
set to the tree), so the load generator and its cost are the same for every tree. Rounds
alternate the trees (A B, then B A) so both see the same minutes of a shared machine.
Besides the rate, every run reports the broker process's CPU time per request (utime +
stime from ``/proc/<pid>/stat`` over the measured window), which holds better than the rate
when other work shares the cores, and the load average when it started. The table gives,
per load and tree, the median and the spread (min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop

BODY = b"p" * 100
CRC = zlib.crc32(BODY) & 0x7FFFFFFF
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    load: str
    tree: str
    count: int
    seconds: float
    cpu_s: float
    loadavg: str
    unit: str

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.count * 1e6


# ---------------------------------------------------------------------------- the broker


class Broker:
    """A broker child process started with ``tree``'s own virtualenv."""

    def __init__(
        self,
        tree: Path,
        workdir: Path,
        topics: dict[str, int],
        system: dict[str, object],
        profile: Path | None = None,
    ):
        self.tree = tree
        self.profile = profile
        self.workdir = workdir
        workdir.mkdir(parents=True)
        lines = [
            "[system]",
            f"dataPath={workdir / 'data'}",
            "serverPort=0",
            "hostName=127.0.0.1",
            "configWatchInterval=0",
            "dashboardHttpPort=0",
            *(f"{k}={v}" for k, v in system.items()),
        ]
        for name, n in topics.items():
            lines += [f"[topic={name}]", f"numPartitions={n}"]
        (workdir / "server.ini").write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        ready = self.workdir / "ready.json"
        log = open(self.workdir / "broker.log", "ab")  # noqa: SIM115 - the child keeps it
        python = self.tree / ".venv" / "bin" / "python"
        env = dict(os.environ)
        if not python.exists():  # a bare tree (git archive): this environment, its code
            python = Path(sys.executable)
            env["PYTHONPATH"] = str(self.tree)
        self.proc = subprocess.Popen(
            [
                str(python),
                *(("-m", "cProfile", "-o", str(self.profile)) if self.profile else ()),
                "-m",
                "notify",
                "broker",
                "start",
                "-c",
                str(self.workdir / "server.ini"),
                "--log-level",
                "warning",
                "--ready-file",
                str(ready),
            ],
            cwd=self.tree,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.workdir / "broker.log").read_text()[-2000:])
            time.sleep(0.02)
        self.port = int(json.loads(ready.read_text())["port"])

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------- wire clients


class _Counter(asyncio.Protocol):
    """Counts replies: each has exactly one CRLF (put, transaction and error bodies have
    none), and ``result 200 `` starts every success; counted across chunk boundaries."""

    def __init__(self) -> None:
        self.replies = 0
        self.ok = 0
        self.tail = b""
        self.target = 0
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.on_reply: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.tail + data
        t = self.tail
        self.replies += buf.count(b"\r\n") - t.count(b"\r\n")
        self.ok += buf.count(b"result 200 ") - t.count(b"result 200 ")
        self.tail = buf[-16:]
        if self.on_reply is not None:
            self.on_reply()
        w = self.waiter
        if w is not None and self.replies >= self.target and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(ConnectionError(f"lost after {self.replies} replies: {exc}"))


async def _connect(port: int) -> tuple[asyncio.Transport, _Counter]:
    loop = asyncio.get_running_loop()
    tr, proto = await loop.create_connection(_Counter, "127.0.0.1", port)
    return tr, proto


def _check(protos: list[_Counter]) -> None:
    bad = sum(p.replies - p.ok for p in protos)
    if bad:
        raise RuntimeError(f"{bad} error replies")


async def pipelined_put(port: int, count: int, mark: Callable[[], None]) -> int:
    """One connection, ``count`` single puts (after 10% of them as warm-up), 20,000 in flight."""
    warm = count // 10
    total = warm + count
    frames = [b"put bench 0 100 0 %d %d\r\n%b" % (CRC, i, BODY) for i in range(total)]
    tr, p = await _connect(port)
    loop = asyncio.get_running_loop()
    p.waiter = loop.create_future()
    p.target = total
    sent = 0
    marked = False

    def fill() -> None:
        nonlocal sent, marked
        if not marked and p.replies >= warm:
            marked = True
            mark()
        limit = min(total, p.replies + 20_000)
        if sent < limit:
            tr.write(b"".join(frames[sent:limit]))
            sent = limit

    p.on_reply = fill
    fill()
    await p.waiter
    tr.close()
    _check([p])
    return count


async def _closed_loop(
    port: int,
    clients: int,
    seconds: float,
    mark: Callable[[], None],
    frame: Callable[[int, int], bytes],
    replies: int,
) -> int:
    """``clients`` connections, each sending ``frame(client, n)`` and awaiting ``replies``
    replies before the next; counts the rounds done in ``seconds`` after a 1 s warm-up."""
    loop = asyncio.get_running_loop()
    conns = [await _connect(port) for _ in range(clients)]
    counting = False
    done = [0] * clients
    stop_at = [float("inf")]

    async def one(k: int) -> None:
        tr, p = conns[k]
        n = 0
        while loop.time() < stop_at[0]:
            n += 1
            p.target = p.replies + replies
            p.waiter = loop.create_future()
            tr.write(frame(k, n))
            await p.waiter
            if counting:
                done[k] += 1

    tasks = [asyncio.ensure_future(one(k)) for k in range(clients)]
    await asyncio.sleep(1.0)
    mark()
    counting = True
    stop_at[0] = loop.time() + seconds
    await asyncio.gather(*tasks)
    for tr, _p in conns:
        tr.close()
    _check([p for _tr, p in conns])
    return sum(done)


def sync_frame(k: int, n: int) -> bytes:
    return b"put bench4 %d 100 0 %d %d\r\n%b" % (k % 4, CRC, n, BODY)


def tx_frame(k: int, n: int) -> bytes:
    key = b"TX:c%d:%d" % (k, n)
    return (
        b"transaction %s c%d BEGIN 30 1\r\n" % (key, k)
        + b"put bench4 %d 100 0 %d %s 2\r\n%b" % (k % 4, CRC, key, BODY)
        + b"transaction %s c%d COMMIT_ONE_PHASE 3\r\n" % (key, k)
    )


# ---------------------------------------------------------------------------- runs

LOADS = ("pipelined put", "10 sync producers", "32 tx clients")


def one_run(load: str, tree: Path, label: str, tmp: Path, args: argparse.Namespace) -> Run:
    system: dict[str, object] = {"unflushThreshold": 1000, "unflushInterval": 10000}
    if load == "32 tx clients":
        system["flushTxLogAtCommit"] = 1
    prof = Path(args.cprofile) / f"{label}-{load.replace(' ', '-')}.prof" if args.cprofile else None
    b = Broker(tree, Path(tempfile.mkdtemp(dir=tmp)) / "b", {"bench": 1, "bench4": 4}, system, prof)
    b.start()
    marks: list[tuple[float, float]] = []
    spy: list[subprocess.Popen[bytes]] = []

    def mark() -> None:
        marks.append((time.perf_counter(), b.cpu_seconds()))
        assert b.proc is not None
        name = f"{label}-{load.replace(' ', '-')}"
        if args.spy:  # sample the broker over the measured window (collapsed stacks)
            spy.append(
                subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "--pid",
                        str(b.proc.pid),
                        "--format",
                        "raw",
                        "--rate",
                        "1000",
                        "--nonblocking",
                        "--output",
                        str(Path(args.spy) / f"{name}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if args.perf:  # where the broker's CPU goes, C level (kernel, interpreter, uvloop)
            spy.append(
                subprocess.Popen(
                    [
                        "perf",
                        "record",
                        "-q",
                        "-F",
                        "999",
                        "-p",
                        str(b.proc.pid),
                        "-o",
                        str(Path(args.perf) / f"{name}.data"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if args.strace:  # system calls of the broker over the measured window
            spy.append(
                subprocess.Popen(
                    [
                        "strace",
                        "-c",
                        "-f",
                        "-p",
                        str(b.proc.pid),
                        "-o",
                        str(Path(args.strace) / f"{name}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    la = Path("/proc/loadavg").read_text().split()[0]
    try:
        job: Awaitable[int]
        if load == "pipelined put":
            job = pipelined_put(b.port, args.count, mark)
            unit = "msg/s"
        elif load == "10 sync producers":
            job = _closed_loop(b.port, 10, args.seconds, mark, sync_frame, 1)
            unit = "msg/s"
        else:
            job = _closed_loop(b.port, 32, args.seconds, mark, tx_frame, 3)
            unit = "tx/s"
        n = uvloop.run(job)
        t1, c1 = time.perf_counter(), b.cpu_seconds()
    finally:
        for p in spy:
            p.send_signal(signal.SIGINT)
            p.wait(30)
        b.stop()
        shutil.rmtree(b.workdir.parent, ignore_errors=True)
    t0, c0 = marks[0]
    return Run(load, label, n, t1 - t0, c1 - c0, la, unit)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tree",
        action="append",
        default=None,
        help="a source tree with its own .venv (repeat for A/B; default: this one)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the trees")
    ap.add_argument("--count", type=int, default=200_000, help="pipelined puts per run")
    ap.add_argument("--seconds", type=float, default=4.0, help="closed-loop load duration")
    ap.add_argument("--only", action="append", choices=LOADS, help="run only these loads")
    ap.add_argument("--dir", default=None, help="where brokers keep data (default: temp dir)")
    ap.add_argument(
        "--spy",
        default=None,
        help="sample each broker with py-spy (pip install py-spy) into this directory",
    )
    ap.add_argument("--perf", default=None, help="perf record each broker into this directory")
    ap.add_argument(
        "--strace", default=None, help="count system calls (strace -c) into this directory"
    )
    ap.add_argument(
        "--cprofile", default=None, help="run each broker under cProfile, stats into this directory"
    )
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in (args.tree or [Path(__file__).resolve().parents[1]])]
    labels = [_label(t) for t in trees]
    loads = args.only or list(LOADS)
    tmp = Path(tempfile.mkdtemp(prefix="notify-putpath-", dir=args.dir))
    runs: list[Run] = []
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S')}, loadavg {_loadavg()}", flush=True)
    try:
        for rnd in range(args.rounds):
            for load in loads:
                order = list(zip(trees, labels, strict=True))
                if rnd % 2:
                    order.reverse()  # A B, then B A: neither always runs first
                for tree, label in order:
                    r = one_run(load, tree, label, tmp, args)
                    runs.append(r)
                    print(
                        f"round {rnd + 1} {load:<18} {label:<24} {r.rate:>9,.0f} {r.unit} "
                        f"{r.cpu_us:>7.1f} us broker CPU/req  load {r.loadavg}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"ended {time.strftime('%Y-%m-%d %H:%M:%S')}, loadavg {_loadavg()}")
    print()
    print(
        f"| {'load':<18} | {'tree':<24} | {'median':>10} | {'min-max':>17} | "
        f"{'CPU us/req median (min-max)':>27} | loadavg |"
    )
    print(f"|{'-' * 20}|{'-' * 26}|{'-' * 12}|{'-' * 19}|{'-' * 29}|---------|")
    for load in loads:
        for label in labels:
            rs = [r for r in runs if r.load == load and r.tree == label]
            rates = [r.rate for r in rs]
            cpus = [r.cpu_us for r in rs]
            las = [float(r.loadavg) for r in rs]
            print(
                f"| {load:<18} | {label:<24} | {statistics.median(rates):>10,.0f} | "
                f"{min(rates):>8,.0f}-{max(rates):<8,.0f} | "
                f"{statistics.median(cpus):>9.1f} ({min(cpus):.1f}-{max(cpus):.1f}){'':>6} | "
                f"{min(las):.1f}-{max(las):.1f} |"
            )


def _label(tree: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head, dirty = "?", ""
    return f"{tree.name}@{head}{'+' if dirty else ''}"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
