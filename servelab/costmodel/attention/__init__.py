"""Decode-attention kernels as named, swappable cost models (``--attention-kernel``).

A serving engine's decode attention is one kernel launch per layer over a ragged batch of
contexts; how that kernel divides the work decides whether a step costs the *sum* of the
contexts or is held up by the *longest* one. Each module here is one kernel family:

- ``split-kv`` (FlashDecoding, FlashInfer, vLLM's PagedAttention V2, FlashAttention-3 on
  Hopper): every sequence's KV is cut into chunks spread over all SMs, so the cost follows
  the sum of contexts plus a per-row merge;
- ``per-seq`` (vLLM's PagedAttention V1): one thread block per (sequence, query head), so
  when the grid is small the longest sequence's block, on one SM, bounds the kernel;
- ``padded`` (a dense kernel over a [rows, longest] tensor, as our CPU engine's gather does):
  every row pays for the longest context.

Per-GPU defaults (``default_kernel``) and the reason: on the A100 family the per-step CPU
overheads and operator profiles we charge were measured under vLLM 0.3-0.4, whose decode
kernel for contexts up to 8K is PagedAttention V1, so ``per-seq``; on the H100 family the
engines people deploy (vLLM V1 with FlashAttention-3, SGLang/TensorRT-LLM with FlashInfer
or XQA) run split-KV decode, so ``split-kv``; any other GPU gets ``split-kv``, the kernel
current engines ship everywhere.

Prefill attention is the same for all three (FlashAttention over the chunk's causal
pairs): ``base.KernelCoefficients.chunk_s``, from FLOPs at a stated efficiency.
"""

from servelab.costmodel.attention.base import DecodeKernel, KernelCoefficients, coefficients_for
from servelab.costmodel.attention.padded import PaddedKernel
from servelab.costmodel.attention.per_seq import PerSeqKernel
from servelab.costmodel.attention.split_kv import SplitKVKernel

KERNELS: dict[str, type] = {"split-kv": SplitKVKernel, "per-seq": PerSeqKernel, "padded": PaddedKernel}
_PER_SEQ_GPUS = ("A100-40GB", "A100-80GB", "A800-80GB")


def default_kernel(gpu: str) -> str:
    """The decode kernel a run on ``gpu`` gets when none is named (see the module docstring)."""
    return "per-seq" if gpu in _PER_SEQ_GPUS else "split-kv"


def make_kernel(name: str, coefficients: KernelCoefficients) -> DecodeKernel:
    from servelab.core.errors import UserError

    cls = KERNELS.get(name)
    if cls is None:
        raise UserError(f"unknown attention kernel {name!r}; known: {', '.join(KERNELS)}")
    return cls(coefficients)


__all__ = ["KERNELS", "DecodeKernel", "KernelCoefficients", "coefficients_for", "default_kernel", "make_kernel"]
