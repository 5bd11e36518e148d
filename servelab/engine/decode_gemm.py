"""The CPU's projection kernel for decode-sized row counts (``decode_gemm.c``), through ctypes.

Why: on the AVX2 EPYC the projections were most of a decode step (batch 32, context 1,152:
~330 of ~560 ms, docs/benchmarks/decode_kernels.md), and at 32 rows MKL (``F.linear``) and
oneDNN's packed weights multiply at 25-55 GFLOP/s on one core. The C loop streams a weight
packed once at load into 16-column panels, with the next lines asked for ahead, while the rows
stay in cache; it matched or beat the oneDNN-packed weights from 1 to 512 rows when probed
(issue 27), so on such a CPU it replaces the oneDNN copy rather than adding a third copy of the
weights.

Used only where it can run: float32, the weight's rows a multiple of 16, a CPU whose best torch
path is AVX2 (on AVX512 oneDNN has twice the vector width), one torch thread (it runs on one;
with more, MKL's threads run ``F.linear``), a C compiler (``paged_decode``'s cached build), and
``SERVELAB_DECODE_GEMM`` not ``0``. ``kernel()`` is None elsewhere and ``why_not`` says why.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from servelab.core.native_build import build_shared_library

SOURCE = Path(__file__).with_name("decode_gemm.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared")
PANEL = 16  # output columns per packed panel (the C kernel's register tile width)

_kernel: ctypes._CFuncPtr | None = None
_tried = False
why_not: str | None = None


def kernel() -> ctypes._CFuncPtr | None:
    """The C function, built and loaded once per process; None where it cannot run (``why_not``)."""
    global _kernel, _tried, why_not
    if _tried:
        return _kernel
    _tried = True
    if os.environ.get("SERVELAB_DECODE_GEMM", "1") == "0":
        why_not = "SERVELAB_DECODE_GEMM=0"
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX2":
        why_not = f"CPU capability {capability} (the kernel is AVX2 + FMA; oneDNN serves wider vectors)"
        return None
    try:
        fn = ctypes.CDLL(str(build_shared_library(SOURCE, FLAGS))).decode_linear_f32
    except OSError as e:
        why_not = str(e)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr]
    fn.restype = None
    _kernel = fn
    return fn


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``pack`` applies to this weight here (float32 on the CPU, rows % 16, the kernel builds)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.shape[0] % PANEL == 0 and weight.shape[0] > 0 and kernel() is not None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> panels [N / 16, K, 16]: each panel's 16 columns of one k in one 64-byte line."""
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] float32 @ the packed weight's transpose (+ bias): [M, N]. The caller checks
    shapes, dtypes and devices (``model.Linear``); this passes raw pointers to C."""
    fn = kernel()
    if fn is None:
        raise RuntimeError(f"the decode GEMM kernel is not available: {why_not}")
    x = x.contiguous()
    m, k = x.shape
    n = panels.shape[0] * PANEL
    out = torch.empty(m, n, dtype=x.dtype)
    fn(x.data_ptr(), m, k, panels.data_ptr(), n, None if bias is None else bias.data_ptr(), out.data_ptr())
    return out
