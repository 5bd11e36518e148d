"""Every registered policy, driven by the simulator on small workloads, must keep the contract:
feasible plans (the runtime raises PlanError otherwise), every request finishes or is rejected
with a reason (an abort means the policy stranded it: a failure), and the KV blocks all
return to the free list."""

import pytest
from simkit import ToyCostModel, random_workload

from servelab.cluster.config import single_instance
from servelab.core.policy import POLICIES
from servelab.core.request import RequestStatus
from servelab.simulator import Simulation

SINGLE_INSTANCE_POLICIES = [n for n in POLICIES.names() if not getattr(POLICIES.get(n), "needs_cluster", False)]


@pytest.mark.parametrize("policy", SINGLE_INSTANCE_POLICIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_contract(policy, seed):
    wl = random_workload(150, seed=seed, rate=60, max_prompt=2000, max_output=400)
    sim = Simulation(wl, single_instance(policy, gpu="A100-40GB", model="Llama-2-13B"), cost_model=ToyCostModel())
    res = sim.run()
    assert res.conserved, f"unfinished: {res.unfinished[:10]}"
    assert len(res.requests) == len(wl)
    for req in res.requests:
        assert req.status in (RequestStatus.FINISHED, RequestStatus.REJECTED), (req.request_id, req.status,
                                                                                 req.finish_reason)
        assert req.finish_reason, req.request_id
        if req.status is RequestStatus.FINISHED:
            assert len(req.token_times_s) == req.spec.num_output_tokens
    assert sum(r.status is RequestStatus.FINISHED for r in res.requests) > 0
    for inst in sim.instances:
        inst.runtime.check_invariants()
        assert inst.runtime.blocks.num_free_gpu_blocks == inst.runtime.blocks.num_gpu_blocks


def test_static_batches_are_padded_and_held():
    wl = random_workload(64, seed=5, rate=1000)
    sim = Simulation(wl, single_instance("static", policy_params={"batch_size": 8}), cost_model=ToyCostModel())
    res = sim.run()
    assert res.conserved
    steps = res.collector.steps
    assert steps.num_padding_tokens.sum() > 0


def test_sarathi_finishes_a_prompt_left_with_one_token():
    """A chunk boundary can leave exactly one prompt token; it must still be scheduled."""
    from servelab.core.request import RequestSpec

    wl = [RequestSpec(0, 0.0, 513, 5), RequestSpec(1, 0.0, 300, 5)]
    sim = Simulation(wl, single_instance("sarathi", policy_params={"token_budget": 512}), cost_model=ToyCostModel())
    res = sim.run()
    assert [r.status.value for r in res.requests] == ["finished", "finished"]
