"""Why restore cuts P50 TTFT by 4.5% here against the paper's 28% (Fig. 15): a candidate reason
and the experiment that could refute it.

The paper's reason restore helps: pipelined execution is slower than DP (without restore,
KunServe's TTFT is 1.7x vLLM's), so serving DP again after a burst lowers the median. Reason
(S1): here a group's step cuts a prompt's chunk between its microbatches (the lookahead
former, as token chunking does), so both stages work on one prompt at once and its prefill is
not slower than on one GPU; pipelined TTFT then stays close to DP's and restore has little to
win on the median. It predicts that with whole rows per microbatch (``former=rows``: a
prompt's chunk in one microbatch, one stage at a time, as vLLM's virtual engines) restore's P50
TTFT change is at least twice as large (more negative) as with the default former, on the
mean and on a majority of seeds. Otherwise S1 is refuted.

Runs: Fig. 15's setting (``run._restore``: two bursts, a lower-load stretch between them) with
``former=rows``, with and without restore, on every seed's arrivals; the default former's pair
is the restore step's (same seeds, same arrivals).
"""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st

ON, OFF = "kunserve, rows", "kunserve w/o restore, rows"
SYSTEMS = {ON: "kunserve:former=rows", OFF: "kunserve:former=rows,restore=false"}
DEFAULT = ("kunserve", "kunserve w/o restore")  # the restore step's runs
MAJORITY = 2 / 3


def run(rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    from servelab.designs.kunserve.reproduce.points import _summary

    tasks = [dict(system=name, specs=st.workload("decode-heavy", rate, sizes.long_duration_s, sizes.long_bursts, s,
                                                 load=sizes.long_load),
                  hw=hw, sizes=sizes, spec=spec) for s in sizes.seeds for name, spec in SYSTEMS.items()]
    done = iter(ex.run_many(tasks))
    seeds = [{"seed": s, "runs": {name: _summary(next(done)) for name in SYSTEMS}} for s in sizes.seeds]
    return {"rate": rate, "workload": "decode-heavy", "bursts": sizes.long_bursts, "load": sizes.long_load,
            "systems": SYSTEMS, "seeds": seeds}


def _change(runs: dict, on: str, off: str, metric: str = "ttft_s", p: str = "50") -> float:
    return runs[on][metric][p] / runs[off][metric][p] - 1


def verdict(block: dict, restore: dict | None) -> dict:
    """S1's prediction from this step's runs and the restore step's (paired by seed)."""
    rows = [_change(s["runs"], ON, OFF) for s in block["seeds"]]
    by_seed = {s["seed"]: s["runs"] for s in (restore or {}).get("seeds", [])}
    default = [_change(by_seed[s["seed"]], *DEFAULT) if s["seed"] in by_seed else None for s in block["seeds"]]
    out = {"rows": rows, "default": default,
           "tpot_rows": [_change(s["runs"], ON, OFF, "tpot_s") for s in block["seeds"]]}
    if None in default or not default:
        return out | {"holds": None, "verdict": "untested"}
    larger = sum(r <= 2 * d and r < 0 for r, d in zip(rows, default)) >= MAJORITY * len(rows)
    mean_ok = float(np.mean(rows)) <= 2 * float(np.mean(default)) and float(np.mean(rows)) < 0
    ok = larger and mean_ok
    return out | {"holds": ok, "verdict": "holds" if ok else "refuted"}
