"""UELLM: SLO-ODBS order and grouping over predicted outputs, padded KV, held batches."""

from __future__ import annotations

import numpy as np
import pytest
from simkit import ToyCostModel

from servelab.baselines.static import StaticBatchingPolicy, StaticConfig
from servelab.baselines.uellm import UELLMConfig, UELLMPolicy, first_group, sort_key, with_predictions
from servelab.cluster.config import single_instance
from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.registry import RegistryError
from servelab.core.policy import POLICIES
from servelab.core.request import SLO, Request, RequestSpec
from servelab.simulator import Simulation


def _req(rid, prompt, output, predicted=None, t=0.0, slo=None):
    return Request(RequestSpec(rid, t, prompt, output, predicted_output_tokens=predicted, slo=slo))


def _runtime(num_blocks):
    return InstanceRuntime(0, KVCacheConfig(16, num_blocks), InstanceLimits(16384, 256), "mixed")


def test_order_is_slo_then_predicted_output():
    cfg = UELLMConfig()
    a, b = _req(0, 10, 500, predicted=40), _req(1, 10, 20, predicted=300)
    assert sort_key(a, cfg) < sort_key(b, cfg)  # the prediction, not the true length, orders
    tight = _req(2, 10, 50, predicted=50, slo=SLO(ttft_s=0.5, tpot_s=0.01))
    loose = _req(3, 10, 50, predicted=50, slo=SLO(ttft_s=30.0, tpot_s=0.1))
    assert sort_key(tight, cfg) < sort_key(loose, cfg)
    # a x (0.5 + 0.01 x 50) + b x 50
    assert sort_key(tight, cfg)[0] == pytest.approx(1.0 * 1.0 + 0.3 * 50)


def test_group_closes_at_row_cap_or_padding_budget():
    cfg = UELLMConfig(batch_size=3, pad_budget_tokens=1000, pad_margin=1.0)
    reqs = [_req(i, 10, p, predicted=p) for i, p in enumerate([100, 120, 130, 140])]
    assert [r.request_id for r in first_group(reqs, cfg)] == [0, 1, 2]  # row cap
    # 100 -> 600 adds (600 - 100) x 2 = 1000 <= 1000; then 600 -> 1200 adds 600 x 3 > 1000
    reqs = [_req(i, 10, p, predicted=p) for i, p in enumerate([100, 600, 1200, 50])]
    assert [r.request_id for r in first_group(reqs, cfg)] == [0, 1]  # closed: 50 waits for the next batch


def test_padded_kv_limits_the_batch_where_real_kv_would_not():
    # 60 blocks of 16 tokens = 960 tokens; rows of (prompt, output): (400, 40) and 3 x (20, 20)
    specs = [(400, 40), (20, 20), (20, 20), (20, 20)]
    sizes = {}
    for padded in (True, False):
        rt, policy = _runtime(60), StaticBatchingPolicy(StaticConfig(batch_size=4, padded_kv=padded))
        for i, (p, o) in enumerate(specs):
            req = _req(i, p, o, t=0.001 * i)
            rt.add(req)
            policy.on_arrival(0.0, req)
        sizes[padded] = len(policy.schedule(1.0, rt).request_ids)
    # padded: 2 rows x blocks(440) = 2 x 28 = 56 <= 60, 3 rows = 84 > 60; real: 28 + 3 x 3 = 37
    assert sizes == {True: 2, False: 4}


def test_uellm_batches_by_prediction_and_holds_padded_batches():
    rng = np.random.default_rng(0)
    specs = [RequestSpec(i, 0.0, int(rng.integers(10, 400)), int(rng.integers(1, 300))) for i in range(60)]
    specs = with_predictions(specs, 0.0, rng)
    sim = Simulation(specs, single_instance("uellm", policy_params={"batch_size": 8}), cost_model=ToyCostModel())
    res = sim.run()
    assert res.conserved and all(r.status.value == "finished" for r in res.requests)
    assert res.collector.steps.num_padding_tokens.sum() > 0
    # oracle predictions, all at t=0: request 0 runs alone (the instance was free at its
    # arrival); the next batch holds the 8 shortest outputs of the rest
    by_start: dict[float, list[int]] = {}
    for r in res.requests:
        by_start.setdefault(r.token_times_s[0], []).append(r.spec.num_output_tokens)
    starts = sorted(by_start)
    assert len(by_start[starts[0]]) == 1
    rest = sorted(s.num_output_tokens for s in specs[1:])
    assert sorted(by_start[starts[1]]) == rest[:8]


def test_with_predictions_is_seeded_and_bounded():
    specs = [RequestSpec(i, 0.0, 10, 5 + 10 * i) for i in range(200)]
    oracle = with_predictions(specs, 0.0, np.random.default_rng(1))
    assert [s.predicted_output_tokens for s in oracle] == [s.num_output_tokens for s in specs]
    a = with_predictions(specs, 0.3, np.random.default_rng(1))
    b = with_predictions(specs, 0.3, np.random.default_rng(1))
    assert [s.predicted_output_tokens for s in a] == [s.predicted_output_tokens for s in b]
    ratio = np.array([s.predicted_output_tokens / s.num_output_tokens for s in a[20:]])
    assert 0.7 < np.mean(np.abs(np.log(ratio)) < np.log(1.5)) < 0.95
    with pytest.raises(ValueError):
        with_predictions(specs, -1.0, np.random.default_rng(1))


def test_bad_parameters_are_named():
    with pytest.raises(RegistryError, match="pad_margin"):
        POLICIES.create("uellm", {"pad_margin": "-1"})
    assert isinstance(POLICIES.create("uellm", {"batch_size": "4"}), UELLMPolicy)
