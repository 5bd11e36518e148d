"""Why KunServe loses to vLLM-PP at the faithful point: two candidate reasons, each tested by an
experiment that could refute it (the paper has KunServe's P99 TTFT the lowest of all systems).

H1, dispatch: Llumnix's freeness dispatcher (the most free KV per request) sends arrivals to
the pipeline groups, whose KV is twice a single's, and they queue there behind the groups'
pipelined compute while single instances, short of KV, have compute to spare. It predicts,
per seed, from the first group formed to the last arrival (``dispatch_probe``): (a) the groups
get a larger share of the arrivals than their share of the GPUs (by more than ``FAVOUR``); (b) arrivals sent to groups
queue longer than those sent to single instances; (c) most of the worst 1% by TTFT that
arrived then were sent to groups; (d) a group's queue waits for compute (its steps at 90% of
the budget while requests queue, most of its queued time) while single instances' steps leave
budget unused; (e) a dispatcher that skips units without compute to spare while another has it
(``dispatch=kv+compute``) lowers KunServe's P99 TTFT on a majority of seeds (the same arrivals)
and by at least half of its mean gap to vLLM-PP.

H2, compute headroom: at the faithful point compute has room, so vLLM-PP's lower throughput
(its pipeline bubbles; the paper: 3.3-21.8% below DP, the paper's reason vLLM-PP loses) never
binds. It predicts that vLLM-PP's queue in the burst is not waiting for compute at the
faithful rate, and that at a higher rate where it is (``saturated``), KunServe's P99 TTFT is
below vLLM-PP's. KunServe still at or above vLLM-PP there refutes it. Where no rate meets that
compute-bound criterion (at decode-heavy lengths vLLM-PP's KV binds first as the rate grows),
the rates where vLLM-PP is overloaded (requests queued, for compute or memory, most of its burst
step time: its throughput binds whatever binds it) are read instead, and the report says so;
with neither, it is untested.

The grid: the faithful rate x ``RATE_FACTORS``, vLLM-PP, KunServe and KunServe with the
kv+compute dispatcher, on every seed's arrivals (the same lengths and bursts). Higher rates are
not re-checked for the premise (vLLM's run and its 4x-KV ceiling would double the cost): they
test the reason, not the paper's claim.
"""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st

RATE_FACTORS = (1.0, 1.6, 2.2)
KV_COMPUTE = "kunserve, dispatch kv+compute"
SYSTEMS = {"vllm-pp": "vllm-pp", "kunserve": "kunserve", KV_COMPUTE: "kunserve:dispatch=kv+compute"}
SATURATED = 0.5  # vLLM-PP compute-bound: its steps at >= 90% of the budget with requests queued, this share of its burst step time
MAJORITY = 2 / 3  # of the seeds
# (a): arrivals to groups over the groups' GPU share above this; a plain ">" read 100% of arrivals
# against a 99% share (every instance in a group: no other destination) as favouring the groups
FAVOUR = 1.1


def _keep(runs: dict, summaries: dict) -> None:
    for name, r in runs.items():
        summaries[name]["dispatch"] = r.get("dispatch")
        summaries[name]["throughput_tok_s"] = r.get("throughput_tok_s")


def run(over_seeds, rate: float, hw: st.Hardware, sizes: ex.Sizes, factors=RATE_FACTORS) -> dict:
    grid = []
    for f in factors:
        out = over_seeds(SYSTEMS, "decode-heavy", f * rate, hw, sizes, sizes.duration_s, sizes.bursts, hook=_keep)
        grid.append({"factor": f, "rate": f * rate, "seeds": out["seeds"]})
    return {"rate": rate, "workload": "decode-heavy", "systems": SYSTEMS, "saturated_share": SATURATED, "grid": grid}


def nested_get(d, *path):
    """``d[path[0]][path[1]]...``, None where a level is missing (a run that skipped a phase)."""
    for k in path:
        if d is None:
            return None
        d = d.get(k)
    return d


def _share(num, den):
    return num / den if num is not None and den else None


def seed_h1(s: dict) -> dict:
    """H1's predictions on one seed's runs (a-e of the module docstring); None where unmeasured."""
    kun = s["runs"]["kunserve"]
    d = nested_get(kun, "dispatch", "after_first_group")
    alt = s["runs"].get(KV_COMPUTE)
    grp, sgl = nested_get(d, "steps", "group"), nested_get(d, "steps", "single")
    late = None if d is None or d.get("worst") is None else d["worst"]["to_group"] + d["worst"]["to_single"]
    out = {"to_groups": nested_get(d, "to_groups"), "group_gpu_share": nested_get(d, "group_gpu_share"),
           "queue_group_s": nested_get(d, "by_dest", "group", "mean_queue_s"),
           "queue_single_s": nested_get(d, "by_dest", "single", "mean_queue_s"),
           "worst_late": late, "worst_to_group_of_late": _share(nested_get(d, "worst", "to_group"), late),
           "group_queued_compute": _share(nested_get(grp, "queued_compute_s"), nested_get(grp, "queued_s")),
           "group_queued_kv_full": _share(nested_get(grp, "queued_other_kv_full_s"), nested_get(grp, "queued_s")),
           "group_fill": nested_get(grp, "fill"), "single_fill": nested_get(sgl, "fill"),
           "p99": kun["ttft_s"]["99"], "p99_kv_compute": alt["ttft_s"]["99"] if alt else None,
           "p99_vllm_pp": s["runs"]["vllm-pp"]["ttft_s"]["99"]}
    out["a"] = _gt(out["to_groups"], None if out["group_gpu_share"] is None else FAVOUR * out["group_gpu_share"])
    out["b"] = _gt(out["queue_group_s"], out["queue_single_s"])
    out["c"] = None if out["worst_to_group_of_late"] is None else out["worst_to_group_of_late"] > 0.5
    out["d"] = None if out["group_queued_compute"] is None or out["single_fill"] is None else \
        out["group_queued_compute"] > 0.5 and out["single_fill"] < 0.9
    return out


def _majority(vals) -> bool:
    known = [v for v in vals if v is not None]
    return bool(known) and sum(v >= SATURATED for v in known) >= MAJORITY * len(known)


def _gt(a, b):
    return None if a is None or b is None else a > b


def pp_saturation(s: dict) -> float | None:
    """vLLM-PP's burst step time spent at >= 90% of the budget with requests queued (share)."""
    g = nested_get(s["runs"]["vllm-pp"], "dispatch", "burst", "steps", "group")
    return _share(nested_get(g, "queued_compute_s"), nested_get(g, "busy_s"))


def pp_queued(s: dict) -> float | None:
    """vLLM-PP's burst step time with requests queued, for compute or for memory (share)."""
    g = nested_get(s["runs"]["vllm-pp"], "dispatch", "burst", "steps", "group")
    return _share(nested_get(g, "queued_s"), nested_get(g, "busy_s"))


def pp_queue_for_compute(s: dict) -> float | None:
    """Of vLLM-PP's burst step time with requests queued, the share at >= 90% of the budget."""
    g = nested_get(s["runs"]["vllm-pp"], "dispatch", "burst", "steps", "group")
    return _share(nested_get(g, "queued_compute_s"), nested_get(g, "queued_s"))


def verdicts(block: dict) -> dict:
    """Each hypothesis's verdict from the grid's numbers: a prediction holds where it holds on a
    majority of seeds (at the faithful rate for H1); H1 holds only if (a)-(e) all do."""
    first = block["grid"][0]
    rows = [seed_h1(s) for s in first["seeds"]]
    h1 = {}
    for p in "abcd":
        vals = [r[p] for r in rows if r[p] is not None]
        h1[p] = None if not vals else sum(vals) >= MAJORITY * len(vals)
    if all(r["p99_kv_compute"] is not None for r in rows):
        lower = sum(r["p99_kv_compute"] < r["p99"] for r in rows) >= MAJORITY * len(rows)
        gap = float(np.mean([r["p99"] - r["p99_vllm_pp"] for r in rows]))
        cut = float(np.mean([r["p99"] - r["p99_kv_compute"] for r in rows]))
        h1["e"] = lower and gap > 0 and cut >= 0.5 * gap
    else:
        h1["e"] = None
    known = [v for v in h1.values() if v is not None]
    h1["verdict"] = "untested" if not known else ("holds" if all(known) else "refuted")
    h2 = {"rates": []}
    for row in block["grid"]:
        sat = [pp_saturation(s) for s in row["seeds"]]
        x = [s["runs"]["kunserve"]["ttft_s"]["99"] / s["runs"]["vllm-pp"]["ttft_s"]["99"] for s in row["seeds"]]
        known_sat = [v for v in sat if v is not None]
        saturated = bool(known_sat) and sum(v >= SATURATED for v in known_sat) >= MAJORITY * len(known_sat)
        h2["rates"].append({"rate": row["rate"], "factor": row["factor"], "saturation": sat, "saturated": saturated,
                            "queued_for_compute": [pp_queue_for_compute(s) for s in row["seeds"]],
                            "queued": [pp_queued(s) for s in row["seeds"]],
                            "overloaded": _majority([pp_queued(s) for s in row["seeds"]]),
                            "kun_over_pp": x, "kunserve_wins": sum(v < 1 for v in x) >= MAJORITY * len(x)
                            and float(np.mean(x)) < 1})
    at_faithful = h2["rates"][0]
    sat_rows = [r for r in h2["rates"] if r["saturated"]]
    if at_faithful["saturated"]:
        h2["verdict"] = "refuted"  # the premise of H2 (headroom at the faithful point) is false
    elif not sat_rows:
        # the compute-bound criterion unmet (KV can bind first): read where vLLM-PP is overloaded instead,
        # its requests queued (for compute or memory) most of its burst step time; named in the report
        over = [r for r in h2["rates"][1:] if r["overloaded"]]
        h2["by_overload"] = bool(over)
        h2["verdict"] = "untested" if not over else ("holds" if all(r["kunserve_wins"] for r in over) else "refuted")
    else:
        h2["verdict"] = "holds" if all(r["kunserve_wins"] for r in sat_rows) else "refuted"
    return {"h1": h1, "h1_seeds": rows, "h2": h2}
