"""Issue 25's gap tests (open_gaps), their report section, and running steps alone
(standalone) then merging them with a full run's results (render --base)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servelab.core.request import RequestSpec
from servelab.designs.alignedserve.reproduce import open_gaps as og
from servelab.designs.alignedserve.reproduce import render, report_open_gaps, report_prefetch_gaps, report_sources, standalone
from servelab.designs.alignedserve.reproduce import setting as st


def test_busy_probe_splits_step_time_by_role():
    specs = st.synthetic(40, 0.9, 0)
    r = st.run(specs, "distserve", "OPT-2.7B", 2, probe=og.busy_probe)
    roles = r["busy_by_role"]
    assert set(roles) == {"prefill", "decode"} and all(0 < v <= 1 for v in roles.values())
    # one prefill and one decode GPU: the server's busy share is their mean
    assert r["busy_all"] == pytest.approx((roles["prefill"] + roles["decode"]) / 2)
    # the decode role's share is the one the decomposition already measured
    assert roles["decode"] == pytest.approx(r["decode_step_ms"]["busy_share"])


def test_context_probe_counts_long_rows_and_their_steps():
    specs = [RequestSpec(i, 0.0, 3000 if i % 2 else 100, 20) for i in range(12)]
    r = st.run(specs, "alignedserve:prefix_aware=false", "OPT-2.7B", 2, probe=og.context_probe)
    assert 0 < r["share_long_steps"] <= 1
    short = [RequestSpec(i, 0.0, 100, 20) for i in range(12)]
    assert st.run(short, "alignedserve", "OPT-2.7B", 2, probe=og.context_probe)["share_long_steps"] == 0


def test_host_link_scale_slows_the_pool_link_only():
    specs = st.synthetic(30, 0.9, 0)
    slow = st.run(specs, "alignedserve:prefetch=false", "OPT-2.7B", 2, host_link_scale=0.1)
    fast = st.run(specs, "alignedserve:prefetch=false", "OPT-2.7B", 2)
    assert slow["router"]["kv_wait_total_s"] > fast["router"]["kv_wait_total_s"]
    ds = [st.run(specs, "distserve", "OPT-2.7B", 2, host_link_scale=f)["decode_tok_s"] for f in (1.0, 0.1)]
    assert ds[0] == ds[1]  # DistServe's hand-offs cross NVLink, never the host link


def test_spread_keeps_the_median_and_crowds_the_ranges():
    specs = [RequestSpec(i, 0.0, p, 10) for i, p in enumerate([100, 1000, 2000, 3000, 9000])]
    tight = og.spread(specs, 0.1)
    assert [r.num_prompt_tokens for r in og.spread(specs, 1.0)] == [100, 1000, 2000, 3000, 9000]
    assert [r.num_prompt_tokens for r in tight] == [1810, 1900, 2000, 2100, 2700]
    assert og.neighbours(tight) > og.neighbours(specs) == 0


def test_link_times_grow_with_the_prompt_and_pcie_is_the_slower():
    a, b = og.link_times_ms(512), og.link_times_ms(4096)
    assert b["nvlink"] > a["nvlink"] and b["pcie"] > b["nvlink"]
    assert b["pcie"] / a["pcie"] == pytest.approx(8, rel=0.01)


def _split_rows(ds_over_vllm, busy):
    rows = []
    for s in range(3):
        rows += [{"seed": s, "label": "vLLM", "num_prefill": None, "decode_tok_s": 100.0, "busy_all": 1.0,
                  "busy_by_role": {}, "num_requests": 10},
                 {"seed": s, "label": "FastGen (sarathi)", "num_prefill": None, "decode_tok_s": 100.0,
                  "busy_all": 1.0, "busy_by_role": {}, "num_requests": 10}]
        for k in (1, 2):
            rows += [{"seed": s, "label": "DistServe", "num_prefill": k, "decode_tok_s": 100.0 * ds_over_vllm[k] + s,
                      "busy_all": busy[k], "busy_by_role": {"prefill": 0.5, "decode": 0.9}, "num_requests": 10},
                     {"seed": s, "label": "AlignedServe", "num_prefill": k, "decode_tok_s": 80.0 * ds_over_vllm[k] + s,
                      "busy_all": 0.5, "busy_by_role": {}, "num_requests": 10}]
    return rows


def test_split_verdicts_follow_the_numbers():
    res = {"sizes": {"num_gpus": 4}}
    def verdicts(busy):
        lines = report_open_gaps._split({**res, "open_split": _split_rows({1: 0.9, 2: 0.6}, busy)})
        return next(x for x in lines if x.startswith("Verdicts:"))
    held = verdicts({1: 0.9, 2: 0.6})
    assert "(1) idle GPU time as the split's cost: 1 prefill GPUs" in held and "refuted" not in held
    off = verdicts({1: 0.5, 2: 0.6})
    assert "1 prefill GPUs: measured - predicted +0.41" in off and "refuted (idle time" in off


def test_fig15_verdict_reads_the_sparse_over_dense_wait():
    def rows(sparse_wait):
        out = []
        for s in range(3):
            for f, w in ((1.0, sparse_wait + 0.1 * s), (0.1, 1.0 + 0.05 * s)):
                for lab in ("AlignedServe, no starvation bound", "AlignedServe", "DistServe"):
                    out.append({"seed": s, "spread": f, "label": lab, "rate": 1.0, "neighbours": 5.0, "load": 0.9,
                                "second_token_mean_s": w, "first_gap_p99_s": 2 * w, "num_starved": 0,
                                "decode_tok_s": 10.0, "num_requests": 10})
        return out
    assert "holds" in "\n".join(report_open_gaps._fig15({"open_fig15": rows(3.0)}))
    assert "refuted" in "\n".join(report_open_gaps._fig15({"open_fig15": rows(0.5)}))


def test_fig14_link_takes_x1_from_the_fig14_gap_runs():
    def row(s, f, label, tok, wait):
        return {"seed": s, "link_scale": f, "label": label, "decode_tok_s": tok, "kv_wait_total_s": wait,
                "decode_gpus": 4, "makespan_s": 100.0, "decode_rows": 10.0, "num_requests": 1200, "kernel": "split-kv"}
    gap = [row(s, None, lab, 100.0, 1.0) for s in range(3) for lab in ("AlignedServe", "w/o P")]
    slow = [row(s, 0.1, "AlignedServe", 100.0, 1.0) for s in range(3)]
    slow += [row(s, 0.1, "w/o P", 80.0 - s, 41.0) for s in range(3)]
    text = "\n".join(report_prefetch_gaps.fig14_link_lines({"gap_fig14": gap, "open_fig14": slow}))
    assert "| x1 (" in text and "| x0.1 (" in text and "holds: the ratio falls" in text


def test_standalone_refuses_unknown_steps_and_lists_the_new_ones(capsys, tmp_path):
    assert standalone.main(["--steps", "no such step", "--out", str(tmp_path / "p.json")]) == 2
    assert "unknown steps" in capsys.readouterr().err
    assert standalone.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "gap tested: Fig. 15 prefix-range sparsity" in listed and "headline grid" in listed


def test_standalone_writes_the_partial_format(tmp_path, monkeypatch):
    monkeypatch.setattr(og, "arxiv_kv_sizes", lambda sizes, seed: {"num_requests": 1, "prompt_p50": 2.0,
                                                                    "share_nvlink_5ms": 1.0, "share_pcie_5ms": 0.0})
    from servelab.designs.alignedserve.reproduce import run
    monkeypatch.setattr(run, "OPEN_GAP_STEPS", tuple((lab, og.arxiv_kv_sizes if "arXiv" in lab else fn, key)
                                                     for lab, fn, key in run.OPEN_GAP_STEPS))
    out = tmp_path / "p.json"
    assert standalone.main(["--steps", "gap tested: Fig. 11 arXiv KV sizes", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["steps_done"] == ["gap tested: Fig. 11 arXiv KV sizes"]
    assert data["results"]["open_fig11_arxiv"]["prompt_p50"] == 2.0 and "timings_cpu_s" in data


def test_rebase_replaces_sections_and_names_each_rerun():
    base = {"sizes": {}, "fig7": [1], "open_fig11": [0], "timings_cpu_s": {"a": 1.0, "b": 2.0}, "total_cpu_s": 3.0}
    part = render.combine([{"results": {"open_fig11": [2]}, "steps_done": ["b"], "timings_cpu_s": {"b": 5.0},
                            "load_average": [[3.0, 4.5]]},
                           {"results": {"open_fig11": [9], "open_fig13": [3]}, "steps_done": ["c"],
                            "timings_cpu_s": {"c": 1.0}}])
    assert part["results"] == {"open_fig11": [2], "open_fig13": [3]}  # the first file holding a section wins
    res = render.rebase(part, base, base_label="full run X", label="commit Y", why="new tests")
    assert res["fig7"] == [1] and res["open_fig11"] == [2] and res["timings_cpu_s"] == {"a": 1.0, "b": 5.0, "c": 1.0}
    again = render.rebase({"results": {"fig7": [7]}, "steps_done": ["a"], "timings_cpu_s": {"a": 1.0}},
                          res, base_label="ignored", label="commit Z", why="fix")
    assert again["base_run"] == "full run X" and [r["label"] for r in again["reruns"]] == ["commit Y", "commit Z"]
    head = "\n".join(report_sources.head_lines(again))
    assert "full run X" in head and "commit Y (6 s CPU, load average 3.0-4.5): steps b; c; why: new tests" in head
    assert report_sources.head_lines(base) == []


def test_render_refuses_missing_or_foreign_files(tmp_path, capsys):
    part = tmp_path / "p.json"
    part.write_text(json.dumps({"results": {}}))
    args = ["--base-label", "x", "--label", "y", "--why", "z", "--out", str(tmp_path)]
    assert render.main(["--partial", str(part), "--base", str(tmp_path / "none.json"), *args]) == 2
    assert "no file" in capsys.readouterr().err
    assert render.main(["--partial", str(part), "--base", str(part), *args]) == 2
    assert "full run's results.json" in capsys.readouterr().err


def test_fixed_lengths_stay_within_a_tenth():
    p = np.array([r.num_prompt_tokens for r in og.fixed_lengths(200, 2048, 0)])
    assert p.min() >= 0.9 * 2048 - 1 and p.max() <= 1.1 * 2048 and p.std() > 0


def test_burst_probe_reads_the_moves_the_router_timed():
    specs = og.fixed_lengths(60, 512, 0)
    r = og._keep_release(st.run(specs, "alignedserve", "OPT-2.7B", 2, probe=og.burst_probe))
    # every move onto a decode GPU is one release the router timed: the two shares are one quantity
    assert r["moves_under_5ms"] == pytest.approx(r["release_under_5ms"])
    # queueing behind a burst can only delay a move: the serial prediction never exceeds the alone one
    assert r["serial_under_5ms"] <= r["alone_under_5ms"] and r["burst_p50"] >= 1


def test_keep_sections_drops_the_other_sections_and_their_steps():
    part = {"results": {"open_fig13": [1], "open_fig11": [2]}, "steps_done": ["s13", "s11", "other"],
            "timings_cpu_s": {"s13": 1.0, "s11": 2.0, "other": 3.0}}
    kept = render.keep_sections(part, {"open_fig13"}, {"s13": "open_fig13", "s11": "open_fig11"})
    assert kept["results"] == {"open_fig13": [1]} and kept["steps_done"] == ["s13", "other"]
    assert kept["timings_cpu_s"] == {"s13": 1.0, "other": 3.0}
