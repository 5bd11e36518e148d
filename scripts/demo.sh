#!/usr/bin/env bash
# Installs what servelab needs (idempotent) and runs the demo: the real Azure 2023
# conversation trace on simulated Llama-2-7B / A100-80GB instances, four baselines side by side.
# The results go under results/demo/ in the folder it was started from (where it says).
set -euo pipefail
here="$(pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
(cd "$root" && bash scripts/setup_env.sh)
cd "$here"
exec "$root/.venv/bin/servelab" demo "$@"
