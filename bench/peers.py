"""notify against real peers: RabbitMQ (pika), Redis Streams (redis-py) and NATS JetStream
(nats-py), one table.

    bash scripts/peers.sh install                # redis-server, rabbitmq-server, the extra
    .venv/bin/python bench/peers.py              # full run (~4-5 minutes)
    .venv/bin/python bench/peers.py --quick      # ~1.5 minutes

Starts every server itself on 127.0.0.1 (free ports, temp dirs on the disk of --dir) and
stops it by PID at the end, on Ctrl-C and on SIGTERM. Measures the raw limits (100-byte
append + fdatasync rate, loopback bandwidth) in the same run, prints one table with msg/s,
tx/s, p50/p99 latency, server and client CPU per message and the ratio to notify at equal
durability, and writes docs/peers.md and docs/peers.png. The code lives in bench/peers/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.broker_bench import raw_fsync_rate, raw_loopback_bandwidth  # noqa: E402
from bench.peers import servers  # noqa: E402
from bench.peers.common import Budget, Result  # noqa: E402
from bench.peers.notify_side import NotifyRunner  # noqa: E402
from bench.peers.report import (  # noqa: E402
    RawLimits,
    machine_facts,
    print_table,
    write_chart,
    write_markdown,
)
from notify.version import __version__  # noqa: E402

SYSTEMS = ("notify", "redis", "rabbitmq", "nats")
#: the last run's figures (bench/results/ is gitignored)
RESULTS = ROOT / "bench" / "results" / "peers.json"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="shorter scenarios (~1.5 minutes)")
    ap.add_argument("--dir", default=None, help="where servers keep data (default: temp dir)")
    ap.add_argument("--only", default=",".join(SYSTEMS), help="comma list of " + "/".join(SYSTEMS))
    ap.add_argument("--docs", default=str(ROOT / "docs"), help="where peers.md/.png go")
    ap.add_argument("--no-docs", action="store_true", help="print the table only")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help=f"rewrite the table and docs from the last run's {RESULTS.name}",
    )
    args = ap.parse_args()
    if args.report_only:
        return report_only(Path(args.docs))
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    budget = Budget(1.0 if args.quick else 3.0, args.quick)
    servers.install_cleanup()
    facts = machine_facts()
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="notify-peers-", dir=args.dir))
    rows: list[Result] = []
    versions: dict[str, str] = {"notify": __version__}
    peaks: dict[str, int] = {}
    try:
        print("raw limits ...", flush=True)
        fs = raw_fsync_rate(tmp, 1.0 if args.quick else 2.0)
        lb = raw_loopback_bandwidth((512 << 20) if args.quick else (2 << 30))
        raw = RawLimits(fs.rate, lb.count / lb.seconds / 1e6)
        print(
            f"  {raw.fsync_per_s:,.0f} append+fdatasync/s, loopback {raw.loopback_mb_s:,.0f} MB/s",
            flush=True,
        )
        if "notify" in only:
            print("notify ...", flush=True)
            runner = NotifyRunner(tmp / "notify", budget)
            rows += runner.run()
            peaks["notify broker"] = runner.peak_rss_kib
        if "redis" in only:
            print("Redis ...", flush=True)
            if not servers.have_redis():
                print("  redis-server missing: run `bash scripts/peers.sh install`; skipped")
            else:
                from bench.peers import redis_side

                got, peak, versions["Redis"] = redis_side.run(tmp, budget)
                rows += got
                peaks["redis-server"] = peak
        if "rabbitmq" in only:
            print("RabbitMQ ...", flush=True)
            if not servers.have_rabbitmq():
                print("  rabbitmq-server missing: run `bash scripts/peers.sh install`; skipped")
            else:
                from bench.peers import rabbit_side

                got, peak, versions["RabbitMQ"] = rabbit_side.run(tmp, budget)
                rows += got
                peaks["RabbitMQ (beam.smp)"] = peak
        if "nats" in only:
            print("NATS JetStream ...", flush=True)
            if not servers.have_nats():
                print("  nats-server missing: run `bash scripts/peers.sh install`; skipped")
            else:
                from bench.peers import nats_side

                got, peak, versions["NATS"] = nats_side.run(tmp, budget)
                rows += got
                peaks["nats-server"] = peak
        raw.fsync_end_per_s = raw_fsync_rate(tmp, 1.0).rate
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the servers", file=sys.stderr)
        servers.cleanup_all()
        return 130
    finally:
        servers.cleanup_all()
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - t_start
    run = {
        "rows": [dataclasses.asdict(r) for r in rows],
        "raw": dataclasses.asdict(raw),
        "facts": facts,
        "versions": versions,
        "peaks": peaks,
        "seconds": seconds,
        "quick": args.quick,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(run, indent=1))
    print_table(rows, raw)
    if not args.no_docs:
        write_docs(Path(args.docs), run)
    print(f"total {seconds:.0f} s (results in {RESULTS})")
    return 0


def write_docs(docs: Path, run: dict[str, Any]) -> None:
    rows = [Result(**r) for r in run["rows"]]
    raw = RawLimits(**run["raw"])
    write_markdown(
        rows,
        raw,
        docs / "peers.md",
        run["facts"],
        run["versions"],
        run["peaks"],
        run["seconds"],
        run["quick"],
    )
    write_chart(rows, raw, docs / "peers.png")
    print(f"wrote {docs / 'peers.md'} and {docs / 'peers.png'}")


def report_only(docs: Path) -> int:
    run = json.loads(RESULTS.read_text())
    print_table([Result(**r) for r in run["rows"]], RawLimits(**run["raw"]))
    write_docs(docs, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
