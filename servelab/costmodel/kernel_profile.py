"""The file ``servelab profile-gpu`` writes and ``simulate --kernel-profile`` reads (no torch here).

JSON, schema ``servelab.kernel_profile`` version 1:

    device, device_kind ("cuda" | "cpu"), dtype, torch, created_utc
    shape:       {num_heads, num_kv_heads, head_dim}          the attention layer timed
    attention:   [{kernel, batch, contexts: [..], time_s}]    one layer's decode attention
    prefill:     {tokens, time_s}                             one causal chunk (SDPA)
    gemms:       [{k, n, tokens: [..], time_s: [..]}]         [T, k] @ [k, n]
    empty_step_s                                              a step that does no model work

What the simulator takes from it:
- per kernel measured (``split-kv``: packed ragged gather/scatter, work ~ sum of contexts;
  ``per-seq``: one SDPA call per sequence; ``padded``: one SDPA over [rows, longest]), the
  coefficients of that kernel's formula (``attention`` modules) by non-negative relative
  least squares over the mixed-context batches (for ``per-seq`` the bubble factor by a grid
  search), scaled to the simulated model's heads and head size per rank;
- the prefill pair cost from the measured causal chunk (FLOPs / time: the efficiency);
- GEMM tables for exactly the shapes timed (``op_resolve`` prefers them);
- ``empty_step_s`` as the per-step overhead, unless ``--cpu-overhead`` is named.
Timings should come from the GPU being simulated; the run's context names the device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError
from servelab.costmodel.attention.base import KernelCoefficients
from servelab.costmodel.fitting import nonneg_relative_lstsq
from servelab.costmodel.tables import LogLogTable

SCHEMA = "servelab.kernel_profile"
VERSION = 1
BATCH_KINDS = ("uniform", "one-long", "two-clusters")


class KernelProfileError(UserError):
    """A kernel profile file that cannot be used, with the path and what is wrong."""


MAX_VALUE = 1e12  # seconds, tokens or widths beyond this are a unit or typing mistake


def _positive(value, what: str, where: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_VALUE
    if not ok or not np.isfinite(float(value)):
        raise KernelProfileError(f"{where}: {what} must be a number in (0, {MAX_VALUE:g}], got {str(value)[:40]}")
    return float(value)


def _features(kernel: str, contexts: np.ndarray, factor: float = 0.0) -> list[float]:
    n, total, longest = float(len(contexts)), float(contexts.sum()), float(contexts.max())
    work = {"split-kv": total, "padded": n * longest, "per-seq": max(total, longest * factor)}[kernel]
    return [1.0, n, work]


@dataclass(frozen=True, eq=False)
class KernelProfile:
    data: dict
    path: str

    @property
    def device(self) -> str:
        return str(self.data["device"])

    # ---- loading ----
    @classmethod
    def load(cls, path) -> KernelProfile:
        where = str(path)
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise KernelProfileError(f"{where}: cannot read ({e.strerror})") from None
        except (UnicodeDecodeError, ValueError) as e:
            raise KernelProfileError(f"{where}: not a JSON kernel profile ({type(e).__name__})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") != VERSION:
            raise KernelProfileError(f"{where}: not a {SCHEMA} version {VERSION} file (write one with "
                                     f"servelab profile-gpu)")
        shape = data.get("shape")
        if not isinstance(shape, dict):
            raise KernelProfileError(f"{where}: 'shape' must be an object")
        for key in ("num_heads", "num_kv_heads", "head_dim"):
            _positive(shape.get(key), f"shape.{key}", where)
        attention, gemms = data.get("attention", []), data.get("gemms", [])
        if not isinstance(attention, list) or not isinstance(gemms, list):
            raise KernelProfileError(f"{where}: 'attention' and 'gemms' must be lists")
        for k, row in enumerate(attention):
            if not isinstance(row, dict) or row.get("kernel") not in ("split-kv", "per-seq", "padded"):
                raise KernelProfileError(f"{where}: attention[{k}] needs a kernel split-kv|per-seq|padded")
            _positive(row.get("time_s"), f"attention[{k}].time_s", where)
            contexts = row.get("contexts")
            if not isinstance(contexts, list) or not contexts:
                raise KernelProfileError(f"{where}: attention[{k}].contexts must be a non-empty list")
            for c in contexts:
                _positive(c, f"attention[{k}].contexts", where)
        for k, row in enumerate(gemms):
            tokens, times = (row.get("tokens"), row.get("time_s")) if isinstance(row, dict) else (None, None)
            if not isinstance(tokens, list) or not isinstance(times, list) or not tokens or len(tokens) != len(times):
                raise KernelProfileError(f"{where}: gemms[{k}] needs non-empty tokens and time_s of equal length")
            for v in (row.get("k"), row.get("n"), *tokens, *times):
                _positive(v, f"gemms[{k}] values", where)
        prefill = data.get("prefill")
        if prefill is not None:
            if not isinstance(prefill, dict):
                raise KernelProfileError(f"{where}: 'prefill' must be an object or absent")
            _positive(prefill.get("tokens"), "prefill.tokens", where)
            _positive(prefill.get("time_s"), "prefill.time_s", where)
        _positive(data.get("empty_step_s"), "empty_step_s", where)
        if not isinstance(data.get("device"), str):
            raise KernelProfileError(f"{where}: 'device' must be a string")
        return cls(data, where)

    # ---- what the simulator asks ----
    def kernels(self) -> list[str]:
        return sorted({row["kernel"] for row in self.data.get("attention") or []})

    def fit_kernel(self, kernel: str) -> tuple[np.ndarray, float, float]:
        """(floor_s, row_s, kv_s) coefficients, the per-seq factor, and the median relative error."""
        rows = [r for r in self.data.get("attention") or [] if r["kernel"] == kernel]
        if not rows:
            raise KernelProfileError(f"{self.path}: no {kernel} timings (measured: {', '.join(self.kernels())})")
        contexts = [np.asarray(r["contexts"], dtype=float) for r in rows]
        measured = np.array([r["time_s"] for r in rows])
        factors = [0.0] if kernel != "per-seq" else list(np.geomspace(0.25, 256, 41))
        best = None
        for factor in factors:
            x = np.array([_features(kernel, c, factor) for c in contexts])
            coef = nonneg_relative_lstsq(x, measured)
            error = float(np.median(np.abs(x @ coef / measured - 1)))
            if best is None or error < best[2]:
                best = (coef, float(factor), error)
        return best

    def coefficients(self, kernel: str, instance, stated: KernelCoefficients) -> KernelCoefficients:
        """The measured kernel's coefficients, scaled from the profiled layer to ``instance``'s rank."""
        shape = self.data["shape"]
        model, tp = instance.model_spec, instance.tp
        heads, kv_heads = model.num_heads // tp, max(1, model.num_kv_heads // tp)
        kv_scale = kv_heads * model.head_dim / (shape["num_kv_heads"] * shape["head_dim"])
        q_scale = heads * model.head_dim / (shape["num_heads"] * shape["head_dim"])
        (floor, row, kv), factor, error = self.fit_kernel(kernel)
        coefficients = replace(stated, floor_s=float(floor), row_s=float(row) * q_scale, kv_read_s=float(kv) * kv_scale,
                               source=f"measured by servelab profile-gpu on {self.device} ({self.path}; "
                                      f"fit median error {error:.1%})")
        if kernel == "per-seq":
            coefficients = replace(coefficients, longest_factor=factor * shape["num_heads"] / heads)
        prefill = self.data.get("prefill")
        if prefill:
            tokens = float(prefill["tokens"])
            pairs = tokens * (tokens + 1) / 2
            pair_s = float(prefill["time_s"]) / pairs  # the measured chunk is compute-bound at this size
            coefficients = replace(coefficients, pair_s=pair_s * q_scale)
        return coefficients

    def gemm_table(self, key: tuple):
        if key[0] != "gemm":
            return None
        for row in self.data.get("gemms") or []:
            if (row["k"], row["n"]) == (key[1], key[2]):
                return LogLogTable.fit(row["tokens"], row["time_s"], source=f"{self.path} gemm {key[1:]}",
                                      monotone=False)
        return None

    def overhead(self):
        from servelab.costmodel.cpu_overhead import CPUOverhead

        step = float(self.data["empty_step_s"])
        return CPUOverhead(None, step, f"empty step measured by servelab profile-gpu on {self.device}: "
                                       f"{step * 1e3:.3f} ms per step")
