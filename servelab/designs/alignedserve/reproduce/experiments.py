"""The reproduction's experiments, one function per claim; each returns plain rows.

Every run is a simulation on the setting of ``setting.py`` (H100, OPT, all requests at time
0). ``Sizes`` scales them: the reduced run uses 4 GPUs, fewer requests and one model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from servelab.designs.alignedserve.reproduce import latency
from servelab.designs.alignedserve.reproduce import setting as st


def _cost(kernel: str | None):
    """The cost model's ``--attention-kernel`` choice for a figure (None: the GPU's default, split-KV)."""
    from servelab.costmodel.options import CostOptions

    return None if kernel is None else CostOptions(attention_kernel=kernel)


@dataclass(frozen=True)
class Sizes:
    num_gpus: int = 8
    num_requests: int = 1200
    app_requests: int = 1200
    models: tuple[str, ...] = ("OPT-2.7B", "OPT-6.7B", "OPT-13B")
    short_shares: tuple[float, ...] = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
    long_lengths: tuple[int, ...] = (2000, 4000, 6000, 8000, 10000)
    applications: tuple[str, ...] = st.APPLICATIONS
    dfs_requests: int = 100_000
    dfs_searches: int = 2000
    seeds: int = 3  # the headline grid (regimes.py): seeds per cell
    seeds_split_kv: int = 5  # ... under the default (split-kv) kernel, the headline's own
    regime_requests: int = 2000
    fig14_seeds: int = 8  # Fig. 14's gap and prefetch-mechanism tests (fig14_gap.py, prefetch_kernels.py)


def fig7_synthetic(sizes: Sizes, seed: int, kernel: str | None = None) -> list[dict]:
    """Figure 7 (throughput) and Figure 9 (P99 TPOT) on the synthetic mixes."""
    rows = []
    for model in sizes.models:
        for share in sizes.short_shares:
            specs = st.synthetic(sizes.num_requests, share, seed)
            for label, spec in st.SYSTEMS.items():
                r = st.run(specs, spec, model, sizes.num_gpus, cost_model=_cost(kernel))
                rows.append(_slim(r, label=label, short_share=share))
    return rows


def fig8_applications(sizes: Sizes, seed: int, model: str = "OPT-6.7B", kernel: str | None = None) -> list[dict]:
    """Figures 8 and 10: throughput and P99 TPOT on real length distributions."""
    rows = []
    for app in sizes.applications:
        specs = st.application(app, sizes.app_requests, seed)
        for label, spec in st.SYSTEMS.items():
            r = st.run(specs, spec, model, sizes.num_gpus, cost_model=_cost(kernel))
            rows.append(_slim(r, label=label, workload=app, keep_router=label == "AlignedServe"))
    return rows


def fig12_long_lengths(sizes: Sizes, seed: int, kernel: str | None = None) -> list[dict]:
    """Figure 12: decode-iteration time as the long requests grow (95% long, as the paper says)."""
    rows = []
    for model in sizes.models:
        for length in sizes.long_lengths:
            specs = st.fixed_mix(sizes.num_requests // 2, 0.95, length, seed)
            for label in ("DistServe", "AlignedServe"):
                r = st.run(specs, st.SYSTEMS[label], model, sizes.num_gpus, cost_model=_cost(kernel))
                rows.append(_slim(r, label=label, long_len=length))
    return rows


def fig13_vs_fcfs(sizes: Sizes, seed: int, model: str = "OPT-13B", kernel: str | None = None) -> list[dict]:
    """Figure 13: forward-time CDF with Density First Search vs FCFS batches in AlignedServe."""
    rows = []
    for app in ("ShareGPT-like", "LongBench-like (arXiv)"):
        specs = st.application(app, sizes.app_requests, seed)
        for label, spec in (("prefix-aware", "alignedserve"), ("FCFS", "alignedserve:prefix_aware=false")):
            r = st.run(specs, spec, model, sizes.num_gpus, cost_model=_cost(kernel))
            steps = np.array(r["step_ms"])
            rows.append({"workload": app, "batching": label, "share_under_30ms": float(np.mean(steps < 30.0)),
                         "step_p50_ms": float(np.median(steps)), "cdf_ms": _cdf(steps),
                         "decode_tok_s": r["decode_tok_s"], "batch_span_median": r["router"]["batch_span_median"]})
    return rows


def fig14_ablation(sizes: Sizes, seed: int, model: str = "OPT-6.7B", kernel: str | None = None,
                   specs=None) -> list[dict]:
    """Figure 14: AlignedServe, without GPU prefetching, without prefetching and batching, on
    Azure conv's trace (its first requests, whatever the seed) unless ``specs`` are given."""
    specs = st.application("Azure conv", sizes.app_requests, seed) if specs is None else specs
    rows = []
    for label, spec in (("AlignedServe", "alignedserve"), ("w/o P", "alignedserve:prefetch=false"),
                        ("w/o P&B", "alignedserve:prefetch=false,prefix_aware=false"),
                        ("DistServe", "distserve")):
        r = st.run(specs, spec, model, sizes.num_gpus, cost_model=_cost(kernel))
        rows.append(_slim(r, label=label, workload="Azure conv", keep_router=True))
    return rows


def fig11_and_overheads(sizes: Sizes, seed: int, model: str = "OPT-6.7B", kernel: str | None = None) -> list[dict]:
    """Figure 11 (time to schedule an iteration), batch switch share, pool occupancy, and
    Figure 15 (TTFT) with and without the starvation bound, on ShareGPT-like and LongBench-like."""
    rows = []
    for app in ("ShareGPT-like", "LongBench-like (arXiv)"):
        specs = st.application(app, sizes.app_requests, seed)
        for label, spec in (("AlignedServe", "alignedserve"), ("AlignedServe, no starvation bound",
                                                               "alignedserve:max_wait_s=0"), ("DistServe", "distserve")):
            r = st.run(specs, spec, model, sizes.num_gpus, cost_model=_cost(kernel))
            row = _slim(r, label=label, workload=app, keep_router=label != "DistServe")
            sched = np.array(r.get("schedule_ms", []))
            release = np.array(r.get("release_ms", []))
            hand = np.array(r["handoff_ms"])
            row.update({
                "decision_share_under_5ms": float(np.mean(sched < 5.0)) if len(sched) else None,
                "release_share_under_5ms": float(np.mean(release < 5.0)) if len(release) else None,
                "handoff_share_under_5ms": float(np.mean(hand < 5.0)) if len(hand) else None,
                "handoff_share_over_10ms": float(np.mean(hand > 10.0)) if len(hand) else None,
                "handoff_p50_ms": float(np.median(hand)) if len(hand) else None,
                "pool_samples": r.get("pool_samples", [])[:: max(1, len(r.get("pool_samples", [])) // 200)],
            })
            rows.append(row)
    return rows


def dfs_timing(sizes: Sizes, seed: int, block_size: int = 16) -> dict:
    """Density First Search with ``dfs_requests`` requests in the tree (ShareGPT-like lengths,
    log-normal median 800): each search cuts a batch, which is replaced by as many new
    requests. CPU time per search (``time.thread_time``)."""
    from servelab.catalog.instance import InstanceSpec, num_kv_blocks
    from servelab.designs.alignedserve.quadtree import QuadTree

    rng = np.random.default_rng(seed)
    max_blocks = int(0.4 * num_kv_blocks(InstanceSpec(st.GPU, "OPT-13B")))
    tree = QuadTree()
    lengths = (rng.lognormal(np.log(800), 1.0, sizes.dfs_requests).astype(int) + 1).tolist()
    t0 = time.thread_time()
    for rid, n in enumerate(lengths):
        tree.insert(rid, n, -(-n // block_size))
    insert_us = 1e6 * (time.thread_time() - t0) / len(lengths)
    times, batch_sizes, next_id = [], [], len(lengths)
    for _ in range(sizes.dfs_searches):
        a = time.thread_time()
        batch = tree.search(max_blocks, 36)
        times.append(time.thread_time() - a)
        if batch is None:  # no range holds 36 requests within the threshold: a valid (timed) answer
            batch = tree.search(max_blocks, 36, force=True)
        batch_sizes.append(len(batch.request_ids))
        for rid in batch.request_ids:
            tree.remove(rid)
        for n in (rng.lognormal(np.log(800), 1.0, len(batch.request_ids)).astype(int) + 1).tolist():
            tree.insert(next_id, n, -(-n // block_size))
            next_id += 1
    ms = 1e3 * np.array(times)
    return {"num_requests": len(tree), "max_blocks": max_blocks, "searches": len(times),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()), "insert_us": insert_us, "batch_size_mean": float(np.mean(batch_sizes))}


def gap_bubble(sizes: Sizes, seed: int, model: str = "OPT-2.7B", share: float = 0.95) -> list[dict]:
    """Does AlignedServe's gain follow the iteration bubble? The 95%-short mix under the cost
    model's split-KV decode kernel and under its padded one (every row reads the longest)."""
    from servelab.costmodel.options import CostOptions

    specs = st.synthetic(sizes.num_requests, share, seed)
    rows = []
    deep = 3 * sizes.num_gpus // 4  # prefill GPUs for a deep pool (decode-bound)
    for kernel in ("split-kv", "padded"):
        cost = CostOptions(attention_kernel=kernel)
        for label in ("vLLM", "DistServe", "AlignedServe"):
            r = st.run(specs, st.SYSTEMS[label], model, sizes.num_gpus, cost_model=cost)
            rows.append(_slim(r, label=label, kernel=kernel, num_prefill="half", keep_router=label == "AlignedServe"))
        for label in ("DistServe", "AlignedServe"):
            r = st.run(specs, f"{st.SYSTEMS[label]}:num_prefill={deep}", model, sizes.num_gpus, cost_model=cost)
            rows.append(_slim(r, label=label, kernel=kernel, num_prefill=deep, keep_router=label == "AlignedServe"))
    return rows


def gap_gating(sizes: Sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """Our gap's own hypothesis: AlignedServe loses to DistServe because a decode GPU waits for
    a batch of 36 (and for the pool's PCIe hops). Same runs with a minimum batch of 1, and
    with FCFS batches of 1 and no prefetch (DistServe plus the pool detour)."""
    rows = []
    for app in ("ShareGPT-like", "synthetic 95% short"):
        specs = (st.synthetic(sizes.num_requests, 0.95, seed) if app.startswith("synthetic")
                 else st.application(app, sizes.app_requests, seed))
        for label, spec in (("DistServe", "distserve"), ("AlignedServe", "alignedserve"),
                            ("AlignedServe, min batch 1", "alignedserve:min_batch=1"),
                            ("pool detour only", "alignedserve:min_batch=1,prefix_aware=false,prefetch=false")):
            r = st.run(specs, spec, model, sizes.num_gpus)
            rows.append(_slim(r, label=label, workload=app))
    return rows


def gap_pool_depth(sizes: Sizes, seed: int, model: str = "OPT-2.7B", share: float = 0.95) -> list[dict]:
    """Does batching need a deep pool? Fewer prefill GPUs (a shallower pool) vs more."""
    specs = st.synthetic(sizes.num_requests, share, seed)
    rows = []
    for num_prefill in sorted({1, sizes.num_gpus // 4, sizes.num_gpus // 2, 3 * sizes.num_gpus // 4} - {0}):
        for label, spec in (("DistServe", "distserve"), ("AlignedServe", "alignedserve")):
            r = st.run(specs, f"{spec}:num_prefill={num_prefill}", model, sizes.num_gpus)
            rows.append(_slim(r, label=label, num_prefill=num_prefill, keep_router=label == "AlignedServe"))
    return rows


def _slim(r: dict, *, keep_router: bool = False, **extra) -> dict:
    keys = ("system", "model", "num_gpus", "num_requests", "num_finished", "conserved", "decode_tok_s", "makespan_s",
            "ttft_mean_s", "ttft_max_s", "second_token_mean_s", "second_token_max_s",
            "decode_step_ms", "num_recompute_preemptions", "cpu_s") + latency.KEYS
    out = {k: r[k] for k in keys}
    out.update(extra)
    if keep_router and "router" in r:
        out["router"] = r["router"]
    return out


def _cdf(values: np.ndarray, points=tuple(range(0, 101, 5))) -> list[tuple[float, float]]:
    return [(float(p), float(np.mean(values <= p))) for p in points] if len(values) else []


def gap_tpot(sizes: Sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """Is a long P99 TPOT decoding, or the wait before it? Figs. 8/10's runs carry the split
    (``latency.split``); this adds AlignedServe with decode iterations that never wait for
    joining KV (``wait_for_kv=false``), to test what is left of its TPOT once the pool wait is
    out: if the KV waits set it, it falls to DistServe's without them."""
    rows = []
    for app in sizes.applications:
        specs = st.application(app, sizes.app_requests, seed)
        r = st.run(specs, "alignedserve:wait_for_kv=false", model, sizes.num_gpus)
        rows.append(_slim(r, label="AlignedServe, no KV wait", workload=app, keep_router=True))
    return rows


def gap_fig15(sizes: Sizes, seed: int, model: str = "OPT-6.7B", shares=(0.5, 0.9)) -> list[dict]:
    """Fig. 15's mean TTFT (the paper 1.49 s / 2.54 s; ours, the first-to-second-token wait at
    time 0, several times that). Hypothesis: at time 0 the wait is the offline queue, which
    sits in AlignedServe's pool. Test: the same lengths arriving as a Poisson process at a
    share of DistServe's offline request rate (its capacity, measured here): if the wait stays
    long below capacity, the queue is not its reason; AlignedServe with its 10 s starvation bound
    beside it tests the next hypothesis, that requests of sparse prefix ranges wait for a batch."""
    import numpy as np
    from dataclasses import replace

    rows = []
    for app in ("ShareGPT-like", "LongBench-like (arXiv)"):
        specs = st.application(app, sizes.app_requests, seed)
        cap = st.run(specs, "distserve", model, sizes.num_gpus)
        capacity = cap["num_finished"] / cap["makespan_s"]
        for share in shares:
            gaps = np.random.default_rng(seed).exponential(1.0 / (share * capacity), len(specs))
            timed = [replace(s, arrival_time_s=float(t)) for s, t in zip(specs, np.cumsum(gaps))]
            for label, spec in (("AlignedServe, no starvation bound", "alignedserve:max_wait_s=0"),
                                ("AlignedServe", "alignedserve"), ("DistServe", "distserve")):
                r = st.run(timed, spec, model, sizes.num_gpus)
                rows.append(_slim(r, label=label, workload=app, load=share, rate=share * capacity))
    return rows
