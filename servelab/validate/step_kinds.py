"""docs/fidelity.md's step error by step kind: which shapes carry a system's step error.

A padded-batch policy (static, uellm, multibin; bucketserve when ``padded``) runs dense
padded prefills and decodes beside the ragged steps every policy runs; a system over the
per-system goal is split here into its steps' kinds, each with its share of the steps, the
median signed error (predicted / measured - 1: > 0 the cost model is slower than the
engine) and the median absolute error, pooled over the system's workloads. A kind whose
signed error is far from the others' is a term of the model that misses; kinds that all
share one signed error point to the calibration's level, not to a shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def step_kind(shape: Any) -> str:
    pad = shape.padding
    if pad is not None:
        return "padded prefill" if pad.row_tokens > 1 else "padded decode"
    if shape.prefill_tokens:
        return "mixed" if shape.num_decodes else ("prefill" if len(shape.prefill_tokens) == 1 else "prefills (2+)")
    return "decode, 1 row" if shape.num_decodes == 1 else "decode, 2+ rows"


def kind_rows(done: list, labels: list[str]) -> list[list[str]]:
    """Rows (system, kind, steps, share, signed median, APE median) for the systems named."""
    from servelab.validate.report import pct

    out = []
    for label in labels:
        pooled: dict[str, list[float]] = {}
        for system, _, v in done:
            if system.label != label:
                continue
            for rec in v.real.steps:
                if rec.duration_s > 0 and (rec.shape.prefill_tokens or rec.shape.num_decodes):
                    ratio = float(v.cost.step_time_s(rec.shape)) / rec.duration_s - 1.0
                    pooled.setdefault(step_kind(rec.shape), []).append(ratio)
        total = sum(len(x) for x in pooled.values())
        for kind in sorted(pooled, key=lambda k: -len(pooled[k])):
            e = np.array(pooled[kind])
            out.append([label, kind, str(len(e)), pct(len(e) / total), pct(float(np.median(e))),
                        pct(float(np.median(np.abs(e))))])
    return out


def kinds_text(done: list, goal: float) -> list[str]:
    """docs/fidelity.md item 7: each system whose median step error is at least ``goal``, and
    vllm x1 beside them, by step kind."""
    from servelab.validate.report import markdown_table

    medians: dict[str, list[float]] = {}
    for system, _, v in done:
        medians.setdefault(system.label, []).append(v.metrics["step"]["median"] or 0.0)
    over = [k for k, m in medians.items() if float(np.median(m)) >= goal]
    rows = kind_rows(done, over + [k for k in ("vllm x1",) if k in medians and k not in over])
    return ["7. **Which steps carry the error** (servelab.validate.step_kinds): each system over the goal, and "
            "vllm x1 beside them, by step kind, pooled over its workloads; signed = predicted / measured - 1 "
            "(median), APE = its absolute value (median). Kinds that share one signed error are the level; a kind "
            "apart from the others is a term that misses.", "",
            markdown_table(["system", "kind", "steps", "share", "signed", "APE"], rows) if rows else "(none)", ""]
