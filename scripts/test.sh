#!/usr/bin/env bash
# Set up, then run the whole test suite (lint, types, tests). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check notify tests bench
.venv/bin/mypy
# test helpers run as child processes too (workers, clients): compiled once here
.venv/bin/python -m compileall -q -j 0 tests >/dev/null
# three worker processes on two cores (the tests wait on brokers, databases, fsyncs and
# timeouts about half of the time), one test file each at a time (module fixtures stay per file)
exec .venv/bin/pytest -n 3 --dist loadfile "$@"
