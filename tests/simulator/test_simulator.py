"""Simulator behaviour: conservation, determinism, fast-forward equivalence, P/D hand-offs."""

from dataclasses import replace

import numpy as np
import pytest
from simkit import ToyCostModel, random_workload

from servelab.cluster.config import ClusterConfig, InstanceGroup, single_instance
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator import simulate


def _token_times(result):
    return [np.array(r.token_times_s) for r in result.requests]


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_fast_forward_matches_step_by_step(policy):
    wl = random_workload(400, seed=1, rate=40)
    fast = simulate(wl, single_instance(policy), cost_model=ToyCostModel(), fast_forward=True)
    slow = simulate(wl, single_instance(policy), cost_model=ToyCostModel(), fast_forward=False)
    assert fast.conserved and slow.conserved
    for a, b in zip(_token_times(fast), _token_times(slow)):
        assert len(a) == len(b)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


def test_same_seed_same_run():
    wl = random_workload(300, seed=2)
    a = simulate(wl, single_instance("sarathi"), cost_model=ToyCostModel())
    b = simulate(wl, single_instance("sarathi"), cost_model=ToyCostModel())
    assert [r.token_times_s for r in a.requests] == [r.token_times_s for r in b.requests]


def test_every_request_gets_exactly_its_output_tokens():
    wl = random_workload(300, seed=3)
    res = simulate(wl, single_instance("vllm"), cost_model=ToyCostModel())
    assert len(res.requests) == 300
    assert sorted(r.request_id for r in res.requests) == list(range(300))
    for req in res.requests:
        assert req.status is RequestStatus.FINISHED
        assert len(req.token_times_s) == req.spec.num_output_tokens
        assert req.token_times_s[0] >= req.arrival_time_s
        assert np.all(np.diff(req.token_times_s) > 0)


def test_request_too_large_for_kv_is_rejected_with_reason():
    # Llama-2-7B on an A100-40GB holds far fewer than 10M tokens of KV
    wl = [RequestSpec(0, 0.0, 100, 10), RequestSpec(1, 0.1, 10_000_000, 10)]
    cluster = replace(single_instance("vllm", gpu="A100-40GB"), max_model_len=20_000_000)  # past the context check
    res = simulate(wl, cluster, cost_model=ToyCostModel())
    assert res.conserved
    ok, big = res.requests
    assert ok.status is RequestStatus.FINISHED
    assert big.status is RequestStatus.REJECTED and "KV blocks" in big.finish_reason


def test_memory_pressure_preempts_and_still_finishes_everything():
    wl = [RequestSpec(i, 0.0, 1500, 900) for i in range(40)]
    cl = single_instance("vllm", gpu="A100-40GB", model="Llama-2-13B")
    res = simulate(wl, cl, cost_model=ToyCostModel())
    assert res.conserved
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)
    assert sum(r.num_preemptions for r in res.requests) > 0


def test_swap_preemption_uses_host_pool():
    wl = [RequestSpec(i, 0.0, 1500, 900) for i in range(40)]
    cl = single_instance("vllm", gpu="A100-40GB", model="Llama-2-13B", host_kv_gb=64,
                         policy_params={"preemption": "swap"})
    res = simulate(wl, cl, cost_model=ToyCostModel())
    assert res.conserved
    assert sum(r.num_swaps for r in res.requests) > 0


def test_distserve_hands_every_request_to_a_decode_instance():
    wl = random_workload(200, seed=4)
    cl = ClusterConfig(groups=(InstanceGroup(count=2, role="prefill"), InstanceGroup(count=2, role="decode")),
                       router="distserve")
    res = simulate(wl, cl, cost_model=ToyCostModel())
    assert res.conserved
    multi = [r for r in res.requests if r.spec.num_output_tokens > 1]
    assert all(r.num_transfers == 1 for r in multi)
    assert all(r.instance_id in (2, 3) for r in multi)
    assert len(res.transfers) == len(multi)


def test_fast_forward_of_padded_static_batches_matches_step_by_step():
    wl = random_workload(200, seed=6, rate=30)
    cluster = single_instance("static", policy_params={"batch_size": 8})
    fast = simulate(wl, cluster, cost_model=ToyCostModel(), fast_forward=True)
    slow = simulate(wl, cluster, cost_model=ToyCostModel(), fast_forward=False)
    assert fast.conserved and slow.conserved
    for a, b in zip(_token_times(fast), _token_times(slow)):
        assert len(a) == len(b)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    f, s = fast.collector.steps, slow.collector.steps
    assert f.num_padding_tokens.sum() == s.num_padding_tokens.sum()
    assert len(f.duration_s) < len(s.duration_s)
