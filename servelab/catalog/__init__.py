"""Hardware and model catalog: GPU datasheets, model shapes, and the instances built from them."""

from servelab.catalog.gpus import GPUS, GPUSpec, get_gpu
from servelab.catalog.instance import (
    InstanceSpec,
    held_param_bytes,
    kv_bytes_per_block,
    kv_bytes_per_token,
    kv_cache_config,
    num_host_kv_blocks,
    num_kv_blocks,
)
from servelab.catalog.models import MODELS, ModelSpec, get_model

__all__ = [
    "GPUS", "GPUSpec", "get_gpu", "MODELS", "ModelSpec", "get_model", "InstanceSpec",
    "held_param_bytes", "kv_bytes_per_block", "kv_bytes_per_token", "kv_cache_config",
    "num_host_kv_blocks", "num_kv_blocks",
]
