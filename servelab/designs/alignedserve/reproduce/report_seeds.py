"""The report's section for ``seeds.py``: each figure's and gap test's number per seed."""

from __future__ import annotations

from servelab.reproduce.stats import t_interval


def seed_lines(res: dict) -> list[str]:
    rows = res.get("seeds")
    if not rows:
        return []
    seeds = sorted({r["seed"] for r in rows})
    out = ["## Figures and gap tests over seeds (issue 25)", "",
           f"The figure steps above run seed {seeds[0]}; the quantity each claim or gap verdict rests on, rerun on "
           f"seeds {seeds} (the same sizes and models as the step named; Fig. 7 at OPT-6.7B and the 70% / 95% short "
           f"mixes only). **Simulated**, {rows[0]['num_gpus']} x H100, split-kv; 95% t intervals over seeds. "
           "A reading above that one seed supports and this interval does not is not settled.", "",
           "| figure | quantity | " + " | ".join(f"seed {s}" for s in seeds) + " | over seeds |",
           "|---|---|" + "---|" * (len(seeds) + 1)]
    keys = list(dict.fromkeys((r["figure"], r["quantity"]) for r in rows))
    for fig, q in keys:
        vals = {r["seed"]: r["value"] for r in rows if r["figure"] == fig and r["quantity"] == q}
        cells = [f"{vals[s]:.2f}" if s in vals else "n/a" for s in seeds]
        out.append(f"| {fig} | {q} | " + " | ".join(cells) + f" | {t_interval(list(vals.values())).format('{:.2f}')} |")
    return out + [""]
