"""DistServe-style prefill/decode disaggregation.

Arrivals go to the prefill instance with the least outstanding work; each request is handed
off once its prompt is computed and its first token emitted, and continues on the decode
instance with the most free KV blocks (its KV crosses the cluster link on the way).
"""

from __future__ import annotations

from typing import Any

from servelab.cluster.config import ClusterConfig
from servelab.cluster.presets import pd_cluster, register_preset
from servelab.core.policy import ROUTERS, ClusterState, InstanceState, Placement, Router
from servelab.core.request import Request
from servelab.costmodel.links import LinkSpec


@ROUTERS.register("distserve")
class DistServeRouter(Router):
    def __init__(self) -> None:
        self._had_both = False  # both pools existed once: an empty pool now means failures

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        prefill = cluster.instances_with_role("prefill")
        decode = cluster.instances_with_role("decode")
        self._had_both |= bool(prefill and decode)
        if not (prefill and decode):
            if not self._had_both:
                return [Placement(request, None, "distserve router needs prefill and decode instances")]
            # a pool lost every instance: the survivors serve whole requests (degraded, not stopped)
            prefill = prefill or decode
            if not prefill:
                return [Placement(request, None, "distserve router: every instance failed")]
        target = min(prefill, key=lambda inst: (inst.num_outstanding_tokens, inst.instance_id))
        return [Placement(request, target.instance_id)]

    def handoff_point(self, request: Request, instance: InstanceState) -> int | None:
        return request.num_prompt_tokens if instance.role == "prefill" else None

    def handoff_target(self, now_s: float, request: Request, source_id: int, cluster: ClusterState) -> int:
        decode = cluster.instances_with_role("decode")
        if not decode:  # every decode instance failed: the request finishes where it is
            return source_id
        target = max(decode, key=lambda inst: (inst.blocks.num_free_gpu_blocks - len(inst.waiting), -inst.instance_id))
        return target.instance_id


@register_preset("distserve")
def _distserve(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """DistServe: vLLM scheduling on both pools; ``num_prefill`` sizes the prefill pool."""
    return pd_cluster("distserve", "vllm", num_instances, params, group, link)
