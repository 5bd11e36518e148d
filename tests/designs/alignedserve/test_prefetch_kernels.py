"""Issue 25's prefetch-mechanism test: its runs, its decomposition and its verdicts."""

from __future__ import annotations

import pytest

from servelab.core.errors import UserError
from servelab.designs.alignedserve.reproduce import fig14_gap, regimes
from servelab.designs.alignedserve.reproduce import prefetch_kernels as pk
from servelab.designs.alignedserve.reproduce import setting as st


def test_runs_spread_over_processes_give_the_numbers_of_one_process(monkeypatch):
    """``SERVELAB_REPRO_JOBS=2`` must not change a number (each run is deterministic) but its CPU time."""
    specs = st.application("ShareGPT-like", 60, 0)
    tasks = [{"specs": specs, "system_spec": spec, "model": "OPT-2.7B", "num_gpus": 2}
             for spec in ("alignedserve", "alignedserve:prefetch=false", "distserve")]
    monkeypatch.setenv(st.JOBS_ENV, "1")
    one = st.run_many(tasks, keep=regimes._row)
    monkeypatch.setenv(st.JOBS_ENV, "2")
    two = st.run_many(tasks, keep=regimes._row)
    assert [{k: v for k, v in r.items() if k != "cpu_s"} for r in one] == \
        [{k: v for k, v in r.items() if k != "cpu_s"} for r in two]
    assert one[0]["decode_tok_s"] != one[1]["decode_tok_s"]  # the tasks' own runs, in order


def test_a_bad_jobs_value_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(st.JOBS_ENV, "two")
    with pytest.raises(UserError, match="SERVELAB_REPRO_JOBS"):
        st.run_many([{"specs": [], "system_spec": "distserve", "model": "OPT-2.7B", "num_gpus": 2}] * 2)


def test_the_control_changes_one_output_token_of_one_request():
    specs = st.application("ShareGPT-like", 40, 0)
    changed = [(a, b) for a, b in zip(specs, fig14_gap.sham(specs)) if a != b]
    assert len(changed) == 1 and changed[0][1].num_output_tokens == changed[0][0].num_output_tokens + 1


def _run(tok_s, rows, ms, busy, bubble, switch, wait, makespan=10.0):
    return {"decode_tok_s": tok_s, "decode_rows": rows, "decode_ms": ms, "busy": busy, "iteration_bubble": bubble,
            "switch_share": switch, "kv_wait_total_s": wait, "makespan_s": makespan, "decode_gpus": 4}


def test_the_throughput_ratio_splits_into_rows_bubble_even_speed_and_busy_share():
    a = _run(1000.0, 40.0, 20.0, 0.9, 1.0, 0.5, 2.0)
    # twice the rows, iterations 1.5x as long of which the bubble 2 -> 1.5 (padding shrank), 0.8 of the busy share
    p = _run(1000.0 * 2 / 1.5 * (0.72 / 0.9), 80.0, 30.0, 0.72, 0.5, 0.4, 6.0)
    f = pk.factors(a, p)
    assert f["rows"] == pytest.approx(2.0) and f["busy"] == pytest.approx(0.8)
    assert f["speed"] == pytest.approx(1 / 1.5) and f["bubble"] == pytest.approx(2.0 / 1.5)
    assert f["speed"] == pytest.approx(f["bubble"] * f["even"])
    assert f["tput"] == pytest.approx(f["rows"] * f["speed"] * f["busy"])
    assert f["mixed_pts"] == pytest.approx(-10.0) and f["kv_wait_s"] == pytest.approx(4.0)
    assert f["predicted"] == pytest.approx(1 - 4.0 / 40.0)


def _rows(kernel, nop_ratios, control_ratios, nowait_ratio=1.0, bubble_nop=1.0):
    out = []
    for s, (t, c) in enumerate(zip(nop_ratios, control_ratios)):
        base = _run(1000.0, 40.0, 20.0, 0.9, 1.0, 0.5, 2.0)
        runs = {"AlignedServe": base, "w/o P": {**base, "decode_tok_s": 1000.0 * t, "iteration_bubble": bubble_nop},
                fig14_gap.SHAM: {**base, "decode_tok_s": 1000.0 * c},
                "AlignedServe, no KV wait": base, "w/o P, no KV wait": {**base, "decode_tok_s": 1000.0 * nowait_ratio}}
        out += [{**r, "kernel": kernel, "seed": s, "label": lab, "model": "OPT-6.7B", "num_requests": 1200}
                for lab, r in runs.items()]
    return out


def test_a_spread_no_wider_than_the_controls_leaves_schedule_sensitivity_standing():
    k = pk.per_kernel(_rows("padded", [1.30, 0.88, 1.02, 0.95, 1.08], [1.25, 0.90, 0.97, 1.10, 0.85]))["padded"]
    text = pk.verdicts(k)
    assert text[0].endswith("does not hold over these seeds")
    assert text[1].endswith("not refuted (one perturbation moves a run as much; the mean is the pauses' prediction)")
    assert "refuted as a systematic gain (w/o P is not faster)" in text[2]
    assert text[5].endswith("not refuted") and text[6].endswith("none")


def test_a_consistent_gain_with_less_padding_refutes_noise_and_supports_padding():
    k = pk.per_kernel(_rows("padded", [1.20, 1.22, 1.19, 1.21], [1.01, 0.99, 1.00, 1.00], bubble_nop=0.6,
                            nowait_ratio=1.2))["padded"]
    text = pk.verdicts(k)
    assert text[0].endswith(": holds")
    assert "refuted (a systematic effect beyond the pauses)" in text[1]
    assert text[2].endswith("not refuted")
    assert "refuted (prefetch acts without pauses)" in text[5]
    assert "bubble factor 1.250" in text[6]


def test_the_report_section_prints_every_kernel_it_ran():
    rows = _rows("split-kv", [0.9, 0.92, 1.02], [1.0, 0.98, 1.01]) + _rows("padded", [1.3, 0.88, 1.02], [1.0, 1.1, 0.9])
    text = "\n".join(pk.prefetch_kernel_lines({"gap_fig14": rows}))
    assert "| split-kv | 0.95" in text and "| padded | 1.07" in text and "seed 0 1.30" in text
    assert pk.prefetch_kernel_lines({"gap_fig14": [r for r in rows if r["label"] != fig14_gap.SHAM]}) == []


def test_a_failed_run_among_workers_stops_the_rest(monkeypatch):
    """An interrupt or a failing run must not wait for every queued run (``with`` on the pool did)."""
    monkeypatch.setenv(st.JOBS_ENV, "2")
    good = {"specs": st.application("ShareGPT-like", 20, 0), "system_spec": "distserve", "model": "OPT-2.7B",
            "num_gpus": 2}
    with pytest.raises(Exception):
        st.run_many([{**good, "system_spec": "no-such-policy"}] + [good] * 2, keep=regimes._row)
