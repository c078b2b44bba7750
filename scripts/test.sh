#!/usr/bin/env bash
# Set up, then run the whole test suite (lint, types, tests). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check notify txlog configserver tests bench
.venv/bin/mypy
exec .venv/bin/pytest "$@"
