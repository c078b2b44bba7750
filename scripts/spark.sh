#!/usr/bin/env bash
# PySpark for `notify audit` and its tests.
#
#   bash scripts/spark.sh install   # idempotent: pip installs pyspark>=4.0 and pyarrow into .venv
#   bash scripts/spark.sh check     # print what is there, exit 1 when something is missing
#
# Spark runs on the machine's Java 17 (Debian: openjdk-17-jre-headless). Without Java the audit
# tests skip (or fail when CI is set); install it with apt-get when root, else warn.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PKGS=("pyspark>=4.0" "pyarrow" "numpy")

warn() { echo "spark.sh: warning: $*" >&2; }

have_py() {
  "$PY" - <<'EOF' 2>/dev/null
import importlib.util, sys
import pyspark
ok = all(importlib.util.find_spec(m) for m in ("pyarrow", "numpy")) and int(pyspark.__version__.split(".")[0]) >= 4
sys.exit(0 if ok else 1)
EOF
}

have_java() { command -v java >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]; }

check() {
  local rc=0
  if have_py; then echo "pyspark/pyarrow: ok"; else echo "pyspark/pyarrow: missing"; rc=1; fi
  if have_java; then echo "java: ok"; else echo "java: missing"; rc=1; fi
  return $rc
}

install() {
  if [ ! -x "$PY" ]; then
    warn ".venv is missing: run scripts/setup.sh first"
    return 1
  fi
  if have_py; then
    echo "spark.sh: pyspark and pyarrow already installed"
  else
    "$PY" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}"
  fi
  if ! have_java; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q --no-install-recommends openjdk-17-jre-headless \
        || { apt-get update -q && apt-get install -y -q --no-install-recommends openjdk-17-jre-headless; } \
        || warn "could not install Java 17: the audit tests will skip"
    else
      warn "no Java runtime and no root/apt-get: the audit tests will skip"
    fi
  fi
}

case "${1:-}" in
  install) install ;;
  check) check ;;
  *) echo "usage: $0 install|check" >&2; exit 2 ;;
esac
