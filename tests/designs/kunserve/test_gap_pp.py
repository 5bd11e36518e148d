"""The vLLM-PP gap test's measurements and verdicts: the dispatch probe reads where arrivals were
sent, how long they queued by destination and what each unit kind's queue waited for; the
verdicts follow the numbers (a prediction the numbers contradict refutes its hypothesis); a
rerun step's sections replace a full run's when the report is rendered."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np

from servelab.designs.kunserve.reproduce import dispatch_probe, gap_pp, render, report_gap_pp

# instances 0-3; group 0 = [0, 1] from 10 s to 30 s (so instances 0, 1 are half the GPUs then)
EVENTS = [(10.0, "form", {"group": 0, "members": [0, 1]}), (11.0, "exchanged", {"group": 0}),
          (30.0, "split", {"group": 0, "members": [0, 1]})]


def _steps():
    """Group 0: two 1 s steps at 12 s and 13 s with a queue, one at its 1,024-token budget
    (queued for compute), one at 100 tokens with the KV full (queued for memory); instance 2:
    a 1 s step at 12 s of 256 of its 512 tokens, nothing queued; instance 0 before the drop."""
    rows = [  # instance, start, duration, tokens, waiting, kv used, kv total
        (0, 5.0, 1.0, 512, 0, 10, 100),
        (0, 12.0, 1.0, 1024, 3, 50, 200),
        (0, 13.0, 1.0, 100, 2, 199, 200),
        (2, 12.0, 1.0, 256, 0, 20, 100),
    ]
    cols = list(zip(*rows))
    names = ("instance_id", "start_s", "duration_s", "num_tokens", "num_waiting", "kv_used_blocks", "kv_total_blocks")
    return SimpleNamespace(**{k: np.array(v) for k, v in zip(names, cols)})


def test_the_probe_reads_destinations_queueing_and_what_each_queue_waits_for():
    # requests 0-199 arrive 0..40 s; those arriving in [10, 30) on even ids were sent to the group
    n = 200
    rid = np.arange(n)
    arrival = np.linspace(0.0, 40.0, n, endpoint=False)
    inside = (arrival >= 10) & (arrival < 30)
    placed = {int(i): (0 if i % 2 == 0 else 2) for i in rid}
    queue = np.where(inside & (rid % 2 == 0), 2.0, 0.1)
    ttft = queue + 0.2
    ttft[[20, 60]] = 50.0, 60.0  # the worst 1% (2 of 200): id 20 arrived before the drop (4 s), 60 in it (12 s, to the group)
    out = dispatch_probe.measure(_steps(), EVENTS, placed, rid, arrival, queue, ttft, 512, 4, (10.0, 30.0))
    assert np.isclose(out["group_gpu_share"], 0.5)  # 2 of 4 instances for the whole window
    assert out["arrivals"] == int(inside.sum()) and np.isclose(out["to_groups"], 0.5)
    grp, sgl = out["by_dest"]["group"], out["by_dest"]["single"]
    assert np.isclose(grp["mean_queue_s"], 2.0) and np.isclose(sgl["mean_queue_s"], 0.1)
    assert out["worst"] == {"n": 2, "before": 0.5, "to_group": 0.5, "to_single": 0.0, "after": 0.0}
    g, s = out["steps"]["group"], out["steps"]["single"]
    assert g["busy_s"] == 2.0 and g["queued_s"] == 2.0 and g["queued_compute_s"] == 1.0
    assert g["queued_other_s"] == 1.0 and g["queued_other_kv_full_s"] == 1.0
    assert np.isclose(g["fill"], (1.0 + 100 / 1024) / 2)  # a group's budget: 2 stages x 512
    assert s["busy_s"] == 1.0 and s["queued_s"] == 0.0 and np.isclose(s["fill"], 0.5)
    # a router that records no dispatch: the step readings stay, the destinations are unknown
    bare = dispatch_probe.measure(_steps(), EVENTS, None, rid, arrival, queue, ttft, 512, 4, (10.0, 30.0))
    assert bare["to_groups"] is None and bare["worst"] is None and bare["steps"] == out["steps"]


def _run(p99, to_groups=0.8, gpu=0.5, qg=2.0, qs=0.1, late=(0.5, 0.5, 0.0), compute=(3.0, 4.0), single_fill=0.5,
         sat=None, queued=0.0):
    d = {"to_groups": to_groups, "group_gpu_share": gpu,
         "by_dest": {"group": {"mean_queue_s": qg}, "single": {"mean_queue_s": qs}},
         "worst": {"before": late[0], "to_group": late[1], "to_single": late[2]},
         "steps": {"group": {"queued_compute_s": compute[0], "queued_s": compute[1], "queued_other_kv_full_s": 0.0,
                             "fill": 0.8}, "single": {"fill": single_fill}}}
    burst = {"steps": {"group": {"queued_compute_s": sat, "queued_s": max(sat, queued), "busy_s": 1.0}}} \
        if sat is not None else None
    return {"ttft_s": {"99": p99}, "dispatch": {"after_first_group": d, "burst": burst}}


def _block(kun=(2.0, 2.4, 3.0), alt=(1.2, 1.3, 1.4), pp=(1.0, 1.1, 1.2), sat=(0.1, 0.7), high=(0.8, 0.9, 0.9),
           queued=(0.0, 0.0), **kw):
    def row(f, s_pp, kun_p99, pp_p99, q):
        return {"factor": f, "rate": 6.9 * f, "seeds": [
            {"seed": i, "runs": {"vllm-pp": _run(pp_p99[i], sat=s_pp, queued=q), "kunserve": _run(kun_p99[i], **kw),
                                 gap_pp.KV_COMPUTE: _run(alt[i])}} for i in range(3)]}
    return {"rate": 6.9, "grid": [row(1.0, sat[0], kun, pp, queued[0]), row(2.0, sat[1], high, (1.0, 1.0, 1.0), queued[1])]}


def test_the_verdicts_follow_the_numbers():
    v = gap_pp.verdicts(_block())
    assert v["h1"] == {"a": True, "b": True, "c": True, "d": True, "e": True, "verdict": "holds"}
    assert v["h2"]["verdict"] == "holds" and [r["saturated"] for r in v["h2"]["rates"]] == [False, True]
    # arrivals sent to groups queue less than those sent to singles: (b) fails, H1 refuted
    assert gap_pp.verdicts(_block(qg=0.05))["h1"]["verdict"] == "refuted"
    # the group's queue waits for memory, not compute: (d) fails
    v = gap_pp.verdicts(_block(compute=(1.0, 4.0)))
    assert v["h1"]["d"] is False and v["h1"]["verdict"] == "refuted"
    # kv+compute closes under half the gap (2.47 -> 2.3 against vLLM-PP's 1.1): (e) fails
    assert gap_pp.verdicts(_block(alt=(1.9, 2.3, 2.8)))["h1"]["e"] is False
    # KunServe still above vLLM-PP where vLLM-PP is compute-bound: H2 refuted; never saturated: untested
    assert gap_pp.verdicts(_block(high=(1.5, 1.2, 0.9)))["h2"]["verdict"] == "refuted"
    assert gap_pp.verdicts(_block(sat=(0.1, 0.2)))["h2"]["verdict"] == "untested"
    assert gap_pp.verdicts(_block(sat=(0.8, 0.9)))["h2"]["verdict"] == "refuted"  # no headroom at the faithful rate
    # never compute-bound (its KV binds first) but overloaded at 2x: read there, and KunServe above it refutes
    v = gap_pp.verdicts(_block(sat=(0.1, 0.3), queued=(0.2, 0.9), high=(1.2, 1.3, 1.1)))["h2"]
    assert v["verdict"] == "refuted" and v["by_overload"] and [r["overloaded"] for r in v["rates"]] == [False, True]


def test_the_section_prints_each_prediction_and_verdict():
    res = {"gap_pp": _block(qg=0.05)}
    text = "\n".join(report_gap_pp.claims(res) + report_gap_pp.section(res))
    assert "H1 **refuted**" in text and "H2 holds" in text.replace("**", "") and "b fails" in text
    assert report_gap_pp.section({}) == [] and report_gap_pp.claims({}) == []


def test_rerun_steps_replace_the_full_runs_sections():
    base = {"end_to_end": {"a": 1, "b": 2}, "plan_time": [{"median_ms": 1.7}], "eq1": [3], "timings_cpu_s": {"x": 1.0},
            "reused": {"from": "old"}}
    part = {"results": {"plan_time": [{"median_ms": 0.6}], "gap_pp": {"grid": []}, "end_to_end": {"b": 5}},
            "steps_done": ["drop-plan time", "gap"], "timings_cpu_s": {"drop-plan time": 0.5}}
    res = render.rebase(part, copy.deepcopy(base), "why")
    assert res["plan_time"] == [{"median_ms": 0.6}] and res["gap_pp"] == {"grid": []} and res["eq1"] == [3]
    assert res["end_to_end"] == {"a": 1, "b": 5} and "reused" not in res
    assert res["timings_cpu_s"] == {"x": 1.0, "drop-plan time": 0.5}
    assert res["rerun"] == {"steps": ["drop-plan time", "gap"], "why": "why"}
    assert render.main(["--partial", "p.json", "--out", "."]) == 2  # neither --previous nor --base


def test_sections_from_a_same_code_run_are_told_apart_from_its_older_ones():
    """A cut-short run merged with an earlier run of the same simulation code: the earlier run's
    own sections are named as same-code, those it had itself taken from older code apart."""
    previous = {"end_to_end": {"a-14B": 1, "b-14B": 2}, "restore": 3, "faithful_grid": 4,
                "reused": {"from": "commit old", "sections": ["end to end b-14B", "restore"]}}
    partial = {"results": {"end_to_end": {"a-14B": 9}}, "steps_done": ["end to end a 14B"], "timings_cpu_s": {}}
    res = render.merge(partial, previous, "the run at X", same_code=True)
    assert res["end_to_end"] == {"a-14B": 9, "b-14B": 2} and res["restore"] == 3
    assert res["reused"]["sections"] == ["faithful_grid"]
    assert res["reused"]["older"] == {"from": "commit old", "sections": ["end to end b-14B", "restore"]}
    plain = render.merge(partial, previous, "the run at X")
    assert "older" not in plain["reused"] and "restore" in plain["reused"]["sections"]


def test_a_step_run_alone_must_be_one_of_the_full_runs(tmp_path, capsys):
    from servelab.designs.kunserve.reproduce import standalone

    src = tmp_path / "p.json"
    src.write_text('{"results": {"end_to_end": {}}}')
    assert standalone.main(["steps", "--from-partial", str(src), "--steps", "no such step", "--out",
                            str(tmp_path / "o.json")]) == 2
    assert "unknown steps" in capsys.readouterr().err and not (tmp_path / "o.json").exists()
    assert standalone.main(["nope"]) == 2
