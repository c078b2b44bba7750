"""``notify demo`` (what ``./scripts/demo.sh`` runs once set up) on the sample config."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import timing

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_within_a_minute(tmp_path: Path) -> None:
    ini = (ROOT / "conf" / "server.ini").read_text()
    ini = re.sub(r"(?m)^serverPort=.*$", "serverPort=0", ini)
    ini = re.sub(r"(?m)^dashboardHttpPort=.*$", "dashboardHttpPort=0", ini)
    ini = re.sub(r"(?m)^dataPath=.*$", f"dataPath={tmp_path / 'data'}", ini)
    config = tmp_path / "server.ini"
    config.write_text(ini)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "notify", "demo", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "half message + local transaction: COMMIT" in proc.stdout
    assert "the relay published:" in proc.stdout and "lamp (outbox)" in proc.stdout
    assert "demo finished" in proc.stdout
    timing(elapsed < 60, f"the demo took {elapsed:.1f} s")


def test_demo_script_sets_up_only_the_demo() -> None:
    """demo.sh asks setup.sh for the demo's needs only; the servers, the browser, Spark and
    the docs tools are installed by the full setup (the test command's)."""
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert "scripts/setup.sh --demo" in demo
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    demo_part, full_part = setup.split('if [ "$mode" = demo ]; then', 1)[1].split("exit 0", 1)
    assert "services" not in demo_part and "spark" not in demo_part and "[dev" not in demo_part
    assert "services browser spark docs" in full_part and ".[dev,docs]" in full_part
    assert "bash scripts/setup.sh\n" in (ROOT / "scripts" / "test.sh").read_text()
