"""Issue 25: the gap reasons the report had only explained, each run as an experiment that
could refute it (the report's section 'Gap reasons tested', ``report_open_gaps``).

Each function is one step of ``servelab reproduce alignedserve`` (and can run alone through
``standalone``); each varies the property its reason names in a controlled workload, over
``SEEDS`` seeds, and keeps per-run rows (plain numbers) for the report's intervals:

- ``split_cost`` (Figs. 7/8 vs vLLM and FastGen): reason, the P/D split's own cost: at time 0
  the prefill GPUs idle once the prompts are in, so a split system decodes on part of the
  server while vLLM and FastGen decode on all of it. Varied: how many of the 8 GPUs prefill
  (1, 2, 4), DistServe and AlignedServe alike, against vLLM and FastGen on the same requests.
- ``fig13_long_share`` (Fig. 13, forward passes under 30 ms): reason, under the split-KV
  kernel a step costs the sum of its rows' contexts, so FCFS's mixed batches cost the mean
  and alignment only gathers long rows into slow steps; the paper's < 10% for FCFS needs the
  longest row to bound the step (padded) and a long row in nearly every FCFS step. Varied:
  the long requests' share, under split-kv and padded.
- ``fig11_kv_size`` (Fig. 11, KV on the decode GPU within 5 ms): reason, a request's KV is
  too large to cross its link in 5 ms (NVLink from a prefill GPU's buffer when prefetched,
  PCIe from the pool otherwise). Varied: the prompt length, with and without prefetch.
- ``fig15_sparsity`` (Fig. 15 LongBench, the wait below capacity): reason, requests of sparse
  prefix ranges wait for a batch. Varied: the spread of the arXiv prompt lengths around their
  median (same median, same output lengths), at 90% of DistServe's capacity on each.
- ``fig14_link`` (Fig. 14, w/o P 0.98 vs the paper's 0.85): reason, without prefetch the
  loss is the decode GPUs' KV pauses, which PCIe 5.0 keeps short. Varied: the host link's
  bandwidth (x0.25, x0.1; x1 is the Fig. 14 gap test's own runs).

Why w/o prefetch runs more rows per iteration (the sixth reason) needs no new runs: the
Fig. 14 gap test's runs hold both prefetch settings with and without KV waits
(``report_open_gaps``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from servelab.designs.alignedserve.reproduce import setting as st
from servelab.designs.alignedserve.reproduce.fig15_wait import at_offline_load

SEEDS = 3
LONG_SHARES = (0.05, 0.3)  # Fig. 13's controlled mixes (long: 1-8K tokens, Fig. 7's)
PROMPT_LENGTHS = (512, 2048, 8192)  # Fig. 11's controlled lengths (+-10%)
SPREADS = (2.0, 1.0, 0.1)  # Fig. 15: arXiv prompt lengths' distance from their median, scaled
LINK_SCALES = (0.25, 0.1)  # Fig. 14: the host (PCIe) link's bandwidth, scaled (x1: the Fig. 14 gap test's runs)
LONG_CONTEXT = 1000  # a step row this long or longer is a long row (Fig. 7's long requests start at 1K)


def splits(num_gpus: int) -> list[int]:
    """Prefill GPUs: one, a quarter and half of the server (1, 2, 4 of 8)."""
    return sorted({1, num_gpus // 4, num_gpus // 2} - {0})


def _seeds(seed: int) -> range:
    return range(seed, seed + SEEDS)


def busy_probe(sim, res) -> dict:
    """Each role's busy share (its instances' step time over instances x makespan) and the
    whole server's."""
    steps = res.collector.steps
    roles = [d.runtime.role for d in sim.driver.drivers]
    if not len(steps) or res.makespan_s <= 0:
        return {"busy_by_role": {}, "busy_all": float("nan")}
    of = np.array([roles[int(i)] for i in steps.instance_id])
    out = {}
    for role in dict.fromkeys(roles):
        n = roles.count(role)
        out[role] = float(steps.duration_s[of == role].sum()) / (n * res.makespan_s)
    return {"busy_by_role": out, "busy_all": float(steps.duration_s.sum()) / (len(roles) * res.makespan_s)}


def context_probe(sim, res) -> dict:
    """Per decode iteration: whether it held a long row, and whether it took under 30 ms."""
    stats = getattr(sim.router, "stats", None)
    if stats is None:
        return {}
    ctx = np.array([m for _, _, m in stats.step_contexts], dtype=float)
    took = 1e3 * np.array(stats.step_s, dtype=float)
    n = min(len(ctx), len(took))
    ctx, took = ctx[:n], took[:n]
    long_ = ctx >= LONG_CONTEXT

    def share(mask):
        return float(np.mean(took[mask] < 30.0)) if mask.any() else float("nan")
    return {"share_long_steps": float(long_.mean()) if n else float("nan"),
            "under30_long": share(long_), "under30_short": share(~long_),
            "under30_all": float(np.mean(took < 30.0)) if n else float("nan"),
            "step_p50_ms": float(np.median(took)) if n else float("nan")}


def _keep_busy(r: dict) -> dict:
    return {"decode_tok_s": r["decode_tok_s"], "makespan_s": r["makespan_s"], "num_finished": r["num_finished"],
            "num_requests": r["num_requests"], "conserved": r["conserved"], "busy_all": r["busy_all"],
            "busy_by_role": r["busy_by_role"], "rows": r["decode_step_ms"].get("rows_mean")}


def split_cost(sizes, seed: int, model: str = "OPT-6.7B", share: float = 0.95) -> list[dict]:
    """Fig. 7's 95%-short mix: vLLM and FastGen once per seed, DistServe and AlignedServe at
    each number of prefill GPUs; ``sizes.fig14_seeds`` seeds (AlignedServe's run-to-run spread
    over DistServe is wide: 3 seeds left the test inconclusive)."""
    keys, tasks = [], []
    for s in range(seed, seed + sizes.fig14_seeds):
        specs = st.synthetic(sizes.num_requests // 2, share, s)
        systems = [("vLLM", st.SYSTEMS["vLLM"], None), ("FastGen (sarathi)", st.SYSTEMS["FastGen (sarathi)"], None)]
        systems += [(label, f"{st.SYSTEMS[label]}:num_prefill={k}", k) for k in splits(sizes.num_gpus)
                    for label in ("DistServe", "AlignedServe")]  # (1, 2, 4 of 8 GPUs)
        for label, spec, k in systems:
            keys.append({"seed": s, "label": label, "num_prefill": k})
            tasks.append({"specs": specs, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus,
                          "probe": busy_probe})
    return [{**k, **row} for k, row in zip(keys, st.run_many(tasks, keep=_keep_busy))]


def _keep_ctx(r: dict) -> dict:
    return {"decode_tok_s": r["decode_tok_s"], "num_finished": r["num_finished"], "num_requests": r["num_requests"],
            "conserved": r["conserved"], **{k: r.get(k) for k in ("share_long_steps", "under30_long", "under30_short",
                                                                   "under30_all", "step_p50_ms")}}


def fig13_long_share(sizes, seed: int, model: str = "OPT-13B") -> list[dict]:
    """Fig. 13's forward-time share under 30 ms, prefix-aware and FCFS, as the long requests'
    share grows, under split-kv and padded."""
    from servelab.costmodel.options import CostOptions

    keys, tasks = [], []
    for s in _seeds(seed):
        for long_share in LONG_SHARES:
            specs = st.synthetic(sizes.num_requests // 3, 1 - long_share, s)
            for kernel in ("split-kv", "padded"):
                for batching, spec in (("prefix-aware", "alignedserve"), ("FCFS", "alignedserve:prefix_aware=false")):
                    keys.append({"seed": s, "long_share": long_share, "kernel": kernel, "batching": batching})
                    tasks.append({"specs": specs, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus,
                                  "cost_model": CostOptions(attention_kernel=kernel), "probe": context_probe})
    return [{**k, **row} for k, row in zip(keys, st.run_many(tasks, keep=_keep_ctx))]


def fixed_lengths(n: int, prompt: int, seed: int) -> list:
    """``n`` requests at time 0, prompts within 10% of ``prompt``, outputs 64-128 tokens."""
    from servelab.core.request import RequestSpec

    rng = np.random.default_rng(seed)
    return [RequestSpec(i, 0.0, int(prompt * rng.uniform(0.9, 1.1)), int(rng.integers(64, 129))) for i in range(n)]


def burst_probe(sim, res) -> dict:
    """Moves onto decode GPUs: the share that landed within 5 ms of their start, and two
    predictions from their sizes on their link (NVLink from a GPU, PCIe from the pool): each
    move alone, and each behind the moves of its burst (same source, destination and start)
    that landed before it, its link carrying one at a time."""
    from servelab.cluster.links import fitted_link_figures
    from servelab.core.policy import POOL

    links = fitted_link_figures(st.GPU)
    roles = [d.runtime.role for d in sim.driver.drivers]
    bursts: dict[tuple, list] = {}
    for src, dst, start, dur, nbytes in res.transfers:
        if dst >= 0 and roles[dst] == "decode":
            bursts.setdefault((src, dst, start), []).append((dur, nbytes))
    took, alone, serial = [], [], []
    for (src, _, _), moves in bursts.items():
        link = links["pcie"] if src == POOL else links["nvlink"]
        ahead = 0.0
        for dur, nbytes in sorted(moves):
            ahead += nbytes
            took.append(dur)
            alone.append(nbytes / link.bandwidth_bytes_per_s + link.latency_s)
            serial.append(ahead / link.bandwidth_bytes_per_s + link.latency_s)
    if not took:
        return {"moves_under_5ms": float("nan"), "alone_under_5ms": float("nan"), "serial_under_5ms": float("nan"),
                "burst_p50": float("nan")}
    return {"moves_under_5ms": float(np.mean(np.array(took) < 5e-3)),
            "alone_under_5ms": float(np.mean(np.array(alone) < 5e-3)),
            "serial_under_5ms": float(np.mean(np.array(serial) < 5e-3)),
            "burst_p50": float(np.median([len(m) for m in bursts.values() for _ in m]))}


def _keep_release(r: dict) -> dict:
    rt = r.get("router", {})
    rel = np.asarray(r.get("release_ms", []), dtype=float)
    return {"decode_tok_s": r["decode_tok_s"], "num_finished": r["num_finished"], "num_requests": r["num_requests"],
            "conserved": r["conserved"], "release_under_5ms": float(np.mean(rel < 5.0)) if len(rel) else float("nan"),
            "release_p50_ms": float(np.median(rel)) if len(rel) else float("nan"),
            "prefetched_share": rt.get("num_prefetched", 0) / max(1, r["num_requests"]),
            **{k: r.get(k) for k in ("moves_under_5ms", "alone_under_5ms", "serial_under_5ms", "burst_p50")}}


def link_times_ms(prompt: int, model: str = "OPT-6.7B") -> dict:
    """One request's KV (``prompt`` tokens) alone on NVLink and on PCIe (fitted link figures)."""
    from servelab.catalog.instance import InstanceSpec, kv_bytes_per_token
    from servelab.cluster.links import fitted_link_figures

    links = fitted_link_figures(st.GPU)
    size = prompt * kv_bytes_per_token(InstanceSpec(st.GPU, model))
    return {k: 1e3 * (size / links[k].bandwidth_bytes_per_s + links[k].latency_s) for k in ("nvlink", "pcie")}


def arxiv_kv_sizes(sizes, seed: int, model: str = "OPT-6.7B") -> dict:
    """Fig. 11's LongBench-like (arXiv) requests: the share whose KV alone crosses NVLink, and
    PCIe, in under 5 ms (prompts clipped to the lifted context, as the runs clip them)."""
    specs = st.application("LongBench-like (arXiv)", sizes.app_requests, seed)
    prompts = np.array([min(r.num_prompt_tokens, st.MAX_MODEL_LEN) for r in specs])
    times = [link_times_ms(int(p), model) for p in prompts]
    return {"num_requests": len(specs), "prompt_p50": float(np.median(prompts)),
            "share_nvlink_5ms": float(np.mean([t["nvlink"] < 5.0 for t in times])),
            "share_pcie_5ms": float(np.mean([t["pcie"] < 5.0 for t in times]))}


def fig11_kv_size(sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """Fig. 11's release -> KV landed share under 5 ms at controlled prompt lengths, with and
    without prefetch, and on LongBench-like lengths (``prompt`` 0; requests at time 0, as in
    Fig. 11's step); each run's moves onto decode GPUs against the size predictions
    (``burst_probe``)."""
    keys, tasks = [], []
    for s in _seeds(seed):
        for prompt in PROMPT_LENGTHS:
            specs = fixed_lengths(sizes.app_requests // 4, prompt, s)
            for label, spec in (("AlignedServe", "alignedserve"), ("w/o P", "alignedserve:prefetch=false")):
                keys.append({"seed": s, "prompt": prompt, "label": label, **link_times_ms(prompt, model)})
                tasks.append({"specs": specs, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus,
                              "probe": burst_probe})
        specs = st.application("LongBench-like (arXiv)", sizes.app_requests // 2, s)
        keys.append({"seed": s, "prompt": 0, "label": "AlignedServe", "nvlink": float("nan"), "pcie": float("nan")})
        tasks.append({"specs": specs, "system_spec": "alignedserve", "model": model, "num_gpus": sizes.num_gpus,
                      "probe": burst_probe})
    return [{**k, **row} for k, row in zip(keys, st.run_many(tasks, keep=_keep_release))]


def spread(specs: list, factor: float) -> list:
    """The same requests with each prompt's distance from the median prompt scaled by ``factor``
    (1: as given; small: the prompts crowd a few prefix ranges)."""
    med = float(np.median([r.num_prompt_tokens for r in specs]))
    return [replace(r, num_prompt_tokens=max(16, int(round(med + factor * (r.num_prompt_tokens - med)))))
            for r in specs]


def neighbours(specs: list, width: int = 256) -> float:
    """The range's density: the median, over requests, of how many others have a prompt within
    ``width`` tokens of theirs."""
    p = np.sort([r.num_prompt_tokens for r in specs])
    lo = np.searchsorted(p, p - width, side="left")
    hi = np.searchsorted(p, p + width, side="right")
    return float(np.median(hi - lo - 1))


def _keep_wait(r: dict) -> dict:
    rt = r.get("router", {})
    return {"decode_tok_s": r["decode_tok_s"], "num_finished": r["num_finished"], "num_requests": r["num_requests"],
            "conserved": r["conserved"], "makespan_s": r["makespan_s"], "second_token_mean_s": r["second_token_mean_s"],
            "first_gap_p99_s": r["first_gap_p99_s"], "num_starved": rt.get("num_starved")}


def fig15_sparsity(sizes, seed: int, model: str = "OPT-6.7B", load: float = 0.9) -> list[dict]:
    """Fig. 15's wait before decoding at ``load`` x DistServe's offline rate, as the arXiv
    prompts' spread around their median shrinks (two rounds: capacity, then the loaded runs).
    The gap test's operating point (``experiments.gap_fig15``: its requests, 90% load, where
    the wait without the bound was longest); at 400 requests and 50% load the wait was under
    a second, no gap to test."""
    n = sizes.app_requests
    base = {s: st.application("LongBench-like (arXiv)", n, s) for s in _seeds(seed)}
    work = {(s, f): spread(base[s], f) for s in base for f in SPREADS}
    keys, tasks = [], []
    for (s, f), (rate, timed) in at_offline_load(work, load, model, sizes.num_gpus, _keep_wait,
                                                 seed_of=lambda key: key[0]).items():
        specs = work[(s, f)]
        for label, spec in (("AlignedServe, no starvation bound", "alignedserve:max_wait_s=0"),
                            ("AlignedServe", "alignedserve"), ("DistServe", "distserve")):
            keys.append({"seed": s, "spread": f, "label": label, "rate": rate, "load": load,
                         "neighbours": neighbours(specs)})
            tasks.append({"specs": timed, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus})
    return [{**k, **row} for k, row in zip(keys, st.run_many(tasks, keep=_keep_wait))]


def _keep_pause(r: dict) -> dict:
    rt, steps = r.get("router", {}), r["decode_step_ms"]
    return {"decode_tok_s": r["decode_tok_s"], "num_finished": r["num_finished"], "num_requests": r["num_requests"],
            "conserved": r["conserved"], "makespan_s": r["makespan_s"], "decode_rows": steps.get("rows_mean"),
            "kv_wait_total_s": rt.get("kv_wait_total_s"), "num_kv_waits": rt.get("num_kv_waits")}


def fig14_link(sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """Fig. 14's w/o P over AlignedServe as the host link slows: the Fig. 14 gap test's requests
    and seeds (``fig14_gap``: Azure conv's lengths per seed, ``sizes.fig14_seeds`` seeds), whose
    split-kv runs are the x1 point."""
    from servelab.api import load_workload

    keys, tasks = [], []
    decode_gpus = sizes.num_gpus - (sizes.num_gpus + 1) // 2
    for s in range(seed, seed + sizes.fig14_seeds):
        specs = load_workload(f"burst:n={sizes.app_requests},lengths=azure-conv", seed=s)
        for scale in LINK_SCALES:
            for label, spec in (("AlignedServe", "alignedserve"), ("w/o P", "alignedserve:prefetch=false")):
                keys.append({"seed": s, "link_scale": scale, "label": label, "decode_gpus": decode_gpus})
                tasks.append({"specs": specs, "system_spec": spec, "model": model, "num_gpus": sizes.num_gpus,
                              "host_link_scale": scale})
    return [{**k, **row} for k, row in zip(keys, st.run_many(tasks, keep=_keep_pause))]
