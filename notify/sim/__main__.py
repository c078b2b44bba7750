"""``python -m notify.sim --seed N [--verbose]``: replay one seed of the core simulation;
``--seeds A:B`` runs a range and prints the seeds per second."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from notify.sim.world import SimFailure, World


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m notify.sim")
    ap.add_argument("--seed", type=int, help="one seed to replay")
    ap.add_argument("--seeds", default="0:200", help="a range A:B of seeds")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--crashes", type=int, default=2)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--segment-size", type=int, default=None, help="tiny segments, e.g. 200")
    ap.add_argument("--delay-heavy", action="store_true", help="mostly delayed puts")
    ap.add_argument(
        "--mixed",
        action="store_true",
        help="a topic without group commit too, and flush rounds as the broker runs them",
    )
    ap.add_argument(
        "--held",
        action="store_true",
        help="with --mixed: puts held for a synchronous slave's confirmation",
    )
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.CRITICAL)
    if a.seed is not None:
        seeds = range(a.seed, a.seed + 1)
    else:
        lo, hi = (int(x) for x in a.seeds.split(":"))
        seeds = range(lo, hi)
    t0 = time.perf_counter()
    failed = 0
    for seed in seeds:
        try:
            World(
                seed,
                a.steps,
                a.crashes,
                a.verbose,
                a.segment_size,
                a.delay_heavy,
                a.mixed,
                a.held,
            ).run()
        except SimFailure as e:
            failed += 1
            print(e, file=sys.stderr)
    dt = time.perf_counter() - t0
    print(f"{len(seeds)} seeds, {failed} failed, {dt:.1f}s ({len(seeds) / dt:.0f} seeds/s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
