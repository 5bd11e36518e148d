#!/usr/bin/env bash
# Installs what servelab needs (idempotent) and runs the demo: the real Azure 2023
# conversation trace on simulated Llama-2-7B / A100-80GB instances, four baselines side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/servelab demo "$@"
