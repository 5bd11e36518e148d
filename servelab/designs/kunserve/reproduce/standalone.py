"""Steps of ``servelab reproduce kunserve`` run alone, from a run's results (a cut-short run's
partial file or a full run's kunserve.json), in the partial-results format ``render`` merges:
when a full run cannot reach them in the time left on a loaded machine, or when a change after
the full run touches only these steps.

    python -m servelab.designs.kunserve.reproduce.standalone grid --from-partial P --out grid.json
    python -m servelab.designs.kunserve.reproduce.standalone vs --from-partial P --systems "a,b" --out vs.json
    python -m servelab.designs.kunserve.reproduce.standalone pp --from-partial P --out pp.json
    python -m servelab.designs.kunserve.reproduce.standalone plan --out plan.json
    python -m servelab.designs.kunserve.reproduce.standalone steps --from-partial P --steps "a;b" --out steps.json

    python -m servelab.designs.kunserve.reproduce.standalone gap-min --from-partial P --what min --reuse floor --out m.json

``grid``: the faithful point over five seeds and a finer grid (``faithful_grid``); ``vs``: the
vs-baselines gap for a subset of its systems (``gaps.GAP_SYSTEMS``), the subset recorded;
``pp``: the dispatch / compute-headroom gap test against vLLM-PP (``gap_pp``); ``plan``: the
drop-plan time (measured: run it alone on a quiet machine); ``steps``: any of the full run's
steps by label, in order, the results written after each; ``gap-min``: the MIN-rule or the
exchange gap step without the runs it shares with earlier sections of the same code.
"""

from __future__ import annotations

import functools
import sys

from servelab.designs.kunserve.reproduce import faithful_grid, gaps, waits


def grid_main(argv=None) -> int:
    """Run this step alone from a run's partial results (its faithful end-to-end block), in the
    partial-results format ``render`` merges: when a full run cannot reach it in the time left."""
    import argparse
    import json
    import sys
    import time
    from pathlib import Path

    from servelab.designs.kunserve.reproduce.run import FAITHFUL, FULL, _clusters
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import cpu_time_s

    ap = argparse.ArgumentParser(description="the faithful point over five seeds and a finer grid, alone")
    ap.add_argument("--from-partial", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if not a.from_partial.is_file():
        print(f"faithful_grid: no file {a.from_partial}", file=sys.stderr)
        return 2
    point = json.loads(a.from_partial.read_text())["results"].get("end_to_end", {}).get(FAITHFUL)
    if point is None:
        print(f"faithful_grid: {a.from_partial} has no {FAITHFUL} end-to-end block", file=sys.stderr)
        return 2
    t0, w0 = cpu_time_s(), time.time()
    out = faithful_grid.run(point, _clusters(FULL)[0], FULL)
    label = "faithful point: five seeds, finer grid"
    a.out.write_text(json.dumps(plain({"steps_done": [label], "timings_cpu_s": {label: cpu_time_s() - t0},
                                       "wall_s": time.time() - w0, "results": {"faithful_grid": out}})))
    return 0


def vs_main(argv=None) -> int:
    """The vs-baselines gap alone, for a subset of its systems, from a run's partial results (its
    faithful end-to-end block gives the rate), in the partial-results format ``render`` merges:
    when a full run cannot reach it in the time left. The subset is recorded in the results."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from servelab.designs.kunserve.reproduce.run import FAITHFUL, FULL, _clusters, _over_seeds
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import cpu_time_s

    ap = argparse.ArgumentParser(description="KunServe against vLLM-PP and InferCept, a subset of the variants")
    ap.add_argument("--from-partial", type=Path, required=True)
    ap.add_argument("--systems", required=True, help="comma-separated names of gaps.GAP_SYSTEMS")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in gaps.GAP_SYSTEMS]
    if unknown or not a.from_partial.is_file():
        print(f"gaps: unknown systems {unknown}" if unknown else f"gaps: no file {a.from_partial}", file=sys.stderr)
        return 2
    rate = json.loads(a.from_partial.read_text())["results"]["end_to_end"][FAITHFUL]["rate"]
    hw, sizes = _clusters(FULL)[0], FULL
    t0 = cpu_time_s()
    hook = functools.partial(waits.attach, ref="kunserve", bursts=sizes.bursts, horizon_s=sizes.duration_s)
    out = _over_seeds({n: gaps.GAP_SYSTEMS[n] for n in names}, "decode-heavy", rate, hw, sizes, sizes.duration_s,
                      sizes.bursts, hook=hook)
    block = {"rate": rate, "workload": "decode-heavy", "seeds": out["seeds"], "systems_subset": names}
    label = "gap: KunServe vs vLLM-PP / InferCept"
    a.out.write_text(json.dumps(plain({"steps_done": [label + " (subset)"], "timings_cpu_s": {label: cpu_time_s() - t0},
                                       "results": {"gap_vs_baselines": _strip(block)}})))
    return 0


def _faithful(path):
    """The faithful point's end-to-end block from a partial file or a full run's kunserve.json."""
    import json

    from servelab.designs.kunserve.reproduce.run import FAITHFUL

    data = json.loads(path.read_text())
    return data.get("results", data).get("end_to_end", {}).get(FAITHFUL)


def pp_main(argv=None) -> int:
    """``gap_pp`` alone at the faithful point's rate of a run's results."""
    import argparse
    import json
    from pathlib import Path

    from servelab.designs.kunserve.reproduce import gap_pp
    from servelab.designs.kunserve.reproduce.run import FULL, _clusters, _over_seeds
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import cpu_time_s

    ap = argparse.ArgumentParser(description="KunServe against vLLM-PP: dispatch and compute headroom, alone")
    ap.add_argument("--from-partial", type=Path, required=True, help="a partial file or a full run's kunserve.json")
    ap.add_argument("--factors", default=None, help="rate factors, comma-separated (default: gap_pp.RATE_FACTORS)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        factors = tuple(float(x) for x in a.factors.split(",")) if a.factors else gap_pp.RATE_FACTORS
    except ValueError:
        print(f"gap_pp: --factors must be numbers separated by commas, got {a.factors!r}", file=sys.stderr)
        return 2
    point = _faithful(a.from_partial) if a.from_partial.is_file() else None
    if point is None:
        print(f"gap_pp: no faithful end-to-end block in {a.from_partial}", file=sys.stderr)
        return 2
    t0 = cpu_time_s()
    out = gap_pp.run(_over_seeds, point["rate"], _clusters(FULL)[0], FULL, factors)
    label = "gap: KunServe vs vLLM-PP, dispatch and compute headroom"
    a.out.write_text(json.dumps(plain({"steps_done": [label], "timings_cpu_s": {label: cpu_time_s() - t0},
                                       "results": {"gap_pp": _strip(out)}})))
    return 0


def plan_main(argv=None) -> int:
    """The drop-plan time alone (CPU time, measured on this machine)."""
    import argparse
    import json
    from pathlib import Path

    from servelab.designs.kunserve.drop_plan import time_drop_plan
    from servelab.designs.kunserve.reproduce.run import FULL
    from servelab.reproduce.runner import cpu_time_s

    ap = argparse.ArgumentParser(description="the drop-plan time, alone")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    t0 = cpu_time_s()
    rows = [time_drop_plan(n) for n in FULL.plan_sizes]
    a.out.write_text(json.dumps({"steps_done": ["drop-plan time"], "timings_cpu_s": {"drop-plan time": cpu_time_s() - t0},
                                 "results": {"plan_time": rows}}))
    return 0


def steps_main(argv=None) -> int:
    """Named steps of the full run alone, in the given order, from a run's results (the
    end-to-end blocks other steps read their rates from; a step run here that makes one, e.g.
    ``end to end longbench 72B``, serves the steps after it). The results so far are written
    after every step, so a run cut short keeps what it finished."""
    import argparse
    import json
    from pathlib import Path

    from servelab.designs.kunserve.reproduce.run import FULL, REPRODUCTION, _start, _steps, _strip_raw
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import Run, _store, cpu_time_s

    ap = argparse.ArgumentParser(description="steps of the full run, alone")
    ap.add_argument("--from-partial", type=Path, required=True, help="a partial file or a full run's kunserve.json")
    ap.add_argument("--steps", required=True, help="step labels separated by ';', run in this order")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if not a.from_partial.is_file():
        print(f"steps: no file {a.from_partial}", file=sys.stderr)
        return 2
    data = json.loads(a.from_partial.read_text())
    run = Run(REPRODUCTION, a.out.parent, False, 0, FULL, {}, 1, None, lambda m: print(m, file=sys.stderr, flush=True))
    _start(run)
    run.results["end_to_end"] = dict(data.get("results", data).get("end_to_end", {}))
    known = {st.label: st for st in _steps(run)}
    wanted = [x.strip() for x in a.steps.split(";") if x.strip()]
    unknown = [x for x in wanted if x not in known]
    if unknown:
        print(f"steps: unknown steps {unknown} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    done, timings, out = [], {}, {}
    for label in wanted:
        step = known[label]
        run.say(f"[standalone] {label}")
        t0 = cpu_time_s()
        value = step.run(run)
        timings[label] = cpu_time_s() - t0
        _store(run.results, step.key, value)
        _store(out, step.key, value)
        done.append(label)
        a.out.write_text(json.dumps(plain({"steps_done": done, "timings_cpu_s": timings,
                                           "results": _strip_raw(out)})))
        run.say(f"[standalone] {label}: {timings[label]:.0f} s CPU")
    return 0


REUSE_RULES = {"min-per-step": "MIN per step", "floor": "stage floor"}  # --reuse's names -> gap_min's


def _reusable(res: dict, rule: str = "MIN per step") -> tuple[dict, dict]:
    """Runs of a run's results that ``gap_min`` / ``gap_exchange`` would repeat: the variant of
    ``rule`` (gap_min's name of the lookahead rule KunServe's default was when ``gap_bubble`` and
    ``gap_residual`` ran: MIN per step before the stage floor became the default, the floor since)
    and the full-link-speed variants, as run by ``gap_bubble``, ``gap_residual`` and the faithful
    ablation on the same arrivals (valid only where those sections ran on this simulation code
    under that default, which the caller asserts with ``--reuse RULE``; ``--check`` reruns one)."""
    from servelab.designs.kunserve.reproduce import gap_bubble, gap_exchange, gap_min, gap_residual

    def col(section, name):
        return [s["runs"][name] for s in res[section]["seeds"]]

    pp, t0, kun = gap_residual.PP, gap_residual.T0, gap_residual.KUN
    have = {(gap_min.LONGBENCH_T0, rule): (col("gap_bubble", gap_bubble.QUEUE), "gap_bubble"),
            (gap_min.LONGBENCH_T0, gap_min.TOKENS): (col("gap_bubble", gap_bubble.TOKENS), "gap_bubble"),
            (gap_min.FAITHFUL_T0, rule): (col("gap_residual", t0), "gap_residual"),
            (gap_min.FAITHFUL_T0, gap_min.PP): (col("gap_residual", pp), "gap_residual"),
            (gap_min.RESIDUAL, rule): (col("gap_residual", kun), "gap_residual"),
            (gap_min.RESIDUAL, gap_min.PP): (col("gap_residual", pp), "gap_residual")}
    ab = [{n: s["runs"][n] for n in gap_exchange.SYSTEMS} for s in res["ablation_memory_bound"]["seeds"]]
    return have, {1.0: (ab, "ablation_memory_bound")}


def gap_min_main(argv=None) -> int:
    """``gap_min`` (``--what min``, point by point, the results written after each) or
    ``gap_exchange`` (``--what exchange``) alone at the rates of a run's results; with ``--reuse
    RULE`` (the lookahead rule KunServe's default was when that run's ``gap_bubble`` and
    ``gap_residual`` ran: ``min-per-step`` or ``floor``) the runs they share with those sections
    and the faithful ablation are taken from it, and ``--check`` reruns one of them (LongBench
    from t=0, that rule, the first seed) to show the numbers identical."""
    import argparse
    import dataclasses
    import json
    from pathlib import Path

    from servelab.designs.kunserve.reproduce import experiments as ex
    from servelab.designs.kunserve.reproduce import gap_exchange, gap_min
    from servelab.designs.kunserve.reproduce import setting as st
    from servelab.designs.kunserve.reproduce.points import _summary
    from servelab.designs.kunserve.reproduce.run import FAITHFUL, FULL, _clusters
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import cpu_time_s

    ap = argparse.ArgumentParser(description="the MIN-rule or the exchange gap step alone")
    ap.add_argument("--from-partial", type=Path, required=True, help="a partial file or a full run's kunserve.json")
    ap.add_argument("--what", choices=("min", "exchange"), required=True)
    ap.add_argument("--points", default=None, help="gap_min points separated by ';' (default: all, in order)")
    ap.add_argument("--reuse", choices=tuple(REUSE_RULES),
                    help="take the shared runs from the file (same simulation code), whose gap_bubble / gap_residual "
                         "ran under this default lookahead rule")
    ap.add_argument("--check", action="store_true", help="with --reuse: rerun one reused run and compare")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if not a.from_partial.is_file():
        print(f"gap_min: no file {a.from_partial}", file=sys.stderr)
        return 2
    data = json.loads(a.from_partial.read_text())
    res = data.get("results", data)
    points = [p.strip() for p in (a.points or ";".join(gap_min.POINTS)).split(";") if p.strip()]
    bad = [p for p in points if p not in gap_min.POINTS]
    if bad:
        print(f"gap_min: unknown points {bad} (known: {'; '.join(gap_min.POINTS)})", file=sys.stderr)
        return 2
    e2e = res.get("end_to_end", {})
    if FAITHFUL not in e2e or "longbench-14B" not in e2e:
        print(f"gap_min: {a.from_partial} lacks the {FAITHFUL} / longbench-14B end-to-end blocks", file=sys.stderr)
        return 2
    rates = {"longbench": e2e["longbench-14B"]["rate"], "decode-heavy": e2e[FAITHFUL]["rate"]}
    hw, sizes = _clusters(FULL)[0], FULL
    rule = REUSE_RULES[a.reuse] if a.reuse else None
    have_min, have_ex = _reusable(res, rule) if a.reuse else ({}, {})
    label = "gap: lookahead's MIN rule" if a.what == "min" else "gap: coordinated exchange by link speed"
    key = "gap_min" if a.what == "min" else "gap_exchange"
    t0, value = cpu_time_s(), {}
    check = None
    if a.what == "min" and a.reuse and a.check:
        wl, systems = gap_min.POINTS[gap_min.LONGBENCH_T0]
        r = _summary(ex.run_system(rule, st.workload(wl, rates[wl], sizes.duration_s, sizes.bursts,
                                                      sizes.seeds[0]), hw, sizes, spec=systems[rule]))
        old = have_min[(gap_min.LONGBENCH_T0, rule)][0][0]
        keys = ("ttft_s", "tpot_s", "bubble_share", "single_microbatch_share")
        check = {"point": gap_min.LONGBENCH_T0, "system": rule, "seed": sizes.seeds[0],
                 "identical": all(plain(r[k]) == old.get(k) for k in keys), "rerun": {k: r[k] for k in keys},
                 "reused": {k: old.get(k) for k in keys}}
    if a.what == "exchange":  # the slowest link first: the strongest test of D1
        factors = sorted(gap_exchange.LINK_FACTORS)
        value = gap_exchange.run(rates["decode-heavy"], hw, dataclasses.replace(sizes), factors=factors, have=have_ex)
        value["links"].sort(key=lambda lk: -lk["factor"])
    # the new rules' runs in parts, the floor first (on a loaded machine a cut-short run keeps them)
    parts = [(p, {r}) for r in (gap_min.FLOOR, gap_min.OLD, gap_min.MIN8, gap_min.TOKENS, gap_min.PP) for p in points
             if r in gap_min.POINTS[p][1] and (p, r) not in have_min]
    for p, only in parts if a.what == "min" else ():
        new = gap_min.run(rates, hw, sizes, have={k: v for k, v in have_min.items() if k[0] == p}, points=[p],
                          only=only)[p]
        if p not in value:
            value[p] = new
        else:
            for old_seed, new_seed in zip(value[p]["seeds"], new["seeds"]):
                old_seed["runs"] |= new_seed["runs"]
        if check is not None:
            value["check"] = check
        a.out.write_text(json.dumps(plain({"steps_done": [label], "timings_cpu_s": {label: cpu_time_s() - t0},
                                           "results": {key: value}})))
    if a.what == "exchange":
        a.out.write_text(json.dumps(plain({"steps_done": [label], "timings_cpu_s": {label: cpu_time_s() - t0},
                                           "results": {key: value}})))
    return 0


SUBCOMMANDS = {"grid": grid_main, "vs": vs_main, "pp": pp_main, "plan": plan_main, "steps": steps_main,
               "gap-min": gap_min_main}


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "raw"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value



def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"standalone: the first argument must be one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    return SUBCOMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
