"""Why a fit from outside a server is as good as it is: the checks that tell the machine's
noise from the model's misfit, computed from a calibration's raw timings (``<fit>.probes.json``).

- **noise**: how far the same probe shape's repeats are apart, on the samples as timed and
  after dividing by the reference probe's load level (``probes.normalise``);
- **held-out**: each sample predicted by a fit without its shape's repeats, and (optimistic)
  without only itself; per kind of sample (TTFT, one-row decode of a prefill probe, decode
  batch), so a kind the line misses shows;
- **lack of fit**: the line against each shape's median (over its repeats) next to the
  samples' own spread around that median. If the line were right, it would miss the medians
  by about the medians' own noise (the spread over the square root of the repeats); a line
  that misses them by much more lacks a term;
- **robust fit**: the held-out error when the line is fitted to each shape's median over its
  repeats instead of to every sample (an outlier of a loaded moment then moves it less);
- **bursts**: probes whose tokens the client read in bursts (no sample, or no TTFT).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def load_runs(path: Path) -> list:
    from servelab.validate.probes import Probe, ProbeRun, samples_of

    raw = json.loads(Path(path).read_text())
    runs = []
    for r in raw["runs"]:
        probe = Probe(**r["probe"])
        samples, note = samples_of(probe, r["requests"])  # today's rules on the raw arrival times
        runs.append(ProbeRun(probe, r["requests"], samples, note, tuple(r.get("reference_s") or (None, None))))
    return runs


def _kind(run, shape) -> str:
    if run.probe.kind == "decode":
        return "decode batch"
    if run.probe.kind == "mixed":
        return "mixed step" if shape.prefill_tokens else "after mixed"
    return "TTFT" if shape.prefill_tokens else "1-row decode"


def checks(runs: list) -> dict:
    from servelab.costmodel.linear import fit_linear_cost_model, held_out_error
    from servelab.validate.probes import normalise
    from servelab.validate.remote_calibrate import adjusted_samples, repeat_noise, request_overhead, sample_groups

    out: dict = {"probes": len(runs), "bursts": sum("burst" in r.note for r in runs),
                 "failed": sum("failed" in r.note for r in runs)}
    for label, use in (("raw", runs), ("normalised", normalise(runs)[0])):
        samples = adjusted_samples(use, request_overhead(use))
        groups = sample_groups(use)
        kinds = [_kind(r, shape) for r in use for shape, _ in r.samples]
        model, fit = fit_linear_cost_model(samples, attention_kernel="split-kv")
        factors = bool(model.token_factors)
        by_shape = held_out_error(samples, "split-kv", factors, groups=groups)
        by_sample = held_out_error(samples, "split-kv", factors)
        per_kind = {}
        for kind in sorted(set(kinds)):
            keep = [i for i, k in enumerate(kinds) if k == kind]
            errs = _group_errors(samples, groups, factors, keep)
            per_kind[kind] = {"n": len(keep), "median": float(np.median(errs)) if errs else None}
        medians: dict = {}
        for (shape, t), g in zip(samples, groups):
            medians.setdefault(g, [shape, []])[1].append(t)
        spread = [abs(t / np.median(ts) - 1) for _, ts in medians.values() if len(ts) >= 2 for t in ts]
        line = [abs(model.step_time_s(shape) / np.median(ts) - 1) for shape, ts in medians.values() if len(ts) >= 2]
        reps = [len(ts) for _, ts in medians.values() if len(ts) >= 2]
        out[label] = {
            "samples": len(samples), "in_sample": fit.median_rel_error,
            "held_out_by_shape": None if by_shape is None else by_shape.median_rel_error,
            "held_out_by_shape_p90": None if by_shape is None else by_shape.p90_rel_error,
            "held_out_by_sample": None if by_sample is None else by_sample.median_rel_error,
            "held_out_median_fit": _median_fit_held_out(samples, groups, factors),
            "per_kind": per_kind, "repeat_noise": (repeat_noise(use) or {}).get("median"),
            "line_vs_shape_medians": float(np.median(line)) if line else None,
            "shape_median_noise": (float(np.median(spread)) / math.sqrt(float(np.median(reps)))) if spread else None,
        }
    return out


def _group_errors(samples, groups, factors: bool, keep: list[int]) -> list[float]:
    """Held-out errors (shape's repeats left out together) of the samples at ``keep``."""
    from servelab.costmodel.linear import _fit_arrays, _predict, step_features

    features = np.array([step_features(s) for s, _ in samples], dtype=float)
    measured = np.array([t for _, t in samples], dtype=float)
    errs = []
    for i in keep:
        out = np.array([g == groups[i] for g in groups])
        coef, table = _fit_arrays(features[~out], features[~out, 1], measured[~out], "split-kv", factors)
        errs.append(abs(float(_predict(features[i:i + 1], coef, table)[0]) / measured[i] - 1))
    return errs


def _median_fit_held_out(samples, groups, factors: bool) -> float | None:
    """Median held-out error (each shape left out) of a line fitted to the other shapes'
    medians over their repeats, against every sample of the left-out shape."""
    from servelab.costmodel.linear import _fit_arrays, _predict, step_features

    keys = list(dict.fromkeys(groups))
    if len(keys) < 3:
        return None
    features = np.array([step_features(s) for s, _ in samples], dtype=float)
    measured = np.array([t for _, t in samples], dtype=float)
    index = np.array([keys.index(g) for g in groups])
    first = np.array([features[index == k][0] for k in range(len(keys))])
    medians = np.array([np.median(measured[index == k]) for k in range(len(keys))])
    errs = []
    for k in range(len(keys)):
        rest = np.arange(len(keys)) != k
        coef, table = _fit_arrays(first[rest], first[rest, 1], medians[rest], "split-kv", factors)
        out = index == k
        errs += list(np.abs(_predict(features[out], coef, table) / measured[out] - 1))
    return float(np.median(errs))


def shape_errors(runs: list, normalised: bool = True) -> list[dict]:
    """Which probe shapes carry the held-out error: per shape (its repeats together), its kind,
    the median sample, what a fit without that shape predicts for it, and the signed error
    of that prediction against the median (``predicted / measured - 1``), largest first."""
    from servelab.costmodel.linear import _fit_arrays, _predict, fit_linear_cost_model, step_features
    from servelab.validate.probes import normalise
    from servelab.validate.remote_calibrate import adjusted_samples, request_overhead, sample_groups

    use = normalise(runs)[0] if normalised else runs
    samples = adjusted_samples(use, request_overhead(use))
    groups = sample_groups(use)
    if len(set(groups)) < 3:
        return []
    labels = [(r.probe.label.rsplit(" (#", 1)[0], _kind(r, shape)) for r in use for shape, _ in r.samples]
    factors = bool(fit_linear_cost_model(samples, attention_kernel="split-kv")[0].token_factors)
    features = np.array([step_features(s) for s, _ in samples], dtype=float)
    measured = np.array([t for _, t in samples], dtype=float)
    out = []
    for g in dict.fromkeys(groups):
        mask = np.array([x == g for x in groups])
        coef, table = _fit_arrays(features[~mask], features[~mask, 1], measured[~mask], "split-kv", factors)
        i = int(np.argmax(mask))
        predicted = float(_predict(features[i:i + 1], coef, table)[0])
        median = float(np.median(measured[mask]))
        out.append({"shape": labels[i][0], "kind": labels[i][1], "n": int(mask.sum()), "measured_s": median,
                    "predicted_s": predicted, "error": predicted / median - 1})
    return sorted(out, key=lambda x: -abs(x["error"]))
