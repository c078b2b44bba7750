#!/usr/bin/env bash
# Set up, then run the quickstart on embedded defaults: a broker, a producer, a consumer
# and a transaction (no ZooKeeper, no database).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/notify demo "$@"
