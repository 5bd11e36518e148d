"""Every simulated claim over several seeds, with intervals; the premise on both sides; the
Alpaca output-length sensitivity and the placement sweep (all simulated, see ``experiments``).

One seed decided the old offline verdict (issue 32: BucketServe / DistServe 0.92, 1.20, 2.06
over seeds 0-2), so each claim is computed per seed (its own workload draw) and reported as a
mean with a 95% Student-t interval over the seeds. The premise variables that decide whether
the mechanism can act are kept beside every value: padding tokens, rows per step, KV-full
share, preemptions and swaps, busy fraction by role, backlog growth.

* ``seed_study``: per seed, Mixed offline at the top batch for every system and the premise
  variants (both padded; DistServe with row caps below the memory limit; DistServe
  recomputing on its decode instance as vLLM's P/D does; BucketServe's own decode policy;
  ADJUSTBUCKETS repeated until stable), and the online sweeps of BucketServe, DistServe and
  UELLM for capacity and steady-state server RPS.
* ``output_length_study``: Alpaca with our generator's output mean (270) and the paper's (83).
* ``placement_study``: prefill:decode instances and their TP on the same 4 GPUs, both systems.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
from scipy import stats

from servelab.designs.bucketserve.reproduce import experiments as ex
from servelab.designs.bucketserve.reproduce import studies as st

Say = Callable[[str], None]

SEED_SYSTEMS = ("bucketserve", "distserve", "uellm")
# premise variants, Mixed offline at the top batch over every seed: key -> system spec
OFFLINE_VARIANTS = {
    "bucketserve_padded": "bucketserve:padded=true",
    "distserve_padded": "distserve:padded=true",
    "distserve_b32": "distserve:batch=32",
    "distserve_recompute": "distserve:preemption=recompute",
    "bucketserve_own_decode": "bucketserve:decode=own",
    "bucketserve_repeat": "bucketserve:repeat=true",
}
# ratios of the premise variants: key -> (numerator, denominator) among the offline runs
VARIANT_RATIOS = {
    "both_padded": ("bucketserve_padded", "distserve_padded"),
    "vs_distserve_b32": ("bucketserve", "distserve_b32"),
    "vs_distserve_recompute": ("bucketserve", "distserve_recompute"),
    "own_decode_vs_distserve": ("bucketserve_own_decode", "distserve"),
    "repeat_vs_one_pass": ("bucketserve_repeat", "bucketserve"),
}
PREMISE_KEYS = ("output_tok_s", "padding_tokens", "real_tokens", "kv_full_frac", "num_preemptions", "num_swaps",
                "gpu_busy_frac", "busy_by_role", "steady_rps", "backlog_growth_rps", "saturated",
                "steady_out_tok_s", "demand_out_tok_s", "slo_attainment", "server_rps", "num_stalled", "makespan_s")
# prefill instances, decode instances, prefill TP, decode TP: the same 4 GPUs
PLACEMENTS = ((1, 1, 2, 2), (1, 3, 1, 1), (2, 2, 1, 1), (3, 1, 1, 1), (1, 2, 2, 1), (2, 1, 1, 2))


def interval(values) -> dict:
    """Mean and 95% Student-t interval over seeds (None values left out)."""
    x = np.array([v for v in values if v is not None], dtype=float)
    if not x.size:
        return {"mean": None, "low": None, "high": None, "n": 0}
    if x.size == 1:
        return {"mean": float(x[0]), "low": None, "high": None, "n": 1}
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return {"mean": float(x.mean()), "low": float(x.mean() - half), "high": float(x.mean() + half), "n": int(x.size)}


def _ratio(a, b):
    return a / b if a is not None and b else None


def _premise(row: dict) -> dict:
    return {k: row.get(k) for k in PREMISE_KEYS}


def _at(online: list[dict], wl: str, system: str, rate: float) -> dict | None:
    return next((r for r in online if r["workload"] == wl and r["system"] == system and r["client_rps"] == rate), None)


def seed_values(sizes, setting: ex.Setting, seed: int) -> dict:
    """One seed: the claim values and the premise variables behind them."""
    top = max(sizes.batch_sizes)
    workload = ex.offline_workload("mixed", sizes.offline_requests, setting, seed)
    specs = {s: s for s in SEED_SYSTEMS} | OFFLINE_VARIANTS
    off = {key: ex.run(spec, workload, top, setting) for key, spec in specs.items()}
    online = st.online_sweep(sizes.rates_by_workload(), SEED_SYSTEMS, sizes.online_requests, sizes.online_batch,
                             setting, seed)
    tops = sizes.top_rates()
    tok = {k: r["output_tok_s"] for k, r in off.items()}
    claims = {"offline_vs_uellm": _ratio(tok["bucketserve"], tok["uellm"]),
              "offline_vs_distserve": _ratio(tok["bucketserve"], tok["distserve"]),
              "gpu_util": off["bucketserve"]["gpu_busy_frac"]}
    bounds = {}
    for wl in ("alpaca", "mixed"):
        (a, la), (b, lb) = st.capacity(online, wl, "bucketserve"), st.capacity(online, wl, "distserve")
        claims[f"slo80_{wl}"] = _ratio(a, b)
        bounds[f"slo80_{wl}"] = la or lb
        bs = _at(online, wl, "bucketserve", tops[wl])
        claims[f"follows_client_{wl}"] = bs["steady_rps"] / tops[wl] if bs else None
    for key, wl, other in (("rps_vs_uellm_alpaca", "alpaca", "uellm"), ("rps_vs_distserve_mixed", "mixed", "distserve"),
                           ("rps_vs_uellm_mixed", "mixed", "uellm")):
        a, b = _at(online, wl, "bucketserve", tops[wl]), _at(online, wl, other, tops[wl])
        claims[key] = _ratio(a["steady_rps"], b["steady_rps"]) if a and b else None
    variants = {k: _ratio(tok[a], tok[b]) for k, (a, b) in VARIANT_RATIOS.items()}
    return {"seed": seed, "claims": claims, "bounds": bounds, "variants": variants,
            "offline": {k: _premise(r) for k, r in off.items()},
            "online": [{"workload": r["workload"], "client_rps": r["client_rps"], "system": r["system"],
                        **_premise(r)} for r in online]}


def seed_study(sizes, setting: ex.Setting, seeds, say: Say, seed0: dict | None = None) -> dict:
    """``seed_values`` for every seed, and each claim's and variant's interval over them."""
    per_seed = []
    for seed in seeds:
        per_seed.append(seed_values(sizes, setting, seed))
        say(f"[bucketserve]   seed {seed}: done")
    claims = {k: interval([s["claims"][k] for s in per_seed]) for k in per_seed[0]["claims"]}
    for k in per_seed[0]["bounds"]:
        claims[k]["bound_seeds"] = sum(1 for s in per_seed if s["bounds"][k])
    variants = {k: interval([s["variants"][k] for s in per_seed]) for k in VARIANT_RATIOS}
    offline = {k: interval([s["offline"][k]["output_tok_s"] for s in per_seed]) for k in per_seed[0]["offline"]}
    return {"seeds": list(seeds), "claims": claims, "variants": variants, "offline_tok_s": offline,
            "per_seed": per_seed}


def output_length_study(sizes, setting: ex.Setting, seeds, say: Say) -> list[dict]:
    """Alpaca at each output mean and rate, BucketServe and DistServe, every seed: steady-state
    server RPS, demanded and served output tok/s, saturation."""
    rows = []
    for mean in sizes.output_means:
        s = dataclasses.replace(setting, alpaca_output_mean=float(mean))
        for rate in sizes.output_rates:
            for system in ("bucketserve", "distserve"):
                runs = [ex.run(system, ex.online_workload("alpaca", sizes.online_requests, rate, s, seed),
                               sizes.online_batch, s) for seed in seeds]
                rows.append({"output_mean": mean, "client_rps": rate, "system": system,
                             **{k: interval([r[k] for r in runs]) for k in ("steady_rps", "steady_out_tok_s",
                                                                             "demand_out_tok_s", "kv_full_frac",
                                                                             "backlog_growth_rps", "slo_attainment")},
                             "saturated_seeds": sum(1 for r in runs if r["saturated"]), "num_seeds": len(runs),
                             "preemptions": sum(r["num_preemptions"] + r["num_swaps"] for r in runs) / len(runs)})
        say(f"[bucketserve]   Alpaca output mean {mean}: done")
    return rows


def placement_spec(system: str, placement) -> str:
    p, d, ptp, dtp = placement
    return f"{system}:prefills={p},decodes={d},ptp={ptp},dtp={dtp}"


def placement_study(sizes, setting: ex.Setting, seeds, say: Say) -> list[dict]:
    """Both systems at each placement: Mixed offline at the top batch, and the top client RPS
    of each dataset, over the seeds."""
    rows = []
    tops = sizes.top_rates()
    for placement in PLACEMENTS:
        for system in ("bucketserve", "distserve"):
            spec = placement_spec(system, placement)
            off = [ex.run(spec, ex.offline_workload("mixed", sizes.offline_requests, setting, seed),
                          max(sizes.batch_sizes), setting) for seed in seeds]
            row = {"placement": list(placement), "system": system,
                   "offline_tok_s": interval([r["output_tok_s"] for r in off])}
            for wl, rate in tops.items():
                on = [ex.run(spec, ex.online_workload(wl, sizes.online_requests, rate, setting, seed),
                             sizes.online_batch, setting) for seed in seeds]
                row[f"{wl}_steady_rps"] = interval([r["steady_rps"] for r in on])
                row[f"{wl}_saturated_seeds"] = sum(1 for r in on if r["saturated"])
                row[f"{wl}_busy_by_role"] = {role: float(np.mean([r["busy_by_role"].get(role, 0.0) for r in on]))
                                             for role in ("prefill", "decode")}
                row[f"{wl}_attainment"] = interval([r["slo_attainment"] for r in on])
            rows.append(row)
        say(f"[bucketserve]   placement {placement}: done")
    return rows
