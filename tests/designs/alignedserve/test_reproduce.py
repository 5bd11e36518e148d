"""The reproduction runs end to end at toy sizes and writes a report with every claim."""

from __future__ import annotations

import json

from servelab.designs.alignedserve.reproduce import experiments as ex
from servelab.designs.alignedserve.reproduce.run import REPRODUCTION
from servelab.reproduce.runner import run_reproduction

TOY = ex.Sizes(num_gpus=2, num_requests=60, app_requests=40, models=("OPT-2.7B",), short_shares=(0.9,),
               long_lengths=(2000,), applications=("ShareGPT-like",), dfs_requests=2000, dfs_searches=20)


def test_reproduction_writes_every_claim(tmp_path):
    res = run_reproduction(REPRODUCTION, tmp_path, sizes=TOY, options={"engine": False})
    text = (tmp_path / "alignedserve.md").read_text()
    for claim in ("Fig. 7", "Figs. 8", "Figs. 9-10", "Fig. 11", "Fig. 13", "Fig. 14", "Batch-switch", "Fig. 15",
                  "Density First Search", "Gap experiments", "simulated"):
        assert claim in text, claim
    assert all(r["conserved"] for r in res["fig7"] + res["fig8"])
    assert json.loads((tmp_path / "alignedserve" / "results.json").read_text())["dfs"]["searches"] == 20
    assert len(res["plots"]) == 4


def test_padded_kernel_charges_every_row_the_longest_context():
    from servelab.catalog.instance import InstanceSpec
    from servelab.core.plan import StepShape
    from servelab.costmodel.roofline import roofline_for_instance

    base = roofline_for_instance(InstanceSpec("H100-80GB", "OPT-2.7B"))
    padded = ex.PaddedDecode(base)
    mixed = StepShape(num_decodes=8, decode_context_sum=7 * 100 + 4000, decode_context_max=4000)
    dense = StepShape(num_decodes=8, decode_context_sum=8 * 4000, decode_context_max=4000)
    assert padded.step_time_s(mixed) == base.step_time_s(dense) > base.step_time_s(mixed)
