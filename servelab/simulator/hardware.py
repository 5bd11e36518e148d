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


def is_cost_options(cost: Any) -> bool:
    """A ``CostOptions`` (each instance builds its own model) rather than one fixed cost model."""
    from servelab.costmodel.options import CostOptions

    return isinstance(cost, CostOptions)


def cost_for_spec(spec, cost: Any = None):
    """``cost`` itself when it is a cost model; else the model built for ``spec`` from ``cost``
    (``CostOptions``) or from ``DEFAULT_COST_OPTIONS`` (cached: identical instances share it)."""
    from servelab.costmodel.build import build_cost_model
    from servelab.costmodel.options import DEFAULT_COST_OPTIONS

    if cost is None:
        return build_cost_model(spec, DEFAULT_COST_OPTIONS)
    if is_cost_options(cost):
        return build_cost_model(spec, cost)
    return cost


def instance_spec(group: InstanceGroup):
    from servelab.catalog.instance import InstanceSpec

    return InstanceSpec(gpu=group.gpu, model=group.model, tp=group.tp, pp=group.pp,
                        memory_reserve_fraction=group.memory_reserve_fraction, block_size=group.block_size,
                        host_kv_bytes=int(group.host_kv_gb * 2**30))


def build_instance_model(group: InstanceGroup, cost_override: Any = None) -> SimInstanceModel:
    """KV blocks from the catalog (HBM minus weights and reserve); cost from ``DEFAULT_COST_OPTIONS``
    unless overridden by a cost model or other ``CostOptions``."""
    return model_for_spec(instance_spec(group), cost_override)


def model_for_spec(spec, cost_override: Any = None) -> SimInstanceModel:
    """The hardware model of an ``InstanceSpec`` (layer ranges included: a partial instance
    holds fewer weights, so more KV, and its roofline times only its layers)."""
    from servelab.catalog.instance import kv_bytes_per_token, kv_cache_config

    cost = cost_for_spec(spec, cost_override)
    lo, hi = spec.layer_range
    fraction = (hi - lo) / spec.model_spec.num_layers
    peak_flops = spec.gpu_spec.peak_flops * spec.tp * spec.pp
    return SimInstanceModel(kv_cache_config(spec), cost, kv_bytes_per_token(spec), peak_flops,
                            float(spec.model_spec.flops_per_token) * fraction)
