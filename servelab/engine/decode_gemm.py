"""The CPU's projection kernel for decode-sized row counts (``decode_gemm.c``), through ctypes.

Why: on the AVX2 EPYC the projections were most of a decode step (batch 32, context 1,152:
~330 of ~560 ms, docs/benchmarks/decode_kernels.md), and at 32 rows MKL (``F.linear``) and
oneDNN's packed weights multiply at 25-55 GFLOP/s on one core. The C loop streams a weight
packed once at load into 16-column panels (in chunks of ``CHUNK`` k's, on huge pages:
``hugepages``), with the next block asked for ahead, while a copy of the rows in the order the
register tiles read them stays in cache; it matched or beat the oneDNN-packed weights from 1 to 512 rows when probed
(issue 27), so on such a CPU it replaces the oneDNN copy rather than adding a third copy of the
weights.

Used only where it can run: float32, the weight's rows a multiple of 16, a CPU whose best torch
path is AVX2 (on AVX512 oneDNN has twice the vector width), one torch thread (it runs on one;
with more, MKL's threads run ``F.linear``), a C compiler (``paged_decode``'s cached build), and
``SERVELAB_DECODE_GEMM`` not ``0``. ``kernel()`` is None elsewhere and ``LIBRARY.why_not`` says why.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from servelab.core.native_build import NativeLibrary
from servelab.engine import hugepages

SOURCE = Path(__file__).with_name("decode_gemm.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared")
PANEL = 16  # output columns per packed panel (the C kernel's register tile width)
CHUNK = 1024  # k's per chunk of the packed weight (the C kernel's KS)


def _needs_avx2_only() -> str | None:
    capability = torch.backends.cpu.get_cpu_capability()
    return None if capability == "AVX2" else \
        f"CPU capability {capability} (the kernel is AVX2 + FMA; oneDNN serves wider vectors)"


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.decode_linear_f32.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr]
    lib.decode_linear_f32.restype = ctypes.c_int


LIBRARY = NativeLibrary(SOURCE, FLAGS, switch="SERVELAB_DECODE_GEMM", unsupported=_needs_avx2_only, bind=_bind)


def kernel() -> ctypes._CFuncPtr | None:
    """The C function, built and loaded once per process; None where it cannot run
    (``LIBRARY.why_not`` says why)."""
    lib = LIBRARY.load()
    return None if lib is None else lib.decode_linear_f32


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``pack`` applies to this weight here (float32 on the CPU, rows % 16, the kernel builds)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.shape[0] % PANEL == 0 and weight.shape[0] > 0 and weight.shape[1] > 0 and kernel() is not None)


def pack(weight: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """weight [N, K] -> K / ``chunk`` chunks of k's (the last one shorter), each [N / 16, k's, 16]
    (each panel's 16 columns of one k in one 64-byte line), one after another in one flat tensor
    on huge pages (``hugepages``): the order the C kernel streams it. Shaped [N, K] like the
    weight, so that shapes can be checked, but not a weight: only ``linear`` reads it."""
    n, k = weight.shape
    w = weight.detach()
    out = hugepages.empty((n * k,), weight.dtype, aligned=True)
    for c0 in range(0, k, chunk):
        ks = min(chunk, k - c0)
        out[c0 * n:(c0 + ks) * n].view(n // PANEL, ks, PANEL).copy_(w[:, c0:c0 + ks].reshape(n // PANEL, PANEL, ks)
                                                                   .transpose(1, 2))
    return out.view(n, k)


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] float32 @ the packed weight's transpose (+ bias): [M, N]. The caller checks
    shapes, dtypes and devices (``model.Linear``); this passes raw pointers to C."""
    fn = kernel()
    if fn is None:
        raise RuntimeError(f"the decode GEMM kernel is not available: {LIBRARY.why_not}")
    n, k = panels.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"decode GEMM: x {tuple(x.shape)} does not match the packed weight [{n}, {k}]")
    x = x.contiguous()
    m = x.shape[0]
    out = torch.empty(m, n, dtype=x.dtype)
    if fn(x.data_ptr(), m, k, panels.data_ptr(), n, None if bias is None else bias.data_ptr(), out.data_ptr()):
        raise MemoryError(f"decode GEMM: no memory for a copy of x [{m}, {k}]")
    return out
