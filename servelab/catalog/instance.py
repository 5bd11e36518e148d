"""One serving instance: a model on ``tp * pp`` GPUs of one kind, and how much KV it holds.

KV capacity follows vLLM's profile-then-fill rule: of the HBM on every GPU, keep
``memory_reserve_fraction`` for activations, workspace and fragmentation, load the weights,
and fill the rest with KV blocks. ``layers`` lets an instance hold only a slice of the model
(KunServe-style partial instances): weights and KV then cover only those layers, and the
embedding / LM head only if the slice includes the first / last layer.

Aggregate accounting: memory is pooled over the instance's GPUs, which is exact for tensor
parallelism and assumes evenly loaded pipeline stages. KV heads are replicated when
``tp`` exceeds the KV head count (every rank needs at least one).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.catalog.gpus import GPUSpec, get_gpu
from servelab.catalog.models import ModelSpec, get_model
from servelab.core.errors import UserError
from servelab.core.kv_blocks import KVCacheConfig


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    gpu: str
    model: str
    tp: int = 1
    pp: int = 1
    dtype_bytes: int = 2
    memory_reserve_fraction: float = 0.1  # activations, workspace, fragmentation
    block_size: int = 16  # tokens per KV block
    host_kv_bytes: int = 0  # host (CPU) memory for swapped-out KV; 0 disables swap
    layers: tuple[int, int] | None = None  # [start, end) of the layers held; None = all

    def __post_init__(self) -> None:
        get_gpu(self.gpu)  # raises on an unknown name
        model = get_model(self.model)
        if self.tp < 1 or self.pp < 1:
            raise UserError(f"tp and pp must be >= 1, got tp={self.tp} pp={self.pp}")
        if model.num_heads % self.tp:
            raise UserError(f"{model.name}: {model.num_heads} heads do not split over tp={self.tp}")
        if self.dtype_bytes not in (1, 2, 4):
            raise UserError(f"dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes}")
        if not 0 <= self.memory_reserve_fraction < 1:
            raise UserError(f"memory_reserve_fraction must be in [0, 1), got {self.memory_reserve_fraction}")
        if self.block_size < 1:
            raise UserError(f"block_size must be >= 1, got {self.block_size}")
        if self.host_kv_bytes < 0:
            raise UserError(f"host_kv_bytes must be >= 0, got {self.host_kv_bytes}")
        start, end = self.layer_range
        if not 0 <= start < end <= model.num_layers:
            raise UserError(f"layers {self.layers} is not a non-empty range within "
                             f"[0, {model.num_layers}) of {model.name}")
        if end - start < self.pp:
            raise UserError(f"{end - start} layers cannot fill pp={self.pp} stages")

    @property
    def gpu_spec(self) -> GPUSpec:
        return get_gpu(self.gpu)

    @property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def layer_range(self) -> tuple[int, int]:
        return self.layers if self.layers is not None else (0, get_model(self.model).num_layers)

    @property
    def num_layers_held(self) -> int:
        start, end = self.layer_range
        return end - start

    @property
    def holds_first_layer(self) -> bool:
        return self.layer_range[0] == 0

    @property
    def holds_last_layer(self) -> bool:
        return self.layer_range[1] == get_model(self.model).num_layers

    @property
    def num_kv_heads_stored(self) -> int:
        """KV heads summed over TP ranks: each rank keeps at least one."""
        return max(get_model(self.model).num_kv_heads, self.tp)


def held_param_bytes(spec: InstanceSpec) -> int:
    """Weight bytes of the layers the instance holds, plus embedding / LM head at the ends."""
    model = spec.model_spec
    params = spec.num_layers_held * model.params_per_layer
    if spec.holds_first_layer:
        params += model.embedding_params
    if spec.holds_last_layer:
        params += model.lm_head_params
    return params * spec.dtype_bytes


def kv_bytes_per_token(spec: InstanceSpec) -> int:
    """KV bytes one token takes on this instance (held layers, all ranks)."""
    return 2 * spec.num_kv_heads_stored * spec.model_spec.head_dim * spec.dtype_bytes * spec.num_layers_held


def kv_bytes_per_block(spec: InstanceSpec) -> int:
    return spec.block_size * kv_bytes_per_token(spec)


def kv_budget_bytes(spec: InstanceSpec) -> int:
    """HBM left for KV after the reserve and the weights; a ``UserError`` if the weights do not fit."""
    usable = int(spec.gpu_spec.hbm_capacity_bytes * spec.num_gpus * (1 - spec.memory_reserve_fraction))
    weights = held_param_bytes(spec)
    if weights >= usable:
        raise UserError(
            f"{spec.model} weights ({weights / 2**30:.1f} GiB) do not fit in {spec.num_gpus} x {spec.gpu} "
            f"({usable / 2**30:.1f} GiB usable after a {spec.memory_reserve_fraction:.0%} reserve); "
            f"raise tp or pp")
    return usable - weights


def num_kv_blocks(spec: InstanceSpec) -> int:
    """GPU KV blocks the instance holds; a ``UserError`` if not even one fits."""
    blocks = kv_budget_bytes(spec) // kv_bytes_per_block(spec)
    if blocks < 1:
        raise UserError(f"{spec}: no room for a single KV block after loading the weights")
    return blocks


def num_host_kv_blocks(spec: InstanceSpec) -> int:
    return spec.host_kv_bytes // kv_bytes_per_block(spec)


def kv_cache_config(spec: InstanceSpec, watermark: float = 0.01) -> KVCacheConfig:
    return KVCacheConfig(block_size=spec.block_size, num_gpu_blocks=num_kv_blocks(spec),
                         num_cpu_blocks=num_host_kv_blocks(spec), watermark=watermark)
