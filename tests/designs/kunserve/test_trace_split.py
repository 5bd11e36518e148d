"""The reproduction's readings of one KunServe run: the reactive drop's timeline cuts each
worst request's queueing by the phase of the unit it was dispatched to, and the TPOT split
marks a token gap pipelined only while its request's instance was in a live group, comparing
it with the reference run over the same seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from servelab.designs.kunserve.reproduce import tpot_split, trigger_trace

EVENTS = [(10.0, "form", {"group": 0, "members": [0, 1]}), (11.5, "exchanged", {"group": 0}),
          (30.0, "split", {"group": 0, "members": [0, 1]})]


@dataclass
class _Router:
    placed: dict = field(default_factory=dict)
    first_throttled_s: dict = field(default_factory=dict)


def test_worst_queueing_is_cut_by_the_phase_of_the_unit_it_waited_on():
    # 100 requests; the worst (id 7) arrived at 9 s on instance 1, first scheduled at 13 s:
    # 1 s as a single before its drop, 1.5 s while the exchange ran, 1.5 s in the group after
    n = 100
    arrival, queue, ttft = np.linspace(0, 50, n), np.full(n, 0.01), np.full(n, 0.1)
    arrival[7], queue[7], ttft[7] = 9.0, 4.0, 4.3
    router = _Router({i: (1 if i == 7 else 2) for i in range(n)}, {1: 9.5, 2: 40.0})
    tr = trigger_trace.trace(router, EVENTS, arrival, ttft, queue, np.arange(n))
    assert tr["first_throttled_s"] == 9.5 and tr["first_form_s"] == 10.0 and tr["worst_n"] == 1
    assert tr["forms"] == [{"t": 10.0, "members": [0, 1], "exchange_s": 1.5}]
    ph = tr["worst_queue_by_phase_s"]
    assert np.allclose([ph["single, before its drop"], ph["exchange"], ph["group"]], [1.0, 1.5, 1.5])
    assert tr["worst_before_first_form"] == 1.0
    # a request on an instance that never joined a group queued as a single throughout
    router.placed[7] = 2
    ph = trigger_trace.trace(router, EVENTS, arrival, ttft, queue, np.arange(n))["worst_queue_by_phase_s"]
    assert np.allclose(list(ph.values()), [4.0, 0.0, 0.0])
    assert trigger_trace.trace(object(), EVENTS, arrival, ttft, queue, np.arange(n)) is None


@dataclass
class _Req:
    instance_id: int
    token_times_s: list


def test_a_gap_is_pipelined_only_while_its_instance_is_in_a_live_group():
    # instance 1 in the group 10-30 s: its gaps there are pipelined (0.2 s), before and after DP
    # (0.1 s); instance 2 never grouped (0.1 s throughout)
    kun = [_Req(1, [5.0, 5.1, 5.2]), _Req(1, [20.0, 20.2, 20.4]), _Req(1, [35.0, 35.1]), _Req(2, [20.0, 20.1, 20.2])]
    bins = tpot_split.binned(kun, EVENTS, 40.0)
    assert sum(bins["pp_n"]) == 2 and np.isclose(sum(bins["pp_sum"]), 0.4)
    # the reference decodes at 0.16 s during 20-21 s: pipelined gaps are +25% over it
    ref = tpot_split.binned([_Req(0, [20.0, 20.16, 20.32])], [], 25.0)  # runs end apart: bins differ in number
    sp = tpot_split.split(bins, ref)
    assert np.isclose(sp["pipelined_gap_s"], 0.2) and np.isclose(sp["ref_gap_same_bins_s"], 0.16)
    assert np.isclose(sp["pipelined_vs_ref"], 0.25) and 0 < sp["pipelined_share"] < 1
    assert np.isclose(sp["dp_gap_s"], 0.1) and np.isclose(sp["pipelined_share"], 2 / 7)
    assert tpot_split.live_groups(EVENTS) == {0: [(10.0, 30.0)], 1: [(10.0, 30.0)]}


def test_the_report_reads_the_timeline_and_the_tpot_split():
    from servelab.designs.kunserve.reproduce import report_trigger

    tr = {"first_throttled_s": 231.2, "first_form_s": 231.3, "forms": [{"t": 231.3, "members": [5, 6], "exchange_s": 1.5}],
          "worst_n": 32, "worst_ttft_s": 1.7, "worst_queue_s": 1.3, "worst_before_first_form": 0.5,
          "worst_queue_by_phase_s": {"single, before its drop": 0.6, "exchange": 0.5, "group": 0.2}}
    split = {"pipelined_share": 0.5, "pipelined_gap_s": 0.07, "dp_gap_s": 0.045, "ref_gap_same_bins_s": 0.059,
             "pipelined_vs_ref": 0.19}
    tpot = {"50": 0.06}
    res = {"gap_vs_baselines": {"seeds": [{"seed": 0, "runs": {"kunserve": {"trigger_trace": tr}}}]},
           "gap_microbatches": {"rate": 6.9, "seeds": [{"seed": 0, "runs": {
               "vllm": {"tpot_s": tpot}, "M=stages": {"tpot_s": tpot, "tpot_split": split}}}]}}
    text = "\n".join(report_trigger.timeline_section(res) + report_trigger.tpot_section(res))
    assert "| kunserve | 0 | 231.2 | 231.3 | 231.3: [5, 6], 1.50 | 1.70 / 1.30 | 0.60 / 0.50 / 0.20 | 50% |" in text
    assert "most of it single, before its drop" in text and "| M=stages | vllm | 50% | 70.0 | 45.0 | 59.0 | +19.0% |" in text
    rows = report_trigger.claims(res)
    assert len(rows) == 1 and "+19.0%" in rows[0]
