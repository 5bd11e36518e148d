"""What every attention kernel model shares: per-layer, per-rank coefficients and prefill.

``KernelCoefficients`` are seconds per unit of work on one TP rank for one layer:
``kv_read_s`` per context token a decode reads (K and V of the rank's KV heads at the
stated memory efficiency), ``row_s`` per query row (read Q, write O, merge partials),
``floor_s`` per launch, ``pair_s`` per causal query-key pair of prefill (4 FLOPs per head
dimension per pair at the stated compute efficiency), and ``longest_factor``: how many
context tokens' worth of full-GPU time one token of the longest sequence costs when it is
read by one thread block per query head, each on one SM at 1/num_SMs of the bandwidth
(num_SMs / query heads per rank).

Stated efficiencies (no attention kernel timings exist in the profiles; ``servelab
profile-gpu`` measures them on a GPU and ``--kernel-profile`` replaces these): decode
reads reach 70% of HBM bandwidth (PagedAttention/FlashInfer decode benchmarks report 60-80%
at large batch); prefill reaches 60% of peak on the A100 (FlashAttention-2 paper: 50-73% in
the forward pass at head dim 128) and 50% on the H100 (FlashAttention-2 reaches 35-40%
there, FlashAttention-3 60-75%).

Every ``decode_s`` takes scalars or numpy arrays for the context sum and maximum and does the
same operations in the same order either way, so the simulator's vectorised fast-forward and
its scalar step agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

DECODE_MEMORY_EFFICIENCY = 0.7
LAUNCH_FLOOR_S = 5e-6
PREFILL_COMPUTE_EFFICIENCY = {"A100-40GB": 0.6, "A100-80GB": 0.6, "A800-80GB": 0.6}
DEFAULT_PREFILL_COMPUTE_EFFICIENCY = 0.5


@dataclass(frozen=True, slots=True)
class KernelCoefficients:
    kv_read_s: float  # per context token a decode row reads
    row_s: float  # per query row
    floor_s: float  # per launch
    pair_s: float  # per causal query-key pair of prefill
    longest_factor: float  # per-seq bubble: context tokens of full-GPU time per token of the longest row
    source: str = "stated"

    def chunk_s(self, chunk: int, context: int, pairs: int) -> float:
        """Prefill of ``chunk`` tokens ending at ``context``: compute over the causal pairs or
        the KV read, whichever is longer (FlashAttention's forward is one or the other)."""
        compute = self.pair_s * pairs
        memory = self.kv_read_s * context + self.row_s * chunk
        return compute if compute > memory else memory


def coefficients_for(gpu, model, tp: int, dtype_bytes: int = 2) -> KernelCoefficients:
    """Stated coefficients for a catalog ``GPUSpec`` and ``ModelSpec`` on one TP rank."""
    heads, kv_heads = model.num_heads // tp, max(1, model.num_kv_heads // tp)
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * DECODE_MEMORY_EFFICIENCY
    compute = gpu.peak_flops * PREFILL_COMPUTE_EFFICIENCY.get(gpu.name, DEFAULT_PREFILL_COMPUTE_EFFICIENCY)
    return KernelCoefficients(
        kv_read_s=2.0 * kv_heads * model.head_dim * dtype_bytes / bandwidth,
        row_s=2.0 * heads * model.head_dim * dtype_bytes / bandwidth,
        floor_s=LAUNCH_FLOOR_S,
        pair_s=4.0 * heads * model.head_dim / compute,
        longest_factor=gpu.num_sms / heads,
        source=f"stated: decode reads at {DECODE_MEMORY_EFFICIENCY:.0%} of HBM bandwidth, prefill at "
               f"{compute / gpu.peak_flops:.0%} of peak FLOP/s")


def bubble_work(context_sum, longest):
    """max(sum of contexts, longest row's cost in context tokens), for scalars or arrays alike."""
    if isinstance(context_sum, np.ndarray):
        return np.maximum(context_sum, longest)
    return context_sum if context_sum > longest else longest


class DecodeKernel(Protocol):
    name: str
    coefficients: KernelCoefficients

    def decode_s(self, num_decodes, context_sum, context_max):
        """Seconds of one layer's decode attention on one rank (scalars or arrays)."""
        ...
