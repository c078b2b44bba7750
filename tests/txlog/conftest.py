"""Shared setup of the txlog tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the project is not necessarily installed in the venv
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    """Directory for one test's log (not created: TxLog.open creates it)."""
    return tmp_path / "txlog"
