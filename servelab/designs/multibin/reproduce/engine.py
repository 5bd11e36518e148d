"""Multi-Bin Batching Figures 5 and 7 on our real engine (measured), next to the simulators.

The measurements behind ``servelab reproduce multibin-engine`` (whose steps are in
``engine_run.py``):

* Figure 5: padded static batches of ``batch_size`` GSM8K prompts whose outputs are forced to
  n tokens (``ignore_eos``), for several n; the measured wall time of each batch is fitted
  with ``fit_linear_service_model`` (time = intercept + per_token * n).
* Figure 7 (reduced): ``num_requests`` GSM8K requests (seeded sample) all at t = 0, one
  instance, policy ``multibin`` with equal-mass (oracle) bins; each request generates exactly
  its reference-answer length in the checkpoint tokenizer's tokens (capped at ``max_tokens``).
  Measured throughput for every k, next to what the token-level simulator (``multibin``
  policy, ``LinearStepCost`` of the fitted line) and the queue simulator predict for the same
  requests.

The engine is our PyTorch engine on CPU with a random-weight checkpoint (``bench-30m`` preset
by default, made in a temporary folder), not Phi-3.5-mini on an A100: only ratios between k
values compare with the paper. Also: the token-level simulator with this machine's calibrated
per-step ``LinearCostModel``, and the queue simulator with the measured line on all 7473
requests (the paper's size). The reproduction writes ``out_dir/multibin_engine.md``, a plot,
and ``out_dir/multibin_engine.json`` (quoted by ``multibin.md``, see ``engine_summary``).
Invariant: every request of every run finishes, else ``RuntimeError`` names the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from servelab.designs.multibin.binning import BinEdges, quantile_edges
from servelab.designs.multibin.service_models import LinearFit, fit_linear_service_model
from servelab.core.request import RequestSpec
from servelab.paths import gsm8k_path
from servelab.designs.multibin.reproduce.experiments import burst_throughput, burst_throughput_token_level

FIG5_TOKENS = (16, 32, 64, 128, 256)
_KV_BUDGET_BYTES = 256 << 20  # far above one running batch of 8 x (prompt + 1024) on bench-30m


def gsm8k_requests(tokenizer, num_requests: int, seed: int, max_tokens: int,
                   path: Path | None = None) -> list[RequestSpec]:
    """A seeded sample of GSM8K: prompt ids from the question, output length = answer tokens (capped)."""
    from servelab.workloads.tokenize import count_tokens

    records = _gsm8k_records(path)
    if not 1 <= num_requests <= len(records):
        raise ValueError(f"num_requests must be in [1, {len(records)}], got {num_requests}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    chosen = [records[i] for i in np.random.default_rng(seed).permutation(len(records))[:num_requests]]
    outputs = np.clip(count_tokens(tokenizer, [r["answer"] for r in chosen]), 1, max_tokens)
    specs = []
    for i, (record, num_out) in enumerate(zip(chosen, outputs)):
        ids = tuple(tokenizer.encode(record["question"]).ids)
        specs.append(RequestSpec(i, 0.0, len(ids), int(num_out), prompt_token_ids=ids, prompt_text=record["question"]))
    return specs


def multibin_policy(edges: BinEdges, batch_size: int) -> str:
    """Policy spec string; the 1 us max-wait releases each bin's last partial batch (all arrive at t=0)."""
    spec = f"multibin:batch_size={batch_size},num_bins={edges.num_bins},max_wait_s=1e-6"
    if edges.num_bins > 1:
        spec += ",boundaries=explicit,edges=" + ";".join(repr(float(e)) for e in edges.inner)
    return spec


def run_engine(loaded, policy: str, specs: Sequence[RequestSpec], batch_size: int):
    """Serve ``specs`` on a fresh engine; every request emits exactly ``num_output_tokens`` (EOS ignored)."""
    from servelab.engine.sampling import SamplingParams
    from servelab.engine.serve_loop import EngineConfig, EngineInstance

    max_prompt = max(s.num_prompt_tokens for s in specs)
    config = EngineConfig(kv_budget_bytes=_KV_BUDGET_BYTES, max_batch_tokens=max(4096, batch_size * max_prompt),
                          max_num_seqs=max(batch_size, 8))
    params = {s.request_id: SamplingParams(temperature=0.0, max_tokens=s.num_output_tokens, ignore_eos=True)
              for s in specs}
    result = EngineInstance(loaded, policy, config).run(specs, params)
    done = [r for r in result.requests if r.status.name == "FINISHED"]
    if len(done) != len(specs) or any(r.num_generated_tokens != r.spec.num_output_tokens for r in done):
        raise RuntimeError(f"engine run {policy!r}: {len(done)} of {len(specs)} requests finished with their "
                           f"forced length; end reasons {result.summary.end_reasons}")
    return result


def measure_figure5(loaded, prompts: Sequence[RequestSpec], tokens: Sequence[int], repeats: int,
                    batch_size: int, log) -> dict:
    """Wall time of one padded batch of ``batch_size`` prompts forced to n output tokens, per n."""
    if len(prompts) < batch_size:
        raise ValueError(f"Figure 5 needs {batch_size} prompts, got {len(prompts)}")
    policy = f"multibin:batch_size={batch_size},num_bins=1,max_wait_s=1e-6"
    batch = list(prompts[:batch_size])

    def forced(n: int) -> list[RequestSpec]:
        return [RequestSpec(s.request_id, 0.0, s.num_prompt_tokens, n, prompt_token_ids=s.prompt_token_ids)
                for s in batch]

    run_engine(loaded, policy, forced(4), batch_size)  # warm-up: first calls allocate and compile paths
    xs, ys = [], []
    for rep in range(repeats):  # repeats interleaved over n: a burst of load from other processes hits one n less
        for n in tokens:
            xs.append(n)
            ys.append(run_engine(loaded, policy, forced(n), batch_size).wall_s)
            log(f"  figure 5: run {rep + 1}, n={n}: {ys[-1]:.3f} s")
    xs_arr, ys_arr = np.asarray(xs, dtype=np.float64), np.asarray(ys)
    fit = fit_linear_service_model(xs_arr, ys_arr)
    rel = (fit.model.request_time_s(xs_arr) - ys_arr) / ys_arr
    return {"tokens": xs, "times_s": ys, "fit": fit, "max_abs_rel_error": float(np.max(np.abs(rel))),
            "mean_abs_rel_error": float(np.mean(np.abs(rel))), "batch_prompt_tokens": [s.num_prompt_tokens
                                                                                      for s in batch]}


def batch_counts(lengths: np.ndarray, edges: BinEdges, batch_size: int) -> tuple[int, int]:
    """(batches, partial batches) that oracle binning of a t=0 burst forms."""
    per_bin = np.bincount(edges.bins_of(lengths), minlength=edges.num_bins)
    return int(np.sum(-(-per_bin // batch_size))), int(np.sum(per_bin % batch_size > 0))


def simulate_with_cost(specs: Sequence[RequestSpec], edges: BinEdges, cost_model, batch_size: int) -> float:
    """Token-level simulator, ``multibin`` policy, any step cost model: output tokens per second."""
    from servelab.cluster.config import single_instance
    from servelab.simulator import simulate

    params = dict(batch_size=batch_size, num_bins=edges.num_bins, boundaries="explicit", edges=edges.inner,
                  max_wait_s=1e-6)
    result = simulate(specs, single_instance("multibin", policy_params=params, max_num_seqs=max(batch_size, 8)),
                      cost_model=cost_model)
    if any(r.status.name != "FINISHED" for r in result.requests):
        raise RuntimeError("simulated Figure 7 run left requests unfinished")
    return result.num_output_tokens / result.makespan_s


def measure_figure7(loaded, specs: Sequence[RequestSpec], ks: Sequence[int], batch_size: int, fit: LinearFit,
                    step_cost, log) -> list[dict]:
    """Per k: engine throughput (measured), both simulators with the fitted line, and the token-level
    simulator with the calibrated per-step cost model ``step_cost`` (None: skipped)."""
    lengths = np.array([s.num_output_tokens for s in specs])
    rows = []
    for k in ks:
        edges = quantile_edges(lengths, k)
        t0 = time.perf_counter()
        res = run_engine(loaded, multibin_policy(edges, batch_size), specs, batch_size)
        s = res.summary
        queue_tok_s = burst_throughput(lengths, lengths, edges, fit.model, batch_size)
        token_tok_s = burst_throughput_token_level(specs, edges, fit.model, batch_size)
        step_tok_s = simulate_with_cost(specs, edges, step_cost, batch_size) if step_cost is not None else None
        num_batches, num_partial = batch_counts(lengths, edges, batch_size)
        rows.append({"k": k, "engine_tok_s": s.output_tokens_per_s, "engine_req_s": s.requests_per_s,
                     "engine_duration_s": s.duration_s, "padding_waste": s.padding_waste,
                     "num_steps": res.collector.num_steps, "num_batches": num_batches, "num_partial": num_partial,
                     "token_sim_tok_s": token_tok_s, "queue_sim_tok_s": queue_tok_s, "calibrated_sim_tok_s": step_tok_s})
        log(f"  figure 7: k={k}: engine {s.output_tokens_per_s:.1f} tok/s ({s.duration_s:.1f} s), token-level sim "
            f"{token_tok_s:.1f}, queue sim {queue_tok_s:.1f} ({time.perf_counter() - t0:.1f} s wall)")
    return rows


def full_size_line(tokenizer, fit: LinearFit, batch_size: int, max_tokens: int, seed: int,
                   ks: Sequence[int] = (1, 2, 4, 8, 16, 32)) -> dict:
    """Queue simulator with the measured line on every GSM8K request (the paper's size), per k: tok/s."""
    specs = gsm8k_requests(tokenizer, len(_gsm8k_records()), seed, max_tokens)
    lengths = np.array([s.num_output_tokens for s in specs])
    tok_s = [burst_throughput(lengths, lengths, quantile_edges(lengths, k), fit.model, batch_size) for k in ks]
    return {"ks": tuple(ks), "num_requests": len(specs), "tok_s": tok_s}


def _gsm8k_records(path: Path | None = None) -> list[dict]:
    from servelab.workloads._parse import read_jsonl

    return read_jsonl(path or gsm8k_path(), ("question", "answer"))[1]


def calibrate_steps(loaded, log):
    """Per-step ``LinearCostModel`` of this machine and checkpoint (``servelab calibrate``'s default grid)."""
    from servelab.engine.calibrate import calibrate

    log("calibrating the per-step cost model (servelab calibrate, default grid)")
    model, error, _ = calibrate(loaded)
    log(f"  calibration fit: {error}")
    return model, str(error)


def make_preset(folder: Path, preset: str, log) -> Path:
    from servelab.engine import tiny_model

    presets = {"bench-30m": tiny_model.BENCH_30M, "bench-200m": tiny_model.BENCH_200M}
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(presets)}")
    log(f"making the {preset} checkpoint in {folder}")
    return tiny_model.make_tiny_model(folder, **presets[preset])
