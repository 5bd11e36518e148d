"""The 1P1D hand-off gap test: its first-gap decomposition and its attainment without the first gap."""

from types import SimpleNamespace

import numpy as np
import pytest

from servelab.core.request import Request, RequestSpec, RequestStatus
from servelab.designs.dynaserve import metrics as dm
from servelab.designs.dynaserve.reproduce.handoff_gap import attainment_without_first_gap, first_gap_parts
from servelab.metrics.request_metrics import RequestTable


def _req(rid, times, prompt=10):
    r = Request(RequestSpec(rid, 0.0, prompt, max(len(times), 1)))
    r.token_times_s = list(times)
    r.num_generated_tokens = len(times)
    r.first_scheduled_time_s = 0.0
    r.finish(RequestStatus.FINISHED, times[-1], "length")
    return r


def test_a_short_request_failed_only_by_its_first_gap_passes_without_it():
    first_only = _req(0, [0.1, 0.3] + [0.3 + 0.05 * i for i in range(1, 10)])  # first gap 200 ms, the rest 50 ms
    later = _req(1, [0.1, 0.15, 0.2, 0.5, 0.55])  # a 300 ms gap after the first
    fine = _req(2, [0.1, 0.15, 0.2])
    table = RequestTable.from_requests([first_only, later, fine])
    assert dm.meets_tbt(table).tolist() == [False, False, True]
    assert attainment_without_first_gap(table, 0.1) == pytest.approx(2 / 3)


def test_the_first_gap_is_the_wait_plus_the_decode_step_that_emitted_the_second_token():
    table = RequestTable.from_requests([_req(0, [1.0, 1.25, 1.3]), _req(1, [2.0, 2.08, 2.12]), _req(2, [3.0])])
    # instance 0 prefills; instance 1 decodes: steps ending at 1.25 (0.07 long), 1.3, 2.08 (0.05 long), 2.12
    steps = SimpleNamespace(instance_id=np.array([0, 1, 1, 0, 1, 1]),
                            start_s=np.array([0.9, 1.18, 1.25, 1.9, 2.03, 2.08]),
                            duration_s=np.array([0.1, 0.07, 0.05, 0.1, 0.05, 0.04]))
    parts = first_gap_parts(table, steps, 1, np.array([0.01, 0.02, 0.03]))
    assert parts["rows"].tolist() == [0, 1]  # a one-token request has no first gap
    assert parts["gap"] == pytest.approx([0.25, 0.08])
    assert parts["step"] == pytest.approx([0.07, 0.05])
    assert parts["wait"] + parts["step"] == pytest.approx(parts["gap"])
    assert parts["kv"] == pytest.approx([0.01, 0.02])
