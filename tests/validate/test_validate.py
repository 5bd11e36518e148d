"""``servelab validate`` on the tiny checkpoint: both sides serve the same requests, the errors
are computed from the right quantities, and bad input is one clear line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from servelab.core.errors import UserError
from servelab.engine.calibrate import REDUCED_GRID
from servelab.engine.tiny_model import make_tiny_model
from servelab.validate.calibration import calibrate_to
from servelab.validate.compare import ValidateOptions, noise_floor, run_validation, sim_overlap
from servelab.validate.report import fmt_s, write_validation
from servelab.validate.workloads import ValidationWorkload


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("tiny")
    model = make_tiny_model(folder)
    from servelab.engine.loader import load_checkpoint

    loaded = load_checkpoint(model)
    cost = folder / "cost.json"
    calibrate_to(loaded, cost, "cpu", grid=REDUCED_GRID)
    return model, loaded, cost


WORKLOAD = ValidationWorkload("burst", "poisson:rate=50,n=6,prompt=uniform(8,40),output=uniform(2,6)", 40, 6)


@pytest.mark.parametrize("policy,n", [("vllm", 1), ("distserve", 2)])
def test_both_sides_serve_the_same_requests(setup, tmp_path, policy, n):
    model, loaded, cost = setup
    v = run_validation(ValidateOptions(model, cost, WORKLOAD, policy=policy, num_instances=n), loaded)
    real = {r.request_id: r for r in v.real.requests}
    sim = {r.request_id: r for r in v.sim.requests}
    assert real.keys() == sim.keys() and len(real) == 6
    for rid, r in real.items():
        assert r.status.value == sim[rid].status.value == "finished"
        assert r.num_generated_tokens == sim[rid].num_generated_tokens  # ignore_eos: same lengths
        assert r.num_prompt_tokens == sim[rid].num_prompt_tokens
    m = v.metrics
    assert m["ttft"]["n"] == 6 and m["step"]["n"] == len(v.real.steps) > 0
    # the step error is |cost(shape) - measured| / measured of the engine's own steps
    apes = sorted(abs(v.cost.step_time_s(s.shape) - s.duration_s) / s.duration_s for s in v.real.steps)
    assert m["step"]["median"] == pytest.approx(float(np.median(apes)))
    # on the CPU clock the engine's step durations are CPU seconds, which a virtual clock sums
    assert all(s.duration_s > 0 for s in v.real.steps)
    if n == 2:
        assert m["transfers"]["real_n"] == m["transfers"]["sim_n"] == 6
    paths = write_validation(tmp_path, v, "servelab validate (test)")
    header = paths["requests"].read_text().splitlines()[0]
    assert "real_ttft_s" in header and "ttft_ape" in header
    assert json.loads(paths["json"].read_text())["metrics"]["num_requests"] == 6
    assert paths["plot"].stat().st_size > 0


def test_bad_options_are_user_errors(setup):
    model, _, cost = setup
    with pytest.raises(UserError, match="--clock"):
        ValidateOptions(model, cost, WORKLOAD, clock="gpu")
    with pytest.raises(UserError, match="no such file"):
        run_validation(ValidateOptions(model, cost.with_name("missing.json"), WORKLOAD))


def test_noise_floor_and_overlap_measure_what_they_say():
    from servelab.core.plan import StepShape
    from servelab.trace.recorder import StepRecord

    def rec(iid, start, dur, rows=2):
        return StepRecord(iid, start, dur, StepShape(num_decodes=rows, decode_context_sum=100), (), 0, 0, (), ())

    steps = [rec(0, 0, 1.0), rec(0, 1, 1.1), rec(0, 2, 0.9)]
    assert noise_floor(steps)["median"] == pytest.approx(0.1)
    assert sim_overlap(steps) is None
    two = [rec(0, 0.0, 2.0), rec(1, 1.0, 2.0)]  # overlap 1 s of 4 busy instance-seconds -> 2/4
    assert sim_overlap(two) == pytest.approx(0.5)


def test_fmt_s_picks_the_unit():
    assert fmt_s(4978.067) == "4,978 s" and fmt_s(0.0123) == "12.3 ms" and fmt_s(2e-5) == "20 us"
