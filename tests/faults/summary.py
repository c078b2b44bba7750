"""Figures the fault suite collects, written to tests/artifacts/faults-summary.json.

Each test records what it did (iterations, faults injected, messages checked, losses, peak
RSS...) under its own section; ``tests/faults/conftest.py`` writes the file at the end of
the session, merged with what an earlier (partial) run left there.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
SUMMARY_PATH = ARTIFACTS / "faults-summary.json"

#: NOTIFY_FAULTS_LONG=1: the bigger version (more iterations, examples, connections)
LONG = os.environ.get("NOTIFY_FAULTS_LONG", "") == "1"

_lock = threading.Lock()
FIGURES: dict[str, dict[str, Any]] = {}


def record(section: str, **values: Any) -> None:
    with _lock:
        FIGURES.setdefault(section, {}).update(values)


def add(section: str, key: str, n: int = 1) -> None:
    with _lock:
        sec = FIGURES.setdefault(section, {})
        sec[key] = sec.get(key, 0) + n


def totals(sections: dict[str, Any]) -> dict[str, Any]:
    """The headline figures (for the README) across the sections."""
    kills = [v for k, v in sections.items() if k.startswith("kill9") and isinstance(v, dict)]

    def total(key: str, secs: list[dict[str, Any]] = kills) -> int:
        return sum(int(s.get(key, 0)) for s in secs)

    res = sections.get("resources", {})
    peaks = [float(v) for k, v in res.items() if k.endswith("_peak_rss_mib")]
    fuzz = sections.get("wire_fuzz", {})
    disk = sections.get("disk_full", {})
    return {
        "kill9_iterations": total("iterations"),
        "kill9_crashpoint_kills": total("crashpoint_kills"),
        "kill9_random_sigkills": total("random_sigkills"),
        "acknowledged_messages_checked": total("acked_messages_checked"),
        "transactions_checked": total("transactions_checked"),
        "messages_served_to_consumers_rechecked": total("messages_served_to_consumers"),
        "losses": total("losses") + int(disk.get("losses", 0)),
        "duplicates": total("duplicates"),
        "partial_transactions_after_restart": total("partial_transactions"),
        "disk_full_refusals_503": int(disk.get("refused_puts_503", 0)),
        "fuzz_examples": int(fuzz.get("codec_examples", 0)) + int(fuzz.get("live_examples", 0)),
        "fuzz_broker_crashes": int(fuzz.get("broker_crashes", 0)),
        "peak_broker_rss_mib_bounded_scenarios": max(
            (
                float(v)
                for k, v in res.items()
                if k.endswith("_peak_rss_mib") and "long_poll" not in k
            ),
            default=0.0,
        ),
        "peak_broker_rss_mib_all": max(peaks, default=0.0),
    }


def write(path: Path = SUMMARY_PATH) -> None:
    with _lock:
        if not FIGURES:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            old = json.loads(path.read_text())
            if not isinstance(old, dict):
                old = {}
        except (OSError, ValueError):
            old = {}
        sections = old.get("sections", {}) if isinstance(old.get("sections"), dict) else {}
        sections.update(FIGURES)
        out = {
            "totals": totals(sections),
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mode": "long" if LONG else "normal",
            "machine": {
                "nproc": os.cpu_count(),
                "kernel": platform.release(),
                "python": platform.python_version(),
            },
            "sections": sections,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
