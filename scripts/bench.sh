#!/usr/bin/env bash
# Run every benchmark in bench/ and print their tables (pass --quick for smaller counts).
# Benchmarks are not tests: run them on a quiet machine; each one measures its raw limits
# (disk fsync rate, loopback bandwidth) in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
quick=""
for a in "$@"; do [ "$a" = "--quick" ] && quick="--quick"; done
echo "== targets: every shape, one table"; .venv/bin/python bench/targets.py $quick
echo "== broker: put/get throughput against raw limits"; .venv/bin/python bench/broker_bench.py $quick
echo "== broker transactions per flushTxLogAtCommit"; .venv/bin/python bench/tx_bench.py $quick
echo "== txlog library"; .venv/bin/python bench/txlog_bench.py
if [ -n "$quick" ]; then count=200000; else count=1000000; fi
echo "== client API end to end"; .venv/bin/python bench/client_e2e.py --count $count
for extra in bench/tx_client_bench.py; do
  [ -f "$extra" ] && { echo "== $extra"; .venv/bin/python "$extra" $quick; }
done
