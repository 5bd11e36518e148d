#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (idempotent: re-runs only when the lock changes).
# torch is pinned to the CPU build served from local disk; never let pip resolve a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.servelab-lock-$(sha1sum requirements.lock | cut -c1-12)
if [ -f "$stamp" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -r requirements.lock
.venv/bin/python -m pip install --quiet --no-deps -e .
rm -f .venv/.servelab-lock-*
touch "$stamp"
