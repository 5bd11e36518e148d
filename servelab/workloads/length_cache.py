"""GSM8K's token counts under its own trained tokenizer, computed once per machine.

Why: a ``gsm8k`` workload's lengths are counts under a byte-level BPE trained on the file itself
(``datasets.load_gsm8k``): training and tokenising 7,473 rows costs 3-6 CPU-s, more than
simulating the workload, in every process that reads the file (each CLI command, each test that
starts one). The counts depend only on the file's bytes, the vocabulary size, the ``tokenizers``
version and the code that trains and counts, so a SHA-256 over all of them names the cached
file and a stale one is never read. The value is the two count arrays as JSON (integers,
exact). A cache that cannot be read or written is skipped: the counts are computed, the answer
is the same. ``SERVELAB_LENGTH_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import numpy as np

from servelab.core.user_cache import cache_dir, write_atomically

CACHE_FORMAT = 1
_CODE = ("tokenize.py", "datasets.py", "length_cache.py")


def enabled() -> bool:
    return os.environ.get("SERVELAB_LENGTH_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def _key(path: Path, label: str) -> str:
    try:
        import tokenizers
        version = tokenizers.__version__
    except ImportError:
        version = "none"
    digest = hashlib.sha256(f"{CACHE_FORMAT}:{label}:{version}".encode())
    here = Path(__file__).parent
    for part in (Path(path), *(here / name for name in _CODE)):
        digest.update(part.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def counts(path: Path, label: str, compute: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt counts, output counts) for the file at ``path``: cached if present, else computed and stored."""
    if not enabled():
        return compute()
    try:
        cached = cache_dir() / f"lengths-{label}-{_key(path, label)[:24]}.json"
    except OSError:
        return compute()
    try:
        data = json.loads(cached.read_text())
        prompt, output = np.asarray(data["prompt"], dtype=np.int64), np.asarray(data["output"], dtype=np.int64)
        if prompt.ndim == output.ndim == 1:
            return prompt, output
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: compute, then (re)write
    prompt, output = compute()
    write_atomically(cached, json.dumps({"prompt": prompt.tolist(), "output": output.tolist()}).encode())
    return prompt, output
