"""vLLM's scheduler on a P/D decode instance: hand-offs that hold their KV, and swapped requests.

Found by the BucketServe reproduction (issue 32): DistServe's offline throughput on Mixed
swung 413-1,263 output tok/s over five seeds because its decode instance idled. Three causes,
each pinned here on a hand-built state:

* a hand-off that arrived with its KV was charged the watermark a second time when admitted,
  so it waited holding its KV while running requests ate the watermark;
* swapped requests came back one at a time, and only when nothing else ran;
* incoming KV kept landing while swapped requests waited, so they could not come back.
"""

from __future__ import annotations

from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.plan import StepPlan, StepResult
from servelab.core.policy import POLICIES
from servelab.core.request import Request, RequestSpec, RequestStatus


def _prefill(rt: InstanceRuntime, rid: int, prompt: int, output: int = 50) -> Request:
    req = Request(RequestSpec(rid, 0.0, prompt, output))
    rt.add(req)
    plan = StepPlan((rid,), (prompt,))
    rt.apply(plan, 0.0)
    rt.complete(plan, [req], StepResult(duration_s=0.01), 0.01)
    return req


def _runtime(num_gpu_blocks=100, num_cpu_blocks=0, watermark=0.1) -> InstanceRuntime:
    kv = KVCacheConfig(block_size=16, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                       watermark=watermark)
    return InstanceRuntime(0, kv, InstanceLimits(4096, 64), "decode")


def test_a_hand_off_holding_its_kv_is_not_charged_the_watermark_again():
    rt = _runtime()  # 100 blocks, watermark 10
    _prefill(rt, 0, 1280)  # running, 80 blocks
    holder = _prefill(rt, 1, 160)  # 10 blocks, then it leaves and lands again with its KV
    rt.detach(1)
    rt.reattach(1)
    holder.status = RequestStatus.TRANSFERRING
    rt.add(holder)
    assert holder in rt.waiting and rt.blocks.num_free_gpu_blocks == 10
    plan = POLICIES.create("vllm", {}).schedule(1.0, rt)
    assert set(plan.request_ids) == {0, 1}, plan  # before: 1 waited (1 block + watermark 10 > 10 free)


def test_swapped_requests_come_back_together_while_others_decode():
    rt = _runtime(num_gpu_blocks=200, num_cpu_blocks=200, watermark=0.01)
    for rid in range(3):
        _prefill(rt, rid, 320)  # 20 blocks each (+1 for the next token)
    rt.apply(StepPlan(swap_out_ids=(1, 2)), 0.02)
    assert len(rt.swapped) == 2
    plan = POLICIES.create("vllm", {"preemption": "swap"}).schedule(1.0, rt)
    assert plan.request_ids == (0,)
    assert set(plan.swap_in_ids) == {1, 2}, plan  # before: none while request 0 ran, then one at a time


def test_no_swap_in_beyond_the_free_blocks_and_watermark():
    rt = _runtime(num_gpu_blocks=64, num_cpu_blocks=200, watermark=0.1)  # watermark 6 blocks
    for rid in range(3):
        _prefill(rt, rid, 320)  # 20 blocks each: 60 of 64
    rt.apply(StepPlan(swap_out_ids=(1, 2)), 0.02)  # 24 free
    plan = POLICIES.create("vllm", {"preemption": "swap"}).schedule(1.0, rt)
    assert plan.swap_in_ids == (1,), plan  # 21 + 6 > 24 - 1 after the first: the second waits
    rt.apply(plan, 1.0)  # feasible: the runtime would raise otherwise


def test_incoming_kv_waits_while_a_swapped_request_waits_to_come_back():
    rt = _runtime(num_gpu_blocks=200, num_cpu_blocks=200, watermark=0.01)
    for rid in range(2):
        _prefill(rt, rid, 320)
    assert rt.can_reserve(320)
    rt.apply(StepPlan(swap_out_ids=(1,)), 0.02)
    assert not rt.can_reserve(320)  # before: it landed and kept request 1 out
    rt.apply(StepPlan(swap_in_ids=(1,)), 0.03)
    assert rt.can_reserve(320)
