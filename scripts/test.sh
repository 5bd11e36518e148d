#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
