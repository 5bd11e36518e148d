"""The CPU's in-place decode attention (``paged_decode.c``), built on first use and called through ctypes.

Why a C kernel: every torch-native way tried on this CPU first copies each row's K and V out of
the scattered cache blocks (the copy alone was a third of the decode attention,
docs/benchmarks/decode_gap.md) and then attends with kernels built for many query rows. The C
loop reads each row's blocks once, in place, with an online softmax (FlashDecoding's merge at
block granularity), so it is the split-kv kernel with one split per cache block.

Built with the system C compiler (``$CC``, else ``cc``) into ``~/.cache/servelab`` (or
``core.user_cache``), keyed by the source's hash; no compiler, a CPU without AVX2 and FMA, or
``SERVELAB_INPLACE_DECODE=0`` leaves ``kernel()`` None and the engine on the torch path. It runs
on one thread, so the engine uses it only while torch runs one thread (the engine's CPU
benchmarks; with more, the torch path's kernels use them all).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from servelab.core.native_build import NativeLibrary

SOURCE = Path(__file__).with_name("paged_decode.c")
# AVX2 + FMA, not -march=native: on this AMD Zen 3 native code was no faster (one layer, K/V in
# cache: 4.45 ms against 3.96) and a cached build would not move with its CPU
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared")
PROFILER_LABEL = "servelab::paged_decode"


def _needs_avx2() -> str | None:
    capability = torch.backends.cpu.get_cpu_capability()
    return None if capability in ("AVX2", "AVX512") else f"CPU capability {capability} (needs AVX2 and FMA)"


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.paged_decode_f32.argtypes = [ptr, i64, i64, i64, i64, ptr, i64, i64, ptr, i64, ptr, ctypes.c_float, ptr]
    lib.paged_decode_f32.restype = None


LIBRARY = NativeLibrary(SOURCE, FLAGS, ("-lm",), switch="SERVELAB_INPLACE_DECODE", unsupported=_needs_avx2,
                        bind=_bind)


def kernel() -> ctypes._CFuncPtr | None:
    """The C function, built and loaded once per process; None where it cannot run
    (``LIBRARY.why_not`` says why)."""
    lib = LIBRARY.load()
    return None if lib is None else lib.paged_decode_f32


def decode(kv_layer: torch.Tensor, q: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Attention of each decode row over its first ``lens[r]`` cache slots. kv_layer: [2,
    num_blocks, block_size, kv_heads, head_dim] float32 contiguous; q: [B, Hq, D]; tables: [B,
    width] int64 block ids (any id past a row's last block); lens: [B] int64 >= 1. Returns [B, Hq, D]."""
    fn = kernel()
    if fn is None:
        raise RuntimeError(f"the in-place decode kernel is not available: {LIBRARY.why_not}")
    _, num_blocks, block_size, kv_heads, head_dim = kv_layer.shape
    rows, heads, _ = q.shape
    if not kv_layer.is_contiguous() or kv_layer.dtype != torch.float32 or head_dim % 32:
        raise ValueError("in-place decode needs a contiguous float32 layer with head_dim a multiple of 32")
    if tables.dtype != torch.int64 or lens.dtype != torch.int64 or tables.shape[0] != rows or lens.shape != (rows,):
        raise ValueError("in-place decode: tables [B, width] and lens [B] must be int64, one row per query")
    if rows and (int(lens.min()) < 1 or int(lens.max()) > tables.shape[1] * block_size
                 or int(tables.min()) < 0 or int(tables.max()) >= num_blocks):
        # the C loop reads raw memory: a block id or length outside the cache would read outside it
        raise ValueError(f"in-place decode: lens must be in [1, {tables.shape[1] * block_size}] and block ids in "
                         f"[0, {num_blocks})")
    q = q.contiguous()
    tables, lens = tables.contiguous(), lens.contiguous()
    out = torch.empty_like(q)
    with torch.profiler.record_function(PROFILER_LABEL):  # so profiles of a step can name it (a ctypes call is no op)
        fn(kv_layer.data_ptr(), num_blocks, block_size, kv_heads, head_dim, q.data_ptr(), rows, heads,
           tables.data_ptr(), tables.shape[1], lens.data_ptr(), scale, out.data_ptr())
    return out
