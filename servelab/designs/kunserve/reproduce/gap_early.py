"""The residual P99 TTFT gap to vLLM-PP with the kv+compute dispatcher (``gap_residual``: about
1.14x, R1-R3 and the MIN rule's M2/M3 refuted): a fourth candidate reason, the trigger's timing.

T1: KunServe stays data-parallel until a unit's head-of-line request cannot be admitted; the
arrivals of the last seconds before its first drop then wait through the throttle and their
group's KV exchange (1.1-1.6 s at 200 Gb/s), while vLLM-PP's pairs pool two GPUs' KV from t=0.
Read from ``gap_residual``: 47-75% of the reactive KunServe's worst 1% arrived while it was DP,
and over the burst's arrivals before the drop its queueing P99 was 1.10 s against 0.57 s for
DP with 4x the KV, so memory, not compute, is what those requests waited for.

A reading, not a prediction (it was looked at in the previous run's ``gap_residual`` before
the prediction below was written): the share of the reactive KunServe's worst 1% that arrived
around its first drop, from ``BEFORE_S`` seconds before it to ``AFTER_S`` after (the exchange).
Under MIN per step it was 91%, 50% and 72% on seeds 0-2.

Prediction, fixed before the run (mean over seeds and a majority of seeds): the same KunServe
with an earlier trigger (``trigger_share=0.9``: a unit drops once its head-of-line demand passes
90% of its KV, before the head is refused) closes at least half of the mean P99 TTFT gap to
vLLM-PP, and its P99 is below kv+compute's on a majority of seeds. Otherwise T1 is refuted.
``trigger_share=0.8`` runs beside it as a dose (no prediction). KunServe kv+compute's and
vLLM-PP's runs are ``gap_residual``'s (same code, seeds and arrivals).

T2, stated after T1 was refuted (the earlier trigger raised the P99 from 1.36 s to 2.43 s): an
earlier drop costs more than it saves because its groups' KV exchange lands at the burst's
peak, moving more running requests' KV while queued requests wait on the members. Prediction,
fixed before its runs (``run_link``: the same two KunServe variants on a 10x faster link, the
exchange nearly free; mean over seeds and a majority of seeds): on the fast link the 90%-KV
trigger's P99 TTFT recovers at least half of the way from its own (200 Gb/s) to kv+compute's
at 200 Gb/s, and is below its 200 Gb/s P99 on a majority of seeds. Otherwise T2 is refuted.
"""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st

KUN, PP = "kunserve kv+compute", "vllm-pp"  # gap_residual's runs
EARLY, EARLIER = "trigger at 90% KV", "trigger at 80% KV"
SYSTEMS = {EARLY: "kunserve:dispatch=kv+compute,trigger_share=0.9",
           EARLIER: "kunserve:dispatch=kv+compute,trigger_share=0.8"}
LINK_FACTOR = 10.0
FAST_EARLY, FAST_KUN = "trigger at 90% KV, 10x link", "kunserve kv+compute, 10x link"
LINK_SYSTEMS = {FAST_EARLY: SYSTEMS[EARLY], FAST_KUN: "kunserve:dispatch=kv+compute"}
BEFORE_S, AFTER_S = 10.0, 5.0
MAJORITY = 2 / 3


def run(rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    from servelab.designs.kunserve.reproduce.points import _summary

    tasks = [dict(system=name, specs=st.workload("decode-heavy", rate, sizes.duration_s, sizes.bursts, s),
                  hw=hw, sizes=sizes, spec=spec) for s in sizes.seeds for name, spec in SYSTEMS.items()]
    done = iter(ex.run_many(tasks))
    seeds = [{"seed": s, "runs": {name: _kept(_summary(next(done))) for name in SYSTEMS}} for s in sizes.seeds]
    return {"rate": rate, "workload": "decode-heavy", "systems": SYSTEMS, "window_s": [BEFORE_S, AFTER_S],
            "seeds": seeds}


def run_link(rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    """T2's runs: the 90%-KV trigger and kv+compute on a ``LINK_FACTOR`` x faster inter-server link."""
    import dataclasses

    from servelab.designs.kunserve.reproduce.points import _summary

    fast = dataclasses.replace(hw, inter_gbps=LINK_FACTOR * hw.inter_gbps)
    tasks = [dict(system=name, specs=st.workload("decode-heavy", rate, sizes.duration_s, sizes.bursts, s),
                  hw=fast, sizes=sizes, spec=spec) for s in sizes.seeds for name, spec in LINK_SYSTEMS.items()]
    done = iter(ex.run_many(tasks))
    seeds = [{"seed": s, "runs": {name: _kept(_summary(next(done))) for name in LINK_SYSTEMS}} for s in sizes.seeds]
    return {"rate": rate, "factor": LINK_FACTOR, "gbps": fast.inter_gbps, "systems": LINK_SYSTEMS, "seeds": seeds}


def link_verdict(link: dict, early: dict | None, residual: dict | None) -> dict:
    """T2's prediction from ``run_link``'s runs, this step's 90%-KV runs and ``gap_residual``'s
    kv+compute runs (paired by seed)."""
    mine = {s["seed"]: s["runs"] for s in (early or {}).get("seeds", [])}
    res = {s["seed"]: s["runs"] for s in (residual or {}).get("seeds", [])}
    seeds = [s["seed"] for s in link["seeds"]]
    if not seeds or any(EARLY not in mine.get(x, {}) or KUN not in res.get(x, {}) for x in seeds):
        return {"verdict": "untested"}
    p99 = {FAST_EARLY: [s["runs"][FAST_EARLY]["ttft_s"]["99"] for s in link["seeds"]],
           FAST_KUN: [s["runs"][FAST_KUN]["ttft_s"]["99"] for s in link["seeds"]],
           EARLY: [mine[x][EARLY]["ttft_s"]["99"] for x in seeds], KUN: [res[x][KUN]["ttft_s"]["99"] for x in seeds]}
    cost = float(np.mean([e - k for e, k in zip(p99[EARLY], p99[KUN])]))  # what the earlier trigger cost
    back = float(np.mean([e - f for e, f in zip(p99[EARLY], p99[FAST_EARLY])]))  # what the fast link won back
    ok = cost > 0 and back >= 0.5 * cost and _maj([f < e for e, f in zip(p99[EARLY], p99[FAST_EARLY])])
    return {"holds": ok, "p99": p99, "cost_s": cost, "back_s": back, "verdict": "holds" if ok else "refuted"}


KEPT = ("ttft_s", "tpot_s", "num_preemptions", "forms", "form_s", "worst_arrivals_s", "bubble_share")


def _kept(summary: dict) -> dict:
    """What the verdict and the report read (kunserve.json, a tracked file, must stay under 2 MB)."""
    return {k: summary[k] for k in KEPT if k in summary}


def around_drop(run: dict, window_s=(BEFORE_S, AFTER_S)) -> float | None:
    """The share of a run's worst 1% by TTFT that arrived from ``window_s[0]`` seconds before its
    first drop to ``window_s[1]`` after it (None: no drop)."""
    forms, worst = run.get("form_s") or [], run.get("worst_arrivals_s") or []
    if not forms or not worst:
        return None
    first = min(forms)
    return sum(first - window_s[0] <= a <= first + window_s[1] for a in worst) / len(worst)


def _maj(flags: list) -> bool:
    return bool(flags) and sum(bool(x) for x in flags) >= MAJORITY * len(flags)


def verdict(block: dict, residual: dict | None) -> dict:
    """T1's prediction from this step's runs and ``gap_residual``'s (paired by seed)."""
    by_seed = {s["seed"]: s["runs"] for s in (residual or {}).get("seeds", [])}
    pairs = [(s["runs"], by_seed.get(s["seed"], {})) for s in block["seeds"]]
    if not pairs or any(KUN not in r or PP not in r for _, r in pairs):
        return {"verdict": "untested"}
    p99 = {n: [mine[n]["ttft_s"]["99"] for mine, _ in pairs] for n in SYSTEMS}
    p99 |= {n: [r[n]["ttft_s"]["99"] for _, r in pairs] for n in (KUN, PP)}
    window = tuple(block.get("window_s", (BEFORE_S, AFTER_S)))
    around = {n: [around_drop(mine[n], window) for mine, _ in pairs] for n in SYSTEMS}
    around[KUN] = [around_drop(r[KUN], window) for _, r in pairs]
    gap = float(np.mean([k - p for k, p in zip(p99[KUN], p99[PP])]))
    cut = float(np.mean([k - e for k, e in zip(p99[KUN], p99[EARLY])]))
    ok = gap > 0 and cut >= 0.5 * gap and _maj([e < k for k, e in zip(p99[KUN], p99[EARLY])])
    first = {n: [min(mine[n]["form_s"], default=None) for mine, _ in pairs] for n in SYSTEMS}
    first[KUN] = [min(r[KUN]["form_s"], default=None) for _, r in pairs]
    return {"holds": ok, "around": around, "p99": p99, "gap_s": gap, "cut_s": cut, "first_drop_s": first,
            "verdict": "holds" if ok else "refuted"}
