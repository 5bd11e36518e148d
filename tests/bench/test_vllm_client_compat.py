"""vLLM's own benchmark client (``vllm bench serve``) against ``servelab serve``.

Runs only where the vLLM venv exists (``scripts/setup_vllm_venv.sh``, ~3.5 GB, never installed
by the tests; ``VLLM_VENV`` names another one); skipped with that reason otherwise. The other
direction, ``servelab bench`` against a vLLM server, needs a vLLM server start (minutes of
compilation) and is exercised by ``python scripts/vs_vllm.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from servelab.bench.vs_vllm import VLLM_BENCH

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm"))


def _vllm_client_installed() -> bool:
    """The venv's benchmark module is on disk (importing vllm here would take ~10 s)."""
    return any(VENV.glob("lib/python3*/site-packages/vllm/benchmarks/serve.py"))


@pytest.mark.slow
@pytest.mark.skipif(not _vllm_client_installed(),
                    reason=f"no vLLM venv at {VENV} (create it with scripts/setup_vllm_venv.sh)")
@pytest.mark.parametrize("engine_process", [False, True], ids=["engine-thread", "engine-process"])
def test_vllm_bench_serve_runs_against_servelab(bench_checkpoint, tmp_path, engine_process):
    from servelab.engine.cluster import EngineConfig
    from servelab.server.run import ServerConfig, ServerThread

    config = ServerConfig(model=bench_checkpoint, port=0, served_model_name="model", engine_process=engine_process,
                          engine=EngineConfig(kv_budget_bytes=8 << 20, block_size=16, max_num_seqs=8))
    with ServerThread(config) as server:
        argv = [str(VENV / "bin" / "python"), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", server.base_url,
                "--endpoint", "/v1/completions", "--model", "model", "--tokenizer", str(bench_checkpoint),
                "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "8",
                "--random-range-ratio", "0", "--num-prompts", "4", "--ignore-eos", "--save-result",
                "--result-dir", str(tmp_path), "--result-filename", "out.json", "--disable-tqdm"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["completed"] == 4 and result["total_output_tokens"] == 4 * 8
    assert result["median_ttft_ms"] > 0 and result["median_tpot_ms"] > 0
