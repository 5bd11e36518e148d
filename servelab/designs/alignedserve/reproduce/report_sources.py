"""The report's head when its sections come from more than one run: the full run named by
``render --base`` and each set of steps rerun alone after it (``render``'s ``reruns``).

Apart from ``render`` so that the report, which every run writes, does not import the
command that merges runs (``render`` imports the report to write it).
"""

from __future__ import annotations


def head_lines(res: dict) -> list[str]:
    """The report's lines naming the sources of its sections (none for a plain full run)."""
    reruns = res.get("reruns")
    if not reruns:
        return []
    out = [f"**Sections from more than one run.** Every section not named below is the full run's "
           f"({res.get('base_run', 'the base run')}). Rerun alone afterwards (`python -m "
           "servelab.designs.alignedserve.reproduce.standalone`), merged by `python -m "
           "servelab.designs.alignedserve.reproduce.render` (`--base` the full run's results.json):"]
    for r in reruns:
        load = f", load average {r['load_average'][0]:.1f}-{r['load_average'][1]:.1f}" if r.get("load_average") else ""
        out.append(f"- {r['label']} ({r['cpu_s']:.0f} s CPU{load}): steps {'; '.join(r['steps']) or 'none (the report re-rendered from the results)'}; why: {r['why']}")
    return out + [""]
