"""Issue 25: the tests of the gaps the audit had left untested (app_gaps, report_app_gaps):
Figs. 8 on the application workloads, Fig. 11's DistServe iterations, Fig. 15's block threshold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.designs.alignedserve.reproduce import app_gaps, report_audit
from servelab.designs.alignedserve.reproduce import report_app_gaps as rep
from servelab.designs.alignedserve.reproduce import setting as st


def test_decode_policy_replaces_the_decode_instances_policy_only():
    c = st.cluster("distserve", "OPT-2.7B", 4, decode_policy=("alignedserve-decode", {"wait_for_kv": True}))
    roles = {g.role: g for g in c.groups}
    assert roles["decode"].policy == "alignedserve-decode" and roles["decode"].policy_params == {"wait_for_kv": True}
    assert roles["prefill"].policy == st.cluster("distserve", "OPT-2.7B", 4).groups[0].policy


def test_iteration_gap_probe_counts_every_gap_between_decode_iterations():
    specs = st.synthetic(24, 0.9, 0)
    r = st.run(specs, "distserve", "OPT-2.7B", 4, decode_policy=("alignedserve-decode", {"wait_for_kv": True}),
               probe=app_gaps.iteration_gap_probe)
    assert r["num_finished"] == len(specs)
    assert r["num_gaps"] > 0
    for k in ("gap_over_10ms", "gap_under_5ms", "pull_over_10ms", "pull_under_5ms", "joins_share"):
        assert 0.0 <= r[k] <= 1.0
    assert r["gap_over_10ms"] + r["gap_under_5ms"] <= 1.0
    assert r["copy_alone_over_10ms"] == 0.0  # prompts under 8K tokens cross NVLink in well under 10 ms


def test_iteration_gaps_match_the_step_records():
    import numpy as np

    specs = st.synthetic(24, 0.9, 1)
    seen = {}

    def probe(sim, res):
        steps = res.collector.steps
        roles = [d.runtime.role for d in sim.driver.drivers]
        seen["n"] = sum(int(np.sum(steps.instance_id == i)) - 1 for i in set(steps.instance_id.tolist())
                        if roles[int(i)] == "decode")
        return app_gaps.iteration_gap_probe(sim, res)

    r = st.run(specs, "distserve", "OPT-2.7B", 4, probe=probe)
    assert r["num_gaps"] == seen["n"] > 0


def _fig8_rows(greedy: float, split_vllm: float) -> list[dict]:
    rows = []
    for s, jitter in enumerate((1.0, 1.02, 0.98, 1.01, 0.99)):
        for label, k, tok in (("vLLM", None, 100.0), ("FastGen (sarathi)", None, 98.0), ("DistServe", 4, 80.0),
                              ("AlignedServe", 4, 70.0), ("AlignedServe, greedy join", 4, 80.0 * greedy),
                              ("DistServe", 2, 100.0 * split_vllm), ("AlignedServe", 2, 100.0 * split_vllm * 70 / 80)):
            rows.append({"workload": "Azure conv", "seed": s, "label": label, "num_prefill": k,
                         "decode_tok_s": tok * jitter, "rows": 10.0, "num_requests": 1200})
    return rows


def test_fig8_verdicts_follow_the_numbers():
    def verdicts(greedy, split_vllm):
        lines = rep.fig8_app_lines({"open_fig8": _fig8_rows(greedy, split_vllm)})
        return (report_audit._counts(lines, "(a) ", after="Verdicts per workload"),
                report_audit._counts(lines, "(b) ", after="Verdicts per workload"))
    assert verdicts(1.0, 0.85) == ("holds 1/1", "holds 1/1")
    assert verdicts(0.8, 0.85)[0] == "refuted 1/1"
    assert verdicts(1.0, 1.05)[1] == "refuted 1/1"  # DistServe not below vLLM at its best split
    best = rep.best_over_any(_fig8_rows(1.0, 0.85), "Azure conv", [0, 1, 2, 3, 4])
    assert best == pytest.approx([70.0 / 80.0] * 5)  # over the slowest baseline, DistServe
    assert rep.fig8_app_lines({}) == []


def _fig11_rows(paused_over: float, handoff_over: float) -> list[dict]:
    rows = []
    for s, jitter in enumerate((0.0, 0.01, -0.01)):
        for label in ("DistServe", "DistServe, pauses for joining KV"):
            over = paused_over if "pauses" in label else 0.0
            rows.append({"workload": "LongBench-like (arXiv)", "seed": s, "label": label, "decode_tok_s": 4000.0,
                         "joins_share": 0.05, "gap_over_10ms": over + jitter, "gap_under_5ms": 1 - over,
                         "pull_over_10ms": 0.0, "handoff_over_10ms": handoff_over + jitter, "copy_alone_over_10ms": 0.1,
                         "num_requests": 1200})
    return rows


def test_fig11_verdicts_follow_the_numbers():
    def verdicts(paused, handoff):
        lines = rep.fig11_distserve_lines({"open_fig11_ds": _fig11_rows(paused, handoff)})
        return (report_audit._counts(lines, ": pause ", after="Verdicts:"),
                report_audit._counts(lines, "the wait for decode memory ", after="Verdicts:"))
    assert verdicts(0.01, 0.64) == ("refuted 1/1", "holds 1/1")
    assert verdicts(0.8, 0.15) == ("holds 1/1", "refuted 1/1")
    assert verdicts(0.8, 0.02)[1] == "anchor missing"  # no hand-offs over 10 ms: nothing to explain
    assert rep.fig11_distserve_lines({}) == []


def _fig15_rows(waits: tuple[float, float, float], used: float | None = None) -> list[dict]:
    rows = []
    for s, jitter in zip((3, 4, 5), (1.0, 1.05, 0.95)):
        for th, wait in zip((0.4, 0.65, 0.9), waits):
            rows.append({"seed": s, "threshold": th, "second_token_mean_s": wait * jitter, "decode_tok_s": 2500.0,
                         "rows": 8.0, "busy": 0.8, "gpu_used_p50": th if used is None else used, "num_requests": 1200, "load": 0.9})
    return rows


def test_fig15_threshold_verdict_follows_the_waits():
    fig15 = rep.fig15_threshold_lines

    def verdict(waits):
        return report_audit._said(fig15({"open_fig15_threshold": _fig15_rows(waits)}), "Verdict:", upto=". ")
    assert verdict((8.0, 5.0, 2.0)) == "holds"
    assert verdict((8.0, 8.0, 2.0)) == "holds in part"
    assert verdict((8.0, 8.0, 8.0)) == "refuted"
    starved = fig15({"open_fig15_threshold": _fig15_rows((8.0, 5.0, 2.0), used=0.07)})
    assert report_audit._said(starved, "Verdict:", upto=". ") == "holds in part"
    assert "the premise is refuted" in " ".join(starved)
    text = " ".join(fig15({"open_fig15_threshold": _fig15_rows((8.0, 5.0, 2.0))}))
    assert "at or below the paper's 2.54 s" in text
    assert fig15({}) == []


def test_steps_run_at_tiny_sizes(monkeypatch):
    from servelab.designs.alignedserve.reproduce import experiments as ex

    monkeypatch.setattr(app_gaps, "SEEDS", 1)
    monkeypatch.setattr(app_gaps, "FIG8_SEEDS", 1)
    monkeypatch.setattr(app_gaps, "FIG15_SEEDS", (3,))
    tiny = replace(ex.Sizes(), num_gpus=4, app_requests=10)
    rows = app_gaps.fig8_apps(tiny, 0)
    assert len(rows) == len(app_gaps.APPS) * len(app_gaps.fig8_systems(tiny.num_gpus))
    assert all(r["num_finished"] == r["num_requests"] for r in rows)
    ds = app_gaps.fig11_distserve(tiny, 0)
    assert {r["label"] for r in ds} == {lab for lab, *_ in app_gaps.FIG11_SYSTEMS}
    th = app_gaps.fig15_threshold(tiny, 0)
    assert sorted({r["threshold"] for r in th}) == list(app_gaps.THRESHOLDS)
    assert all(r["num_finished"] == r["num_requests"] and r["rate"] > 0 for r in th)
