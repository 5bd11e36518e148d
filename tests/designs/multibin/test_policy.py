"""The multibin policy and router on small traces: bins never mix, every request served once, padded batches."""

import numpy as np
import pytest

from servelab.designs.multibin.binning import uniform_edges
from servelab.designs.multibin.queue_sim import simulate_batches
from servelab.designs.multibin.service_models import LinearServiceModel, LinearStepCost
from servelab.cluster.config import ClusterConfig, InstanceGroup, single_instance
from servelab.core.instance import InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.plan import StepResult
from servelab.core.policy import POLICIES, ROUTERS
from servelab.core.registry import RegistryError
from servelab.core.request import Request, RequestSpec
from servelab.simulator import simulate

PARAMS = dict(batch_size=4, num_bins=3, boundaries="explicit", edges=(10.0, 20.0), max_wait_s=5.0)


def _trace(n=60, seed=0, rate=2.0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    outputs = rng.integers(1, 30, n)
    return [RequestSpec(i, float(a), 4, int(o)) for i, (a, o) in enumerate(zip(arrivals, outputs))]


def _drive(policy, specs, *, max_steps=100_000):
    """Minimal hand loop: arrivals then steps of constant duration 1, until everything finishes."""
    rt = InstanceRuntime(0, KVCacheConfig(block_size=4, num_gpu_blocks=4096))
    pending, now, steps = list(specs), 0.0, []
    for _ in range(max_steps):
        while pending and pending[0].arrival_time_s <= now:
            req = Request(pending.pop(0))
            rt.add(req)
            policy.on_arrival(now, req)
        plan = policy.schedule(now, rt)
        if plan.is_empty:
            if not pending and rt.is_idle:
                return steps
            wake = policy.next_wakeup_s(now)
            now = min(x for x in (pending[0].arrival_time_s if pending else None, wake) if x is not None)
            continue
        applied = rt.apply(plan, now)
        for req in applied.rejected:
            policy.on_finish(now, req)
        batch = applied.batch
        if not batch:
            continue
        steps.append((plan, [r.spec for r in batch]))
        now += 1.0
        out = rt.complete(plan, batch, StepResult(1.0), now)
        for req in out.finished:
            policy.on_finish(now, req)
    raise AssertionError("did not finish")


def test_policy_batches_never_mix_bins_and_serve_everyone_once():
    specs = _trace()
    policy = POLICIES.create("multibin", PARAMS)
    steps = _drive(policy, specs)
    edges = uniform_edges(0, 30, 3)
    served = [rid for b in policy.served_batches for rid in b.member_ids]
    assert sorted(served) == list(range(len(specs)))
    for batch in policy.served_batches:
        assert {edges.bin_of(specs[i].num_output_tokens) for i in batch.member_ids} == {batch.bin_index}
        assert len(batch.member_ids) <= 4
    # padded: a batch's prefill step is dense and decode steps keep the batch's full row count
    for plan, _ in steps:
        assert plan.padding is not None and plan.padding.num_rows >= len(plan.request_ids)


def test_policy_holds_instance_until_longest_member_finishes():
    specs = [RequestSpec(i, 0.0, 4, n) for i, n in enumerate((3, 9, 12, 15))]  # bin 0 (3, 9) and bin 1 (12, 15)
    policy = POLICIES.create("multibin", dict(PARAMS, batch_size=2))
    steps = _drive(policy, specs)
    ids = [set(p.request_ids) for p, _ in steps]
    # 9 steps for the first batch (prefill + 8 decodes), then 15 for the second: no overlap
    assert len(steps) == 9 + 15
    assert all(s <= {0, 1} for s in ids[:9]) and all(s <= {2, 3} for s in ids[9:])


def test_policy_rejects_what_can_never_fit():
    policy = POLICIES.create("multibin", dict(PARAMS, batch_size=1))
    rt = InstanceRuntime(0, KVCacheConfig(block_size=4, num_gpu_blocks=4, watermark=0.0))
    req = Request(RequestSpec(0, 0.0, 8, 20))
    rt.add(req)
    policy.on_arrival(0.0, req)
    plan = policy.schedule(0.0, rt)
    assert plan.reject and plan.reject[0][0] == 0 and "KV blocks" in plan.reject[0][1]


def test_bad_config_is_a_clear_error():
    with pytest.raises(RegistryError, match="edges"):
        POLICIES.create("multibin", dict(boundaries="explicit", num_bins=3, edges="5"))
    with pytest.raises(RegistryError, match="boundaries"):
        POLICIES.create("multibin", dict(boundaries="magic"))


def test_online_boundaries_learn_from_completions():
    specs = [RequestSpec(i, 0.0, 4, 100 + i % 50) for i in range(64)]
    policy = POLICIES.create("multibin", dict(batch_size=4, num_bins=2, boundaries="online", lmin=1, lmax=1000,
                                              online_warmup=16, online_refit_every=16, max_wait_s=1.0))
    _drive(policy, specs)
    assert policy.edges.num_refits >= 1 and 100 <= policy.edges.edges.inner[0] <= 150


@pytest.mark.parametrize("servers", [1, 2])
def test_token_level_matches_queue_simulator(servers):
    specs = _trace(n=120, seed=4, rate=0.5)
    tokens = np.array([s.num_output_tokens for s in specs])
    arrivals = np.array([s.arrival_time_s for s in specs])
    model = LinearServiceModel(0.2, 0.1)
    if servers == 1:
        cluster = single_instance("multibin", policy_params=PARAMS)
    else:
        cluster = ClusterConfig(groups=(InstanceGroup(count=2, policy="multibin_replica"),), router="multibin",
                                router_params=PARAMS)
    res = simulate(specs, cluster, cost_model=LinearStepCost.from_linear(model))
    assert res.conserved and all(r.status.name == "FINISHED" for r in res.requests)
    fast = simulate_batches(model.request_time_s(tokens), tokens, arrivals, uniform_edges(0, 30, 3), 4,
                            num_servers=servers, max_wait_s=5.0)
    assert len(specs) / res.makespan_s == pytest.approx(fast.throughput_per_s, rel=1e-6)


def test_router_dispatches_whole_batches_to_idle_instances():
    specs = _trace(n=80, seed=5, rate=4.0)
    cluster = ClusterConfig(groups=(InstanceGroup(count=3, policy="multibin_replica"),), router="multibin",
                            router_params=PARAMS)
    from servelab.simulator.run import Simulation

    sim = Simulation(specs, cluster, cost_model=LinearStepCost(0.3, 0.1))
    res = sim.run()
    assert res.conserved
    edges = uniform_edges(0, 30, 3)
    placed = [rid for _, b in sim.router.dispatched for rid in b.member_ids]
    assert sorted(placed) == list(range(len(specs)))
    for _, batch in sim.router.dispatched:
        assert {edges.bin_of(specs[i].num_output_tokens) for i in batch.member_ids} == {batch.bin_index}
    ran = [b for inst in sim.instances for b in inst.policy.served_batches]
    assert sorted(map(sorted, ran)) == sorted(sorted(b.member_ids) for _, b in sim.router.dispatched)
    assert len({iid for iid, _ in sim.router.dispatched}) > 1
    assert ROUTERS.get("multibin").name == "multibin"
