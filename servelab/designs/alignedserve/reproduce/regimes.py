"""Issue 25's headline grid: AlignedServe where its premise holds, under every decode kernel.

The premise is a deep pool: Density First Search narrows a batch only when the pool holds
more KV blocks than the threshold (40% of a decode GPU). With the paper's join rule (one
for one after completions) the decode GPU runs one batch at a time and the rest of an
offline load waits in the pool, so every cut's pool depth is recorded and printed.

Each (workload, kernel, seed) runs the same requests on the same GPUs through:

- vLLM (one mixed instance per GPU): the comparison "same GPUs, same load";
- DistServe (the same P/D split as AlignedServe): the comparison "AlignedServe's mechanisms
  on the system it is built on" (the paper's prototype is DistServe plus the pool);
- AlignedServe with FCFS batches from the pool (``prefix_aware=false``): the pool, the join
  rule and prefetch without alignment, so AlignedServe / this = alignment's own share;
- AlignedServe with the greedy join (``join=greedy``), the rule before issue 25;
- AlignedServe with one join per completion (``join=one-for-one``), the first reading of
  the paper's rule in issue 25 (rows stay at the first batch's size);
- AlignedServe without GPU prefetch (``prefetch=false``): iterations wait for PCIe;
- AlignedServe with a 90% block threshold: a gap test (are rows per iteration and the
  switch share set by the paper's 40% batch size?);
- AlignedServe with a minimum batch of 128 (the example in the paper's text; its evaluation
  uses 36): a gap test (under the paper's triggers a batch is refilled only below the
  minimum, so are rows per iteration set by it?).

Kernels are the cost model's ``--attention-kernel`` choices (``split-kv`` is the H100
default; ``per-seq`` and ``padded`` let the longest row bound a step).
"""

from __future__ import annotations

from servelab.costmodel.attention import KERNELS
from servelab.costmodel.options import CostOptions
from servelab.designs.alignedserve.reproduce import setting as st
from servelab.reproduce.stats import t_interval

VARIANTS = {  # label -> spec
    "vLLM": st.VLLM_CHUNKED,
    "DistServe": "distserve",
    "AlignedServe": "alignedserve",
    "AlignedServe, FCFS pool": "alignedserve:prefix_aware=false",
    "AlignedServe, greedy join": "alignedserve:join=greedy",
    "AlignedServe, one for one": "alignedserve:join=one-for-one",
    "AlignedServe w/o prefetch": "alignedserve:prefetch=false",
    "AlignedServe, 90% threshold": "alignedserve:block_fraction=0.9",
    "AlignedServe, min batch 128": "alignedserve:min_batch=128",
}
# req/s: about 3x DistServe's offline rate on ShareGPT-like (checked in the report). At 100 req/s (the rate before)
# only 12% of AlignedServe's requests were cut from a pool over the block threshold (seed 0, split-kv): AlignedServe
# keeps up there, so the pool stays shallow; at 200 req/s with twice the requests (20 s of arrivals) 78% were
POISSON_RATE = 200.0
POISSON_FACTOR = 2  # the sustained load runs this many times the grid's request count
POISSON = f"ShareGPT-like, Poisson {POISSON_RATE:g} req/s"
WORKLOADS = ("synthetic 95% short", "ShareGPT-like", POISSON)
ROUTER_KEYS = ("switch_share", "rows_per_iteration_mean", "pool_depth_at_cut", "num_starved", "num_starved_batches",
               "num_kv_waits", "kv_wait_total_s", "kv_wait_p50_p95_ms", "batch_size_mean", "batch_span_median",
               "num_batches", "num_joins_small", "num_joins_completions", "iteration_bubble",
               "batch_blocks_over_threshold_p10_p50_p90", "gpu_blocks_used_p10_p50_p90", "switch_event_share",
               "switch_minority_rows_p50", "switch_share_over_tenth", "num_steals", "num_stolen")


def _specs(workload: str, n: int, seed: int):
    """At time 0 (offline, as the paper), or sustained Poisson arrivals above decode capacity."""
    if workload.startswith("synthetic"):
        return st.synthetic(n, 0.95, seed)
    if workload == POISSON:
        from servelab.api import load_workload

        return load_workload(f"poisson:rate={POISSON_RATE:g},n={POISSON_FACTOR * n},prompt=lognormal(180,1.0,4096),"
                             "output=lognormal(180,0.8,1024)", seed=seed)
    return st.application(workload, n, seed)


def offline_capacity(rows: list[dict], kernel: str, label: str = "DistServe") -> float:
    """``label``'s request rate (requests / makespan) on ShareGPT-like at time 0 under ``kernel``,
    mean over seeds: what a sustained arrival rate must exceed to keep the pool filling."""
    rates = [r["num_requests"] / r["makespan_s"] for r in rows
             if r["workload"] == "ShareGPT-like" and r["kernel"] == kernel and r["label"] == label]
    return sum(rates) / len(rates) if rates else float("nan")


def headline_grid(sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """Every variant x workload x kernel x seed (seeds ``seed .. seed + sizes.seeds - 1``; under
    split-kv, the default kernel and the headline, ``sizes.seeds_split_kv``)."""
    keys, tasks = [], []
    for workload in WORKLOADS:
        for kernel in KERNELS:
            cost = CostOptions(attention_kernel=kernel)
            n_seeds = sizes.seeds_split_kv if kernel == "split-kv" else sizes.seeds
            for s in range(seed, seed + n_seeds):
                specs = _specs(workload, sizes.regime_requests, s)
                for label, spec in VARIANTS.items():
                    keys.append((label, workload, kernel, s))
                    tasks.append({"specs": specs, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus,
                                  "cost_model": cost})
    rows = []
    for (label, workload, kernel, s), row in zip(keys, st.run_many(tasks, keep=_row)):  # SERVELAB_REPRO_JOBS processes
        row.update(label=label, workload=workload, kernel=kernel, seed=s)
        rows.append(row)
    return rows


def _row(r: dict) -> dict:
    """What the grid keeps of a run (in the worker that ran it)."""
    row = {k: r[k] for k in ("decode_tok_s", "tok_s_first90", "makespan_s", "tpot_p99_ms", "num_finished", "num_requests",
                             "conserved", "cpu_s", "model", "num_gpus")}
    row.update(decode_rows_mean=r["decode_step_ms"].get("rows_mean"), decode_step_mean_ms=r["decode_step_ms"].get("mean"),
               decode_busy=r["decode_step_ms"].get("busy_share"))
    if "router" in r:
        row["router"] = {k: r["router"][k] for k in ROUTER_KEYS}
    return row


def summarise(rows: list[dict]) -> list[dict]:
    """Per (workload, kernel): each variant's throughput interval over seeds, and per-seed
    ratios (AlignedServe over each comparison) as intervals."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for kernel in dict.fromkeys(r["kernel"] for r in rows):
            cell = [r for r in rows if r["workload"] == workload and r["kernel"] == kernel]
            if not cell:
                continue
            by = {}
            for r in cell:
                by.setdefault(r["label"], {})[r["seed"]] = r
            seeds = sorted(by["AlignedServe"])
            tput = {lab: t_interval([v[s]["decode_tok_s"] for s in seeds]) for lab, v in by.items()}
            ratios = {lab: t_interval([by["AlignedServe"][s]["decode_tok_s"] / by[lab][s]["decode_tok_s"]
                                       for s in seeds]) for lab in by if lab != "AlignedServe"}
            fcfs = by.get("AlignedServe, FCFS pool", {})
            pool_share = t_interval([fcfs[s]["decode_tok_s"] / by["DistServe"][s]["decode_tok_s"] for s in seeds
                                     if s in fcfs and s in by.get("DistServe", {})])
            first90 = {lab: t_interval([by["AlignedServe"][s]["tok_s_first90"] / by[lab][s]["tok_s_first90"]
                                        for s in seeds]) for lab in by if lab != "AlignedServe"}
            premise = {lab: _premise([v[s].get("router", {}) for s in seeds], [v[s] for s in seeds])
                       for lab, v in by.items()}
            dist = by.get("DistServe", {})
            # every variant over DistServe (throughput) and DistServe's P99 TPOT over each variant's, per seed
            over_dist = {lab: t_interval([v[s]["decode_tok_s"] / dist[s]["decode_tok_s"] for s in seeds
                                          if s in v and s in dist]) for lab, v in by.items() if lab != "DistServe"}
            tpot_dist = {lab: t_interval([dist[s]["tpot_p99_ms"] / v[s]["tpot_p99_ms"] for s in seeds
                                          if s in v and s in dist]) for lab, v in by.items() if lab != "DistServe"}
            out.append({"workload": workload, "kernel": kernel, "seeds": seeds, "tput": tput, "ratios": ratios,
                        "first90": first90, "pool_share": pool_share, "premise": premise,
                        "over_distserve": over_dist, "tpot_distserve_over": tpot_dist})
    return out


def _premise(reports: list[dict], runs: list[dict]) -> dict:
    """Means over seeds; a system without the router's report (DistServe: decode rows and
    iteration time only; vLLM's mixed steps: nothing) gets what its steps show."""
    steps = [r.get("decode_rows_mean") for r in runs]
    base = {}
    if all(v is not None for v in steps):
        busy = [r.get("decode_busy") for r in runs]
        base = {"decode_rows": sum(steps) / len(steps),
                "decode_ms": sum(r["decode_step_mean_ms"] for r in runs) / len(runs),
                "busy": sum(busy) / len(busy) if all(b is not None for b in busy) else None}
    if not reports or not reports[0]:
        return base

    def mean(f):
        vals = [f(r) for r in reports]
        return sum(vals) / len(vals)

    return {
        **base,
        "depth_p50": mean(lambda r: r["pool_depth_at_cut"]["blocks_over_threshold_p10_p50_p90"][1]),
        "share_over": mean(lambda r: r["pool_depth_at_cut"]["share_over_threshold"]),
        "switch": mean(lambda r: r["switch_share"]),
        "switch_joins": mean(lambda r: r.get("switch_event_share", float("nan"))),
        "depth_req_p50": mean(lambda r: r["pool_depth_at_cut"].get("blocks_over_threshold_request_p50", float("nan"))),
        "req_over": mean(lambda r: r["pool_depth_at_cut"].get("requests_cut_over_threshold", float("nan"))),
        "stolen": mean(lambda r: r.get("num_stolen", 0)),
        "rows": mean(lambda r: r["rows_per_iteration_mean"]),
        "span": mean(lambda r: r["batch_span_median"]),
        "fill": mean(lambda r: r["batch_blocks_over_threshold_p10_p50_p90"][1]),
        "used": mean(lambda r: r["gpu_blocks_used_p10_p50_p90"][1]),
        "starved": mean(lambda r: r["num_starved"]),
        "kv_wait_s": mean(lambda r: r["kv_wait_total_s"]),
        **({"bubble": mean(lambda r: r["iteration_bubble"])} if all("iteration_bubble" in r for r in reports) else {}),
    }
