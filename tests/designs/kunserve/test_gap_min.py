"""The MIN-rule and exchange gap tests' verdicts follow the numbers (a prediction the numbers
contradict refutes its reason), and their report sections print the verdicts and the reuse."""

from __future__ import annotations

from servelab.designs.kunserve.reproduce import gap_exchange as gx
from servelab.designs.kunserve.reproduce import gap_min as gm
from servelab.designs.kunserve.reproduce import report_gap_exchange, report_gap_min


def _run(p99, bubble=None, single=None):
    return {"ttft_s": {"99": p99, "50": 0.3}, "tpot_s": {"50": 0.06, "99": 0.09}, "bubble_share": bubble,
            "single_microbatch_share": single}


def _res(floor_bubble, floor_single, floor_p99):
    lb = {gm.OLD: _run(2.9, 0.30, 0.77), gm.FLOOR: _run(2.7, floor_bubble, floor_single),
          gm.MIN8: _run(2.8, 0.20, 0.40), gm.TOKENS: _run(2.75, 0.075, 0.05)}
    faithful = {gm.OLD: _run(1.56), gm.FLOOR: _run(floor_p99), gm.MIN8: _run(1.4), gm.PP: _run(1.19)}
    out = {}
    for point, runs in ((gm.LONGBENCH_T0, lb), (gm.FAITHFUL_T0, faithful), (gm.RESIDUAL, faithful)):
        wl, systems = gm.POINTS[point]
        out[point] = {"workload": wl, "rate": 2.5, "systems": systems, "reused": {gm.OLD: "gap_bubble"},
                      "seeds": [{"seed": s, "runs": runs} for s in range(3)]}
    return out


def test_min_rule_verdicts_follow_the_numbers():
    v = gm.verdicts(_res(floor_bubble=0.07, floor_single=0.02, floor_p99=1.25))
    assert v["m1"] == {"a": True, "b": True, "verdict": "holds"} and v["m4"]["verdict"] == "holds"
    assert v["m2"]["verdict"] == "holds" and abs(v["m2"]["cut_s"] - 0.31) < 1e-9  # 0.31 of a 0.37 s gap
    half = gm.verdicts(_res(floor_bubble=0.12, floor_single=0.02, floor_p99=1.45))
    assert half["m1"] == {"a": True, "b": False, "verdict": "refuted"}  # halved, but above token chunking
    assert half["m2"]["verdict"] == "refuted"  # 0.11 s of 0.37
    stuck = gm.verdicts(_res(floor_bubble=0.07, floor_single=0.50, floor_p99=1.25))
    assert stuck["m1"]["a"] is False and stuck["m4"]["verdict"] == "refuted"  # MIN = 8's single share not between


def test_min_rule_section_prints_predictions_reuse_and_verdicts():
    res = _res(floor_bubble=0.07, floor_single=0.02, floor_p99=1.25)
    res["check"] = {"point": gm.LONGBENCH_T0, "system": gm.OLD, "seed": 0, "identical": True,
                    "rerun": {"ttft_s": {"99": 2.9}, "bubble_share": 0.3}, "reused": {"ttft_s": {"99": 2.9}, "bubble_share": 0.3}}
    text = "\n".join(report_gap_min.section({"gap_min": res}))
    assert "**M1 holds** (a holds, b holds)" in text and "**M2 holds**" in text and "**identical**" in text
    assert "MIN per step from `gap_bubble`" in text and "stage_floor=false" in text
    assert "M1 **holds**" in "\n".join(report_gap_min.claims({"gap_min": res}))
    assert report_gap_min.section({}) == [] and report_gap_min.claims({}) == []


def _link(factor, bulk, coord):
    return {"factor": factor, "gbps": 200 * factor,
            "seeds": [{"seed": s, "runs": {gx.BULK: _run(b), gx.COORD: _run(c)}} for s, (b, c) in enumerate(zip(bulk, coord))]}


def test_exchange_verdict_needs_the_gain_to_grow_as_the_link_slows():
    grows = {"rate": 6.9, "systems": gx.SYSTEMS, "links": [_link(1.0, [2.0, 1.6, 4.0], [1.3, 1.3, 4.0]),
                                                          _link(0.5, [3.0, 2.5, 5.0], [1.5, 1.4, 4.1]),
                                                          _link(0.25, [5.0, 4.0, 7.0], [2.0, 1.8, 4.5])]}
    v = gx.verdict(grows)
    assert v["a"] and v["b"] and v["verdict"] == "holds"
    flat = dict(grows, links=[grows["links"][0], _link(0.5, [2.0, 1.6, 4.0], [1.3, 1.3, 4.0]), grows["links"][2]])
    assert gx.verdict(flat)["a"] is False and gx.verdict(flat)["verdict"] == "refuted"
    assert gx.verdict(dict(grows, links=grows["links"][:1]))["verdict"] == "untested"
    text = "\n".join(report_gap_exchange.section({"gap_exchange": grows}))
    assert "**D1 holds** (a holds, b holds)" in text and "| 50 | +drop |" in text
