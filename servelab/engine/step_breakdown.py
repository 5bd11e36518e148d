"""Where a decode step's CPU time goes, by part of the model, measured with module hooks.

Why hooks and CPU time, not ``torch.profiler``: the profiler times in wall clock (on a shared
machine that counts other processes' turns) and names ops, not parts of the model (the ``mul``
of a norm, of RoPE and of the MLP's activation look alike). Here each projection, each norm, the
attention module, the MLP, the decoder layer, the model and the runner's step are timed with
``time.process_time`` on entry and exit; the parts that are not modules (RoPE with the q/k/v
split and views, the MLP's activation, the residual adds and the per-layer Python, embedding and
logits gather, batch building and sampling) are the parent's time less its timed children. Where
``layer_ops`` fuses the residual add after attention with the norm after it (float32, one
thread), that norm is no module call and counts with the residual adds. The
hooks cost a few microseconds each (about 330 a step at 16 layers), which lands in the parent's
remainder; callers report the plain step beside the sum so the reader sees that cost.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from servelab.engine import attention
from servelab.engine.model import MLP, Attention, DecoderLayer, Linear, Model, RMSNorm

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
# The rows of a breakdown, in order; "projection: X" per name in PROJECTIONS
PARTS = (*(f"projection: {p}" for p in PROJECTIONS), "attention kernel (KV write + attend)",
         "RoPE, q/k/v split and views", "norms (RMSNorm)", "MLP activation (silu x up)",
         "residual adds (+ fused add and norm) and per-layer Python", "embedding, RoPE table, logits gather",
         "batch building and sampling (runner)")


class _Timer:
    """Accumulates CPU seconds per key across nested enter/exit pairs."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self._starts: list[float] = []

    def enter(self) -> None:
        self._starts.append(time.process_time())

    def exit(self, key: str) -> None:
        self.total[key] += time.process_time() - self._starts.pop()


def _hook(module: torch.nn.Module, timer: _Timer, key: str) -> list:
    return [module.register_forward_pre_hook(lambda *_: timer.enter()),
            module.register_forward_hook(lambda *_: timer.exit(key))]


def _parts(t: dict[str, float]) -> dict[str, float]:
    proj = {p: t[p] for p in PROJECTIONS}
    parts = {f"projection: {p}": proj[p] for p in PROJECTIONS}
    parts["attention kernel (KV write + attend)"] = t["attend"]
    parts["RoPE, q/k/v split and views"] = t["attention"] - proj["qkv_proj"] - proj["o_proj"] - t["attend"]
    parts["norms (RMSNorm)"] = t["norm"]
    parts["MLP activation (silu x up)"] = t["mlp"] - proj["gate_up_proj"] - proj["down_proj"]
    parts["residual adds (+ fused add and norm) and per-layer Python"] = (t["layer"] - t["layer_norms"] - t["attention"]
                                                                          - t["mlp"])
    parts["embedding, RoPE table, logits gather"] = (t["model"] - t["layer"] - proj["lm_head"]
                                                     - (t["norm"] - t["layer_norms"]))
    parts["batch building and sampling (runner)"] = t["run"] - t["model"]
    return parts


def breakdown(model: Model, step: Callable[[], object], repeats: int) -> dict[str, float]:
    """Median CPU ms per part of ``step()`` (one warm-up call, then ``repeats``), plus
    ``"sum"`` (the parts of one step) . ``step`` runs ``model`` once, e.g. ``runner.run(chunks)``."""
    timer, handles = _Timer(), []
    names = {m: n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
    for m in model.modules():
        if isinstance(m, Linear) and names[m] in PROJECTIONS:
            handles += _hook(m, timer, names[m])
        elif isinstance(m, RMSNorm):
            handles += _hook(m, timer, "norm")
        elif isinstance(m, Attention):
            handles += _hook(m, timer, "attention")
        elif isinstance(m, MLP):
            handles += _hook(m, timer, "mlp")
        elif isinstance(m, DecoderLayer):
            handles += _hook(m, timer, "layer")
            for norm in (m.input_layernorm, m.post_attention_layernorm):  # the layer's norms, apart from the final one
                handles += _hook(norm, timer, "layer_norms")
    handles += _hook(model, timer, "model")
    attend = attention.RaggedMetadata.attend

    def timed_attend(self, *args, **kwargs):
        timer.enter()
        try:
            return attend(self, *args, **kwargs)
        finally:
            timer.exit("attend")

    attention.RaggedMetadata.attend = timed_attend
    samples: dict[str, list[float]] = defaultdict(list)
    try:
        for i in range(repeats + 1):
            timer.total.clear()
            timer.enter()
            step()
            timer.exit("run")
            if i:  # the first call warms up
                for part, s in _parts(timer.total).items():
                    samples[part].append(s * 1e3)
                samples["sum"].append(timer.total["run"] * 1e3)
    finally:
        attention.RaggedMetadata.attend = attend
        for h in handles:
            h.remove()
    return {part: statistics.median(v) for part, v in samples.items()}


def format_rows(parts: dict[str, float], plain_ms: float, layers: int) -> list[str]:
    """Markdown rows: part, ms per step, ms per layer (the layers' parts), share of the hooked step."""
    rows = []
    total = parts["sum"]
    for part in PARTS:
        per_layer = "" if part in ("projection: lm_head", "embedding, RoPE table, logits gather",
                                   "batch building and sampling (runner)") else f"{parts[part] / layers:.2f}"
        rows.append(f"| {part} | {parts[part]:.1f} | {per_layer} | {parts[part] / total:.1%} |")
    rows.append(f"| **step with hooks** (plain step, no hooks: {plain_ms:.1f}) | {total:.1f} | | 100% |")
    return rows
