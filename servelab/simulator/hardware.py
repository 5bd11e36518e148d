"""Per-instance hardware model for the simulator: KV capacity, cost model, KV bytes per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.cluster.config import InstanceGroup
from servelab.core.kv_blocks import KVCacheConfig


@dataclass(frozen=True)
class SimInstanceModel:
    kv_config: KVCacheConfig
    cost: Any  # CostModel: step_time_s(shape), decode_step_times_s(n, context_sums)
    kv_bytes_per_token: float
    peak_flops: float  # of the whole instance (tp x pp GPUs), for MFU
    flops_per_token: float  # linear-layer FLOPs per token, for the MFU estimate


def instance_spec(group: InstanceGroup):
    from servelab.catalog.instance import InstanceSpec

    return InstanceSpec(gpu=group.gpu, model=group.model, tp=group.tp, pp=group.pp,
                        memory_reserve_fraction=group.memory_reserve_fraction, block_size=group.block_size,
                        host_kv_bytes=int(group.host_kv_gb * 2**30))


def build_instance_model(group: InstanceGroup, cost_override: Any = None) -> SimInstanceModel:
    """KV blocks from the catalog (HBM minus weights and reserve); cost from the roofline unless overridden."""
    from servelab.catalog.gpus import get_gpu
    from servelab.catalog.instance import kv_bytes_per_token, kv_cache_config
    from servelab.catalog.models import get_model
    spec = instance_spec(group)
    if cost_override is not None:
        cost = cost_override
    else:
        from servelab.costmodel.roofline import roofline_for

        cost = roofline_for(group.gpu, group.model, tp=group.tp, pp=group.pp)
    model = get_model(group.model)
    peak_flops = get_gpu(group.gpu).peak_flops * group.tp * group.pp
    return SimInstanceModel(kv_cache_config(spec), cost, kv_bytes_per_token(spec), peak_flops,
                            float(model.flops_per_token))
