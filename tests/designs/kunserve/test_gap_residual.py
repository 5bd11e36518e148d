"""The residual-gap test's measurements and verdicts: prefill and queueing spans by phase, and each
reason's verdict following the numbers (a prediction the numbers contradict refutes it)."""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import gap_residual as gr
from servelab.designs.kunserve.reproduce import report_gap_residual


def test_spans_split_queueing_and_prefill_by_phase():
    ttft = np.array([1.0, 2.0, 3.0, np.nan])
    queue = np.array([0.5, 0.5, 1.0, 0.2])
    phases = np.array(["no group", "no group", "pipelined", "pipelined"], dtype=object)
    out = gr.spans({"ttft": ttft, "queue": queue}, phases)
    assert out["no group"]["n"] == 2 and np.isclose(out["no group"]["prefill_p50_s"], 1.0)  # 0.5 and 1.5
    assert out["pipelined"]["n"] == 1 and np.isclose(out["pipelined"]["prefill_p99_s"], 2.0)  # the unfinished one left out
    assert out["burst, no group"] is None and out["all"]["n"] == 3


def _run(p99, burst=None, piped=None, prefill=None, worst_dp=0, worst=4):
    return {"ttft_s": {"99": p99}, "tpot_s": {"50": 0.06},
            "phases": {"worst_total": worst, "no group": {"worst": worst_dp, "p99_ttft_s": 0.5},
                       "burst, no group": {"worst": 0, "p99_ttft_s": burst}, "pipelined": {"worst": 0, "p99_ttft_s": piped}},
            "spans": {"burst, no group": {"prefill_p50_s": prefill, "prefill_p99_s": prefill, "queue_p99_s": 1.0}}}


def _block(kun_piped, pp_rows, t0_tokens):
    seed = {"runs": {gr.KUN: _run(1.1, burst=1.5, piped=kun_piped, prefill=0.3, worst_dp=3),
                     gr.PP: _run(1.0, burst=1.2, piped=1.0, prefill=0.2),
                     gr.PP_ROWS: _run(pp_rows), gr.T0: _run(1.3), gr.T0_TOKENS: _run(t0_tokens),
                     gr.DP4: _run(0.9, burst=1.4)}}
    return {"rate": 6.9, "systems": gr.SYSTEMS, "kv_scale": gr.KV_SCALE,
            "seeds": [dict(seed, seed=s) for s in range(3)]}


def test_each_reason_holds_only_where_all_its_predictions_do():
    v = gr.verdicts(_block(kun_piped=1.02, pp_rows=1.1, t0_tokens=1.05))
    assert v["r1"] == {"a": True, "b": True, "c": True, "verdict": "holds"}  # 3 of 4 worst while DP
    assert v["r2"]["verdict"] == "holds" and v["r3"]["verdict"] == "holds"  # rows: 1.1 / 1.1; t0: cut 0.25 of gap 0.3
    w = gr.verdicts(_block(kun_piped=1.2, pp_rows=0.9, t0_tokens=1.25))
    assert w["r1"]["c"] is False and w["r1"]["verdict"] == "refuted"  # pipelined 1.2 vs 1.0
    assert w["r2"]["b"] is False and w["r2"]["verdict"] == "refuted"  # 1.1 / 0.9 = 1.22x
    assert w["r3"]["verdict"] == "refuted"  # cut 0.05 s of a 0.3 s gap


def test_the_report_section_states_the_verdicts():
    res = {"gap_residual": _block(kun_piped=1.2, pp_rows=0.9, t0_tokens=1.25)}
    text = "\n".join(report_gap_residual.section(res))
    assert "**R1 refuted**" in text and "**R2 refuted**" in text and "**R3 refuted**" in text
    assert report_gap_residual.claims(res)[0].count("**refuted**") == 3
    assert report_gap_residual.section({}) == [] and report_gap_residual.claims({}) == []


def test_the_bubble_reason_needs_long_prompts_to_unbalance_token_chunking():
    from servelab.designs.kunserve.reproduce import gap_bubble as gb
    from servelab.designs.kunserve.reproduce import report_gap_bubble

    def block(tokens, look):
        return {"rate": 2.5, "systems": gb.SYSTEMS, "seeds": [
            {"seed": s, "runs": {gb.TOKENS: {"bubble_share": t}, gb.STEP: {"bubble_share": lk},
                                 gb.QUEUE: {"bubble_share": lk}}} for s, (t, lk) in enumerate(zip(tokens, look))]}

    held = gb.verdict(block([0.20, 0.22, 0.18], [0.08, 0.09, 0.07]), [0.08, 0.08, 0.08])
    assert held["a"] and held["b"] and held["verdict"] == "holds"
    flat = gb.verdict(block([0.09, 0.10, 0.08], [0.07, 0.07, 0.07]), [0.08, 0.08, 0.08])
    assert flat["a"] is False and flat["verdict"] == "refuted"  # long prompts leave the bubble where it was
    assert gb.verdict(block([0.2], [0.1]), [])["verdict"] == "untested"  # no faithful-point bubble to compare
    runs = {s: {"bubble_share": 0.1, "ttft_s": {"99": 1.0}, "tpot_s": {"50": 0.05, "99": 0.08}} for s in gb.SYSTEMS}
    res = {"gap_bubble": {"rate": 2.5, "systems": gb.SYSTEMS, "seeds": [{"seed": 0, "runs": runs}]},
           "ablation_memory_bound": {"seeds": [{"runs": {"+coordinated": {"bubble_share": 0.08}}}]}}
    assert "**B1 refuted**" in "\n".join(report_gap_bubble.section(res))  # 10% < 2 x 8%


def test_the_restore_reason_needs_rows_to_double_restores_gain():
    from servelab.designs.kunserve.reproduce import gap_restore as gs
    from servelab.designs.kunserve.reproduce import report_gap_restore

    def run(t50):
        return {"ttft_s": {"50": t50, "99": 2.0}, "tpot_s": {"50": 0.06}, "forms": 2, "splits": 2, "bubble_share": 0.1}

    restore = {"seeds": [{"seed": s, "runs": {"kunserve": run(0.95), "kunserve w/o restore": run(1.0)}} for s in range(3)]}
    big = {"rate": 6.9, "systems": gs.SYSTEMS, "seeds": [{"seed": s, "runs": {gs.ON: run(0.8), gs.OFF: run(1.0)}}
                                                          for s in range(3)]}
    v = gs.verdict(big, restore)  # -20% with rows against -5%
    assert v["verdict"] == "holds" and all(abs(x + 0.05) < 1e-9 for x in v["default"])
    small = {**big, "seeds": [{"seed": s, "runs": {gs.ON: run(0.93), gs.OFF: run(1.0)}} for s in range(3)]}
    assert gs.verdict(small, restore)["verdict"] == "refuted"  # -7% is not twice -5%
    assert gs.verdict(big, None)["verdict"] == "untested"
    assert "**S1 holds**" in "\n".join(report_gap_restore.section({"gap_restore": big, "restore": restore}))


def test_r3_on_the_residual_reads_the_token_chunking_runs_by_seed():
    block = _block(kun_piped=1.02, pp_rows=1.1, t0_tokens=1.05)  # KunServe 1.1 s, vLLM-PP 1.0 s on every seed
    closed = {"seeds": [{"seed": s, "run": {"ttft_s": {"99": 1.02}}} for s in range(3)]}
    v = gr.tokens_verdict(block, closed)
    assert v["verdict"] == "holds" and abs(v["gap_s"] - 0.1) < 1e-9 and abs(v["cut_s"] - 0.08) < 1e-9
    barely = {"seeds": [{"seed": s, "run": {"ttft_s": {"99": 1.08}}} for s in range(3)]}
    assert gr.tokens_verdict(block, barely)["verdict"] == "refuted"  # 0.02 s of a 0.1 s gap
    assert gr.tokens_verdict(block, None) is None
    text = "\n".join(report_gap_residual.section({"gap_residual": block, "gap_residual_tokens": closed}))
    assert "**R3 on the residual itself**" in text and "**holds**" in text


def test_the_trigger_timing_reason_needs_an_earlier_trigger_to_close_half_the_gap():
    from servelab.designs.kunserve.reproduce import gap_early as ge
    from servelab.designs.kunserve.reproduce import report_gap_early

    def run(p99, forms=(100.0,), worst=(95.0, 99.0, 104.0, 300.0)):
        return {"ttft_s": {"50": 0.3, "99": p99}, "tpot_s": {"50": 0.06}, "forms": len(forms), "form_s": list(forms),
                "worst_arrivals_s": list(worst)}

    residual = {"seeds": [{"seed": s, "runs": {ge.KUN: run(1.4), ge.PP: run(1.2, forms=())}} for s in range(3)]}

    def block(early):
        return {"rate": 6.9, "systems": ge.SYSTEMS, "window_s": [ge.BEFORE_S, ge.AFTER_S],
                "seeds": [{"seed": s, "runs": {ge.EARLY: run(e, forms=(90.0,)), ge.EARLIER: run(1.3, forms=(80.0,))}}
                          for s, e in enumerate(early)]}

    v = ge.verdict(block([1.15, 1.25, 1.45]), residual)  # 0.117 s of a 0.2 s gap, lower on 2 of 3 seeds
    assert v["verdict"] == "holds" and abs(v["gap_s"] - 0.2) < 1e-9 and abs(v["cut_s"] - 0.35 / 3) < 1e-9
    assert v["around"][ge.KUN] == [0.75] * 3  # 95, 99 and 104 s of the worst lie within [90, 105] s
    assert v["around"][ge.EARLY] == [0.25] * 3 and v["first_drop_s"][ge.EARLY] == [90.0] * 3  # only 95 s within [80, 95] s
    assert ge.verdict(block([1.35, 1.35, 1.35]), residual)["verdict"] == "refuted"  # 0.05 s of 0.2
    assert ge.verdict(block([0.8, 1.5, 1.5]), residual)["verdict"] == "refuted"  # half closed on the mean, lower on 1 of 3
    assert ge.verdict(block([1.2] * 3), None)["verdict"] == "untested"
    assert ge.around_drop(run(1.0, forms=())) is None
    text = "\n".join(report_gap_early.section({"gap_early": block([1.15, 1.25, 1.45]), "gap_residual": residual}))
    assert "**T1 holds**" in text and "| trigger at 90% KV | `kunserve:dispatch=kv+compute,trigger_share=0.9` |" in text
    assert "T1 **holds**" in "\n".join(report_gap_early.claims({"gap_early": block([1.25] * 3), "gap_residual": residual}))
    assert report_gap_early.section({}) == [] and report_gap_early.claims({}) == []


def test_the_exchange_reason_needs_the_fast_link_to_win_back_half_of_the_earlier_triggers_cost():
    from servelab.designs.kunserve.reproduce import gap_early as ge
    from servelab.designs.kunserve.reproduce import report_gap_early

    def run(p99):
        return {"ttft_s": {"50": 0.3, "99": p99}, "tpot_s": {"50": 0.06}, "forms": 4, "form_s": [90.0],
                "worst_arrivals_s": [95.0]}

    residual = {"seeds": [{"seed": s, "runs": {ge.KUN: run(1.4), ge.PP: run(1.2)}} for s in range(3)]}
    early = {"rate": 6.9, "systems": ge.SYSTEMS, "seeds": [{"seed": s, "runs": {ge.EARLY: run(2.4), ge.EARLIER: run(1.9)}}
                                                           for s in range(3)]}

    def link(fast_early):
        return {"rate": 6.9, "factor": 10.0, "gbps": 2000.0, "systems": ge.LINK_SYSTEMS,
                "seeds": [{"seed": s, "runs": {ge.FAST_EARLY: run(f), ge.FAST_KUN: run(1.3)}}
                          for s, f in enumerate(fast_early)]}

    v = ge.link_verdict(link([1.8, 1.9, 2.5]), early, residual)  # 1.0 s cost, 0.33 s won back: under half
    assert v["verdict"] == "refuted" and abs(v["cost_s"] - 1.0) < 1e-9 and abs(v["back_s"] - 1 / 3) < 1e-9
    assert ge.link_verdict(link([1.5, 1.6, 2.3]), early, residual)["verdict"] == "holds"  # 0.6 s, lower on 3 of 3
    assert ge.link_verdict(link([1.0, 1.0, 2.5]), early, residual)["verdict"] == "holds"  # 0.9 s, lower on 2 of 3
    assert ge.link_verdict(link([1.5] * 3), None, residual)["verdict"] == "untested"
    res = {"gap_early": early, "gap_residual": residual, "gap_early_link": link([1.5, 1.6, 2.3])}
    text = "\n".join(report_gap_early.section(res))
    assert "**T1 refuted**" in text and "**T2 holds**" in text and "| 2000 Gb/s |" in text
    assert "T2 **holds**" in "\n".join(report_gap_early.claims(res))
