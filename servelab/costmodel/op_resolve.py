"""Which table times each operator of a catalog instance, and how it was found.

For every non-attention op of one layer (per TP rank): a ``servelab profile-gpu`` table of
exactly this shape if one was given, else the family's profile (``op_profiles``: measured,
same-shape, or scaled from the nearest shape by the fitted roofline's ratio), else the
fitted roofline itself. The answer is a function of the token count (vectorised) and an
``OpSource`` the run's context prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from servelab.catalog.gpus import GPUSpec, get_gpu
from servelab.catalog.instance import InstanceSpec
from servelab.costmodel.op_profiles import GPU_FAMILIES, LAYER_OPS, OP_COUNTS, OpSource, key_shape, load_library, op_keys
from servelab.costmodel.ops import OpEfficiency, OpShape, RooflineParams, op_times_s

TokenFn = Callable[[np.ndarray], np.ndarray]


def roofline_fn(shape: OpShape, eff: OpEfficiency, gpu: GPUSpec) -> TokenFn:
    """One instance of the op (``shape.count`` copies summed), 0 at 0 tokens."""
    def fn(tokens: np.ndarray) -> np.ndarray:
        t = np.asarray(tokens, dtype=float)
        return np.where(t > 0, shape.count * op_times_s(shape, eff, t, gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s),
                        0.0)
    return fn


def _same_model(profiled_name: str, catalog_name: str) -> bool:
    from servelab.catalog.models import get_model

    try:
        return get_model(profiled_name.rsplit("/", 1)[-1]).name == catalog_name
    except Exception:  # a profiled model outside the catalog
        return False


def _origins(origins) -> str:
    return ", ".join(f"{m} tp={tp}" for m, tp in origins[:3]) + (" ..." if len(origins) > 3 else "")


def resolve_op(op: str, key: tuple, instance: InstanceSpec, params: RooflineParams, library,
               kernel_profile=None) -> tuple[TokenFn, OpSource]:
    gpu = instance.gpu_spec
    eff = params.op(op)
    if kernel_profile is not None:
        table = kernel_profile.gemm_table(key)
        if table is not None:
            return table, OpSource(op, "measured", f"servelab profile-gpu on {kernel_profile.device}")
    if library is None:
        return roofline_fn(key_shape(key, instance.dtype_bytes), eff, gpu), OpSource(
            op, "roofline", f"no operator profiles for {gpu.name}")
    found = library.ops.get(key)
    profiled_gpu = get_gpu(library.profiled_gpu)
    if found is not None and profiled_gpu.name == gpu.name:
        mine = any(_same_model(m, instance.model) and tp == instance.tp for m, tp in found.origins)
        kind = "measured" if mine else "same-shape"
        return found.table, OpSource(op, kind, f"{library.family} profile of {_origins(found.origins)}")
    ref = found if found is not None else library.nearest(key)
    if ref is None:
        return roofline_fn(key_shape(key, instance.dtype_bytes), eff, gpu), OpSource(
            op, "roofline", f"no {key[0]} operator in the {library.family} profiles")
    table = scaled_table(ref, key, eff, gpu, profiled_gpu, instance.dtype_bytes)
    what = [] if ref.key == key else [f"shape {ref.key[1:]} -> {key[1:]}"]
    if profiled_gpu.name != gpu.name:
        what.append(f"{profiled_gpu.name} -> {gpu.name}")
    return table, OpSource(op, "scaled", f"{library.family} profile of {_origins(ref.origins)}, "
                                         f"{' and '.join(what)} by the fitted roofline's ratio")


def scaled_table(ref, key: tuple, eff: OpEfficiency, gpu: GPUSpec, ref_gpu: GPUSpec, dtype_bytes: int = 2):
    """``ref``'s measured table times the fitted roofline's ratio of ``key`` on ``gpu`` to
    ``ref.key`` on ``ref_gpu``, token count by token count (kept monotone)."""
    x = ref.table.x
    target = op_times_s(key_shape(key, dtype_bytes), eff, x, gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s)
    base = op_times_s(key_shape(ref.key, dtype_bytes), eff, x, ref_gpu.peak_flops, ref_gpu.hbm_bandwidth_bytes_per_s)
    return ref.table.scaled(target / base)


def resolve_layer_ops(instance: InstanceSpec, params: RooflineParams, data_dir: Path,
                      kernel_profile=None) -> list[tuple[str, int, TokenFn, OpSource]]:
    """(op, count per layer, time by token count, source) for every non-attention layer op."""
    model = instance.model_spec
    family = GPU_FAMILIES.get(instance.gpu_spec.name)
    library = load_library(*family, str(data_dir)) if family else None
    keys = op_keys(model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim, model.intermediate_size,
                   model.gated_mlp, instance.tp)
    out = []
    for op in LAYER_OPS:
        fn, source = resolve_op(op, keys[op], instance, params, library, kernel_profile)
        out.append((op, OP_COUNTS.get(op, 1), fn, source))
    return out


def resolve_embed(instance: InstanceSpec, params: RooflineParams, data_dir: Path) -> tuple[TokenFn, OpSource]:
    model = instance.model_spec
    family = GPU_FAMILIES.get(instance.gpu_spec.name)
    library = load_library(*family, str(data_dir)) if family else None
    return resolve_op("embed", ("embed", model.hidden_size), instance, params, library)
