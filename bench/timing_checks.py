"""The durations, rates and ratios the test suite measures but does not assert.

The suite runs on a loaded machine, where every wall-clock bound fails some day: a test
that measures one (a long poll's wait, a rebalance, a scrape's effect on the loop, the cost
of a topic creation at 160 topics against 0...) prints it through ``tests.helpers.timing``
and asserts it only when ``NOTIFY_TIMING_CHECKS=1``. This runs those tests so, on a quiet
machine, and prints one row per figure::

    python bench/timing_checks.py            # every test that measures a duration
    python bench/timing_checks.py -k long_poll

Exits non-zero when a figure is over its bound. Arguments after the options go to pytest.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_tests() -> list[str]:
    """The test files that call ``timing(``."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "timing(" in p.read_text()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default=None, help="only the tests matching this pytest expression")
    args, rest = ap.parse_known_args()
    cmd = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", *timed_tests()]
    if args.k:
        cmd += ["-k", args.k]
    cmd += rest
    env = {**os.environ, "NOTIFY_TIMING_CHECKS": "1"}
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    figures = re.findall(r"timing: (ok|OVER): (.*)$", p.stdout, re.M)
    print(f"{'':5} figure (load {os.getloadavg()[0]:.1f}, {time.monotonic() - t0:.0f} s)")
    for verdict, figure in figures:
        print(f"{verdict:5} {figure}")
    tail = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else []
    print("\n".join(tail))
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-2000:], sep="\n", file=sys.stderr)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
