"""A user cache of the profile-fitted roofline parameters, so a run does not refit them.

Fitting the A100/H100 profiles (``profile_fit.fitted_params``) costs about a CPU-second,
more than simulating a thousand requests; its result depends only on the profile files and
the fitting code. The cache key is a SHA-256 over both: the name and bytes of every profile
file the fit reads, and the source of the modules that fit (``profile_fit``, ``ops``,
``links``, ``fitting``), so editing either refits. The value is the ``RooflineParams`` as
JSON (floats round-trip exactly, so a cached run is bit-identical to a fitted one).

Where: ``core.user_cache.cache_dir()``. ``SERVELAB_FIT_CACHE=0``
turns it off. A cache that cannot be written (read-only home) or read (a truncated file) is
skipped: the fit runs as before, the answer is the same.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from servelab.core.user_cache import cache_dir, write_atomically
from servelab.costmodel.ops import OpEfficiency, RooflineParams

CACHE_FORMAT = 1
_FIT_MODULES = ("profile_fit.py", "ops.py", "links.py", "fitting.py")


def enabled() -> bool:
    return os.environ.get("SERVELAB_FIT_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def cache_key(files: list[Path], label: str) -> str:
    """SHA-256 over the label, every input file (name and bytes) and the fitting code."""
    digest = hashlib.sha256(f"{CACHE_FORMAT}:{label}".encode())
    here = Path(__file__).parent
    for path in [*sorted(files), *(here / name for name in _FIT_MODULES)]:
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def to_json(params: RooflineParams) -> dict:
    data = asdict(params)
    data["per_op"] = [[name, asdict(eff)] for name, eff in params.per_op]
    return data


def from_json(data: dict) -> RooflineParams:
    effs = {k: OpEfficiency(**data[k]) for k in ("gemm", "memory_op", "attention")}
    per_op = tuple((name, OpEfficiency(**eff)) for name, eff in data["per_op"])
    rest = {k: v for k, v in data.items() if k not in (*effs, "per_op")}
    return RooflineParams(**effs, per_op=per_op, **rest)


def load_or_fit(files: list[Path], label: str, fit: Callable[[], RooflineParams]) -> RooflineParams:
    """The cached parameters for ``files`` if present and readable, else ``fit()`` (then stored)."""
    if not enabled():
        return fit()
    try:
        path = cache_dir() / f"roofline-{label}-{cache_key(files, label)[:24]}.json"
    except OSError:
        return fit()
    try:
        return from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: fit, then (re)write
    params = fit()
    write_atomically(path, json.dumps(to_json(params), indent=1).encode())  # unwritable: no cache, same answer
    return params
