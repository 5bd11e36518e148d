"""The reproduction's setting: the paper's server, systems and workloads, and one run.

Paper (Section 4.1): one server, 8 x H100 with NVLink, 800 GB DRAM, PCIe 5.0; OPT-2.7B /
6.7B / 13B / 30B in fp16, one GPU per instance. Choices the paper leaves open, stated in the
report: every system gets the same GPUs (vLLM and the FastGen stand-in run one mixed
instance per GPU behind a least-loaded router; DistServe and AlignedServe split them half
prefill, half decode, with NVLink between them); all requests arrive at time 0 (offline
decoding throughput, no SLO); OPT's 2,048-token context is lifted to 16,384 in the cost
model (the paper runs 8-10K requests on OPT, so it must have done the same; OPT's learned
positions do not enter a cost model).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from servelab.cluster.config import ClusterConfig
from servelab.cluster.presets import cluster_for
from servelab.core.request import RequestSpec
from servelab.designs.alignedserve.reproduce import latency
from servelab.reproduce.jobs import JOBS_ENV, map_in_processes  # noqa: F401  (JOBS_ENV: the tests' handle)
from servelab.simulator.run import Simulation

GPU = "H100-80GB"
MAX_MODEL_LEN = 16384
# the paper's vLLM "integrates the technologies proposed by Sarathi-Serve and Orca": chunked prefill
# (a 2048-token step budget) with decodes in every step; our ``vllm`` policy runs whole prompts
# between decode iterations (vLLM without chunked prefill), kept as a gap-test variant
VLLM_CHUNKED = "sarathi:token_budget=2048"
SYSTEMS = {  # label -> policy spec (presets included)
    "vLLM": VLLM_CHUNKED,
    "DistServe": "distserve",
    "FastGen (sarathi)": "sarathi:token_budget=512",
    "AlignedServe": "alignedserve",
}


@dataclass(frozen=True)
class Setting:
    num_gpus: int = 8
    models: tuple[str, ...] = ("OPT-2.7B", "OPT-6.7B", "OPT-13B", "OPT-30B")


def cluster(system_spec: str, model: str, num_gpus: int, *, max_decode_seqs: int | None = None,
            host_link_scale: float = 1.0, decode_policy: tuple[str, dict] | None = None) -> ClusterConfig:
    """``max_decode_seqs`` caps a decode instance's running rows (the batch-switch gap test);
    ``host_link_scale`` scales the GPU-host (PCIe) link's bandwidth, the host pool's link (the
    Fig. 14 link-speed gap test); ``decode_policy`` (name, params) replaces the decode
    instances' policy (the Fig. 11 DistServe gap test: DistServe's decode loop pausing for
    joining KV)."""
    c = cluster_for(system_spec, num_instances=num_gpus, gpu=GPU, model=model)
    if decode_policy is not None:
        c = replace(c, groups=tuple(replace(g, policy=decode_policy[0], policy_params=dict(decode_policy[1]))
                                    if g.role == "decode" else g for g in c.groups))
    if host_link_scale != 1.0:
        from servelab.cluster.links import fitted_link_figures
        from servelab.costmodel.links import LinkSpec

        pcie = fitted_link_figures(GPU)["pcie"]
        c = replace(c, topology=replace(c.topology, host_link=LinkSpec(pcie.bandwidth_bytes_per_s * host_link_scale,
                                                                      pcie.latency_s)))
    # vLLM without chunked prefill requires max_num_batched_tokens >= max_model_len: the step
    # limit follows the lifted context (else Fig. 12's 10K prompts are rejected, 8192 < 10000)
    groups = tuple(replace(g, max_batch_tokens=max(g.max_batch_tokens, MAX_MODEL_LEN),
                           max_num_seqs=min(g.max_num_seqs, max_decode_seqs) if max_decode_seqs and g.role == "decode"
                           else g.max_num_seqs) for g in c.groups)
    return replace(c, groups=groups, max_model_len=MAX_MODEL_LEN, on_overflow="truncate")


def synthetic(n: int, short_share: float, seed: int, *, long_range=(1000, 8000)) -> list[RequestSpec]:
    """Figure 7's mixes: short requests under 1K tokens (prompt 32-800, output 16-200), long
    ones of 1-8K (prompt in ``long_range`` less the output, output 16-500), all at time 0."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if rng.random() < short_share:
            prompt, output = int(rng.integers(32, 801)), int(rng.integers(16, 201))
        else:
            output = int(rng.integers(16, 501))
            prompt = max(32, int(rng.integers(*long_range)) - output)
        out.append(RequestSpec(i, 0.0, prompt, output))
    return out


def fixed_mix(n: int, long_share: float, long_len: int, seed: int, *, short_len: int = 200) -> list[RequestSpec]:
    """Figure 12's mixes: short requests of a constant length, long ones of ``long_len``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        total = long_len if rng.random() < long_share else short_len
        output = int(rng.integers(32, 129))
        out.append(RequestSpec(i, 0.0, max(16, total - output), output))
    return out


def application(name: str, n: int, seed: int) -> list[RequestSpec]:
    """Real length distributions, all at time 0. ShareGPT has no data here: a log-normal
    stand-in with ShareGPT's published means (prompt ~ 300, output ~ 250 tokens); LongBench's
    stand-in is the arXiv summarization lengths (as the issue suggests)."""
    from servelab.api import load_workload

    specs = {
        "ShareGPT-like": f"burst:n={n},prompt=lognormal(180,1.0,4096),output=lognormal(180,0.8,1024)",
        "LongBench-like (arXiv)": f"arxiv:n={n}",
        "Azure code": f"azure-code:n={n}",
        "Azure conv": f"azure-conv:n={n}",
        "Mooncake conv": f"mooncake:n={n}",
    }[name]
    reqs = load_workload(specs, seed=seed)
    return [replace(r, arrival_time_s=0.0) for r in reqs]


APPLICATIONS = ("ShareGPT-like", "LongBench-like (arXiv)", "Azure code", "Azure conv", "Mooncake conv")


def run(specs: list[RequestSpec], system_spec: str, model: str, num_gpus: int, *, cost_model=None,
        max_decode_seqs: int | None = None, host_link_scale: float = 1.0,
        decode_policy: tuple[str, dict] | None = None,
        probe: Callable[[Simulation, object], dict] | None = None) -> dict:
    """One simulation -> decoding throughput, TPOT (from the second token, ``latency.split``), TTFT,
    the first-to-second-token wait, decode-iteration times, router stats; ``probe(sim, result)``
    adds what a gap test reads from the finished simulation (a module-level function, so runs
    spread over processes can carry it)."""
    t0 = time.process_time()
    # P/D runs step one iteration at a time, so each recorded decode row is one iteration
    # (a fast-forwarded run's row would blur decode iterations with recomputed prefills)
    pd = system_spec.startswith(("distserve", "alignedserve"))
    sim = Simulation(specs, cluster(system_spec, model, num_gpus, max_decode_seqs=max_decode_seqs,
                                    host_link_scale=host_link_scale, decode_policy=decode_policy),
                     cost_model=cost_model, fast_forward=not pd)
    res = sim.run()
    done = [r for r in res.requests if r.status.value == "finished"]
    ttft = [r.token_times_s[0] - r.arrival_time_s for r in done if r.token_times_s]
    second = [r.token_times_s[1] - r.token_times_s[0] for r in done if len(r.token_times_s) > 1]
    out = {
        "system": system_spec, "model": model, "num_gpus": num_gpus, "num_requests": len(specs),
        "num_finished": len(done), "conserved": res.conserved,
        "decode_tok_s": res.num_output_tokens / res.makespan_s if res.makespan_s > 0 else 0.0,
        "makespan_s": res.makespan_s,
        "tok_s_first90": _first90(done),
        **latency.split([np.asarray(r.token_times_s, dtype=float) for r in done]),  # TPOT from the 2nd token
        "ttft_mean_s": float(np.mean(ttft)) if ttft else float("nan"),
        "ttft_max_s": float(np.max(ttft)) if ttft else float("nan"),
        "second_token_mean_s": float(np.mean(second)) if second else float("nan"),
        "second_token_max_s": float(np.max(second)) if second else float("nan"),
        "decode_step_ms": _decode_steps_ms(sim, res),
        "num_recompute_preemptions": res.collector.num_preemptions("recompute"),
        "cpu_s": time.process_time() - t0,
    }
    router = sim.router
    if hasattr(router, "stats"):
        out["router"] = router.stats.summary()
        out["step_ms"] = [1e3 * s for s in router.stats.step_s]
        out["schedule_ms"] = [1e3 * s for s in router.stats.schedule_s]
        out["release_ms"] = [1e3 * s for s in router.stats.release_s]
        out["pool_samples"] = router.stats.pool_samples
    out["handoff_ms"] = [1e3 * dur for src, dst, _, dur, _ in res.transfers
                         if dst >= 0 and _role(sim, dst) == "decode"]
    if probe is not None:
        out.update(probe(sim, res))
    return out


def run_many(tasks: list[dict], keep: Callable[[dict], dict] | None = None) -> list[dict]:
    """``keep(run(**task))`` for each task, in order (``keep``: a module-level function that keeps
    what the caller needs, applied where the run ran, so a worker sends back rows, not traces),
    over ``SERVELAB_REPRO_JOBS`` worker processes (``servelab.reproduce.jobs``: same results as
    one process but for ``cpu_s``, each run's own)."""
    return map_in_processes(_run_task, [(t, keep) for t in tasks])


def _run_task(item: tuple[dict, Callable[[dict], dict] | None]) -> dict:
    task, keep = item
    r = run(**task)
    return keep(r) if keep is not None else r


def _first90(done) -> float:
    """Output tokens per second until 90% of them were generated: throughput without the
    makespan's tail (a gap test: does a loss come from the last batches alone?)."""
    times = np.sort(np.concatenate([np.asarray(r.token_times_s, dtype=float) for r in done if r.token_times_s])
                    if done else np.zeros(0))
    if not len(times):
        return float("nan")
    k = int(0.9 * len(times))
    return k / times[k - 1] if k and times[k - 1] > 0 else float("nan")


def _role(sim: Simulation, iid: int) -> str:
    return sim.driver.drivers[iid].runtime.role


def _decode_steps_ms(sim: Simulation, res) -> dict:
    """Per-iteration times of decode instances' pure decode steps (P/D systems only: they run
    without fast-forwarding, so a row is one iteration; a mixed instance's rows are not split)."""
    steps = res.collector.steps
    if not len(steps):
        return {}
    roles = np.array([_role(sim, int(i)) for i in steps.instance_id])
    pure = (roles == "decode") & (steps.num_rows > 0) & (steps.num_tokens == steps.num_rows)
    rows = steps.num_rows[pure]
    count = np.ones(int(pure.sum()))
    per = steps.duration_s[pure]
    if not len(per):
        return {}
    num_decode = sum(1 for d in sim.driver.drivers if d.runtime.role == "decode")
    # the share of the decode GPUs' time spent in steps: with rows and iteration time it makes up
    # decode throughput (tokens/s = busy x decode GPUs x rows / iteration time), so a throughput
    # ratio splits into rows, iteration speed and busy time (the report's decomposition)
    busy = float(steps.duration_s[roles == "decode"].sum()) / (num_decode * res.makespan_s) \
        if num_decode and res.makespan_s > 0 else float("nan")
    order = np.argsort(per)
    cum = np.cumsum(count[order]) / count.sum()
    def q(p):
        return 1e3 * float(per[order][np.searchsorted(cum, p)])
    return {"mean": 1e3 * float((per * count).sum() / count.sum()), "p50": q(0.5), "p90": q(0.9),
            "rows_mean": float((rows * count).sum() / count.sum()),
            "share_under_30ms": float(count[per < 0.030].sum() / count.sum()), "busy_share": busy}
