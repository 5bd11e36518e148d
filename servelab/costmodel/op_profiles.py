"""Measured operator times by token count, indexed by the operator's per-rank shape.

Input: Vidur's MLP/projection profiles of one GPU family (``profiling/<family>/*_mlp.csv``
and ``profiling/compute/<family>/<org>/<model>/mlp.csv``): per (model, TP degree, token
count) the median milliseconds of every non-attention operator of one layer.

A GEMM's time depends on its per-rank shape [T, k] @ [k, n], not on which model or TP
degree it came from, so tables are keyed by shape: ``("gemm", k, n)``, and for elementwise
ops by their per-rank width (``("norm", hidden)``, ...). A catalog model at a TP degree then
finds each of its operators one of three ways, and says which (``OpSource``):

- ``measured``: a profile of this model at this TP degree holds the shape;
- ``same-shape``: another profiled model or TP degree holds exactly this shape (Llama-2-13B's
  layer is InternLM-20B's; Llama-3.1-8B's is Meta-Llama-3-8B's; OPT-2.7B's is Phi-2's);
- ``scaled``: the nearest profiled shape of the same kind (log distance over its widths),
  times the ratio of the fitted roofline's predictions for the two shapes (and GPUs), token
  count by token count. This keeps the measured small-T behaviour (launch floors, tile
  waves) and moves only what the shape changes. It is also how a GPU without its own
  profiles (H200: H100 compute, faster HBM) uses its family's tables.

Only when a family has no profile at all does the caller fall back to the roofline.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.costmodel.ops import OpShape, gemm_shape, memory_shape
from servelab.costmodel.tables import LogLogTable

# profile column -> our op name (two norms and two adds share a table: same kernel, same shape)
PROFILE_COLUMNS = {
    "attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj", "mlp_up_proj": "up_proj",
    "mlp_down_proj": "down_proj", "input_layernorm": "norm", "post_attention_layernorm": "norm",
    "attn_rope": "rope", "mlp_act": "act", "add": "add", "emb": "embed",
}
LAYER_OPS = ("qkv_proj", "o_proj", "up_proj", "down_proj", "norm", "rope", "act", "add")
OP_COUNTS = {"norm": 2, "add": 2}  # per layer: before attention and before the MLP
# catalog GPU -> (profile family folder, the GPU the family was measured on)
GPU_FAMILIES = {
    "A100-40GB": ("a100", "A100-80GB"), "A100-80GB": ("a100", "A100-80GB"), "A800-80GB": ("a100", "A100-80GB"),
    "H100-80GB": ("h100", "H100-80GB"), "H800-80GB": ("h100", "H100-80GB"), "H200": ("h100", "H100-80GB"),
    "A40": ("a40", "A40"),
}
_SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tensor_parallel_workers")


def op_keys(hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int, gated: bool,
            tp: int) -> dict[str, tuple]:
    """Per-rank shape key of every non-attention op of one layer, and of the embedding."""
    heads, kv_heads, inter = num_heads // tp, max(1, num_kv_heads // tp), intermediate // tp
    return {
        "qkv_proj": ("gemm", hidden, (heads + 2 * kv_heads) * head_dim),
        "o_proj": ("gemm", heads * head_dim, hidden),
        "up_proj": ("gemm", hidden, (2 if gated else 1) * inter),
        "down_proj": ("gemm", inter, hidden),
        "norm": ("norm", hidden), "rope": ("rope", (heads + kv_heads) * head_dim),
        "act": ("act", inter, gated), "add": ("add", hidden), "embed": ("embed", hidden),
    }


def key_shape(key: tuple, dtype_bytes: int = 2) -> OpShape:
    """The roofline ``OpShape`` of a key (what the scaling ratio is computed from)."""
    kind, d = key[0], dtype_bytes
    if kind == "gemm":
        return gemm_shape("gemm", key[1], key[2], d)
    widths = {"norm": 2 * key[1], "rope": 2 * key[1], "add": 3 * key[1], "embed": 2 * key[1]}
    if kind == "act":
        widths["act"] = (2 if key[2] else 1) * key[1] + key[1]
    return memory_shape(kind, widths[kind] * d)


@dataclass(frozen=True, eq=False)
class ProfiledOp:
    key: tuple
    table: LogLogTable  # seconds by token count
    origins: tuple[tuple[str, int], ...]  # (profiled model, tp) pairs that measured this shape


@dataclass(frozen=True)
class OpSource:
    op: str
    kind: str  # measured | same-shape | scaled | roofline
    detail: str


@dataclass(frozen=True, eq=False)
class OpLibrary:
    family: str
    profiled_gpu: str
    files: tuple[str, ...]
    ops: dict  # key -> ProfiledOp

    def nearest(self, key: tuple) -> ProfiledOp | None:
        """The profiled op of the same kind whose widths are closest in log space."""
        best, best_d = None, math.inf
        for other in self.ops.values():
            if other.key[0] != key[0] or (key[0] == "act" and other.key[2] != key[2]):
                continue
            d = sum(abs(math.log(a / b)) for a, b in zip(key[1:], other.key[1:]) if not isinstance(a, bool))
            if d < best_d or (d == best_d and best is not None and other.key < best.key):
                best, best_d = other, d
        return best


def model_name_of(path: Path, root: Path) -> str:
    """``a100/Llama-2-7b-hf_mlp.csv`` -> ``Llama-2-7b-hf``; ``compute/a100/Qwen/Qwen-72B/mlp.csv`` -> ``Qwen/Qwen-72B``."""
    if path.name.endswith("_mlp.csv"):
        return path.name[: -len("_mlp.csv")]
    return f"{path.parent.parent.name}/{path.parent.name}"


def family_files(family: str, data_dir: Path) -> list[Path]:
    prof = data_dir / "profiling"
    return sorted((prof / family).glob("*_mlp.csv")) + sorted((prof / "compute" / family).glob("*/*/mlp.csv"))


def read_series(path: Path) -> dict[tuple[tuple, int], tuple[str, list[float], list[float]]]:
    """(key, tp) -> (op, token counts, seconds) for every op column of one profile file."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or any(c not in rows[0] for c in (*_SHAPE_COLUMNS, "num_tokens")):
        raise ValueError(f"{path}: not an operator profile (needs columns {_SHAPE_COLUMNS} and num_tokens)")
    columns = [c for c in PROFILE_COLUMNS if f"time_stats.{c}.median" in rows[0]]
    out: dict = {}
    for row in rows:
        heads, kv_heads, hidden, inter, gated, tp = (row[c] for c in _SHAPE_COLUMNS)
        heads, hidden, tp = int(heads), int(hidden), int(tp)
        keys = op_keys(hidden, heads, int(kv_heads), hidden // heads, int(inter), gated == "True", tp)
        tokens = float(row["num_tokens"])
        for column in columns:
            op = PROFILE_COLUMNS[column]
            _, xs, ys = out.setdefault((keys[op], tp, column), (op, [], []))
            xs.append(tokens)
            ys.append(float(row[f"time_stats.{column}.median"]) * 1e-3)
    return {k: v for k, v in out.items()}


@functools.lru_cache(maxsize=None)
def load_library(family: str, profiled_gpu: str, data_dir: str) -> OpLibrary | None:
    """Every profiled op of a family (None when the family has no profile files)."""
    root = Path(data_dir)
    files = family_files(family, root)
    if not files:
        return None
    samples: dict[tuple, tuple[list, list, list]] = {}
    for path in files:
        model = model_name_of(path, root)
        for (key, tp, _column), (_op, xs, ys) in read_series(path).items():
            acc = samples.setdefault(key, ([], [], []))
            acc[0].extend(xs)
            acc[1].extend(ys)
            if (model, tp) not in acc[2]:
                acc[2].append((model, tp))
    ops = {key: ProfiledOp(key, LogLogTable.fit(xs, ys, source=f"{family} {key}", monotone=False), tuple(origins))
           for key, (xs, ys, origins) in samples.items()}
    return OpLibrary(family, profiled_gpu, tuple(str(f) for f in files), ops)
