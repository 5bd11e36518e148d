"""The reproduction's setting and metrics: lengths have the paper's means, bursts double the
arrival rate inside their window, SLO violation counts against the best baseline's P50s, and
one system run reports what the report reads."""

from __future__ import annotations

import dataclasses

import numpy as np

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st


def test_lengths_have_the_papers_means_and_caps():
    specs = st.workload("sharegpt", 4.0, 400.0, (), seed=0)
    p = np.array([s.num_prompt_tokens for s in specs])
    o = np.array([s.num_output_tokens for s in specs])
    assert abs(p.mean() / 1660 - 1) < 0.05 and abs(o.mean() / 373 - 1) < 0.05 and p.max() <= 4096


def test_a_burst_doubles_the_rate_inside_its_window():
    base = st.workload("burstgpt", 5.0, 300.0, (), seed=1)
    burst = st.workload("burstgpt", 5.0, 300.0, ((100.0, 200.0),), seed=1)

    def count(specs, a, b):
        return sum(a <= s.arrival_time_s < b for s in specs)

    assert abs(count(burst, 100, 200) - 2 * count(base, 100, 200)) <= 1  # the last replay may leave the window
    assert count(burst, 0, 100) == count(base, 0, 100)


def test_a_lower_load_tail_thins_arrivals_from_its_start():
    """Restore's run (item 7): a stretch at a lower rate after the burst, where demand can fall
    under restore's threshold; the reduced run's split happens inside it."""
    base = st.workload("decode-heavy", 4.0, 800.0, (), seed=0)
    tail = st.workload("decode-heavy", 4.0, 800.0, (), seed=0, load=((300.0, 0.4), (500.0, 1.0)))

    def count(specs, a, b):
        return sum(a <= s.arrival_time_s < b for s in specs)

    assert count(tail, 0, 300) == count(base, 0, 300) and count(tail, 500, 800) == count(base, 500, 800)
    assert 0.3 < count(tail, 300, 500) / count(base, 300, 500) < 0.5


def test_slo_violation_is_against_the_best_baselines_p50():
    runs = {"a": {"ttft_s": {"50": 1.0}, "tpot_s": {"50": 0.1},
                  "raw": {"ttft": np.array([0.5, 1.0, 3.0, 6.0]), "tpot": np.array([0.1, 0.1, 0.1, 0.1])}},
            "b": {"ttft_s": {"50": 2.0}, "tpot_s": {"50": 0.05},
                  "raw": {"ttft": np.array([1.0, 1.0, 1.0, 1.0]), "tpot": np.array([0.05, 0.3, 0.05, 0.05])}}}
    out = ex.slo_violation(runs, (1.0, 5.0), ("a", "b"))
    assert out["best_p50_ttft_s"] == 1.0 and out["best_p50_tpot_s"] == 0.05
    assert out["violation"]["a"] == [1.0, 0.25]  # every TPOT is 2x the best P50; one TTFT over 5 s
    assert out["violation"]["b"] == [0.25, 0.25]


def test_one_run_reports_the_memory_timeline_and_the_drops():
    hw = dataclasses.replace(st.CLUSTER_A, num_instances=2, memory_reserve_fraction=0.6)  # ~20K KV tokens each
    specs = st.workload("decode-heavy", 2.5, 30.0, ((10.0, 20.0),), seed=0, factor=3)
    r = ex.run_system("kunserve", specs, hw, ex.Sizes(window_s=5.0, bursts=((10.0, 20.0),)))
    assert r["conserved"] and r["finished"] == len(specs)
    m = r["memory"]
    assert len(m["t"]) >= 5 and max(m["kv_capacity_gb"]) > m["kv_capacity_gb"][0]
    assert r["drops"] and r["pipeline"]["steps"] > 0 and r["exchange"]["num"] >= 1
    assert 0 < r["mean_demand_share"] < 2


def test_the_premise_check_reads_throttling_and_the_ceiling():
    """vLLM on the throttled 2-instance setting: memory-throttled, prompt before the burst;
    the 4x-KV ceiling decides whether memory is what queues."""
    from servelab.designs.kunserve.reproduce.premise import with_ceiling

    hw = dataclasses.replace(st.CLUSTER_A, num_instances=2, memory_reserve_fraction=0.6)
    sizes = ex.Sizes(window_s=5.0, bursts=((10.0, 20.0),))
    specs = st.workload("decode-heavy", 2.5, 30.0, sizes.bursts, seed=0, factor=3)
    v = ex.run_system("vllm", specs, hw, sizes)
    ceil = ex.run_system("vllm", specs, hw, sizes, kv_scale=4.0)
    c = v["check"]
    assert c["memory_throttled"] and c["time_above_95_kv_s"] > 1.0 and c["pre_burst_p50_ttft_s"] < 1.0
    assert ceil["check"]["time_above_95_kv_s"] < c["time_above_95_kv_s"]
    assert with_ceiling(c, c["p99_ttft_s"] / 3)["holds"] and not with_ceiling(c, c["p99_ttft_s"])["holds"]


def test_the_operating_point_is_the_lowest_rate_where_the_premise_holds(monkeypatch):
    from servelab.designs.kunserve.reproduce import points

    def fake(checks):
        def run_many(tasks):  # a premise check's two runs carry their rate; the rest are seeds' runs
            return [{"check": {"holds": checks[round(t["rate"])][0], "prompt_before_burst": checks[round(t["rate"])][1]},
                     "ttft_s": {"50": 0.1, "99": 2.0}} if "rate" in t else {"ttft_s": {"99": 1.0}} for t in tasks]
        return run_many

    sizes = ex.Sizes(rate_probes=4, seeds=(0,))
    monkeypatch.setattr(points.st, "workload", lambda *a, **k: [])
    monkeypatch.setattr(points, "check_tasks", lambda wl, rate, hw, sizes, seed: [{"rate": rate}, {"rate": rate}])
    monkeypatch.setattr(points, "completed", lambda v, ceil: (v, ceil))
    monkeypatch.setattr(points.ex, "run_many", fake({1: (False, True), 2: (True, True), 4: (True, True), 8: (False, False)}))
    p = points.choose_point("x", st.CLUSTER_A, sizes, 0, 1.0, 8.0)
    assert round(p["rate"]) == 2 and p["holds"]
    assert [g.get("kunserve_p99_ttft_s") for g in p["grid"]] == [None, 1.0, 1.0, None]  # the claim at every pass
    monkeypatch.setattr(points.ex, "run_many", fake({1: (False, True), 2: (False, True), 4: (False, False), 8: (False, False)}))
    p = points.choose_point("x", st.CLUSTER_A, sizes, 0, 1.0, 8.0)
    assert round(p["rate"]) == 2 and not p["holds"]  # none holds: the highest still prompt, marked


def test_the_premise_needs_the_papers_mean_demand_bound():
    from servelab.designs.kunserve.reproduce.premise import with_ceiling

    c = {"prompt_before_burst": True, "memory_throttled": True, "p99_ttft_s": 30.0}
    assert with_ceiling(c, 3.0, 0.5)["holds"] and not with_ceiling(c, 3.0, 0.65)["holds"]
