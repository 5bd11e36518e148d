"""Two steps of ``servelab reproduce kunserve`` run alone, from a cut-short run's partial
results, in the partial-results format ``render`` merges: when a full run cannot reach them in
the time left on a loaded machine.

    python -m servelab.designs.kunserve.reproduce.standalone grid --from-partial P --out grid.json
    python -m servelab.designs.kunserve.reproduce.standalone vs --from-partial P --systems "a,b" --out vs.json

``grid``: the faithful point over five seeds and a finer grid (``faithful_grid``); ``vs``: the
vs-baselines gap for a subset of its systems (``gaps.GAP_SYSTEMS``), the subset recorded.
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


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "raw"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value



def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("grid", "vs"):
        print("standalone: the first argument must be grid or vs", file=sys.stderr)
        return 2
    return (grid_main if argv[0] == "grid" else vs_main)(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
