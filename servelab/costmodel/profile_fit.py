"""Fit the roofline's per-operator efficiencies to measured kernel times.

Input: Vidur's ``<model>_mlp.csv`` profiles (``shared/data/profiling/{a100,h100}/``): one
row per (token count, TP degree) with the median milliseconds of each operator of one
layer (``time_stats.<op>.median``) and the model shape in the last columns. Attention
kernels are not in these files, so attention efficiency, step and layer overheads keep
their defaults.

Model fitted per operator (``ops.op_times_s``): floor + max(FLOPs / (peak * compute_eff),
bytes / (bandwidth * memory_eff)), with shapes from ``ops.layer_op_shapes``, the same
function the roofline uses. Objective: mean |log(predicted / measured)| (relative error,
symmetric, robust to the few outliers), minimised by a coarse-to-fine grid search over
(log compute_eff, log memory_eff, floor); deterministic and numpy-only. Elementwise ops fit
only memory_eff and floor. The profiler reruns each kernel with warm caches, so small
operands served from L2 show memory efficiencies above 1.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from servelab.catalog.gpus import GPUSpec, get_gpu
from servelab.costmodel.fitting import FitError, fit_error
from servelab.costmodel.links import fit_send_recv
from servelab.paths import default_data_dir
from servelab.costmodel.ops import (
    GEMM_OPS,
    MEMORY_OPS,
    OpEfficiency,
    OpShape,
    RooflineParams,
    embed_shape,
    layer_op_shapes,
)

# profile column op -> roofline op
PROFILE_OPS = {
    "attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj", "mlp_up_proj": "up_proj",
    "mlp_down_proj": "down_proj", "input_layernorm": "norm", "post_attention_layernorm": "norm",
    "attn_rope": "rope", "mlp_act": "act", "add": "add", "emb": "embed",
}
# GPU -> (profile directory, the GPU the profiles were measured on: Vidur's DGX A100 80GB and
# DGX H100). Fitted efficiencies are fractions of that GPU's peaks and carry over to the rest
# of its family (same silicon; H200 is H100 compute with faster HBM, an assumption).
PROFILE_FAMILIES = {
    "A100-40GB": ("a100", "A100-80GB"), "A100-80GB": ("a100", "A100-80GB"), "A800-80GB": ("a100", "A100-80GB"),
    "H100-80GB": ("h100", "H100-80GB"), "H800-80GB": ("h100", "H100-80GB"), "H200": ("h100", "H100-80GB"),
}
_COMPUTE_RANGE = (0.02, 1.0)
_MEMORY_RANGE = (0.02, 4.0)  # above 1 when a small operand stays in L2
_FLOOR_RANGE_S = (0.0, 50e-6)
IDEAL = OpEfficiency(compute=1.0, memory=1.0, floor_s=0.0)


@dataclass(frozen=True, slots=True)
class OpSamples:
    """One roofline op's measurements: FLOPs, bytes and time (s) per profile row."""

    flops: np.ndarray
    bytes_: np.ndarray
    time_s: np.ndarray


@dataclass(frozen=True, slots=True)
class OpFit:
    op: str
    efficiency: OpEfficiency
    fitted: FitError
    default: FitError  # the same op under RooflineParams() defaults
    ideal: FitError  # datasheet peaks, no floor: the unfitted roofline


@dataclass(frozen=True, slots=True)
class FitReport:
    gpu: str
    files: tuple[str, ...]
    ops: tuple[OpFit, ...]  # one per roofline op found in the files
    gemm: OpFit  # all GEMMs fitted together: the efficiency of unprofiled GEMMs (LM head)

    def op(self, name: str) -> OpFit:
        for fit in self.ops:
            if fit.op == name:
                return fit
        raise KeyError(f"no fit for op {name!r}; fitted: {', '.join(f.op for f in self.ops)}")

    def params(self, base: RooflineParams | None = None) -> RooflineParams:
        base = base if base is not None else RooflineParams()
        names = ", ".join(Path(f).name for f in self.files)
        return replace(base, gemm=self.gemm.efficiency, per_op=tuple((f.op, f.efficiency) for f in self.ops),
                       source=f"GEMM and elementwise ops fitted on {self.gpu} to {names}")

    def table(self) -> str:
        """Fitted efficiencies and relative errors (median / p90) of fitted, default and ideal."""
        lines = [f"{self.gpu}: {', '.join(Path(f).name for f in self.files)}",
                 f"{'op':<10} {'compute':>7} {'memory':>7} {'floor_us':>8}  {'fitted':>13}  {'default':>13}  "
                 f"{'ideal':>13}"]
        for fit in (*self.ops, self.gemm):
            e = fit.efficiency
            errors = "  ".join(f"{err.median_rel_error:6.1%}/{err.p90_rel_error:6.1%}"
                               for err in (fit.fitted, fit.default, fit.ideal))
            lines.append(f"{fit.op:<10} {e.compute:7.3f} {e.memory:7.3f} {e.floor_s * 1e6:8.2f}  {errors}")
        return "\n".join(lines)


def load_profile(path: str | Path) -> dict[str, OpSamples]:
    """Per roofline op, the FLOPs, bytes and measured time of every row of one profile."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = {"n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
               "num_tensor_parallel_workers"} - rows[0].keys()
    if missing:
        raise ValueError(f"{path}: not an MLP profile, missing columns {sorted(missing)}")
    columns = [op for op in PROFILE_OPS if f"time_stats.{op}.median" in rows[0]]
    acc: dict[str, tuple[list, list, list]] = {}
    shapes_cache: dict[tuple, dict[str, OpShape]] = {}
    for row in rows:
        key = tuple(row[c] for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp",
                                     "num_tensor_parallel_workers"))
        shapes = shapes_cache.get(key)
        if shapes is None:
            heads, kv_heads, hidden, inter, gated, tp = key
            heads, hidden = int(heads), int(hidden)
            layer = layer_op_shapes(hidden, heads, int(kv_heads), hidden // heads, int(inter), gated == "True",
                                    int(tp), dtype_bytes=2)
            shapes = shapes_cache[key] = {s.name: s for s in (*layer, embed_shape(hidden, 2))}
        tokens = float(row["num_tokens"])
        for column in columns:
            shape = shapes[PROFILE_OPS[column]]
            flops, bytes_, times = acc.setdefault(shape.name, ([], [], []))
            flops.append(shape.flops_per_token * tokens)
            bytes_.append(shape.weight_bytes + shape.bytes_per_token * tokens)
            times.append(float(row[f"time_stats.{column}.median"]) * 1e-3)
    return {op: OpSamples(np.array(f), np.array(b), np.array(t)) for op, (f, b, t) in acc.items()}


def predict_s(samples: OpSamples, eff: OpEfficiency, gpu: GPUSpec) -> np.ndarray:
    compute = samples.flops / (gpu.peak_flops * eff.compute)
    memory = samples.bytes_ / (gpu.hbm_bandwidth_bytes_per_s * eff.memory)
    return eff.floor_s + np.maximum(compute, memory)


def fit_op(samples: OpSamples, gpu: GPUSpec, fit_compute: bool = True, rounds: int = 8) -> OpEfficiency:
    """Grid search, then repeated 5-point zooms around the best point (halving the step)."""
    log_time = np.log(samples.time_s)
    flops = samples.flops[None, :] / gpu.peak_flops
    bytes_ = samples.bytes_[None, :] / gpu.hbm_bandwidth_bytes_per_s
    lo = np.array([np.log(_COMPUTE_RANGE[0]), np.log(_MEMORY_RANGE[0]), _FLOOR_RANGE_S[0]])
    hi = np.array([np.log(_COMPUTE_RANGE[1]), np.log(_MEMORY_RANGE[1]), _FLOOR_RANGE_S[1]])
    if not fit_compute:
        lo[0] = hi[0] = 0.0  # compute efficiency 1; unused when FLOPs are zero
    axes = [np.unique(np.linspace(lo[i], hi[i], 9)) for i in range(3)]
    best = np.zeros(3)
    for _ in range(rounds):
        grid = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")])  # [3, K]
        pred = grid[2][:, None] + np.maximum(flops / np.exp(grid[0])[:, None], bytes_ / np.exp(grid[1])[:, None])
        loss = np.mean(np.abs(np.log(pred) - log_time), axis=1)
        best = grid[:, int(np.argmin(loss))]
        steps = [a[1] - a[0] if len(a) > 1 else 0.0 for a in axes]
        axes = [np.unique(np.clip(np.linspace(best[i] - steps[i], best[i] + steps[i], 5), lo[i], hi[i]))
                for i in range(3)]
    return OpEfficiency(compute=float(np.exp(best[0])), memory=float(np.exp(best[1])), floor_s=float(best[2]))


def _fit(name: str, samples: OpSamples, gpu: GPUSpec, default: OpEfficiency) -> OpFit:
    eff = fit_op(samples, gpu, fit_compute=bool(np.any(samples.flops > 0)))
    return OpFit(name, eff, *(fit_error(predict_s(samples, e, gpu), samples.time_s) for e in (eff, default, IDEAL)))


def _concat(parts: Sequence[OpSamples]) -> OpSamples:
    return OpSamples(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("flops", "bytes_", "time_s")))


def fit_profile(paths: str | Path | Sequence[str | Path], gpu: str) -> FitReport:
    """Fit every op found in one or more MLP profiles measured on ``gpu``."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise ValueError("fit_profile needs at least one profile file")
    spec = get_gpu(gpu)
    per_op: dict[str, list[OpSamples]] = {}
    for path in paths:
        for op, samples in load_profile(path).items():
            per_op.setdefault(op, []).append(samples)
    merged = {op: _concat(parts) for op, parts in per_op.items()}
    defaults = RooflineParams()
    ops = tuple(_fit(op, merged[op], spec, defaults.op(op)) for op in (*GEMM_OPS, *MEMORY_OPS) if op in merged)
    gemms = [merged[op] for op in GEMM_OPS if op in merged]
    if not gemms:
        raise ValueError(f"{paths}: the profiles hold no GEMM timings")
    return FitReport(spec.name, tuple(str(p) for p in paths), ops, _fit("gemm", _concat(gemms), spec, defaults.gemm))


def fitted_params(gpu: str, data_dir: str | Path | None = None, *, use_cache: bool = False) -> RooflineParams:
    """RooflineParams fitted to every MLP profile of the GPU's family, plus NVLink
    efficiency and latency from its send/recv profile. Raises if there is no profile.

    ``use_cache``: take the fit from the user cache when the profile files and the fitting
    code are unchanged (``fit_cache``); the result is the same either way."""
    name = get_gpu(gpu).name
    if name not in PROFILE_FAMILIES:
        raise KeyError(f"no profiles for {name}; profiled families: {sorted(set(PROFILE_FAMILIES.values()))}")
    family, profiled_gpu = PROFILE_FAMILIES[name]
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    files = sorted((root / "profiling" / family).glob("*_mlp.csv"))
    if not files:
        raise FileNotFoundError(f"no *_mlp.csv profiles in {root / 'profiling' / family}")
    send_recv = root / "profiling" / f"{family}_dgx_send_recv.csv"
    if use_cache:
        from servelab.costmodel.fit_cache import load_or_fit

        inputs = [*files, send_recv] if send_recv.exists() else files
        return load_or_fit(inputs, family, lambda: _fit_family(files, profiled_gpu, send_recv))
    return _fit_family(files, profiled_gpu, send_recv)


def _fit_family(files: list[Path], profiled_gpu: str, send_recv: Path) -> RooflineParams:
    params = fit_profile(files, profiled_gpu).params()
    if send_recv.exists():
        link = fit_send_recv(send_recv)["nvlink"].link
        nvlink_bw = get_gpu(profiled_gpu).nvlink_bandwidth_bytes_per_s
        params = replace(params, comm_latency_s=float(link.latency_s),
                         comm_efficiency=float(link.bandwidth_bytes_per_s / nvlink_bw),
                         source=f"{params.source}; NVLink fitted to {send_recv.name}")
    return params


@functools.lru_cache(maxsize=None)
def _cached_params(gpu: str, data_dir: str) -> RooflineParams:
    try:
        return fitted_params(gpu, data_dir, use_cache=True)
    except (KeyError, FileNotFoundError):
        return RooflineParams()


def params_for_gpu(gpu: str, data_dir: str | Path | None = None) -> RooflineParams:
    """Profile-fitted params where the GPU's family has profiles, else the defaults (cached)."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    return _cached_params(get_gpu(gpu).name, str(root))
