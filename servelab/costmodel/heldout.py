"""Held-out error of operator-time predictors: the profile tables against the roofline fit.

Two tests, both on the measured per-layer operator profiles of one GPU family:

- **points left out** (``points_held_out``): in every (model, TP, operator) series, every
  interior token count in fold k of 5 (interleaved) is predicted by a table built without
  fold k (``tables.held_out_errors``); the roofline is refitted per operator on the same
  training rows (``profile_fit.fit_op``) and predicts the same held-out rows. This is the
  error of a profiled model at token counts the profile skipped.
- **models left out** (``models_held_out``): every profiled model's operators predicted
  from the *other* models' profiles as a catalog model that was never profiled would be
  (same-shape table, else the nearest shape scaled by the fitted roofline's ratio;
  ``op_resolve``), against the roofline fitted without that model. This is the error of a
  catalog model that borrows.

Errors are |predicted / measured - 1| per point, summarised per operator as median and p90.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.catalog.gpus import get_gpu
from servelab.costmodel.op_profiles import OpLibrary, ProfiledOp, family_files, key_shape, model_name_of, read_series
from servelab.costmodel.op_resolve import scaled_table
from servelab.costmodel.ops import OpEfficiency
from servelab.costmodel.profile_fit import OpSamples, fit_op, predict_s
from servelab.costmodel.tables import LogLogTable, held_out_errors

NUM_FOLDS = 5


@dataclass(frozen=True)
class OpErrors:
    op: str
    profile: np.ndarray  # relative errors of the profile tables on held-out points
    roofline: np.ndarray  # of the roofline fitted without them

    @staticmethod
    def summary(errors: np.ndarray) -> tuple[float, float]:
        return (float(np.median(errors)), float(np.percentile(errors, 90))) if errors.size else (np.nan, np.nan)


def _series(family: str, data_dir: Path):
    """(model, tp, column, op, key, tokens, seconds) for every series of the family's profiles."""
    out = []
    for path in family_files(family, data_dir):
        model = model_name_of(path, data_dir)
        for (key, tp, column), (op, xs, ys) in read_series(path).items():
            out.append((model, tp, column, op, key, np.asarray(xs), np.asarray(ys)))
    return out


def _samples(key: tuple, tokens: np.ndarray, times: np.ndarray) -> OpSamples:
    shape = key_shape(key)
    return OpSamples(shape.flops_per_token * tokens, shape.weight_bytes + shape.bytes_per_token * tokens, times)


def _concat(parts: list[OpSamples]) -> OpSamples:
    return OpSamples(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("flops", "bytes_", "time_s")))


def _fit(parts: list[OpSamples], gpu) -> OpEfficiency:
    merged = _concat(parts)
    return fit_op(merged, gpu, fit_compute=bool(np.any(merged.flops > 0)))


def points_held_out(family: str, profiled_gpu: str, data_dir: Path) -> dict[str, OpErrors]:
    gpu = get_gpu(profiled_gpu)
    series = _series(family, data_dir)
    out: dict[str, OpErrors] = {}
    for op in sorted({s[3] for s in series}):
        mine = [s for s in series if s[3] == op]
        profile = np.concatenate([held_out_errors(x, y, NUM_FOLDS, monotone=False) for *_, x, y in mine])
        roof = []
        for fold in range(NUM_FOLDS):
            train, test = [], []
            for *_, key, x, y in mine:
                ux, inv = np.unique(x, return_inverse=True)
                uy = np.bincount(inv, weights=y) / np.bincount(inv)
                idx = np.arange(ux.size)
                held = (idx % NUM_FOLDS == fold) & (idx > 0) & (idx < ux.size - 1)
                train.append(_samples(key, ux[~held], uy[~held]))
                test.append(_samples(key, ux[held], uy[held]))
            eff = _fit(train, gpu)
            held = _concat(test)
            roof.append(np.abs(predict_s(held, eff, gpu) / held.time_s - 1))
        out[op] = OpErrors(op, profile, np.concatenate(roof))
    return out


def _library_without(series, model: str, family: str, profiled_gpu: str) -> OpLibrary:
    acc: dict[tuple, tuple[list, list, list]] = {}
    for m, tp, _column, _op, key, x, y in series:
        if m == model:
            continue
        xs, ys, origins = acc.setdefault(key, ([], [], []))
        xs.extend(x)
        ys.extend(y)
        if (m, tp) not in origins:
            origins.append((m, tp))
    ops = {k: ProfiledOp(k, LogLogTable.fit(xs, ys, monotone=False), tuple(o)) for k, (xs, ys, o) in acc.items()}
    return OpLibrary(family, profiled_gpu, (), ops)


def models_held_out(family: str, profiled_gpu: str, data_dir: Path) -> dict[str, OpErrors]:
    gpu = get_gpu(profiled_gpu)
    series = _series(family, data_dir)
    profile: dict[str, list] = {}
    roof: dict[str, list] = {}
    for model in sorted({s[0] for s in series}):
        library = _library_without(series, model, family, profiled_gpu)
        for op in sorted({s[3] for s in series}):
            others = [_samples(s[4], s[5], s[6]) for s in series if s[0] != model and s[3] == op]
            if not others:
                continue
            eff = _fit(others, gpu)
            for m, _tp, _column, o, key, x, y in series:
                if m != model or o != op:
                    continue
                ref = library.ops.get(key) or library.nearest(key)
                if ref is None:
                    continue
                predicted = scaled_table(ref, key, eff, gpu, gpu)(x) if ref.key != key else ref.table(x)
                profile.setdefault(op, []).append(np.abs(predicted / y - 1))
                roof.setdefault(op, []).append(np.abs(predict_s(_samples(key, x, y), eff, gpu) / y - 1))
    return {op: OpErrors(op, np.concatenate(profile[op]), np.concatenate(roof[op])) for op in profile}


def pooled(errors: dict[str, OpErrors]) -> OpErrors:
    return OpErrors("all", np.concatenate([e.profile for e in errors.values()]),
                    np.concatenate([e.roofline for e in errors.values()]))

