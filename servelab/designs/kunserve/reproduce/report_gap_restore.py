"""The report's section on restore's small P50 TTFT gain (``gap_restore``): restore's effect
with whole rows per microbatch against the default former's (Fig. 15's runs), and the verdict."""

from __future__ import annotations

from servelab.designs.kunserve.reproduce import gap_restore as gs
from servelab.designs.kunserve.reproduce.report_sections import iv


def claims(res: dict) -> list[str]:
    b = res.get("gap_restore")
    if not b:
        return []
    v = gs.verdict(b, res.get("restore"))
    return [f"| reason restore's P50 TTFT gain is small: (S1) a group's former cuts a prompt across its microbatches "
            f"| -28% | P50 TTFT with vs without restore, whole rows: {iv(v['rows'], '{:+.1%}')} (default former "
            f"{iv(v['default'], '{:+.1%}')}); S1 **{v['verdict']}** | Fig. 15's setting, {b['rate']:.2f} req/s, "
            f"{len(b['seeds'])} seeds |"]


def section(res: dict) -> list[str]:
    b = res.get("gap_restore")
    if not b:
        return []
    v = gs.verdict(b, res.get("restore"))
    out = ["## Gap: restore's P50 TTFT gain, with whole rows per microbatch", "",
           "Restore lowers P50 TTFT by 28% in the paper (pipelined, KunServe's TTFT is 1.7x vLLM's there), here by "
           "the Fig. 15 row above. **S1**: a group's step cuts a prompt's chunk between its microbatches (the "
           "lookahead former, as token chunking does), so both stages work on one prompt at once and pipelined "
           "prefill is not slower than DP's; restore then has little to win on the median. Prediction, fixed "
           "before the run: with whole rows per microbatch (`former=rows`, vLLM's virtual engines) restore's P50 "
           "TTFT change is at least twice the default former's, on the mean and a majority of seeds "
           f"(`servelab/designs/kunserve/reproduce/gap_restore.py`; Fig. 15's setting, {b['rate']:.2f} req/s, "
           f"seeds {[s['seed'] for s in b['seeds']]}, the default former's pair from the Fig. 15 runs).", "",
           "| run | spec | TTFT P50 (s) | TTFT P99 (s) | TPOT P50 (ms) | groups formed / split | bubble |",
           "|---|---|---|---|---|---|---|"]
    for name in b["systems"]:
        runs = [s["runs"][name] for s in b["seeds"]]
        out.append(f"| {name} | `{b['systems'][name]}` | {iv([r['ttft_s']['50'] for r in runs])} | "
                   f"{iv([r['ttft_s']['99'] for r in runs])} | {iv([1e3 * r['tpot_s']['50'] for r in runs], '{:.0f}')} | "
                   f"{iv([r['forms'] for r in runs], '{:.1f}')} / {iv([r['splits'] for r in runs], '{:.1f}')} | "
                   f"{iv([r['bubble_share'] for r in runs], '{:.1%}')} |")
    out += ["", f"P50 TTFT with vs without restore: whole rows {iv(v['rows'], '{:+.1%}')} (per seed "
            f"{', '.join(f'{x:+.1%}' for x in v['rows'])}), default former "
            f"{iv(v['default'], '{:+.1%}')}; P50 TPOT with whole rows {iv(v['tpot_rows'], '{:+.1%}')}. "
            f"**S1 {v['verdict']}**.", ""]
    return out
