"""Write docs/reproduction/kunserve.md from a cut-short run's partial results, the sections
it did not reach taken from a previous full run and named as such in the report.

``servelab reproduce kunserve`` writes ``kunserve.partial.json`` (the steps done so far) when
it is interrupted. On a loaded machine a full run may not fit the time left; its steps run
the faithful point's sections first, so the partial results hold the claims the change is
about. This command merges them with the previous run's ``kunserve.json`` for the sections
not reached, lists those sections (and the previous run's source) at the top of the report,
and writes the report, its figures and ``kunserve.json``. Steps the run did not reach can be run
alone into more partial files first (``standalone``: the finer grid, the vs-baselines gap for a
subset of systems); the first file holding a section wins:

    python -m servelab.designs.kunserve.reproduce.render --partial docs/reproduction/kunserve.partial.json \\
        --previous old/kunserve.json --previous-label "commit 3bd0fd6" --out docs/reproduction

With ``--sources`` (each ``--partial`` with its ``--partial-label``) every section names its run
at the report's head; ``--note "section|section=text"`` appends a remark to some of them, e.g.
which design default a section carried from an older run ran under.

With ``--base`` instead of ``--previous``, the base is a full run of this code and the partial
files hold steps rerun alone after it (a change that touched only them): their sections replace
the full run's, and the report's head names them and ``--why``:

    python -m servelab.designs.kunserve.reproduce.render --partial plan.json --partial pp.json \\
        --base docs/reproduction/kunserve.json --why "..." --out docs/reproduction
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SECTIONS = ("plan_time", "eq1", "end_to_end", "gap_microbatches", "gap_vs_baselines", "gap_pp", "gap_residual",
            "gap_residual_tokens", "gap_early", "gap_early_link", "gap_bubble", "gap_min", "gap_exchange", "gap_restore", "faithful_grid", "ablation_memory_bound", "restore",
            "ablation", "extreme", "pp_throughput", "gap_merge")
META = ("reduced", "seed", "sizes", "clusters")  # the run's settings, which a standalone step's file lacks


def _names(results: dict) -> list[str]:
    """The report's sections in ``results``, an end-to-end workload counting as one."""
    out = []
    for key in SECTIONS:
        if key == "end_to_end":
            out += [f"end to end {wl}" for wl in results.get(key, {})]
        elif key in results:
            out.append(key)
    return out


def sources_of(results: dict, label: str) -> dict[str, str]:
    """Section -> the run it comes from, for a rendered run's results: its own ``sources`` if it
    has them, else read from its ``reused`` record (the sections it took from an earlier run, and
    those that run had taken from an older one), every other section being ``label``'s."""
    if "sources" in results:
        return dict(results["sources"])
    reused = results.get("reused") or {}
    older = reused.get("older") or {}
    out = {}
    for name in _names(results):
        if name in older.get("sections", []):
            out[name] = f"{older['from']} (older simulation code: KunServe's numbers may differ under the current trigger)"
        elif name in reused.get("sections", []):
            out[name] = reused["from"]
        else:
            out[name] = label
    return out


def with_sources(parts: list[tuple[dict, str]], previous: dict, previous_label: str,
                 notes: dict[str, str] | None = None) -> dict:
    """Standalone steps' results (each with the label of the run that made it; the first file
    holding a section wins) over a rendered run's: every section of the result names the run it
    comes from (``sources``), so the report's head says it section by section. The run's
    settings come from ``previous`` where the steps' files lack them. ``notes``: section -> a
    remark appended to its run's label, e.g. the design default it ran under when a default
    changed after some sections ran (a section carried from older runs would otherwise read as
    if it ran on the current code's defaults)."""
    res = {k: previous[k] for k in META if k in previous}
    sources = sources_of(previous, previous_label)
    timings = dict(previous.get("timings_cpu_s", {}))
    for key in SECTIONS:
        if key in previous:
            res[key] = dict(previous[key]) if key == "end_to_end" else previous[key]
    taken: set[str] = set()
    for part, label in parts:
        for key, value in part["results"].items():
            if key == "end_to_end":
                for wl, block in value.items():
                    name = f"end to end {wl}"
                    if name not in taken:
                        res.setdefault(key, {})[wl] = block
                        sources[name] = label
                        taken.add(name)
            elif key not in taken:
                res[key] = value
                sources[key] = label
                taken.add(key)
        timings |= part.get("timings_cpu_s", {})
    res["timings_cpu_s"] = timings
    names = _names(res)
    for name, note in (notes or {}).items():
        if name not in names:
            raise ValueError(f"a note for section {name!r}, which the results lack (sections: {', '.join(names)})")
        sources[name] = f"{sources[name]} [{note}]"
    res["sources"] = {name: sources[name] for name in names}
    return res


def parse_notes(args: list[str]) -> dict[str, str]:
    """``--note "section[|section...]=text"`` arguments -> section -> text (sections as the report's
    head names them, e.g. ``end to end decode-heavy-14B``, ``gap_pp``; several notes on one
    section joined with '; ')."""
    out: dict[str, str] = {}
    for arg in args:
        names, sep, text = arg.partition("=")
        if not sep or not text.strip() or not names.strip():
            raise ValueError(f"a note must read 'section[|section...]=text', got {arg!r}")
        for name in (n.strip() for n in names.split("|") if n.strip()):
            out[name] = f"{out[name]}; {text.strip()}" if name in out else text.strip()
    return out


def merge(partial: dict, previous: dict, label: str, same_code: bool = False) -> dict:
    """The partial run's results, each missing section (an end-to-end workload counts as one)
    taken from ``previous``; ``reused`` lists what came from where. ``same_code``: the previous
    run's simulation code is this one's (shown, e.g., by a step rerun here giving identical
    numbers); the sections it had itself taken from an older run are listed apart."""
    res = dict(partial["results"])
    reused = []
    for key in SECTIONS:
        if key == "end_to_end":
            ran, e2e = res.get(key, {}), {}
            for wl, block in previous.get(key, {}).items():  # the previous run's order (the workloads')
                e2e[wl] = ran.get(wl, block)
                if wl not in ran:
                    reused.append(f"end to end {wl}")
            res[key] = e2e | ran
        elif key not in res and key in previous:
            res[key] = previous[key]
            reused.append(key)
    timings = dict(partial.get("timings_cpu_s", {}))
    res["timings_cpu_s"] = timings
    res["reused"] = {"from": label, "sections": reused, "steps_run": list(partial.get("steps_done", []))}
    if same_code:  # the previous run's own sections are this code's; those it took from an older run are not
        older = previous.get("reused") or {}
        old = [x for x in reused if x in older.get("sections", [])]
        res["reused"] |= {"same_code": True, "sections": [x for x in reused if x not in old],
                          "older": {"from": older.get("from"), "sections": old}}
    return res


def rebase(partial: dict, base: dict, why: str) -> dict:
    """A full run's results with the rerun steps' sections in place of its own (an end-to-end
    workload counts as one); ``rerun`` lists the steps and why."""
    res = dict(base)
    res.pop("reused", None)
    for k, v in partial["results"].items():
        res[k] = res.get(k, {}) | v if k == "end_to_end" else v
    res["timings_cpu_s"] = dict(base.get("timings_cpu_s", {})) | dict(partial.get("timings_cpu_s", {}))
    res["rerun"] = {"steps": list(partial.get("steps_done", [])), "why": why}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", type=Path, action="append", required=True,
                    help="partial results, repeatable (the first holding a section wins)")
    ap.add_argument("--partial-label", action="append", default=[],
                    help="with --sources: the run each --partial comes from (commit, command), one per --partial")
    ap.add_argument("--sources", action="store_true",
                    help="with --previous: name each section's run at the report's head, read from the previous "
                         "render's own record (its sections not rerun keep their runs; --previous-label names the "
                         "rest)")
    ap.add_argument("--note", action="append", default=[],
                    help="with --sources: 'section[|section...]=text', a remark appended to those sections' run at "
                         "the report's head (repeatable)")
    ap.add_argument("--previous", type=Path, help="a previous full run's kunserve.json, for the sections not reached")
    ap.add_argument("--previous-label", help="where the previous results come from (a commit)")
    ap.add_argument("--previous-same-code", action="store_true",
                    help="the previous run's simulation code is this one's (its own older sections listed apart)")
    ap.add_argument("--base", type=Path, help="a full run's kunserve.json of this code: the partial files' steps "
                                              "were rerun after it and replace its sections")
    ap.add_argument("--why", help="with --base: why those steps were rerun (printed at the report's head)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if (a.previous is None) == (a.base is None) or (a.previous and not a.previous_label) or (a.base and not a.why):
        print("render: give --previous with --previous-label, or --base with --why", file=sys.stderr)
        return 2
    if a.sources and (a.previous is None or len(a.partial_label) != len(a.partial)):
        print("render: --sources needs --previous and one --partial-label per --partial", file=sys.stderr)
        return 2
    if a.note and not a.sources:
        print("render: --note needs --sources", file=sys.stderr)
        return 2
    try:
        notes = parse_notes(a.note)
    except ValueError as e:
        print(f"render: {e}", file=sys.stderr)
        return 2
    for p in (*a.partial, a.previous or a.base):
        if not p.is_file():
            print(f"render: no file {p}", file=sys.stderr)
            return 2
    from servelab.designs.kunserve.reproduce import plots
    from servelab.designs.kunserve.reproduce.report import write_report
    from servelab.designs.kunserve.reproduce.run import _strip_raw, _to_json
    from servelab.metrics.plain_json import plain
    from servelab.reproduce.runner import write_results_json

    parts = [json.loads(p.read_text()) for p in a.partial]
    partial = {"results": {}, "steps_done": [], "timings_cpu_s": {}}
    for part in parts:
        for k, v in part["results"].items():
            if k == "end_to_end":
                partial["results"][k] = v | partial["results"].get(k, {})
            else:
                partial["results"].setdefault(k, v)
        partial["steps_done"] += [x for x in part.get("steps_done", []) if x not in partial["steps_done"]]
        partial["timings_cpu_s"] = part.get("timings_cpu_s", {}) | partial["timings_cpu_s"]
    if a.sources:
        try:
            res = with_sources(list(zip(parts, a.partial_label)), json.loads(a.previous.read_text()),
                               a.previous_label, notes)
        except ValueError as e:
            print(f"render: {e}", file=sys.stderr)
            return 2
    elif a.base is not None:
        res = rebase(partial, json.loads(a.base.read_text()), a.why)
    else:
        res = merge(partial, json.loads(a.previous.read_text()), a.previous_label, a.previous_same_code)
    res = plain(_strip_raw(res))
    fig_dir = a.out / "kunserve"
    fig_dir.mkdir(parents=True, exist_ok=True)
    res["figures"] = [f"kunserve/{f}" for f in plots.all_figures(res, fig_dir)]
    write_report(res, a.out / "kunserve.md")
    write_results_json(a.out / "kunserve.json", _to_json(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
