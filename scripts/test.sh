#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs the whole test suite.
# Tests run in one pytest-xdist worker per core (at most 4): on CI's 2 cores the suite is
# about 20 min of CPU, much of it in servers and subprocesses a single worker waits on.
# --dist worksteal: a worker that runs out of tests takes pending ones from the other.
# Pass -n 0 to run them in one process (e.g. with -x or a debugger).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/python -m pytest -p no:cacheprovider -n auto --maxprocesses 4 --dist worksteal "$@"
