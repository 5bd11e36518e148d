"""A plan names the decode group by reference (issue 29): a decode step of a steady running set
allocates the same whatever its size, instead of copying every member's id and request.

With tens of instances each member's objects are cold in the caches, and touching ~100 of them
per step (the plan's id tuple, the set that checked it, the list of requests) is what made a
token cost more on many instances (docs/benchmarks/scale_diagnosis.md). The readers that want
every row (a trace, a move, the engine) still get them while the step is in flight.
"""

from __future__ import annotations

import tracemalloc

import pytest

from servelab.core.instance import InstanceLimits, InstanceRuntime, PlanError
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.plan import StepPlan, StepResult
from servelab.core.policy import POLICIES
from servelab.core.request import Request, RequestSpec


def _steady(n: int) -> tuple[InstanceRuntime, object, list[Request]]:
    """``n`` requests prefilled on one instance with a decode group, every one a group member."""
    rt = InstanceRuntime(0, KVCacheConfig(block_size=16, num_gpu_blocks=20_000), InstanceLimits(8192, 512))
    rt.enable_decode_group()
    policy = POLICIES.create("vllm", {})
    reqs = [Request(RequestSpec(i, 0.0, 20, 1000)) for i in range(n)]
    for req in reqs:
        rt.add(req)
        policy.on_arrival(0.0, req)
    now = 0.0
    while rt.group.n < n:  # the prefill step, then the first decode: every request joins
        now += 0.01
        _step(rt, policy, now)
    return rt, policy, reqs


def _step(rt, policy, now):
    plan = policy.schedule(now, rt)
    applied = rt.apply(plan, now)
    rt.complete(plan, applied.rows, StepResult(0.01), now + 0.01)
    return plan, applied


def _step_bytes(n: int) -> int:
    """Peak bytes allocated by one decode step (plan, apply, complete) of ``n`` steady decoders,
    at a step where no member needs a new KV block (the group's block appends aside)."""
    rt, policy, _ = _steady(n)
    now = 1.0
    while rt.group.blocks_needed_next():  # a step where no member starts a new KV block
        now += 0.01
        _step(rt, policy, now)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _step(rt, policy, now + 0.01)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_plan_of_the_steady_group_copies_none_of_its_members():
    rt, policy, reqs = _steady(64)
    plan = policy.schedule(2.0, rt)
    assert plan.request_ids == () and plan.group is rt.group.rows()  # before: the 64 ids, copied every step
    assert plan.num_rows == 64 and plan.total_tokens == 64 and not plan.is_empty
    assert policy.schedule(2.0, rt).group is plan.group  # the same object while the members stay
    applied = rt.apply(plan, 2.0)
    assert applied.rows == [] and applied.group_rows == 64 and applied.num_rows == 64
    assert applied.batch == reqs and plan.all_request_ids == tuple(range(64))  # every row, while in flight
    rt.complete(plan, applied.rows, StepResult(0.01), 2.01)
    assert all(r.num_generated_tokens == 2 for r in rt.running)  # the prefill's token and this one


def test_a_decode_step_allocates_the_same_at_any_batch_size():
    small, large = _step_bytes(40), _step_bytes(320)
    # before: the ids (twice), their set and the request list grew ~60 B a member: +16 KB here
    assert large - small < 1_000, (small, large)


def test_stale_group_rows_are_refused():
    rt, policy, reqs = _steady(40)
    plan = policy.schedule(2.0, rt)
    rt.abort(reqs[5].request_id, "client gone", 2.0)  # a member leaves: the group's version moves on
    with pytest.raises(PlanError, match="decode group rows"):
        rt.apply(plan, 2.0)
    with pytest.raises(RuntimeError, match="read after the group changed"):
        plan.all_request_ids


def test_a_plan_that_names_a_member_twice_is_refused():
    rt, policy, _ = _steady(40)
    plan = policy.schedule(2.0, rt)
    with pytest.raises(PlanError, match="scheduled twice"):
        rt.apply(StepPlan((3,), (1,), group=plan.group), 2.0)
