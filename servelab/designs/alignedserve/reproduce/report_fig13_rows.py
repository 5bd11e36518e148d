"""The report's test 'Fig. 13: long rows x batch mixing' (``fig13_rows``), with the verdict its
stated hypothesis gets from per-seed paired differences."""

from __future__ import annotations

from servelab.designs.alignedserve.reproduce.gap_rows import interval_text, is_below, row_matching, seeds_of
from servelab.reproduce.stats import t_interval

BASE, UNBOUNDED = "prefix-aware", "prefix-aware, dynamic joins unbounded"


def fig13_mixing_lines(res: dict) -> list[str]:
    rows = res.get("open_fig13_mix")
    if not rows:
        return []
    seeds = seeds_of(rows)
    out = ["**Fig. 13: long rows x batch mixing (prefix-aware's padded steps hold a long row as often as FCFS's in the "
           "long-share test above).** Hypothesis (stated before this run): a decode GPU's running rows mix batches "
           "in most iterations, the old batch's long outputs staying while new batches join, so alignment does not "
           "keep long rows out of the steps. Varied: dynamic joins unbounded (`requests_buffer=1000`), which cut the "
           "mixed-iteration share in the batch-switch test. Refuted if the mixed share falls but the share of steps "
           "holding a long row does not (paired difference's interval not below 0). **Simulated**, Fig. 7's mix at "
           f"{rows[0]['long_share']:.0%} long requests, OPT-13B, {rows[0]['num_requests']} requests at time 0, 8 GPUs, "
           f"padded kernel, seeds {seeds}:", "",
           "| batching | mixed-iteration share | steps holding a long row | under 30 ms | tok/s |", "|---|---|---|---|---|"]
    for label in dict.fromkeys(r["label"] for r in rows):
        got = [row_matching(rows, seed=s, label=label) for s in seeds]
        out.append(f"| {label} | {interval_text([g['switch_share'] for g in got])} | "
                   f"{interval_text([g['share_long_steps'] for g in got])} | "
                   f"{interval_text([g['under30_all'] for g in got])} | "
                   f"{interval_text([g['decode_tok_s'] for g in got], '{:.0f}')} |")

    def change(key):
        return t_interval([row_matching(rows, seed=s, label=UNBOUNDED)[key] - row_matching(rows, seed=s, label=BASE)[key]
                           for s in seeds])
    mixed, long_ = change("switch_share"), change("share_long_steps")
    verdict = ("inconclusive: the mixed share does not fall here, so the premise is not met" if not is_below(mixed, 0.0)
               else "holds: fewer mixed iterations, fewer steps holding a long row" if is_below(long_, 0.0)
               else "refuted: the mixed share falls, the steps holding a long row do not")
    return out + ["", f"Verdict: with dynamic joins unbounded the mixed share changes by {mixed.format('{:+.2f}')}, the "
                  f"share of steps holding a long row by {long_.format('{:+.2f}')}: {verdict}.", ""]
