#!/usr/bin/env bash
# Create .venv in the project root and install notify with its dev tools, then the real
# servers the tests start (ZooKeeper, MariaDB, PostgreSQL), Chromium for the dashboard test
# and PySpark for the audit job. Idempotent; works on a fresh Debian 12 machine with python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
for helper in services browser spark; do
  if [ -f "scripts/$helper.sh" ]; then
    bash "scripts/$helper.sh" install
  fi
done
