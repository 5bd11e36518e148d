#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (idempotent: re-runs only when a lock changes).
#   setup_env.sh          runtime set (requirements.lock): demo, simulator, engine, server, Ray
#   setup_env.sh test     runtime + test set (requirements-test.lock): pytest, hypothesis, HF, openai...
# torch is pinned to the CPU build served from local disk; never let pip resolve a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want=${1:-runtime}
locks=requirements.lock
[ "$want" = test ] && locks="requirements.lock requirements-test.lock"
stamp=.venv/.servelab-$want-$(cat $locks | sha1sum | cut -c1-12)
if [ -f "$stamp" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet torch==2.13.0
for lock in $locks; do .venv/bin/python -m pip install --quiet -r "$lock"; done
.venv/bin/python -m pip install --quiet --no-deps -e .
rm -f .venv/.servelab-$want-*
touch "$stamp"
