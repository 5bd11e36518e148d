"""Python's object arenas on transparent huge pages, for simulations of many instances.

At equal load per instance a simulated token cost more CPU the more instances there were, the
same Python work running slower (docs/benchmarks/scale_diagnosis.md): each step of an instance
reads that instance's objects after the other instances' steps pushed them out of the CPU's
caches and address-translation buffers. With 4 KiB pages, 0.8 GB of objects (256 instances)
span 200,000 pages, far beyond what the TLB maps. pymalloc takes its 1 MiB arenas from the
system one ``mmap`` at a time, so on a machine whose THP mode is ``madvise`` they never get
huge pages. ``install()`` gives pymalloc an arena allocator (``arena_hugepages.c``, built with
the system C compiler on first use and called by pymalloc directly) that cuts the arenas out of
one region marked ``MADV_HUGEPAGE``. Measured at 256 instances x 977 requests (alternating
processes, docs/benchmarks/scale.md's workload): +13% and +24% tokens per CPU-s, same results,
peak RSS 0.81 -> 0.83 GB; at 32 instances within the machine's noise.

Only where it is worth it: ``servelab perf scale`` and ``servelab simulate`` install it at
start (before the simulation allocates). Arenas freed later are kept for reuse, not returned to
the system, so a process's memory stays at its peak. ``SERVELAB_HUGEPAGE_ARENAS=0``, no C
compiler, or THP off (``never``) leave Python's own allocator; ``why_not`` says why.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from servelab.core.native_build import build_shared_library

SOURCE = Path(__file__).with_name("arena_hugepages.c")
FLAGS = ("-O2", "-fPIC", "-shared")
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


class _ArenaAllocator(ctypes.Structure):  # PyObjectArenaAllocator
    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]


_installed: tuple[ctypes.CDLL, _ArenaAllocator] | None = None  # kept alive: pymalloc calls into them
_tried = False
why_not: str | None = None  # why ``install()`` left Python's allocator, once tried


def _build() -> Path:
    return build_shared_library(SOURCE, FLAGS)


def _thp_problem() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    try:
        mode = THP_MODE.read_text()
    except OSError:
        return "no transparent huge pages on this kernel"
    if "[never]" in mode:
        return "transparent huge pages are off (never)"
    return None


def install() -> bool:
    """From now on pymalloc's new arenas come from a huge-page region (once per process).
    True when it is in place; False (``why_not`` says why) when Python's allocator stays."""
    global _installed, _tried, why_not
    if _tried:
        return _installed is not None
    _tried = True
    if os.environ.get("SERVELAB_HUGEPAGE_ARENAS", "1") == "0":
        why_not = "SERVELAB_HUGEPAGE_ARENAS=0"
        return False
    why_not = _thp_problem()
    if why_not is not None:
        return False
    try:
        lib = ctypes.CDLL(str(_build()))
    except OSError as e:
        why_not = str(e)
        return False
    allocator = _ArenaAllocator(None, ctypes.cast(lib.servelab_arena_alloc, ctypes.c_void_p).value,
                                ctypes.cast(lib.servelab_arena_free, ctypes.c_void_p).value)
    setter = ctypes.pythonapi.PyObject_SetArenaAllocator
    setter.argtypes, setter.restype = [ctypes.POINTER(_ArenaAllocator)], None
    setter(ctypes.byref(allocator))
    _installed = (lib, allocator)
    return True


def region_bytes() -> int:
    """Bytes of arenas handed out from the huge-page region so far (0 when not installed)."""
    if _installed is None:
        return 0
    fn = _installed[0].servelab_arena_region_bytes
    fn.restype = ctypes.c_size_t
    return int(fn())
