"""Kernel-level roofline: one layer's operator shapes, their times, and the fitted knobs.

Every operator is linear in the step's token count T: it does ``flops_per_token * T`` FLOPs
and moves ``weight_bytes + bytes_per_token * T`` bytes (weights read once per step,
activations read and written per token). Its time is

    floor_s + max(FLOPs / (peak * compute_eff), bytes / (bandwidth * memory_eff))

with the efficiencies of ``OpEfficiency``. The roofline cost model and the profile fit
both build their operators with ``layer_op_shapes``, so a fitted efficiency means the same
thing in both. Shapes are per tensor-parallel rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GEMM_OPS = ("qkv_proj", "o_proj", "up_proj", "down_proj", "lm_head")
MEMORY_OPS = ("norm", "rope", "act", "add", "embed")
ATTENTION_OP = "attention"


@dataclass(frozen=True, slots=True)
class OpEfficiency:
    compute: float  # achieved fraction of peak FLOP/s
    memory: float  # achieved fraction of HBM bandwidth (above 1 when data stays in L2)
    floor_s: float = 0.0  # fixed cost of one kernel: launch, tail, a minimum duration

    def __post_init__(self) -> None:
        if not (self.compute > 0 and self.memory > 0 and self.floor_s >= 0):
            raise ValueError(f"invalid {self}: efficiencies must be > 0 and floor_s >= 0")


@dataclass(frozen=True, slots=True)
class OpShape:
    name: str  # the efficiency key (GEMM_OPS / MEMORY_OPS)
    flops_per_token: float
    weight_bytes: float  # read once per step, whatever T is
    bytes_per_token: float  # activations read + written per token
    count: int = 1  # instances per layer (two norms, two residual adds)


def gemm_shape(name: str, k: int, n: int, dtype_bytes: int) -> OpShape:
    """[T, k] @ [k, n]: reads the weight once, reads the input and writes the output per token."""
    return OpShape(name, 2.0 * k * n, float(k * n * dtype_bytes), float((k + n) * dtype_bytes))


def memory_shape(name: str, bytes_per_token: float, count: int = 1) -> OpShape:
    return OpShape(name, 0.0, 0.0, float(bytes_per_token), count)


def layer_op_shapes(hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int,
                    gated_mlp: bool, tp: int, dtype_bytes: int) -> tuple[OpShape, ...]:
    """One decoder layer's non-attention operators on one TP rank (attention is timed apart)."""
    heads = num_heads // tp
    kv_heads = max(1, num_kv_heads // tp)
    inter = intermediate // tp
    d = dtype_bytes
    up_width = (2 if gated_mlp else 1) * inter
    return (
        gemm_shape("qkv_proj", hidden, (heads + 2 * kv_heads) * head_dim, d),
        gemm_shape("o_proj", heads * head_dim, hidden, d),
        gemm_shape("up_proj", hidden, up_width, d),
        gemm_shape("down_proj", inter, hidden, d),
        memory_shape("norm", 2 * hidden * d, count=2),  # read + write, before attention and MLP
        memory_shape("rope", 2 * (heads + kv_heads) * head_dim * d),  # q and k, in place
        memory_shape("act", (up_width + inter) * d),  # SiLU(gate) * up, or GELU
        memory_shape("add", 3 * hidden * d, count=2),  # residual adds after attention and MLP
    )


def lm_head_shape(hidden: int, vocab: int, tp: int, dtype_bytes: int) -> OpShape:
    """Vocab-parallel LM head; T is the number of rows that sample a token."""
    return gemm_shape("lm_head", hidden, -(-vocab // tp), dtype_bytes)


def embed_shape(hidden: int, dtype_bytes: int) -> OpShape:
    return memory_shape("embed", 2 * hidden * dtype_bytes)  # gather a row, write it


def op_times_s(shape: OpShape, eff: OpEfficiency, num_tokens: np.ndarray, peak_flops: float,
               bandwidth: float) -> np.ndarray:
    """Vectorised time of ONE instance of the op (not times ``count``) for each token count."""
    t = np.asarray(num_tokens, dtype=float)
    compute = shape.flops_per_token * t / (peak_flops * eff.compute)
    memory = (shape.weight_bytes + shape.bytes_per_token * t) / (bandwidth * eff.memory)
    return eff.floor_s + np.maximum(compute, memory)


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """The knobs calibration fits. Defaults are rules of thumb, not fits: large GEMMs reach
    ~70% of peak tensor FLOP/s and ~80% of HBM bandwidth when weight-bound; FlashAttention-2
    reaches ~50% of peak in its forward pass; elementwise kernels ~60% of bandwidth; a kernel
    costs at least a few microseconds; a serving step pays ~1 ms of CPU work (scheduling,
    input preparation, sampling) that the GPU waits on."""

    gemm: OpEfficiency = OpEfficiency(compute=0.7, memory=0.8, floor_s=5e-6)
    memory_op: OpEfficiency = OpEfficiency(compute=1.0, memory=0.6, floor_s=3e-6)
    attention: OpEfficiency = OpEfficiency(compute=0.5, memory=0.7, floor_s=5e-6)
    per_op: tuple[tuple[str, OpEfficiency], ...] = ()  # overrides by op name (ops.GEMM_OPS, ...)
    comm_efficiency: float = 0.8  # fraction of link bandwidth collectives and sends reach
    comm_latency_s: float = 10e-6  # per all-reduce or send
    swap_efficiency: float = 0.8  # fraction of PCIe bandwidth a KV swap reaches
    step_overhead_s: float = 1e-3  # per step, CPU side
    layer_overhead_s: float = 0.0  # per layer per step (launch gaps without CUDA graphs)
    # decode attention: thread blocks working on one request's KV of one KV head (vLLM's paged
    # attention v1 uses one; split-KV kernels use more). The longest request's KV is read by
    # kv_heads x this many blocks, one SM each, which bounds the kernel from below (the bubble).
    decode_kv_splits: int = 1
    source: str = "defaults"

    def __post_init__(self) -> None:
        if not (0 < self.comm_efficiency and 0 < self.swap_efficiency):
            raise ValueError("comm_efficiency and swap_efficiency must be > 0")
        if min(self.comm_latency_s, self.step_overhead_s, self.layer_overhead_s) < 0:
            raise ValueError("latencies and overheads must be >= 0")
        if self.decode_kv_splits < 1:
            raise ValueError(f"decode_kv_splits must be >= 1, got {self.decode_kv_splits}")

    def op(self, name: str) -> OpEfficiency:
        for op_name, eff in self.per_op:
            if op_name == name:
                return eff
        if name == ATTENTION_OP:
            return self.attention
        return self.gemm if name in GEMM_OPS else self.memory_op
