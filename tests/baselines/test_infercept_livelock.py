"""InferCept on a tiny KV cache (issue 22, item 1): the run used to go on forever.

Llama-2-7B on an A100-40GB with 63% of memory reserved (287 blocks), a burst of long
requests. Requests swapped back in wait in the queue with their KV; a request preempted by
recompute is put at the queue's head; Sarathi stopped at that head (it cannot fit) and ran
the KV holders behind it only when nothing was running, while the one running request's
next chunk could not get its blocks either. The plan was empty forever, and InferCept's
swap-in poll re-armed every 0.05 s, so the event heap never emptied. These runs have the
watchdog off: they must end because the scheduler never stalls, not because it was stopped.
"""

from __future__ import annotations

import collections
import signal

import pytest

from servelab import api
from servelab.cluster.watchdog import WatchdogConfig

TINY = {"gpu": "A100-40GB", "model": "Llama-2-7B", "gpu_memory_utilization": 0.37}


def _run(policy: str, n: int, instances: int, swap_space_gb: float = 0.0):
    wl = api.load_workload(f"burst:n={n},prompt=uniform(200,2500),output=uniform(50,1500)")
    hw = api.HardwareChoice(num_instances=instances, swap_space_gb=swap_space_gb, **TINY)

    def hang(signum, frame):
        raise TimeoutError(f"{policy} x{instances} on {n} requests ran for 30 s without ending")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        return api.run_simulation(wl, policy, hw, watchdog=WatchdogConfig(enabled=False))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("policy,n,instances,swap", [("infercept", 20, 1, 0.0),
                                                      ("infercept:preemption=swap", 100, 2, 4.0)])
def test_infercept_on_a_tiny_kv_cache_ends_with_every_request_finished(policy, n, instances, swap):
    out = _run(policy, n, instances, swap)
    assert collections.Counter(r.status.value for r in out.result.requests) == {"finished": n}
    assert out.result.conserved


def test_swapped_back_requests_run_while_a_running_chunk_cannot_grow():
    """The state the livelock reached, built by hand: one running request whose next chunk
    needs more blocks than are free, a recompute-preempted head that cannot fit, and KV
    holders (landed swap-ins) behind it. Sarathi's plan runs the holders."""
    from servelab.core.instance import InstanceRuntime
    from servelab.core.kv_blocks import KVCacheConfig
    from servelab.core.policy import POLICIES
    from servelab.core.request import Request, RequestSpec, RequestStatus

    rt = InstanceRuntime(0, KVCacheConfig(num_gpu_blocks=20, block_size=16))
    policy = POLICIES.create("sarathi", {"token_budget": 512})
    running = Request(RequestSpec(0, 0.0, 200, 50))
    rt.add(running)
    rt.apply(_plan(0, 160), 0.0)  # 10 blocks, 40 prompt tokens left (3 blocks)
    holder = Request(RequestSpec(1, 0.0, 120, 50))
    rt.add(holder)
    rt.apply(_plan(1, 120), 0.0)  # 8 blocks
    rt.complete(_plan(1, 120), [holder], _result(), 0.1)
    rt.detach(1)
    rt.reattach(1)
    holder.status = RequestStatus.TRANSFERRING  # a swap-in landed: queued again with its KV
    rt.add(holder)
    head = Request(RequestSpec(2, 0.0, 300, 10))
    head.status = RequestStatus.PREEMPTED
    rt.add(head)
    rt.waiting.remove(head)
    rt.waiting.insert(0, head)  # where a recompute preemption puts it
    assert rt.blocks.num_free_gpu_blocks == 2
    plan = policy.schedule(1.0, rt)
    assert 1 in plan.request_ids, plan


def _plan(rid: int, n: int):
    from servelab.core.plan import StepPlan

    return StepPlan((rid,), (n,))


def _result():
    from servelab.core.plan import StepResult

    return StepResult(duration_s=0.01)
