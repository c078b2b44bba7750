#!/usr/bin/env bash
# Set up only what the demo needs (.venv with notify, no test servers, no browser, no
# Spark), then run the quickstart on embedded defaults: a broker, a producer, a consumer and
# a transaction (no ZooKeeper, no database). Extra args go to `notify demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
exec .venv/bin/notify demo "$@"
