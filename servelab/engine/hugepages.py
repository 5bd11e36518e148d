"""Large CPU tensors on transparent huge pages: the paged KV cache and the packed weights.

Why: a decode step reads its KV cache in 16 KiB blocks scattered over the whole cache (1.2 GB
for bench-200m at batch 32, context 1,152) and streams hundreds of MB of weights, on 4 KiB
pages: far more pages than the TLB maps, and the page tables themselves are pushed out of the
caches by the stream, so the page walks go to memory. torch's allocations are plain ``mmap``s,
and where the kernel's THP mode is ``madvise`` (as on the project's machine) they never get 2
MiB pages. ``empty`` marks a new tensor's memory ``MADV_HUGEPAGE`` before anything touches it.
Measured (issue 27, AMD Zen 3, a machine at load 5): the C decode attention over one layer of a
16-layer cache at a time, 32 rows x 1,152, 9.15 ms a layer on 4 KiB pages against 7.75 on huge
pages, alternated in one process (medians of 5 rounds of 16 layers). A whole bench-200m decode
step did not confirm it at that context: 299.2 ms against 300.2 on 4 KiB pages, at context 256
215.7 against 266.7 (docs/benchmarks/decode_kernels.md, one run at load 2-3.5, 3 alternated
rounds): kept as cheap and never slower there, its gain at 1,152 unproven.

Linux only; ``SERVELAB_HUGEPAGES=0`` or THP off leave torch's plain allocation (``why_not()``).
The advice covers the 2 MiB-aligned inside of the allocation; its ends stay on small pages.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from pathlib import Path

import torch

MADV_HUGEPAGE = 14
HUGE = 2 << 20
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_libc: ctypes.CDLL | None = None
_why_not: str | None = None
_checked = False


def why_not() -> str | None:
    """Why tensors here stay on small pages, or None where ``empty`` advises huge pages."""
    global _checked, _why_not, _libc
    if _checked:
        return _why_not
    _checked = True
    if os.environ.get("SERVELAB_HUGEPAGES", "1") == "0":
        _why_not = "SERVELAB_HUGEPAGES=0"
    elif not sys.platform.startswith("linux"):
        _why_not = f"not Linux ({sys.platform})"
    else:
        try:
            mode = THP_MODE.read_text()
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _why_not = "transparent huge pages are off (never)" if "[never]" in mode else None
        except (OSError, AttributeError):
            _why_not = "no transparent huge pages or no madvise here"
    return _why_not


def advise(t: torch.Tensor) -> bool:
    """Mark the 2 MiB-aligned inside of a CPU tensor's memory for huge pages; True when advised.
    Only pages not yet touched come as huge pages at first touch (call it on a new tensor)."""
    if t.device.type != "cpu" or t.numel() * t.element_size() < 2 * HUGE or why_not() is not None:
        return False
    start = t.data_ptr()
    lo, hi = (start + HUGE - 1) // HUGE * HUGE, (start + t.numel() * t.element_size()) // HUGE * HUGE
    return hi > lo and _libc.madvise(lo, hi - lo, MADV_HUGEPAGE) == 0


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu", *,
          aligned: bool = False) -> torch.Tensor:
    """``torch.empty``, on huge pages where it is a CPU tensor of at least 4 MiB and THP allows.
    ``aligned``: start the tensor on a 2 MiB boundary of a 2 MiB larger allocation, so that all of
    it, not only its aligned inside, is on huge pages (for tensors of a few MiB, such as one
    projection's packed weight); the tensor is then a view into that allocation."""
    numel, item = math.prod(shape), dtype.itemsize
    if not aligned or torch.device(device).type != "cpu" or numel * item < HUGE or why_not() is not None:
        t = torch.empty(shape, dtype=dtype, device=device)
        advise(t)
        return t
    flat = torch.empty(numel + HUGE // item, dtype=dtype)
    offset = -flat.data_ptr() % HUGE  # torch's CPU allocations are 64-byte aligned: a whole number of items
    advise(flat)
    return flat[offset // item:offset // item + numel].view(shape)
