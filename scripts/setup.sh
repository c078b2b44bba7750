#!/usr/bin/env bash
# Create .venv in the project root and install notify into it. Idempotent; works on a fresh
# Debian 12 machine with python3 (and python3-venv).
#
#   bash scripts/setup.sh          # everything the test suite needs: notify with its dev
#                                  # and docs tools (mkdocs), the real servers the tests
#                                  # start (ZooKeeper, MariaDB, PostgreSQL), Chromium for the
#                                  # dashboard and docs tests and PySpark for the audit job
#   bash scripts/setup.sh --demo   # only what `notify demo` needs: notify and its runtime
#                                  # dependencies (no dev tools, no servers, no browser)
#
# A run that finds .venv already set up for this pyproject.toml skips pip.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
if [ "${1:-}" = "--demo" ]; then
  mode=demo
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv; then
    # Debian ships venv's pip bootstrap separately (python3-venv)
    rm -rf .venv
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
      "$PY" -m venv .venv
    else
      echo "setup.sh: '$PY -m venv' failed: install python3-venv (apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check --quiet "$@"; }
# uv (from PyPI) resolves and downloads in parallel: about half the time of pip on a fresh
# machine; pip does the install itself when uv cannot be had (offline mirror without it)
install() {
  if [ -x .venv/bin/uv ] || pip install uv 2>/dev/null; then
    .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "$@" && return 0
    echo "setup.sh: uv failed, installing with pip" >&2
  fi
  pip install "$@"
}
# Byte-compile notify's own sources (editable install: pip and uv leave them as source).
# Every broker, client and CLI process imports them; with PYTHONDONTWRITEBYTECODE set (as in
# many CI images) each process would compile ~150 modules again: 5x a broker's start-up CPU.
precompile() { .venv/bin/python -m compileall -q -j 0 notify >/dev/null; }
# what is installed, keyed by pyproject.toml: a full setup also serves the demo
stamp_key=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$mode" = demo ]; then
  if ! grep -qx "$stamp_key" .venv/.notify-demo .venv/.notify-full 2>/dev/null; then
    install -e .
    echo "$stamp_key" > .venv/.notify-demo
  fi
  precompile
  exit 0
fi
if ! grep -qx "$stamp_key" .venv/.notify-full 2>/dev/null; then
  install -e ".[dev,docs]"
  echo "$stamp_key" > .venv/.notify-full
fi
# the client's hot loops compiled with mypyc (scripts/build_native.py: skipped when the
# build matches notify/protocol/hotpath.py; on failure notify runs the same code interpreted)
.venv/bin/python scripts/build_native.py || echo "setup.sh: native build failed: pure Python" >&2
for helper in services browser spark docs; do
  if [ -f "scripts/$helper.sh" ]; then
    bash "scripts/$helper.sh" install
  fi
done
precompile
