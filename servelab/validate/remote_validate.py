"""``servelab validate --base-url URL``: a workload replayed against a running server (the
bench client, arrival times kept) and through the simulator with a fitted step model and
the server's limits; per-request errors next to the server's own replay-to-replay noise.

The requests: the workload spec's arrival times (relative to its first) and its prompt and
output lengths, capped as ``servelab validate`` caps them; prompts are random token ids of
that length (a random-weight or real model's step time depends on shapes, not on tokens),
outputs forced by ``ignore_eos``. The simulator gets the same requests (prompt lengths as
the server counted them), the policy (``sarathi`` with ``token_budget`` = the server's
``max_num_batched_tokens`` is vLLM v1's chunked prefill with decodes first), the batch limits,
block size, KV blocks and context limit the server reported or the flags gave.

Errors are |sim - measured| / measured per request (TTFT, TPOT, e2e) against the first
replay; the noise is the same error between the second replay and the first. An error
inside the noise is as good as the measurement can tell. The distributions' p50 and p90
are compared too (``distribution_errors``): in a burst, which request the server takes first
is the HTTP arrival order, which a per-request error counts and a distribution does not.
``rescale`` times three calibration probes right before the replays and also simulates with
the fit scaled to them (``drift_ratio``): on a shared machine the load moves between the
calibration and the replay, and the scaled run says how much of the error that drift explains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError
from servelab.validate.load import LoadSampler, same_load
from servelab.validate.workloads import ValidationWorkload

METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class RemoteOptions:
    base_url: str
    cost_model: Path
    workload: ValidationWorkload
    policy: str = "sarathi"
    replays: int = 2
    vocab: int = 500
    api_key: str | None = None
    seed: int = 0
    data_dir: Path | None = None
    rescale: bool = False  # drift probes before the replays; also simulate with the model scaled to them

    def __post_init__(self) -> None:
        if not 1 <= self.replays <= 10:
            raise UserError(f"--replays must be in [1, 10], got {self.replays}")


@dataclass
class RemoteValidation:
    options: RemoteOptions
    limits: object
    planned: list
    replays: list[list[dict]]  # per replay, per request: ttft/tpot/e2e seconds (None when failed)
    sim: list[dict]
    metrics: dict
    durations_s: list[float]
    load_avg: list[tuple[float, float]]  # 1-min load average before / after each replay


def plan_requests(options: RemoteOptions) -> list:
    from servelab import api
    from servelab.bench.prompts import PlannedRequest

    w = options.workload
    specs = api.load_workload(w.spec, data_dir=options.data_dir or api.DEFAULT_DATA_DIR, seed=options.seed)
    if not specs:
        raise UserError(f"workload {w.spec!r} has no requests")
    rng = np.random.default_rng(options.seed)
    t0 = min(s.arrival_time_s for s in specs)
    out = []
    for i, s in enumerate(sorted(specs, key=lambda s: (s.arrival_time_s, s.request_id))):
        n = max(1, min(s.num_prompt_tokens, w.max_prompt))
        ids = [int(x) for x in rng.integers(10, options.vocab, size=n)]
        out.append(PlannedRequest(i, float(s.arrival_time_s - t0), ids, n, max(1, min(s.num_output_tokens,
                                                                                      w.max_output))))
    return out


def _times(r) -> dict:
    if not r.success:
        return {"ttft": None, "tpot": None, "e2e": None, "prompt_len": r.prompt_len, "error": r.error}
    return {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2e": r.latency_s, "prompt_len": r.prompt_len, "error": ""}


def replay(options: RemoteOptions, model: str, planned: list) -> tuple[list[dict], float]:
    from servelab.bench.run import BenchConfig, run_benchmark

    config = BenchConfig(base_url=options.base_url, model=model, api_key=options.api_key, progress=False)
    results, duration, _, _ = run_benchmark(config, planned)
    return [_times(r) for r in results], duration


def sim_policy(policy: str, max_batched_tokens: int) -> str:
    """``sarathi`` gets the server's step token limit as its chunk budget unless the spec sets one."""
    from servelab.core.registry import parse_name_params

    name, params = parse_name_params(policy)
    if name == "sarathi":
        params.setdefault("token_budget", max_batched_tokens)
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


def simulate(options: RemoteOptions, limits, planned: list, prompt_lens: list[int], cost) -> list[dict]:
    from servelab.cluster.presets import cluster_for
    from servelab.core.request import RequestSpec
    from servelab.simulator.run import Simulation

    v = limits.values
    specs = [RequestSpec(p.index, p.arrival_s, n, p.output_len) for p, n in zip(planned, prompt_lens)]
    cluster = cluster_for(sim_policy(options.policy, v["max_num_batched_tokens"]), block_size=v["block_size"],
                          max_batch_tokens=v["max_num_batched_tokens"], max_num_seqs=v["max_num_seqs"])
    cluster = replace(cluster, max_model_len=v["max_model_len"])
    sim = Simulation(specs, cluster, cost_model=cost)
    if v.get("num_gpu_blocks"):
        for d in sim.instances:
            d.runtime.resize(v["num_gpu_blocks"])
    result = sim.run()
    extra = request_overhead_of(cost)
    out = []
    for r in sorted(result.requests, key=lambda r: r.request_id):
        t = r.token_times_s
        done = bool(t) and r.status.value == "finished"
        out.append({"ttft": t[0] - r.arrival_time_s + extra if done else None,
                    "tpot": (t[-1] - t[0]) / (len(t) - 1) if done and len(t) > 1 else None,
                    "e2e": r.finish_time_s - r.arrival_time_s + extra if done else None})
    return out


def request_overhead_of(cost) -> float:
    """The fit's request overhead (``remote_calibrate.request_overhead``), 0 when it has none;
    scaled with the model by ``scaled`` like every step cost."""
    try:
        return float(cost.meta.get("request_overhead_s", 0.0))
    except ValueError:
        return 0.0


def _ape(a, b):
    return None if a is None or b is None or b <= 0 else abs(a - b) / b


def error_stats(pred: list[dict], real: list[dict]) -> dict:
    """Median and p90 of |pred - real| / real per metric, with the signed median (bias)."""
    out = {}
    for m in METRICS:
        pairs = [(p[m], r[m]) for p, r in zip(pred, real) if p[m] is not None and r[m] is not None and r[m] > 0]
        ape = np.array([abs(a - b) / b for a, b in pairs])
        bias = np.array([(a - b) / b for a, b in pairs])
        out[m] = {"median": float(np.median(ape)) if len(ape) else None,
                  "p90": float(np.percentile(ape, 90)) if len(ape) else None, "n": int(len(ape)),
                  "bias_median": float(np.median(bias)) if len(bias) else None}
    return out


def distribution_errors(pred: list[dict], real: list[dict]) -> dict:
    """Per metric, |p50(pred) - p50(real)| / p50(real) and the same at p90: errors of the
    distributions, which do not depend on which request the server happened to take first
    (in a burst that order is the HTTP arrival order, a per-request error counts it)."""
    out = {}
    for m in METRICS:
        a = [p[m] for p in pred if p[m] is not None]
        b = [r[m] for r in real if r[m] is not None]
        out[m] = {q: (None if not a or not b or np.percentile(b, q) <= 0
                      else float(abs(np.percentile(a, q) - np.percentile(b, q)) / np.percentile(b, q)))
                  for q in (50, 90)}
    return out


DRIFT_PROBES = (("prefill", 512, 1, 4), ("decode", 128, 8, 12), ("decode", 512, 2, 12))
DRIFT_TRIES = 3  # a probe whose tokens the client read in one burst (a loaded machine) is sent again


def drift_ratio(options: RemoteOptions, limits, cost) -> dict:
    """How much slower (> 1) or faster the server is now than the fitted model says: a few
    calibration probes (a 512-token prefill, 8 and 2 decode rows) right before the replays,
    the median of measured / predicted over their samples. On a shared machine the load at
    calibration and at replay differ; the scaled simulation tells that drift apart from the
    model's shape (if scaling closes the gap, the line was right and the machine moved).
    A probe that gave no sample (``samples_of`` drops streams read in bursts, as a starved
    client reads them) is sent again, up to ``DRIFT_TRIES`` times, so the ratio stands on every
    shape and not only on the ones the load happened to spare; ``per_probe`` says how many
    samples each gave, in how many tries, and why none when none."""
    import asyncio

    from servelab.validate.probes import Probe, run_plan

    v = limits.values
    plan = [Probe(k, max(1, min(p, v["max_model_len"] - o - 1, v["max_num_batched_tokens"])),
                  min(b, v["max_num_seqs"]), o) for k, p, b, o in DRIFT_PROBES]
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
    ratios, per_probe = [], []
    for k, probe in enumerate(plan):
        report = {"probe": probe.label, "samples": 0, "tries": 0, "note": ""}
        while report["tries"] < DRIFT_TRIES and not report["samples"]:
            report["tries"] += 1
            runs, _ = asyncio.run(run_plan(options.base_url, limits.model, [probe], 120.0, vocab=options.vocab,
                                           seed=options.seed + 1 + k * DRIFT_TRIES + report["tries"],
                                           headers=headers))
            got = [t / cost.step_time_s(shape) for r in runs for shape, t in r.samples
                   if cost.step_time_s(shape) > 0]
            ratios += got
            report["samples"] = len(got)
            report["note"] = "; ".join(r.note for r in runs if r.note) if not got else ""
        per_probe.append(report)
    return {"ratio": float(np.median(ratios)) if ratios else None, "ratios": ratios, "per_probe": per_probe}


def scaled(cost, ratio: float):
    """The model with every coefficient times ``ratio`` (token factors, a shape, unchanged)."""
    from servelab.costmodel.linear import COEFFICIENTS

    meta = dict(cost.meta)
    if "request_overhead_s" in meta:
        meta["request_overhead_s"] = f"{request_overhead_of(cost) * ratio:.6g}"
    return replace(cost, meta=meta, **{c: getattr(cost, c) * ratio for c in COEFFICIENTS})


def run_remote_validation(options: RemoteOptions, limits, echo=print) -> RemoteValidation:
    from servelab.costmodel.linear import LinearCostModel

    planned = plan_requests(options)
    drift = None
    if options.rescale:
        drift = drift_ratio(options, limits, LinearCostModel.load(options.cost_model))
        echo(f"  drift probes: the server is {drift['ratio']:.2f}x the fitted model's step times now"
             if drift["ratio"] else "  drift probes: no sample")
    replays, durations, loads = [], [], []
    for k in range(options.replays):
        t0 = time.perf_counter()
        with LoadSampler() as sampler:
            rows, duration = replay(options, limits.model, planned)
        replays.append(rows)
        durations.append(duration)
        loads.append(sampler.summary())
        failed = sum(1 for r in rows if r["ttft"] is None)
        echo(f"  replay {k + 1}/{options.replays}: {len(rows)} requests in {time.perf_counter() - t0:.1f} s"
             + (f", {failed} failed ({next(r['error'] for r in rows if r['ttft'] is None)[:200]})" if failed else ""))
    if all(r["ttft"] is None for r in replays[0]):
        raise UserError("every request of the first replay failed; see the errors above")
    prompt_lens = [r["prompt_len"] or p.prompt_len for r, p in zip(replays[0], planned)]
    cost = LinearCostModel.load(options.cost_model)
    sim = simulate(options, limits, planned, prompt_lens, cost)
    metrics = {"sim_vs_replay": [error_stats(sim, rows) for rows in replays],
               "noise": [error_stats(rows, replays[0]) for rows in replays[1:]],
               "distribution": [distribution_errors(sim, rows) for rows in replays],
               "distribution_noise": [distribution_errors(rows, replays[0]) for rows in replays[1:]],
               "num_requests": len(planned), "durations_s": durations,
               "failed": [sum(1 for r in rows if r["ttft"] is None) for rows in replays],
               "sim_unfinished": sum(1 for r in sim if r["ttft"] is None),
               "load_avg_1min": [(x["start"], x["end"]) if x else (None, None) for x in loads],
               "load": loads, "calibration_load": calibration_load(cost), "limits": limits.to_json(), "workload": options.workload.label,
               "policy": sim_policy(options.policy, limits.values["max_num_batched_tokens"]),
               "request_overhead_s": request_overhead_of(cost)}
    metrics["same_load"] = same_load(loads[0], loads[1]) if len(loads) >= 2 else None
    metrics["inside_noise"] = inside_noise(metrics)
    if drift is not None and drift["ratio"]:
        sim_scaled = simulate(options, limits, planned, prompt_lens, scaled(cost, drift["ratio"]))
        metrics["drift"] = drift
        metrics["scaled_vs_replay"] = [error_stats(sim_scaled, rows) for rows in replays]
        metrics["scaled_distribution"] = [distribution_errors(sim_scaled, rows) for rows in replays]
    return RemoteValidation(options, limits, planned, replays, sim, metrics, durations,
                            metrics["load_avg_1min"])


def calibration_load(cost) -> float | None:
    """The 1-minute load average while the fit's probes ran (``calibrate --base-url`` records it)."""
    try:
        return float(cost.meta["load_avg_1min"])
    except (KeyError, ValueError):
        return None


def inside_noise(metrics: dict) -> dict[str, bool | None]:
    """Per metric: is the simulator's median error (against replay 1) at most the median
    replay-to-replay error. None without a second replay, and None when the two replays did
    not run at the same load (``load.same_load``): the noise they measure then includes the
    load's move, and an error inside it says nothing."""
    loads = metrics.get("load") or []
    if not metrics["noise"] or (len(loads) >= 2 and same_load(loads[0], loads[1]) is False):
        return dict.fromkeys(METRICS)
    sim, noise = metrics["sim_vs_replay"][0], metrics["noise"][0]
    return {m: (None if sim[m]["median"] is None or noise[m]["median"] is None
                else bool(sim[m]["median"] <= noise[m]["median"])) for m in METRICS}
