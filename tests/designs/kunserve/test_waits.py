"""Where the worst requests wait (``reproduce.waits``): phases read from a KunServe run's
reconfiguration log, and each request labelled by the phase at its arrival."""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import waits

EVENTS = [(100.0, "form", {"group": 0, "members": [0, 1]}),
          (103.0, "exchanged", {"group": 0}),
          (150.0, "restore", {"instance": 0}),
          (150.0, "restore", {"instance": 1}),
          (160.0, "split", {"group": 0, "members": [0, 1]}),
          (300.0, "form", {"group": 2, "members": [2, 3]})]


def test_phases_follow_the_log_forming_until_the_exchange_lands_restoring_until_the_split():
    spans = waits.phase_spans(EVENTS, bursts=[(80.0, 120.0)], horizon_s=400.0)
    assert spans["forming"] == [(100.0, 103.0), (300.0, 300.0)]  # no exchange: zero length
    assert spans["restoring"] == [(150.0, 160.0)]
    assert spans["pipelined"] == [(100.0, 160.0), (300.0, 400.0)]
    lab = waits.label(np.array([50.0, 90.0, 101.0, 110.0, 155.0, 200.0, 350.0]), spans)
    assert list(lab) == ["no group", "burst, no group", "forming", "pipelined", "restoring", "no group, after a split",
                         "pipelined, after a split"]


def test_a_phase_holds_the_runs_worst_one_percent_with_their_queue_and_prefill():
    n = 200
    arrival = np.linspace(0.0, 199.0, n)
    ttft = np.full(n, 0.2)
    ttft[[90, 95]] = [5.0, 4.0]  # the worst 1% (2 of 200), both arriving in the burst before a group
    queue = np.full(n, 0.05)
    queue[[90, 95]] = [4.5, 3.0]
    spans = waits.phase_spans(EVENTS, bursts=[(80.0, 100.0)], horizon_s=200.0)
    out = waits.by_phase({"ttft": ttft, "queue": queue, "arrival": arrival}, waits.label(arrival, spans))
    b = out["burst, no group"]
    assert out["worst_total"] == 2 and b["worst"] == 2
    assert np.isclose(b["worst_queue_s"], 3.75) and np.isclose(b["worst_prefill_s"], 0.75)
    assert out["pipelined"]["worst"] == 0 and out["pipelined"]["worst_queue_s"] is None
    assert sum(out[p]["n"] for p in waits.PHASES) == n
