"""A decoder layer's small elementwise parts (RMSNorm, RoPE, the MLP's silu x up) fused in C (``layer_ops.c``), through ctypes.

Why: at decode row counts these are a few torch ops over a few hundred KiB each, whose per-op
overhead and intermediate tensors cost more than their arithmetic (issue 27's step breakdown,
docs/benchmarks/decode_kernels.md section 4). Used where ``applies`` says so: float32 on the
CPU with one torch thread (with more, torch's ops use them all), an AVX2 + FMA CPU, a C
compiler, and ``SERVELAB_LAYER_OPS`` not ``0``; elsewhere the model's torch code runs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from servelab.core.native_build import NativeLibrary

SOURCE = Path(__file__).with_name("layer_ops.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared")


def _needs_avx2() -> str | None:
    capability = torch.backends.cpu.get_cpu_capability()
    return None if capability in ("AVX2", "AVX512") else f"CPU capability {capability} (needs AVX2 and FMA)"


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.rms_norm_f32.argtypes = [ptr, i64, i64, i64, ptr, f32, ptr]
    lib.rope_f32.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr]
    lib.silu_mul_f32.argtypes = [ptr, i64, i64, i64, ptr]
    lib.add_rms_norm_f32.argtypes = [ptr, ptr, i64, i64, ptr, f32, ptr, ptr]
    lib.add_rms_norm_f32.restype = None
    lib.rms_norm_f32.restype = lib.rope_f32.restype = lib.silu_mul_f32.restype = None


LIBRARY = NativeLibrary(SOURCE, FLAGS, ("-lm",), switch="SERVELAB_LAYER_OPS", unsupported=_needs_avx2, bind=_bind)


def library() -> ctypes.CDLL | None:
    """The built library, loaded once per process; None where it cannot run (``LIBRARY.why_not``)."""
    return LIBRARY.load()


def applies(x: torch.Tensor) -> bool:
    """Whether the fused ops take ``x`` here: a 2-D float32 CPU tensor whose rows are each
    contiguous, with one torch thread and the library built."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.stride(1) == 1
            and torch.get_num_threads() == 1 and library() is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """model.RMSNorm's result for x [T, dim] (``applies(x)``), a new contiguous tensor."""
    rows, dim = x.shape
    if weight.shape != (dim,) or weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError(f"rms_norm: weight must be float32 [{dim}] contiguous, got {tuple(weight.shape)}")
    out = torch.empty(rows, dim, dtype=torch.float32)
    library().rms_norm_f32(x.data_ptr(), rows, dim, x.stride(0), weight.data_ptr(), eps, out.data_ptr())
    return out


def add_rms_norm(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + a, RMSNorm(x + a)) for x, a [T, dim] contiguous (``applies`` to both), in one pass: the
    decoder layer's residual add and the norm after it."""
    rows, dim = x.shape
    if a.shape != x.shape or not (x.is_contiguous() and a.is_contiguous()):
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} and a {tuple(a.shape)} must be one contiguous shape")
    if weight.shape != (dim,) or weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError(f"add_rms_norm: weight must be float32 [{dim}] contiguous, got {tuple(weight.shape)}")
    h, out = torch.empty(rows, dim, dtype=torch.float32), torch.empty(rows, dim, dtype=torch.float32)
    library().add_rms_norm_f32(x.data_ptr(), a.data_ptr(), rows, dim, weight.data_ptr(), eps, h.data_ptr(),
                               out.data_ptr())
    return h, out


def rope_(x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """RoPE in place on the first ``heads * head_dim`` columns of x [T, >= heads * head_dim]
    (``applies(x)``); cos, sin: [T, 1, head_dim] or [T, head_dim] float32 contiguous."""
    rows = x.shape[0]
    for t in (cos, sin):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() != rows * head_dim:
            raise ValueError(f"rope_: cos and sin must be float32 [{rows}, 1, {head_dim}] contiguous")
    if x.shape[1] < heads * head_dim or head_dim % 2:
        raise ValueError(f"rope_: x [{rows}, {x.shape[1]}] holds no {heads} heads of even dim {head_dim}")
    library().rope_f32(x.data_ptr(), rows, x.stride(0), heads, head_dim, cos.data_ptr(), sin.data_ptr())


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The MLP's ``silu(gate) * up`` for gate_up [T, 2 * inter] (``applies(gate_up)``): [T, inter],
    in one pass (float32; e^x from a polynomial, relative error below 1e-7 against torch's)."""
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"silu_mul: gate_up [{rows}, {width}] has no two equal halves")
    out = torch.empty(rows, width // 2, dtype=torch.float32)
    library().silu_mul_f32(gate_up.data_ptr(), rows, width // 2, gate_up.stride(0), out.data_ptr())
    return out
