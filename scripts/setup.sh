#!/usr/bin/env bash
# Create .venv in the project root and install notify with its dev tools.
# Idempotent; safe to run on a fresh Debian 12 machine (needs python3 with venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
if [ -x scripts/services.sh ]; then
  bash scripts/services.sh install
fi
