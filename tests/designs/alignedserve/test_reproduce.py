"""The reproduction runs end to end at toy sizes and writes a report with every claim."""

from __future__ import annotations

import json

from servelab.designs.alignedserve.reproduce import experiments as ex
from servelab.designs.alignedserve.reproduce.run import REPRODUCTION
from servelab.reproduce.runner import run_reproduction

TOY = ex.Sizes(num_gpus=2, num_requests=60, app_requests=40, models=("OPT-2.7B",), short_shares=(0.9,),
               long_lengths=(2000,), applications=("ShareGPT-like",), dfs_requests=2000, dfs_searches=20,
               seeds=2, regime_requests=40)


def test_reproduction_writes_every_claim(tmp_path):
    res = run_reproduction(REPRODUCTION, tmp_path, sizes=TOY, options={"engine": False})
    text = (tmp_path / "alignedserve.md").read_text()
    for claim in ("Fig. 7", "Figs. 8", "Figs. 9-10", "Fig. 11", "Fig. 13", "Fig. 14", "Batch-switch", "Fig. 15",
                  "Density First Search", "Gap experiments", "simulated", "Headline grid", "depth at cut p50",
                  "| padded |", "| per-seq |", "| split-kv |", "over AlignedServe, FCFS pool"):
        assert claim in text, claim
    assert all(r["conserved"] for r in res["fig7"] + res["fig8"])
    assert json.loads((tmp_path / "alignedserve" / "results.json").read_text())["dfs"]["searches"] == 20
    assert len(res["plots"]) == 4
