"""AlignedServe's instances and its cluster preset.

Both pools run vLLM's continuous batching (AlignedServe is built on DistServe, whose
instances batch FCFS); on decode instances the ``alignedserve-decode`` policy is the same
loop without fast-forwarding decode runs, because the router decides after every
iteration (Algorithm 2) and must hear each one. Which requests an instance sees is the
router's work: the batches it releases from the buffers.

``wait_for_kv`` (the paper, Section 3.4: "the iteration is paused awaiting scheduling"):
while KV the router released to this instance is still crossing a link (reserved here, not
yet landed), the next iteration waits for it, so the requests join the very next
iteration. That wait is what GPU-prefetch-for-GPU shortens (NVLink from the buffer instead
of PCIe from the pool); without it a running batch never waits and prefetch cannot matter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from servelab.baselines.vllm import ContinuousBatchingPolicy, ContinuousConfig
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import register_preset
from servelab.core.plan import EMPTY_PLAN, StepPlan
from servelab.core.policy import POLICIES, InstanceState
from servelab.core.registry import RegistryError, coerce_param
from servelab.costmodel.links import LinkSpec
from servelab.designs.alignedserve.config import AlignedServeConfig

DEFAULT_POOL_GB = 800.0  # the paper's server: 800 GB of DRAM


@POLICIES.register("alignedserve-decode")
class AlignedServeDecodePolicy(ContinuousBatchingPolicy):
    """vLLM's loop, one iteration at a time (no decode runs, no decode group); with
    ``wait_for_kv`` no iteration starts while joining KV is in flight to this instance."""

    @dataclass(frozen=True)
    class Config(ContinuousConfig):
        wait_for_kv: bool = True

    stable_under_decode = False
    uses_decode_group = False

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        if self.config.wait_for_kv and state.reserved and state.num_running:
            return EMPTY_PLAN  # the landing transfer kicks this instance again
        return super().schedule(now_s, state)


@register_preset("alignedserve")
def _alignedserve(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """Prefill instances (``num_prefill``, half by default) under vLLM, decode instances under
    ``alignedserve-decode``, the ``alignedserve`` router, a host KV pool of ``pool_gb`` GB, the
    topology's links (NVLink inside a server, PCIe to the pool); the other parameters go to the
    router (AlignedServeConfig)."""
    if num_instances < 2:
        raise RegistryError(f"alignedserve needs at least 2 instances (prefill + decode), got {num_instances}")
    params = dict(params)
    num_prefill = coerce_param(params.pop("num_prefill", (num_instances + 1) // 2), int,
                               "preset 'alignedserve' parameter 'num_prefill'")
    pool_gb = coerce_param(params.pop("pool_gb", DEFAULT_POOL_GB), float, "preset 'alignedserve' parameter 'pool_gb'")
    if not 1 <= num_prefill < num_instances:
        raise RegistryError(f"alignedserve: num_prefill must be in [1, {num_instances - 1}], got {num_prefill}")
    keys = {f.name for f in dataclasses.fields(AlignedServeConfig)}
    unknown = sorted(set(params) - keys)
    if unknown:
        raise RegistryError(f"preset 'alignedserve' has no parameter {unknown[0]!r}; valid: "
                            f"{', '.join(sorted(keys | {'num_prefill', 'pool_gb'}))}")
    wait = coerce_param(params.get("wait_for_kv", True), bool, "preset 'alignedserve' parameter 'wait_for_kv'")
    return ClusterConfig(groups=(
        InstanceGroup(count=num_prefill, role="prefill", policy="vllm", **group),
        InstanceGroup(count=num_instances - num_prefill, role="decode",
                      policy="alignedserve-decode", policy_params={"wait_for_kv": wait}, **group),
    ), router="alignedserve", router_params=params, kv_pool_gb=pool_gb)
