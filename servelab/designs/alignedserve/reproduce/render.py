"""Write docs/reproduction/alignedserve.md from a full run's results.json with steps rerun alone
(``standalone``) in place of its own, naming at the report's head which sections come from
which run: a full ``servelab reproduce alignedserve`` costs about 2,400 CPU-s on this
project's 2-core machine, too much to repeat for a change that adds or touches a few steps.

    python -m servelab.designs.alignedserve.reproduce.standalone --steps "..." --out part.json
    python -m servelab.designs.alignedserve.reproduce.render --partial part.json \\
        --base docs/reproduction/alignedserve/results.json --base-label "full run at commit a3768b0" \\
        --label "commit 1234abc" --why "issue 25: new gap tests" --out docs/reproduction

Several ``--partial`` files may be given (the first holding a section wins); ``--sections``
keeps only the named sections of them (a file that also holds sections its step's code has
changed since). The merged
results replace ``--out``'s results.json, so a later render takes them as its base and keeps
the earlier reruns' names (``reruns``, oldest first).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def combine(parts: list[dict]) -> dict:
    """Partial files -> one: the first file holding a section wins; steps, timings and loads joined."""
    out = {"results": {}, "steps_done": [], "timings_cpu_s": {}, "load_average": []}
    for part in parts:
        for k, v in part.get("results", {}).items():
            out["results"].setdefault(k, v)
        out["steps_done"] += [x for x in part.get("steps_done", []) if x not in out["steps_done"]]
        out["timings_cpu_s"] = part.get("timings_cpu_s", {}) | out["timings_cpu_s"]
        out["load_average"] += part.get("load_average", [])
    return out


def keep_sections(partial: dict, sections: set[str], step_keys: dict[str, str]) -> dict:
    """``partial`` with only ``sections``, and only the steps (and their CPU times) that made them
    (``step_keys``: step label -> results key; a step not in it is kept)."""
    steps = [x for x in partial["steps_done"] if x not in step_keys or step_keys[x] in sections]
    return {**partial, "results": {k: v for k, v in partial["results"].items() if k in sections},
            "steps_done": steps, "timings_cpu_s": {k: v for k, v in partial["timings_cpu_s"].items() if k in steps}}


def rebase(partial: dict, base: dict, *, base_label: str, label: str, why: str) -> dict:
    """``base`` with the partial results' sections in its place; ``reruns`` names them, with
    the run they came from and why, after the reruns the base already carried; ``base_label``
    is recorded the first time only (where the sections not rerun come from)."""
    res = dict(base)
    for k, v in partial["results"].items():
        res[k] = v
    res["timings_cpu_s"] = dict(base.get("timings_cpu_s", {})) | dict(partial.get("timings_cpu_s", {}))
    res["total_cpu_s"] = float(base.get("total_cpu_s", sum(base.get("timings_cpu_s", {}).values())))
    res.setdefault("base_run", base_label)
    loads = [x for pair in partial.get("load_average", []) for x in pair if x is not None]
    res["reruns"] = list(base.get("reruns", [])) + [{
        "label": label, "why": why, "steps": list(partial.get("steps_done", [])),
        "sections": sorted(partial["results"]),
        "cpu_s": float(sum(partial.get("timings_cpu_s", {}).values())),
        "load_average": [min(loads), max(loads)] if loads else None}]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", type=Path, action="append", required=True,
                    help="a standalone run's results, repeatable (the first holding a section wins)")
    ap.add_argument("--base", type=Path, required=True, help="a full run's results.json")
    ap.add_argument("--base-label", required=True, help="where the base run comes from (a commit)")
    ap.add_argument("--label", required=True, help="where the partial runs come from (a commit)")
    ap.add_argument("--why", required=True, help="why those steps were run alone (printed at the report's head)")
    ap.add_argument("--sections", help="keep only these results keys of the partial files, comma-separated")
    ap.add_argument("--out", type=Path, required=True, help="the folder of alignedserve.md")
    a = ap.parse_args(argv)
    for p in (*a.partial, a.base):
        if not p.is_file():
            print(f"render: no file {p}", file=sys.stderr)
            return 2
    try:
        parts = [json.loads(p.read_text()) for p in a.partial]
        base = json.loads(a.base.read_text())
    except ValueError as err:
        print(f"render: not JSON: {err}", file=sys.stderr)
        return 2
    if not all(isinstance(p.get("results"), dict) for p in parts) or "sizes" not in base:
        print("render: --partial must be standalone output and --base a full run's results.json", file=sys.stderr)
        return 2
    from servelab.designs.alignedserve.reproduce import plots
    from servelab.designs.alignedserve.reproduce.report import write_report
    from servelab.designs.alignedserve.reproduce.run import OPEN_GAP_STEPS
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import write_results_json

    partial = combine(parts)
    if a.sections:
        wanted = {x.strip() for x in a.sections.split(",") if x.strip()}
        missing = sorted(wanted - set(partial["results"]))
        if missing:
            print(f"render: --sections {missing} are in no --partial file", file=sys.stderr)
            return 2
        partial = keep_sections(partial, wanted, {label: key for label, _, key in OPEN_GAP_STEPS})
    res = plain(rebase(partial, base, base_label=a.base_label, label=a.label, why=a.why))
    fig_dir = a.out / "alignedserve"
    fig_dir.mkdir(parents=True, exist_ok=True)
    res["plots"] = plots.all_figures(res, fig_dir)
    write_report(res, a.out / "alignedserve.md")
    write_results_json(fig_dir / "results.json", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
