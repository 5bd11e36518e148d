"""The colocation gap test's slower engine, its step statistics, and the exact planner."""

import types

import numpy as np
import pytest

from servelab.core.plan import StepShape
from servelab.costmodel.options import CostOptions
from servelab.designs.dynaserve.policy import DynaServePolicyConfig
from servelab.designs.dynaserve.reproduce import paper_coloc as pc
from servelab.designs.dynaserve.reproduce import setting as st
from servelab.designs.dynaserve.reproduce.adjusted_cost import AdjustedCost


def test_adjusted_cost_scales_and_adds_to_every_step_and_keeps_decode_arrays_consistent():
    base = st.Setting().cost_for("14B")
    assert isinstance(base, CostOptions)  # unchanged setting: the simulator builds its own models
    adj = st.Setting(step_scale=1.5, step_delta_s=0.01).cost_for("14B")
    assert isinstance(adj, AdjustedCost)
    shape = StepShape(prefill_tokens=(256,), prefill_context=(256,), num_decodes=8, decode_context_sum=8000,
                      decode_context_max=1000)
    assert adj.step_time_s(shape) == pytest.approx(1.5 * adj.base.step_time_s(shape) + 0.01)
    sums = np.array([800, 8000])
    arr = adj.decode_step_times_s(8, sums)
    one = [adj.step_time_s(StepShape(num_decodes=8, decode_context_sum=int(x))) for x in sums]
    assert arr == pytest.approx(one)
    with pytest.raises(ValueError):
        AdjustedCost(adj.base, scale=0.0)


def test_step_stats_reads_only_steps_holding_a_prompt_chunk():
    steps = types.SimpleNamespace(duration_s=[0.05, 0.12, 0.09, 0.03], num_tokens=[10, 300, 260, 4],
                                  num_rows=[10, 12, 6, 4])
    row = {"steps": steps, "tbt_p99_s": 0.08, "delay_p50_s": 0.5, "num_requests": 10}
    s = pc.step_stats(row, 0.1)
    assert s["mixed_steps"] == 2 and s["mixed_over_slo"] == 0.5 and s["rows_per_mixed"] == 9.0
    assert s["passes_global"]
    assert not pc.step_stats({**row, "tbt_p99_s": 0.11}, 0.1)["passes_global"]


def test_the_paper_step_check_compares_pure_steps_and_flags_colocation_p50s():
    rows = pc.step_check(st.Setting())
    assert len(rows) == len(pc.PAPER_STEPS)
    assert [r["pure"] for r in rows].count(False) == 2
    assert all(r["ours_ms"] > 0 for r in rows)


def test_exact_planner_keeps_mixed_steps_within_the_slo_with_zero_estimate_error():
    setting = st.Setting()
    specs = st.workload("azure-code", 6.5, 80, 0, setting)
    r = st.run("dynaserve", specs, "14B", setting, planner="exact")
    inst = [i for i in r["mixed_steps"] if i.get("count")]
    assert inst, "the run has mixed steps"
    for i in inst:
        assert abs(i["error_ms_p99"]) < 1e-6 and abs(i["error_ms_p1"]) < 1e-6
        assert i["over_slo_share"] == 0.0 and i["actual_ms_p99"] <= 100.0 + 1e-6
    table = st.run("dynaserve", specs, "14B", setting)  # the paper's table estimate: steps land over the SLO
    assert max(i["over_slo_share"] for i in table["mixed_steps"] if i.get("count")) > 0.0


def test_planner_must_be_table_or_exact():
    with pytest.raises(ValueError, match="planner"):
        DynaServePolicyConfig(planner="oracle")


def _cap(workload, delta, low, mean):
    return {"workload": workload, "delta_s": delta, "ratio_vs_coloc": {"mean": mean, "low": low},
            "coloc": {"tuned_chunk": {"median": 512}}}


def test_the_verdict_names_the_per_step_costs_at_which_the_papers_ratio_is_reached():
    points = [{"where": "our tuned coloc. capacity", "scale": 1.0, "delta_s": 0.0, "chunk": 512, "mixed_ms_p99": 89.0,
               "passes": 3, "passes_global": 2}]
    none = pc._verdict({"capacity": [_cap("hybrid", 0.0, 0.75, 0.88), _cap("azure-code", 0.0, 1.10, 1.3)],
                        "points": points})
    assert "reached by the interval at none" in none and "11 ms under the SLO" in none
    assert "disagree on 1 of 1" in none
    some = pc._verdict({"capacity": [_cap("hybrid", 0.014, 1.7, 2.0), _cap("azure-code", 0.03, 1.2, 1.4)],
                        "points": points})
    assert "hybrid +14 ms" in some.split("reached by the interval at")[1]
    assert "azure-code +30 ms" in some.split("reached by the interval at")[1]
