"""The lookahead former's MIN rule, tested: is it what leaves lookahead's bubble above the paper's
(gap c: 6.8% at the faithful point, 30.3% at LongBench lengths pipelined from t=0, against the
paper's 21.9% -> 8.3%) and what separates KunServe's pipelines from vLLM-PP's (gap a)?

The paper (section 4.3, Fig. 11 and the appendix) cuts the lookahead batch, *all* queued work,
recursively until a part has at most ``MIN`` tokens (``m = ceil(tokens_B / MIN)``; no value of
MIN is given, "profiled off-line", so "each microbatch has sufficient tokens to fully utilize
the GPU"); normal execution, with too little queued to look ahead at, is not covered by it
(section 4.4) and runs as its vLLM pipeline does, one microbatch per virtual engine (stage).
Until this test the former applied MIN = 32 to every step, so a decode step of <= 32 rows ran
as one microbatch: on a two-stage group one stage at a time (``gap_bubble``: 77% of the group
steps at LongBench lengths). Three rules, each a KunServe variant on the same arrivals, each spec naming its rule (so the
section does not depend on which is the default):

- ``MIN per step`` (``stage_floor=false``): the rule before this test;
- ``stage floor`` (``stage_floor=true``; a named variant when this test ran, the default since
  its verdicts, M1 holding): a step with at least as many rows as stages becomes one microbatch
  per stage whatever its tokens;
- ``MIN = 8`` (``stage_floor=false,lookahead_min_tokens=8``): a smaller MIN, which the paper
  allows (it fixes none), without the floor.

Three points, each the point of an earlier gap step: LongBench lengths pipelined from t=0
(``gap_bubble``'s, with token chunking beside), and the faithful point both pipelined from t=0
and reactive with the ``kv+compute`` dispatcher (``gap_residual``'s R3 and residual), vLLM-PP on
the same arrivals.

Hypotheses and their predictions, fixed before the run (each on the mean and a majority of
seeds):

- **M1 (gap c)**: the MIN rule is why lookahead's bubble is high. (a) At LongBench lengths from
  t=0 the stage floor leaves at most ``SINGLE_MAX`` of the group steps as one microbatch and
  at most half of ``MIN per step``'s bubble share; (b) with it, lookahead's bubble share is at
  or below token chunking's (the paper's direction).
- **M2 (gap a, R3's configuration)**: at the faithful point pipelined from t=0, the stage floor
  closes at least half of ``MIN per step``'s P99 TTFT gap to vLLM-PP.
- **M3 (gap a, the residual)**: with the reactive drop (``kv+compute``) the stage floor closes
  at least half of the residual P99 TTFT gap to vLLM-PP.
- **M4 (the smaller MIN)**: ``MIN = 8`` moves the LongBench single-microbatch share and bubble
  the same way as the floor but less (both between the other two rules').
"""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st
from servelab.designs.kunserve.reproduce.gaps import _T0

OLD, FLOOR, MIN8, TOKENS, PP = "MIN per step", "stage floor", "MIN = 8", "token chunking", "vllm-pp"
RULES = {OLD: "stage_floor=false", FLOOR: "stage_floor=true", MIN8: "stage_floor=false,lookahead_min_tokens=8"}
LONGBENCH_T0, FAITHFUL_T0, RESIDUAL = "longbench, from t=0", "faithful, from t=0", "faithful, reactive kv+compute"
POINTS = {
    LONGBENCH_T0: ("longbench", {**{n: f"{_T0},{r}" for n, r in RULES.items()}, TOKENS: _T0 + ",former=tokens"}),
    FAITHFUL_T0: ("decode-heavy", {**{n: f"{_T0},{r}" for n, r in RULES.items()}, PP: "vllm-pp"}),
    RESIDUAL: ("decode-heavy", {**{n: f"kunserve:dispatch=kv+compute,{r}" for n, r in RULES.items()}, PP: "vllm-pp"}),
}
SINGLE_MAX = 0.10
MAJORITY = 2 / 3


def run(rates: dict, hw: st.Hardware, sizes: ex.Sizes, have: dict | None = None, points=None, only=None) -> dict:
    """Every point's systems on every seed's arrivals; ``rates``: workload -> base rate.
    ``have``: ``(point, system) -> (per-seed summaries in sizes.seeds' order, where from)``, runs
    of an earlier step on the same simulation code and arrivals, not run again (recorded in
    the block's ``reused``); ``points``: a subset of ``POINTS``, in order; ``only``: the systems to
    run (the others, unless in ``have``, are left out: a run cut into parts on a loaded machine)."""
    from servelab.designs.kunserve.reproduce.points import _summary

    have = have or {}
    chosen = {p: POINTS[p] for p in (points or POINTS)}
    tasks, index, order = [], {}, []
    for point, (wl, systems) in chosen.items():
        for s in sizes.seeds:
            for name, spec in systems.items():
                if (point, name) in have or (only is not None and name not in only):
                    continue
                key = (wl, s, spec)  # vLLM-PP runs once per seed for both faithful points
                if key not in index:
                    index[key] = len(tasks)
                    tasks.append(dict(system=name, specs=st.workload(wl, rates[wl], sizes.duration_s, sizes.bursts, s),
                                      hw=hw, sizes=sizes, spec=spec))
                order.append((point, s, name, index[key]))
    done = [_summary(r) for r in ex.run_many(tasks)]
    out = {p: {"workload": wl, "rate": rates[wl], "systems": systems,
               "seeds": [{"seed": s, "runs": {}} for s in sizes.seeds],
               "reused": {n: have[(p, n)][1] for n in systems if (p, n) in have}} for p, (wl, systems) in chosen.items()}
    pos = {s: i for i, s in enumerate(sizes.seeds)}
    for point, s, name, i in order:
        out[point]["seeds"][pos[s]]["runs"][name] = done[i]
    for (point, name), (per_seed, _) in have.items():
        if point in out:
            for i, summary in enumerate(per_seed):
                out[point]["seeds"][i]["runs"][name] = summary
    return out


def _col(block: dict, name: str, key: str) -> list:
    vals = []
    for s in block["seeds"]:
        r = s["runs"].get(name)
        vals.append(None if r is None else r["ttft_s"]["99"] if key == "p99" else r.get(key))
    return vals


def _maj(flags: list) -> bool:
    return bool(flags) and sum(bool(f) for f in flags) >= MAJORITY * len(flags)


def _closes(block: dict) -> dict | None:
    """The floor's share of ``MIN per step``'s P99 TTFT gap to vLLM-PP it closes (mean, per seed)."""
    if not all(n in s["runs"] for s in block["seeds"] for n in (OLD, FLOOR, PP)):
        return None
    old, floor, pp = (_col(block, n, "p99") for n in (OLD, FLOOR, PP))
    gap = float(np.mean([o - p for o, p in zip(old, pp)]))
    cut = float(np.mean([o - f for o, f in zip(old, floor)]))
    ok = gap > 0 and cut >= 0.5 * gap and _maj([f < o for o, f in zip(old, floor)])
    return {"old": old, "floor": floor, "min8": _col(block, MIN8, "p99"), "pp": pp, "gap_s": gap, "cut_s": cut,
            "holds": ok}


def verdicts(res: dict) -> dict:
    """Each hypothesis's predictions from the runs (see the module docstring)."""
    out: dict = {}
    lb = res.get(LONGBENCH_T0)
    if lb:
        bub = {n: _col(lb, n, "bubble_share") for n in (OLD, FLOOR, MIN8, TOKENS)}
        one = {n: _col(lb, n, "single_microbatch_share") for n in (OLD, FLOOR, MIN8, TOKENS)}
        if any(v is None for n in (OLD, FLOOR, TOKENS) for v in bub[n] + one[n]):
            out["m1"] = out["m4"] = {"verdict": "untested"}
        else:
            a = (float(np.mean(one[FLOOR])) <= SINGLE_MAX and _maj([x <= SINGLE_MAX for x in one[FLOOR]])
                 and float(np.mean(bub[FLOOR])) <= 0.5 * float(np.mean(bub[OLD]))
                 and _maj([f <= 0.5 * o for f, o in zip(bub[FLOOR], bub[OLD])]))
            b = (float(np.mean(bub[FLOOR])) <= float(np.mean(bub[TOKENS]))
                 and _maj([f <= t for f, t in zip(bub[FLOOR], bub[TOKENS])]))
            between = [m is not None and min(f, o) <= m <= max(f, o) for f, m, o in zip(bub[FLOOR], bub[MIN8], bub[OLD])]
            between1 = [m is not None and min(f, o) <= m <= max(f, o) for f, m, o in zip(one[FLOOR], one[MIN8], one[OLD])]
            out["m1"] = {"a": a, "b": b, "verdict": "holds" if a and b else "refuted"}
            known = None not in bub[MIN8] + one[MIN8]
            out["m4"] = {"verdict": ("holds" if _maj(between) and _maj(between1) else "refuted") if known else "untested"}
            out["bubble"], out["single"] = bub, one
    for key, point in (("m2", FAITHFUL_T0), ("m3", RESIDUAL)):
        c = _closes(res[point]) if res.get(point) else None
        if c is not None:
            out[key] = c | {"verdict": "holds" if c["holds"] else "refuted"}
    return out
