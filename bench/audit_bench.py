"""Benchmark of ``notify audit``: generated broker logs, audited with local Spark.

Usage::

    python bench/audit_bench.py [--txs 1000000] [--msgs-per-tx 5] [--dir DIR]
                                [--scale-txs 100000] [--no-scaling] [--quick] [--keep]

1. Generates a broker's files directly with the real codecs, the way the broker writes them
   (no broker process): partition segments ``<topic>-<n>/<start>.meta`` of
   :func:`notify.protocol.records.encode` records rolled at 64 MiB, and a redo log
   ``transactions/redo.<N>`` of :mod:`txlog.records` frames (rolled at txlog's 64 MiB) whose
   bodies are :mod:`notify.protocol.logrecords` APPEND_MSG / PREPARE / COMMIT / APPLIED / ROLLBACK,
   plus a checkpoint. ``--txs`` transactions of 1..9 messages (mean 5) over 16 partitions,
   one in three spanning two partitions; 97 % committed in one phase, 1 % XA committed in
   two, 1 % rolled back, 1 % rolled back after PREPARE; message times spread over 24 hours.
2. Audits them on ``local[2]`` in a fresh process (the CLI's work: every check, the Parquet
   tables, summary.json and report.html) and reports wall time and rows/s; the generated logs
   are consistent, so the audit must find nothing.
3. Incremental (unless ``--no-incremental``): the files put back to what they held when 90 %
   of the transactions had been written (about 21.6 of the 24 hours: the redo files and
   segments rolled since removed, the ones then being written cut there) and audited with a
   state directory, then put back whole and audited again, as a daily run after a run 2.4
   hours earlier: the second run parses only the last 10 %, checks again only what that
   touches, and must find nothing either (the first run's findings are expected: the
   transactions then open, or committed without their APPLIED yet).
4. Scaling: a smaller set (``--scale-txs``) audited on ``local[1]`` and on ``local[2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.idgen import BROKER_BITS, EPOCH_MS, SEQ_BITS
from notify.store.segment import segment_name
from notify.txlog import Position
from notify.txlog.checkpoint import Checkpoint, write_checkpoints
from notify.txlog.config import TxLogConfig
from notify.txlog.records import encode as frame
from notify.txlog.segment import fsync_dir, segment_path

TOPICS = {"orders": 4, "payments": 4, "audit": 4, "events": 4}
SEGMENT_BYTES = 64 * 2**20
TXLOG_SEGMENT_BYTES = TxLogConfig().segment_bytes
DAY_MS = 86_400_000
FLUSH = 4 * 2**20


class _Appender:
    """Files rolled at ``limit`` bytes, written in big chunks (what the broker's appends add
    up to on disk)."""

    def __init__(self, limit: int, path_of: Any, start: int = 0):
        self.limit = limit
        self.path_of = path_of
        self.file_start = start
        self.file_no = 0
        self.size = 0  # bytes in the current file
        self.buf = bytearray()
        self.fh = open(path_of(start, 0), "wb")  # noqa: SIM115 - closed in close()

    @property
    def end(self) -> int:
        return self.file_start + self.size + len(self.buf)

    def append(self, data: bytes) -> int:
        if self.size + len(self.buf) + len(data) > self.limit and self.size + len(self.buf):
            self._roll()
        at = self.end
        self.buf += data
        if len(self.buf) >= FLUSH:
            self._flush()
        return at

    def _flush(self) -> None:
        self.fh.write(self.buf)
        self.size += len(self.buf)
        self.buf = bytearray()

    def _roll(self) -> None:
        self._flush()
        self.fh.close()
        self.file_start += self.size
        self.file_no += 1
        self.size = 0
        self.fh = open(self.path_of(self.file_start, self.file_no), "wb")  # noqa: SIM115

    def close(self) -> None:
        self._flush()
        self.fh.close()

    def mark(self) -> tuple[str, int]:
        """The current file and how many bytes it holds (written or still buffered)."""
        return str(self.path_of(self.file_start, self.file_no)), self.size + len(self.buf)


def generate(
    root: Path, txs: int, seed_ms: int | None = None, mark_at: int | None = None
) -> dict[str, Any]:
    """Write a dataPath under ``root``; return what was written (with ``mark_at``, under
    ``marks`` each file being written when transaction ``mark_at`` began and its size then:
    see :func:`cut_at`)."""
    t0 = time.perf_counter()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    parts: list[tuple[str, int]] = [(t, i) for t, n in TOPICS.items() for i in range(n)]
    seg: dict[tuple[str, int], _Appender] = {}
    for t, i in parts:
        d = root / f"{t}-{i}"
        d.mkdir()
        seg[(t, i)] = _Appender(SEGMENT_BYTES, lambda start, _n, d=d: d / segment_name(start))
    txdir = root / "transactions"
    txdir.mkdir()
    redo = _Appender(TXLOG_SEGMENT_BYTES, lambda _s, n: segment_path(txdir, n))
    base_ms = seed_ms if seed_ms is not None else int(time.time() * 1000) - DAY_MS - 60_000
    step = DAY_MS / max(1, txs)
    shift = BROKER_BITS + SEQ_BITS
    encode, make_msg = frame, records.encode
    n_msgs = n_records = 0
    outcomes = {"committed": 0, "xa_committed": 0, "rolled_back": 0, "prepared_rolled_back": 0}
    body = b"x" * 64
    marks: list[tuple[str, int]] = []
    for i in range(txs):
        if i == mark_at:
            marks = [a.mark() for a in (redo, *seg.values())]
        t_ms = base_ms + int(i * step)
        id0 = ((t_ms - EPOCH_MS) << shift) | (1 << SEQ_BITS)
        count = 1 + (i * 7919) % 9
        r = i % 100
        xa = r in (97, 99)
        key = f"XID:1:{i:08x}:62:bench" if xa else f"TX:bench{i >> 16}:{i & 0xFFFF}"
        p0 = parts[(i * 31) % len(parts)]
        targets = [p0] if i % 3 else [p0, parts[(i * 31 + 5) % len(parts)]]
        batches: list[tuple[tuple[str, int], bytes, int]] = []
        k = 0
        for j, p in enumerate(targets):
            n = count // len(targets) + (count % len(targets) if j == 0 else 0)
            recs = b"".join(make_msg(id0 + k + m, 0, body + b"%d" % (i + m)) for m in range(n))
            k += n
            batches.append((p, recs, n))
            redo.append(encode(lr.APPEND_MSG, lr.AppendMsg(key, p[0], p[1], n, recs).encode()))
            n_records += 1
        if xa:
            redo.append(encode(lr.PREPARE, lr.Prepare(key, t_ms + 1, 60, "").encode()))
            n_records += 1
        if r == 98 or r == 99:
            redo.append(encode(lr.ROLLBACK, lr.Rollback(key, "rollback").encode()))
            n_records += 1
            outcomes["rolled_back" if r == 98 else "prepared_rolled_back"] += 1
            continue
        hints = tuple((p[0], p[1], seg[p].end) for p, _, _ in batches)
        redo.append(encode(lr.COMMIT, lr.Commit(key, t_ms + 2, hints).encode()))
        placements = []
        for p, recs, n in batches:
            off = seg[p].append(recs)
            placements.append((p[0], p[1], off, n, len(recs)))
            n_msgs += n
        redo.append(encode(lr.APPLIED, lr.Applied(key, tuple(placements)).encode()))
        n_records += 2
        outcomes["xa_committed" if xa else "committed"] += 1
    for a in seg.values():
        a.close()
    redo.close()
    cp = Checkpoint(Position(redo.file_no, redo.size), b"", time.time())
    write_checkpoints(txdir, [cp], 0, os.fsync, fsync_dir)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    return {
        "transactions": txs,
        "messages_in_partitions": n_msgs,
        "txlog_records": n_records,
        "outcomes": outcomes,
        "bytes": size,
        "segment_files": sum(1 for _ in root.glob("*-*/*.meta")),
        "redo_files": redo.file_no + 1,
        "seconds": round(time.perf_counter() - t0, 1),
        "marks": marks,
    }


def run_audit(
    data: Path, master: str, out: Path, driver_memory: str, state: Path | None = None
) -> dict[str, Any]:
    """Audit ``data`` in this process; returns timings (called in a child process). With
    ``state`` the run is incremental when that directory holds an earlier run."""
    t0 = time.perf_counter()
    from notify.audit import audit, new_session
    from notify.audit.report import write_outputs
    from notify.audit.session import input_bytes

    size = input_bytes(data / "transactions", data)
    spark = new_session(master, driver_memory=driver_memory, input_bytes=size)
    t1 = time.perf_counter()
    c1 = _tree_cpu()
    # audit() reads and caches the inputs and aggregates the transactions (it counts what
    # each check finds): "read_s" is reading and checking, "checks_s" the findings table
    result = audit(spark, txlog=data / "transactions", data=data, state=state)
    result.txlog.count()  # the inputs, parsed by the data sources and cached
    result.log.count()
    tr = time.perf_counter()
    cr = _tree_cpu()
    counts = result.finding_counts()
    t2 = time.perf_counter()
    summary = write_outputs(
        result,
        out,
        counts=counts,
        run={"started": t1, "master": master},
        also=result.state_writes(),
    )
    result.save_state()
    t3 = time.perf_counter()
    c3 = _tree_cpu()
    rows = sum(summary["txlog_records"].values()) + summary["partition_messages"]
    spark.stop()
    return {
        "incremental": result.incremental,
        "rows_parsed": summary["run"]["txlog_rows_read"] + summary["run"]["log_rows_read"],
        "master": master,
        "session_s": round(t1 - t0, 1),
        "read_s": round(tr - t1, 1),
        "read_cores": round((cr - c1) / (tr - t1), 2),
        "checks_s": round(t2 - tr, 1),
        "outputs_s": round(t3 - t2, 1),
        "audit_s": round(t3 - t1, 1),
        "cores_used": round((c3 - c1) / (t3 - t1), 2),
        "cpu_s": round(c3 - c1, 1),
        "load": [round(x, 1) for x in os.getloadavg()],
        "rows": rows,
        "rows_per_s": round(rows / (t3 - t1)),
        "findings": counts,
        "transactions": sum(v["transactions"] for v in summary["transactions"].values()),
    }


def _tree_cpu() -> float:
    """CPU seconds of this process and its children (the JVM, Python workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in stat[11:15])  # own and reaped children
            # children of every thread: the JVM starts the Python workers from its own
            tasks = Path(f"/proc/{pid}/task").iterdir()
            kids = [k for t in tasks for k in (t / "children").read_text().split()]
        except OSError:
            continue
        todo += [int(k) for k in kids]
    return total / tick


def _number(f: Path) -> int | None:
    """A redo file's number, a segment's start; None for other files."""
    if f.name.startswith("redo.") and f.name[5:].isdigit():
        return int(f.name[5:])
    return int(f.stem) if f.suffix == ".meta" and f.stem.isdigit() else None


def cut_at(marks: list[tuple[str, int]]) -> dict[Path, bytes]:
    """Put the files back to what they held at a mark of :func:`generate` (the broker's
    files a while ago: the files written since removed, each one then being written cut
    to its size then); returns the bytes to put back."""
    saved: dict[Path, bytes] = {}
    for path, size in marks:
        at = Path(path)
        n = _number(at)
        assert n is not None, at
        later = [f for f in at.parent.iterdir() if (_number(f) or -1) > n]  # rolled since
        for f in [at, *later]:
            saved[f] = f.read_bytes()
        at.write_bytes(saved[at][:size])
        for f in later:
            f.unlink()
    return saved


def audit_in_child(
    data: Path, master: str, out: Path, driver_memory: str, state: Path | None = None
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(data),
        "--master",
        master,
        "--out",
        str(out),
        "--driver-memory",
        driver_memory,
        *(["--state", str(state)] if state else []),
    ]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"audit child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    res: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    res["process_s"] = round(time.perf_counter() - t0, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--txs", type=int, default=1_000_000)
    ap.add_argument("--scale-txs", type=int, default=100_000)
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--scaling-only", action="store_true", help="skip the full-size run")
    ap.add_argument("--quick", action="store_true", help="100k transactions, scaling on 20k")
    ap.add_argument("--dir", default=None, help="where to generate (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--state", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--no-incremental",
        action="store_true",
        help="skip the incremental run (audit 90%% of the files, then the last 10%% added)",
    )
    args = ap.parse_args()
    if args.child:
        res = run_audit(
            Path(args.child),
            args.master,
            Path(args.out),
            args.driver_memory,
            Path(args.state) if args.state else None,
        )
        print(json.dumps(res))
        return
    from notify.audit.session import spark_missing

    why = spark_missing()
    if why:
        raise SystemExit(f"audit_bench: {why}")
    if args.quick:
        args.txs, args.scale_txs = 100_000, 20_000
    work = Path(tempfile.mkdtemp(prefix="notify-auditbench-", dir=args.dir))
    try:
        rows = []
        if not args.scaling_only:
            print(f"generating {args.txs:,} transactions in {work} ...", flush=True)
            mark = None if args.no_incremental else int(args.txs * 0.9)
            gen = generate(work / "big", args.txs, mark_at=mark)
            marks = gen.pop("marks")
            print(json.dumps(gen), flush=True)
            big = audit_in_child(work / "big", "local[2]", work / "out-big", args.driver_memory)
            print(json.dumps(big), flush=True)
            rows.append(("full", gen, big))
            if not args.no_incremental:
                saved = cut_at(marks)
                state = work / "state"
                first = audit_in_child(
                    work / "big", "local[2]", work / "out-90", args.driver_memory, state
                )
                print(json.dumps(first), flush=True)
                rows.append(("full, 90% (state)", gen, first))
                for p, b in saved.items():
                    p.write_bytes(b)
                inc = audit_in_child(
                    work / "big", "local[2]", work / "out-inc", args.driver_memory, state
                )
                print(json.dumps(inc), flush=True)
                rows.append(("incremental +10%", gen, inc))
        if not args.no_scaling:
            small = generate(work / "small", args.scale_txs)
            small.pop("marks")
            for master in ("local[1]", "local[2]"):
                r = audit_in_child(
                    work / "small", master, work / f"out-{master[6]}", args.driver_memory
                )
                print(json.dumps(r), flush=True)
                rows.append((f"scaling {master}", small, r))
        print()
        print(
            f"{'run':<18}{'txs':>10}{'messages':>11}{'rows':>11}{'session s':>10}{'read+chk s':>11}"
            f"{'find s':>7}{'out s':>7}{'audit s':>8}{'rows/s':>9}{'cores':>6}{'found':>8}"
            f"{'parsed':>11}{'cpu s':>8}{'load':>6}"
        )
        for name, g, r in rows:
            print(
                f"{name:<18}{g['transactions']:>10,}{g['messages_in_partitions']:>11,}"
                f"{r['rows']:>11,}{r['session_s']:>10}{r['read_s']:>11}{r['checks_s']:>7}"
                f"{r['outputs_s']:>7}{r['audit_s']:>8}{r['rows_per_s']:>9,}{r['cores_used']:>6}"
                f"{sum(r['findings'].values()):>8,}{r['rows_parsed']:>11,}"
                f"{r['cpu_s']:>8}{r['load'][0]:>6}"
            )
        if not args.no_scaling:
            one, two = rows[-2][2], rows[-1][2]
            print(
                f"local[1] -> local[2] on {args.scale_txs:,} txs: audit {one['audit_s']}s -> "
                f"{two['audit_s']}s ({one['audit_s'] / two['audit_s']:.2f}x), reading "
                f"{one['read_s']}s -> {two['read_s']}s ({one['read_s'] / two['read_s']:.2f}x); "
                f"cores used {one['cores_used']} -> {two['cores_used']} of {os.cpu_count()}"
            )
        if any(r["findings"] for n, _g, r in rows if not n.startswith("full, 90%")):
            raise SystemExit("the generated logs are consistent: the audit must find nothing")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
