"""Steps of ``servelab reproduce kunserve`` run alone, from a run's results (a cut-short run's
partial file or a full run's kunserve.json), in the partial-results format ``render`` merges:
when a full run cannot reach them in the time left on a loaded machine, or when a change after
the full run touches only these steps.

    python -m servelab.designs.kunserve.reproduce.standalone grid --from-partial P --out grid.json
    python -m servelab.designs.kunserve.reproduce.standalone vs --from-partial P --systems "a,b" --out vs.json
    python -m servelab.designs.kunserve.reproduce.standalone pp --from-partial P --out pp.json
    python -m servelab.designs.kunserve.reproduce.standalone plan --out plan.json
    python -m servelab.designs.kunserve.reproduce.standalone steps --from-partial P --steps "a;b" --out steps.json

``grid``: the faithful point over five seeds and a finer grid (``faithful_grid``); ``vs``: the
vs-baselines gap for a subset of its systems (``gaps.GAP_SYSTEMS``), the subset recorded;
``pp``: the dispatch / compute-headroom gap test against vLLM-PP (``gap_pp``); ``plan``: the
drop-plan time (measured: run it alone on a quiet machine); ``steps``: any of the full run's
steps by label, in order, the results written after each.
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


SUBCOMMANDS = {"grid": grid_main, "vs": vs_main, "pp": pp_main, "plan": plan_main, "steps": steps_main}


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
