"""Issue 25: what sets Fig. 15's LongBench wait before decoding (the report's test 'Fig. 15
LongBench: the join rule'), one step of ``servelab reproduce alignedserve``.

The sparsity test (``open_gaps.fig15_sparsity``) left the wait without the starvation bound
at 6.9-8.9 s at 90% of DistServe's offline rate (the paper: 2.54 s mean TTFT) and refuted
sparse prefix ranges as its reason. The next hypothesis is the join rule: under the paper's
rule a request in the pool joins a decode GPU only after completions free blocks, and only up
to the batch's block threshold (40% of the GPU), so an arXiv request (a KV of thousands of
tokens) waits for completions even while the GPU has free blocks. Varied: the join rule
(greedy: join whenever blocks are free) and the threshold (90%), on the sparsity test's
requests (arXiv lengths as sampled) at its load, without the starvation bound (Fig. 15's own
setting).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from servelab.designs.alignedserve.reproduce import setting as st

SEEDS = 3
LOAD = 0.9  # of DistServe's offline rate on the same lengths (the sparsity test's point)
VARIANTS = (
    ("AlignedServe, no starvation bound", "alignedserve:max_wait_s=0"),
    ("greedy join, no starvation bound", "alignedserve:max_wait_s=0,join=greedy"),
    ("90% threshold, no starvation bound", "alignedserve:max_wait_s=0,block_fraction=0.9"),
)


def _keep(r: dict) -> dict:
    rt = r.get("router", {})
    return {"decode_tok_s": r["decode_tok_s"], "num_finished": r["num_finished"], "num_requests": r["num_requests"],
            "conserved": r["conserved"], "makespan_s": r["makespan_s"], "second_token_mean_s": r["second_token_mean_s"],
            "first_gap_p99_s": r["first_gap_p99_s"], "rows": r["decode_step_ms"].get("rows_mean"),
            "busy": r["decode_step_ms"].get("busy_share"), "kv_wait_total_s": rt.get("kv_wait_total_s")}


def fig15_join(sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """The arXiv requests of the sparsity test at ``LOAD`` x DistServe's offline rate on them
    (two rounds: capacity, then the loaded runs), under each join variant."""
    base = {s: st.application("LongBench-like (arXiv)", sizes.app_requests, s) for s in range(seed, seed + SEEDS)}
    keys, tasks = [], []
    for s, (rate, timed) in at_offline_load(base, LOAD, model, sizes.num_gpus, _keep).items():
        for label, spec in VARIANTS:
            keys.append({"seed": s, "label": label, "rate": rate, "load": LOAD})
            tasks.append({"specs": timed, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus})
    return [{**k, **row} for k, row in zip(keys, st.run_many(tasks, keep=_keep))]


def at_offline_load(works: dict, load: float, model: str, num_gpus: int, keep, seed_of=lambda key: key) -> dict:
    """Each workload (key -> requests) as Poisson arrivals at ``load`` x DistServe's offline rate
    on it (two rounds: DistServe's capacity at time 0, then the gaps, drawn from the key's seed):
    key -> (rate, timed requests). Shared by the Fig. 15 tests so they load the same way."""
    caps = st.run_many([{"specs": w, "system_spec": "distserve", "model": model, "num_gpus": num_gpus}
                        for w in works.values()], keep=keep)
    out = {}
    for (key, specs), cap in zip(works.items(), caps):
        rate = load * cap["num_finished"] / cap["makespan_s"]
        gaps = np.random.default_rng(seed_of(key)).exponential(1.0 / rate, len(specs))
        out[key] = (rate, [replace(r, arrival_time_s=float(t)) for r, t in zip(specs, np.cumsum(gaps))])
    return out
