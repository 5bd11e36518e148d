"""Build a small C source into a shared library once, cached by its content and flags.

The engine's paged decode kernel and the simulator's huge-page arena allocator are each one C
file compiled on first use with the system compiler (no build step at install, no wheel per
CPU). The library lands in the user cache (``core.user_cache``: ``$SERVELAB_CACHE_DIR``, default ``~/.cache/servelab``) under a name
tagged with a hash of the source, compiler and flags, so an edited source or other flags never
load a stale build, and concurrent first uses (test workers) rename a finished file into place
rather than load a half-written one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from servelab.core.user_cache import cache_dir


def _local_includes(source: Path) -> bytes:
    """The bytes of the ``#include "..."`` files next to ``source`` (one level), so that an edited
    shared header (``engine/simd_exp.h``) changes the tag and rebuilds every library using it."""
    names = re.findall(rb'^\s*#include\s+"([^"]+)"', source.read_bytes(), flags=re.M)
    return b"".join(name + b"\0" + (source.parent / name.decode()).read_bytes() for name in names)


def build_shared_library(source: Path, flags: tuple[str, ...], libs: tuple[str, ...] = ()) -> Path:
    """The built library's path; OSError (one line) without a compiler or when it fails."""
    text = source.read_bytes() + _local_includes(source)
    compiler = os.environ.get("CC") or "cc"
    tag = hashlib.sha256(text + " ".join((compiler, *flags)).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{tag}.so"
    if target.is_file():
        return target
    if shutil.which(compiler) is None:
        raise OSError(f"no C compiler {compiler!r} on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # same file system: the rename is atomic
        built = Path(tmp) / target.name
        proc = subprocess.run([compiler, *flags, str(source), "-o", str(built), *libs], capture_output=True, text=True)
        if proc.returncode:
            raise OSError(f"{compiler} failed: {proc.stderr.strip()[:300]}")
        os.replace(built, target)
    return target


class NativeLibrary:
    """One C source built and loaded once per process, or the reason it is not (``why_not``).

    The engine's C kernels each need the same steps before their first call: an environment
    switch that turns them off (``switch=0``), a check of the machine (``unsupported``: a reason,
    or None when it can run), the cached build, and ctypes signatures (``bind``). ``load()``
    does them once and remembers the library or the reason; ``reset()`` forgets both (tests)."""

    def __init__(self, source: Path, flags: tuple[str, ...], libs: tuple[str, ...] = (), *, switch: str,
                 unsupported: Callable[[], str | None], bind: Callable[[ctypes.CDLL], None]):
        self.source, self.flags, self.libs, self.switch = source, flags, libs, switch
        self._unsupported, self._bind = unsupported, bind
        self.reset()

    def reset(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self.why_not: str | None = None

    def load(self) -> ctypes.CDLL | None:
        if self._tried:
            return self._lib
        self._tried = True
        if os.environ.get(self.switch, "1") == "0":
            self.why_not = f"{self.switch}=0"
            return None
        self.why_not = self._unsupported()
        if self.why_not is not None:
            return None
        try:
            lib = ctypes.CDLL(str(build_shared_library(self.source, self.flags, self.libs)))
        except OSError as e:
            self.why_not = str(e)
            return None
        self._bind(lib)
        self._lib = lib
        return lib
