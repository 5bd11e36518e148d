"""The user's cache folder, and writes into it that a concurrent reader never sees half done.

Several things are worth computing once per machine rather than once per process: the
roofline fit of the profiles (``costmodel.fit_cache``), the C libraries built on first use
(``core.native_build``), GSM8K's token counts under its own trained tokenizer
(``workloads.length_cache``). Each keys its files by a hash of everything its value depends
on, so a stale file is never read; this module only says where they live and writes them.

Where: ``$SERVELAB_CACHE_DIR``, else ``$SERVELAB_CACHE`` (the native builds' older name), else
``$XDG_CACHE_HOME/servelab``, else ``~/.cache/servelab`` (the XDG rule platformdirs follows
on Linux, without the dependency).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    for name in ("SERVELAB_CACHE_DIR", "SERVELAB_CACHE"):
        if explicit := os.environ.get(name):
            return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servelab"


def write_atomically(path: Path, data: bytes) -> bool:
    """Write via a temporary file in the same folder and rename; False when it cannot be written
    (read-only home, full disk): the caller keeps its computed value, there is just no cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True
