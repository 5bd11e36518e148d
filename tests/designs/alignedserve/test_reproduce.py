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
                  "| padded |", "| per-seq |", "| split-kv |", "over AlignedServe, FCFS pool",
                  "Claims under each decode kernel", "ours, split-kv | ours, per-seq | ours, padded",
                  "Batch-switch share (ours", "min(1, R/B)"):
        assert claim in text, claim
    assert all(r["conserved"] for r in res["fig7"] + res["fig8"])
    assert json.loads((tmp_path / "alignedserve" / "results.json").read_text())["dfs"]["searches"] == 20
    assert len(res["plots"]) == 4
    for k in ("split-kv", "per-seq", "padded"):  # item 6: every claim's experiments under every kernel
        assert res[f"claims_{k}"]["kernel"] == k and res[f"claims_{k}"]["fig14"]


def test_figure_experiments_run_under_the_kernel_they_are_given():
    """Before item 6 the figures ignored the kernel (always the GPU's default, split-KV): the
    padded kernel (every row reads the longest context) must change the iteration times."""
    split = ex.fig13_vs_fcfs(TOY, 0, kernel="split-kv")
    padded = ex.fig13_vs_fcfs(TOY, 0, kernel="padded")
    assert [r["step_p50_ms"] for r in split] != [r["step_p50_ms"] for r in padded]


def test_switch_gap_caps_decode_rows_only():
    from servelab.designs.alignedserve.reproduce import kernels, setting

    c = setting.cluster("alignedserve", "OPT-2.7B", 2, max_decode_seqs=8)
    assert {g.role: g.max_num_seqs for g in c.groups}["decode"] == 8
    assert {g.role: g.max_num_seqs for g in c.groups}["prefill"] > 8
    rows = kernels.switch_gap(TOY, 0)
    assert {r["row_cap"] for r in rows} == set(kernels.ROW_CAPS)
    assert all(r["conserved"] and r["num_finished"] == r["num_requests"] for r in rows)
    assert all(r["rows"] <= 8 for r in rows if r["row_cap"] == 8)
