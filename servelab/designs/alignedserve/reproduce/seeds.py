"""Issue 25: the figure experiments' and gap tests' headline quantities over seeds.

The figure steps run one seed (their sizes are the paper's); this step reruns the cheap ones
(Fig. 7 at OPT-6.7B and two mixes, Fig. 13, Fig. 14 on Azure conv's lengths sampled per seed,
the batch-gating and pool-depth gap tests) on ``n`` seeds and keeps, per seed, the one number each claim or verdict rests on, so
the report can say whether a one-seed reading survives other request draws.
"""

from __future__ import annotations

from dataclasses import replace

from servelab.api import load_workload
from servelab.designs.alignedserve.reproduce import experiments as ex


def _ratio(rows: list[dict], num: dict, den: dict, key: str = "decode_tok_s") -> float:
    def pick(sel):
        return next(r for r in rows if all(r.get(k) == v for k, v in sel.items()))[key]
    return pick(num) / pick(den)


def _quantities(sizes, seed: int) -> tuple[list[tuple[str, str, float]], list[dict]]:
    """(figure, quantity, value) for one seed, and the runs behind them (for the completeness check)."""
    out, runs = [], []
    f7 = ex.fig7_synthetic(replace(sizes, models=("OPT-6.7B",), short_shares=(0.7, 0.95)), seed)
    runs += f7
    for share in (0.7, 0.95):
        for base in ("vLLM", "DistServe", "FastGen (sarathi)"):
            out.append(("Fig. 7 (OPT-6.7B)", f"{share:.0%} short: AlignedServe over {base}",
                        _ratio(f7, {"label": "AlignedServe", "short_share": share}, {"label": base, "short_share": share})))
    for r in ex.fig13_vs_fcfs(sizes, seed):
        out.append(("Fig. 13 (OPT-13B)", f"{r['workload']}, {r['batching']}: iterations under 30 ms",
                    r["share_under_30ms"]))
    # Azure conv's trace replay takes the same first requests under every seed (before issue 25's prefetch
    # test these rows repeated one run three times): its length pairs sampled per seed, as fig14_gap's
    f14 = ex.fig14_ablation(sizes, seed, specs=load_workload(f"burst:n={sizes.app_requests},lengths=azure-conv", seed=seed))
    runs += f14
    name = "Fig. 14 (Azure conv lengths per seed)"
    out += [(name, "w/o P over AlignedServe (paper 0.85)", _ratio(f14, {"label": "w/o P"}, {"label": "AlignedServe"})),
            (name, "w/o P&B over w/o P (paper 0.71)", _ratio(f14, {"label": "w/o P&B"}, {"label": "w/o P"})),
            (name, "AlignedServe over DistServe", _ratio(f14, {"label": "AlignedServe"}, {"label": "DistServe"}))]
    gate = ex.gap_gating(sizes, seed)
    runs += gate
    for app in dict.fromkeys(r["workload"] for r in gate):
        out += [("gap: batch gating", f"{app}: AlignedServe over DistServe",
                 _ratio(gate, {"label": "AlignedServe", "workload": app}, {"label": "DistServe", "workload": app})),
                ("gap: batch gating", f"{app}: min batch 1 over AlignedServe",
                 _ratio(gate, {"label": "AlignedServe, min batch 1", "workload": app}, {"label": "AlignedServe", "workload": app}))]
    depth = ex.gap_pool_depth(sizes, seed)
    runs += depth
    for p in dict.fromkeys(r["num_prefill"] for r in depth):
        out.append(("gap: pool depth (OPT-2.7B)", f"{p} prefill GPUs: AlignedServe over DistServe",
                    _ratio(depth, {"label": "AlignedServe", "num_prefill": p}, {"label": "DistServe", "num_prefill": p})))
    return out, runs


def over_seeds(sizes, seed: int, n: int = 3) -> list[dict]:
    """One row per (figure, quantity, seed); each row carries the seed's run counts."""
    rows = []
    for s in range(seed, seed + n):
        values, runs = _quantities(sizes, s)
        done = {"num_finished": sum(r["num_finished"] for r in runs), "num_requests": sum(r["num_requests"] for r in runs),
                "conserved": all(r["conserved"] for r in runs), "label": f"figures over seeds, seed {s}", "model": "",
                "num_gpus": sizes.num_gpus}
        rows += [{"figure": f, "quantity": q, "seed": s, "value": v, **done} for f, q, v in values]
    return rows
