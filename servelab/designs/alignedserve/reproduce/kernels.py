"""Issue 25, item 6 for the figures, and the batch-switch gap test.

``figure_claims``: the experiments behind the claims table (Figs. 7-11, 13-15) rerun under one
``--attention-kernel`` choice at ``claim_sizes`` (one model, the 95%-short mix, half the
requests), so the report can put each claim under split-kv, per-seq and padded side by side
at equal sizes (the split-kv column at full size is the main claims table).

``switch_gap``: why our batch-switch share (50-80%) is far above the paper's <= 8.61%. The
paper counts "the fraction of iterations that contain requests from different batches", as
we do, so the count is not the difference. Hypothesis: a new batch joins as the running
one's completions release blocks (about one for one while the rows hold steady), so if
requests completed in join order, the R running rows would hold one batch only while the
last R joins came from one batch, i.e. in (B - R) / B of the time for batches of B requests:
the share is at least about min(1, R / B), and above it when output
lengths vary (long requests of old batches linger). The paper's share needs batches about 12x
its rows per iteration. Test: the same batch cut with the decode GPU's rows capped (16, 8),
and the same prompts with every output 180 tokens (completions close to join order).
"""

from __future__ import annotations

from dataclasses import replace

from servelab.designs.alignedserve.reproduce import experiments as ex
from servelab.designs.alignedserve.reproduce import setting as st

ROW_CAPS = (None, 16, 8)  # decode max_num_seqs for the switch gap test (None: the preset's)
CONSTANT_OUTPUT = 180
SWITCH_WORKLOADS = ("ShareGPT-like", f"ShareGPT-like, every output {CONSTANT_OUTPUT}")
# the test of why the mixed share is high: dynamic joins from the pool unbounded (the running batch keeps taking
# in-range pool requests as its own, so the Candidate Requests Buffer does not run dry at its first completions)
UNBOUNDED_DYNAMIC = ("dynamic joins unbounded", "alignedserve:requests_buffer=1000")


def claim_sizes(sizes: ex.Sizes) -> ex.Sizes:
    """The reduced sizes of the per-kernel claims: the first model (OPT-2.7B, Fig. 7's claim),
    the highest short share, half the requests; every application workload."""
    return replace(sizes, models=sizes.models[:1], short_shares=sizes.short_shares[-1:],
                   num_requests=max(2, sizes.num_requests // 2), app_requests=max(2, sizes.app_requests // 2))


def figure_claims(sizes: ex.Sizes, seed: int, kernel: str) -> dict:
    """The claims table's experiments under ``kernel`` (the sizes are the caller's)."""
    fig11 = ex.fig11_and_overheads(sizes, seed, kernel=kernel)
    for r in fig11:
        r.pop("pool_samples", None)  # the pool-occupancy plot uses the main run's
    return {"kernel": kernel, "sizes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(sizes).items()},
            "fig7": ex.fig7_synthetic(sizes, seed, kernel=kernel),
            "fig8": ex.fig8_applications(sizes, seed, kernel=kernel),
            "fig11": fig11, "fig13": ex.fig13_vs_fcfs(sizes, seed, kernel=kernel),
            "fig14": ex.fig14_ablation(sizes, seed, kernel=kernel)}


def switch_gap(sizes: ex.Sizes, seed: int, model: str = "OPT-6.7B") -> list[dict]:
    """AlignedServe's switch share against rows per iteration (R) over batch size (B)."""
    n = max(2, sizes.app_requests // 2)
    base = st.application("ShareGPT-like", n, seed)
    rows = []
    for workload in SWITCH_WORKLOADS:
        specs = base if workload == "ShareGPT-like" else [replace(r, num_output_tokens=CONSTANT_OUTPUT) for r in base]
        runs = [(None, "alignedserve", cap) for cap in ROW_CAPS] + [(*UNBOUNDED_DYNAMIC, None)]
        for variant, spec, cap in runs:
            r = st.run(specs, spec, model, sizes.num_gpus, max_decode_seqs=cap)
            rt = r["router"]
            rows_, batch = rt["rows_per_iteration_mean"], rt["batch_size_mean"]
            rows.append({"workload": workload, "variant": variant, "row_cap": cap, "num_requests": n, "model": model,
                         "switch_event_share": rt["switch_event_share"], "minority_p50": rt["switch_minority_rows_p50"],
                         "decode_tok_s": r["decode_tok_s"], "num_finished": r["num_finished"],
                         "conserved": r["conserved"], "switch_share": rt["switch_share"], "rows": rows_,
                         "batch_size_mean": batch, "num_batches": rt["num_batches"],
                         "floor": min(1.0, rows_ / batch) if batch else float("nan"),
                         "joins_per_iteration": rt["num_joins"] / max(1, rt["num_iterations"]),
                         "share_over_threshold": rt["pool_depth_at_cut"]["share_over_threshold"]})
    return rows
