"""vLLM <= 0.3's padded prefill (``padded=true``): one dense batch padded to its longest prompt,
whose rows x longest must fit the step limit; KV stays paged (the BucketServe comparison's
"both padded" DistServe, issue 32)."""

from __future__ import annotations

from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.policy import POLICIES
from servelab.core.request import Request, RequestSpec


def _runtime(prompts) -> InstanceRuntime:
    rt = InstanceRuntime(0, KVCacheConfig(block_size=16, num_gpu_blocks=1000), InstanceLimits(1024, 64), "prefill")
    for i, p in enumerate(prompts):
        rt.add(Request(RequestSpec(i, 0.0, p, 10)))
    return rt


def test_padded_prefill_pads_to_the_longest_and_caps_rows_x_longest():
    rt = _runtime([100, 300, 50, 200, 100])
    plan = POLICIES.create("vllm", {"padded": True}).schedule(0.0, rt)
    assert plan.request_ids == (0, 1, 2)  # a 4th row would make 4 x 300 > 1024
    assert (plan.padding.num_rows, plan.padding.row_tokens) == (3, 300)
    ragged = POLICIES.create("vllm", {}).schedule(0.0, _runtime([100, 300, 50, 200, 100]))
    assert ragged.request_ids == (0, 1, 2, 3, 4) and ragged.padding is None  # 750 summed tokens fit
