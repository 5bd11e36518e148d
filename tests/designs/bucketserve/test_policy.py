"""The BucketServe policy: bucket batches are homogeneous prefills (ragged by default, padded
on request), online work first, memory-safe under pressure with Eq. 5 counted once, N_max
capped by the step limit, P/D through the distserve router, and the monitor reports."""

from __future__ import annotations

from simkit import ToyCostModel, random_workload

from servelab.cluster.config import ClusterConfig, InstanceGroup, single_instance
from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.plan import StepResult
from servelab.core.request import Request, RequestSpec, ServiceClass
from servelab.designs.bucketserve import controller
from servelab.designs.bucketserve.policy import BucketServeConfig, BucketServePolicy
from servelab.simulator import Simulation


def _runtime(num_blocks=4096, role="mixed", max_batch_tokens=16384, max_num_seqs=64):
    return InstanceRuntime(0, KVCacheConfig(16, num_blocks), InstanceLimits(max_batch_tokens, max_num_seqs), role)


def _add(rt, policy, rid, prompt, t=0.0, output=8, cls=ServiceClass.ONLINE):
    req = Request(RequestSpec(rid, t, prompt, output, service_class=cls))
    rt.add(req)
    policy.on_arrival(t, req)
    return req


def _step(rt, policy, now_s):
    plan = policy.schedule(now_s, rt)
    applied = rt.apply(plan, now_s)
    out = rt.complete(plan, applied.batch, StepResult(0.01), now_s + 0.01)
    policy.on_step_done(now_s + 0.01, plan, StepResult(0.01), applied.shape)
    for req in out.finished:
        policy.on_finish(now_s, req)
    return plan


def test_bucket_batch_is_homogeneous_ragged_or_padded():
    # N_max is capped at 4 rows; 8 queued requests, 6 of them short: the bucket splits and the
    # batch comes from the bucket of the oldest request (3000 tokens), without the short ones
    for padded in (False, True):
        rt, policy = _runtime(max_num_seqs=4), BucketServePolicy(BucketServeConfig(padded=padded))
        for i, p in enumerate([3000, 40, 60, 80, 100, 120, 90, 3500]):
            _add(rt, policy, i, p, t=0.001 * i)
        plan = policy.schedule(0.0, rt)
        assert policy.monitor.num_splits >= 1
        assert plan.request_ids == (0, 7)
        if padded:
            assert plan.padding is not None and plan.padding.num_rows == 2 and plan.padding.row_tokens == 3500
        else:
            assert plan.padding is None  # vLLM >= 0.4 runs the bucket as one ragged batch


def test_n_max_is_capped_by_the_step_limit():
    # padded, step limit 8192: the merged bucket's rows would be 3500 tokens long, so one batch
    # runs at most 2 rows; 6 queued requests are "more than one batch" and the bucket splits.
    # Without the cap N_max is 64 rows (memory) and ADJUSTBUCKETS merges everything into one.
    splits = {}
    for cap in (True, False):
        rt = _runtime(max_batch_tokens=8192)
        policy = BucketServePolicy(BucketServeConfig(padded=True, cap_n_max=cap))
        for i, p in enumerate([3500, 40, 60, 80, 100, 120]):
            _add(rt, policy, i, p, t=0.001 * i)
        plan = policy.schedule(0.0, rt)
        splits[cap] = policy.monitor.num_splits
        assert plan.padding.num_rows * plan.padding.row_tokens <= 8192
    assert splits[True] >= 1 and splits[False] == 0
    assert controller.estimate_n_max(100, 10_000, 16, 1.0, 256, step_rows=2) == 2
    assert controller.estimate_n_max(100, 10_000, 16, 1.0, 256) == 256


def test_online_buckets_before_offline():
    rt, policy = _runtime(), BucketServePolicy()
    _add(rt, policy, 0, 100, t=0.0, cls=ServiceClass.OFFLINE)
    _add(rt, policy, 1, 200, t=1.0, cls=ServiceClass.ONLINE)
    plan = policy.schedule(1.0, rt)
    assert plan.request_ids == (1,)


def test_offline_sjf_and_ljf_inside_bucket():
    for order, expected in (("sjf", (0, 1, 2)), ("ljf", (2, 1, 0))):
        rt = _runtime()
        policy = BucketServePolicy(BucketServeConfig(offline_order=order))
        for i, p in enumerate([50, 100, 150]):
            _add(rt, policy, i, p, cls=ServiceClass.OFFLINE)
        assert policy.schedule(0.0, rt).request_ids == expected


def test_batch_respects_safe_memory_with_eq5_counted_once():
    # 100 free blocks of 16 tokens (the instance's 10% reserve is already outside them): six
    # 256-token prompts (16 blocks each) fit; taking Eq. 5's 10% again leaves 90 blocks: five
    for fraction, expected in ((1.0, 6), (0.9, 5)):
        rt, policy = _runtime(num_blocks=100), BucketServePolicy(BucketServeConfig(safe_fraction=fraction))
        for i in range(8):
            _add(rt, policy, i, 256, t=0.001 * i, output=4)
        assert len(policy.schedule(0.0, rt).request_ids) == expected


def test_oversized_request_rejected_with_reason():
    rt, policy = _runtime(num_blocks=50), BucketServePolicy(BucketServeConfig(max_len=2048))
    _add(rt, policy, 0, 3000)
    plan = policy.schedule(0.0, rt)
    assert plan.reject and "max_len" in plan.reject[0][1]


def test_never_out_of_memory_under_pressure():
    # a small KV pool forces preemptions; every plan must apply (PlanError otherwise)
    rt, policy = _runtime(num_blocks=64), BucketServePolicy()
    reqs = [_add(rt, policy, i, 100 + 17 * i, t=0.0, output=300) for i in range(6)]
    now = 0.0
    for _ in range(5000):
        if rt.is_idle:
            break
        _step(rt, policy, now)
        rt.check_invariants()
        now += 0.01
    assert all(r.is_finished for r in reqs)
    assert rt.num_preemptions > 0


def test_simulated_coupled_and_pd_runs_finish_every_request():
    wl = random_workload(200, seed=3, rate=80, max_prompt=3000, max_output=200)
    coupled = Simulation(wl, single_instance("bucketserve", gpu="A100-40GB", model="Llama-2-13B", tp=2),
                         cost_model=ToyCostModel())
    res = coupled.run()
    assert res.conserved and all(r.status.value == "finished" for r in res.requests)
    assert res.collector.steps.num_padding_tokens.sum() == 0  # ragged: no padding computed
    report = coupled.instances[0].policy.report()
    assert report["num_decisions"] > 0 and report["num_arrivals"] == 200
    assert report["num_prefill_batches"] > 0
    assert 0 < report["padding_waste_frac"] < 1  # Eq. 2 on the bucket batches' rectangles
    padded = Simulation(wl, single_instance("bucketserve", policy_params={"padded": True}, gpu="A100-40GB",
                                            model="Llama-2-13B", tp=2), cost_model=ToyCostModel()).run()
    assert padded.conserved and padded.collector.steps.num_padding_tokens.sum() > 0

    group = dict(policy="bucketserve", gpu="A100-40GB", model="Llama-2-13B", tp=2)
    pd = ClusterConfig(groups=(InstanceGroup(role="prefill", **group), InstanceGroup(role="decode", **group)),
                       router="distserve")
    sim = Simulation(wl, pd, cost_model=ToyCostModel())
    res = sim.run()
    assert res.conserved and all(r.status.value == "finished" for r in res.requests)
    assert all(r.num_transfers == int(r.spec.num_output_tokens > 1) for r in res.requests)
    for inst in sim.instances:
        assert inst.runtime.blocks.num_free_gpu_blocks == inst.runtime.blocks.num_gpu_blocks


def test_a_burst_of_hand_offs_that_fills_the_decode_cache_does_not_strand_it():
    """Offline reproduction, all at t=0: the prefill worker's KV hand-offs filled every block of
    the decode worker while nothing ran there, and the watermark kept each from joining the batch
    (980 of 1,100 requests ended stranded). The decode step now runs them, or gives the last
    one's KV up, as vllm does."""
    from servelab.designs.bucketserve.reproduce import experiments as ex

    specs = [RequestSpec(i, 0.0, 60, 50) for i in range(1100)]
    res = Simulation(specs, ex.cluster_for("bucketserve", 8, ex.Setting())).run()
    assert res.conserved
    assert all(r.status.value == "finished" for r in res.requests), \
        sorted({r.finish_reason for r in res.requests if r.status.value != "finished"})
