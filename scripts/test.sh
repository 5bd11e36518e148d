#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs the whole test suite.
# Tests run in one pytest-xdist worker per core (at most 4): on CI's 2 cores the suite is
# about 20 min of CPU, much of it in servers and subprocesses a single worker waits on.
# --maxschedchunk 1: tests go to workers one at a time, so the slow ones (sorted first by
# tests/conftest.py) spread over the workers instead of all landing in the first worker's chunk.
# Pass -n 0 to run them in one process (e.g. with -x or a debugger).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/python -m pytest -p no:cacheprovider -n auto --maxprocesses 4 --dist load --maxschedchunk 1 "$@"
