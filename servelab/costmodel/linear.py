"""Linear step-time model fitted to wall-clock measurements, saved as JSON.

    step = c_step + c_token * tokens + c_decode_ctx * decode_context_sum
           + c_decode_pad * decode_rows * decode_context_max
           + c_prefill_attn * sum(chunk_tokens * chunk_context) + c_row * rows
           + c_swap_block * swap_blocks

``c_decode_pad`` is the iteration bubble: an attention that pads every decode row to the
longest context in the step (our engine's gather does) pays rows x longest, not the sum;
a ragged kernel fits it near 0. A step of mixed context lengths separates the two terms, so
calibration times some (version 1 files, without the term, load with it at 0).
``attention_kernel`` names the engine's decode kernel, and the fit keeps only that kernel's
term: ``padded`` rows x longest, ``split-kv`` the sum, ``auto`` both (non-negative least
squares picks), so a calibration follows whichever kernel the engine runs.

``token_factors`` (version 3): in a step of T = 1, 2, ... tokens the per-step, per-token
and per-row part of the line is multiplied by ``token_factors[T - 1]`` (attention and swaps
are not). Small matrix products are not linear in their rows on a CPU (BLAS
switches from a matrix-vector kernel at one row to blocked kernels that pay for a full tile
at two or three: measured on bench-30m, docs/costmodel.md), so a one-row decode is faster and
two- and three-row steps slower than any line; the factors are the median measured /
predicted ratio of the calibration's steps of each small token count timed at least twice
(linear between those counts, 1 beyond, within [0.5, 2]). Version 1-2 files load with none.

A padded batch is charged as its dense equivalent: ``rows * row_tokens`` tokens, and its
attention as the one masked dense attention it runs, ``rows * row_tokens * context_tokens``
query-key pairs at ``c_decode_pad`` (version 4), whatever the ragged kernel: a padded decode
(row_tokens == 1) costs rows x context like the padded decode kernel, a padded prefill every
pair of its rectangle (no causal half). Before version 4 a padded step went through the
ragged terms (its decode at the split-kv rate per context token, its prefill at the causal
prefill rate); on the quiet machine's fidelity runs (docs/fidelity.md, item 7) that
over-predicted multibin's padded decodes by 11.8% and under-predicted its padded prefills by
14.1%. Files before version 4 load with ``c_decode_pad`` at ``c_decode_ctx`` where it is 0
(a padded decode then costs what it did). A step with no rows costs only its swaps. ``servelab calibrate`` fits
the coefficients with ``fit_linear_cost_model`` (non-negative, relative least squares) and
saves them; the simulator loads the file by path.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from servelab.catalog.instance import InstanceSpec, kv_bytes_per_token
from servelab.core.errors import UserError, shown
from servelab.core.plan import StepShape
from servelab.costmodel.base import register_cost_model
from servelab.costmodel.fitting import (MAX_FACTOR_TOKENS, FitError, fit_error, nonneg_relative_lstsq,
                                        small_token_factors)
from servelab.costmodel.links import LinkSpec

SCHEMA = "servelab.linear_cost_model"
SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
ATTENTION_KERNELS = ("auto", "padded", "split-kv")
COEFFICIENTS = ("c_step", "c_token", "c_decode_ctx", "c_prefill_attn", "c_row", "c_swap_block", "c_decode_pad")
REQUIRED_COEFFICIENTS = COEFFICIENTS[:5]  # c_swap_block (no swap measured), c_decode_pad (v1) may be absent


class CostModelFileError(UserError):
    """A cost-model file that cannot be read, with the path and what is wrong."""


# Seconds per unit of any feature. Measured coefficients are far below 1 s; a larger one is
# a unit mistake (ms or us written as s) that would make every step last hours.
MAX_COEFFICIENT_S = 1e3


def _is_number(value: object) -> bool:
    """A finite JSON number; ``true``/``false`` are not numbers."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def step_features(shape: StepShape) -> tuple[int, int, int, int, int, int, int]:
    """(has_rows, tokens, decode_context_sum, prefill attention pairs, rows, swap_blocks,
    dense attention pairs: decode rows x longest decode context of a ragged step, rows x
    row_tokens x context_tokens of a padded one)."""
    pad = shape.padding
    if pad is not None:
        rows = pad.num_rows
        tokens = rows * pad.row_tokens
        decode_ctx = prefill_attn = 0
        decode_pad = rows * pad.row_tokens * pad.context_tokens
    else:
        rows = len(shape.prefill_tokens) + shape.num_decodes
        tokens = shape.num_tokens
        decode_ctx = shape.decode_context_sum
        prefill_attn = sum(c * ctx for c, ctx in zip(shape.prefill_tokens, shape.prefill_context))
        decode_pad = shape.num_decodes * shape.decode_context_max
    return (1 if rows else 0), tokens, decode_ctx, prefill_attn, rows, shape.swap_blocks, decode_pad


@dataclass(frozen=True, slots=True)
class LinearCostModel:
    c_step: float  # s per step that runs any row
    c_token: float  # s per token computed
    c_decode_ctx: float  # s per context token a decode attends to
    c_prefill_attn: float  # s per (chunk token x chunk context) of prefill attention
    c_row: float  # s per request row (LM head, sampling, metadata)
    c_swap_block: float = 0.0  # s per KV block swapped
    c_decode_pad: float = 0.0  # s per (decode row x longest decode context): the iteration bubble
    kv_bytes_per_token: int = 0  # for kv_transfer_time_s; 0 = unknown
    fit: FitError | None = None  # how well the fit matched its samples
    meta: dict[str, str] = field(default_factory=dict)  # gpu, model, tp, date ... as recorded
    token_factors: tuple[float, ...] = ()  # step of T <= len tokens: the line times token_factors[T - 1]
    attention_kernel: str = "auto"  # the engine's decode kernel the attention term follows

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if not (_is_number(value) and 0 <= value <= MAX_COEFFICIENT_S):
                raise ValueError(f"LinearCostModel.{name} must be a finite number >= 0 "
                                 f"(at most {MAX_COEFFICIENT_S:g} s), got {shown(value)}")
        if not (self.c_step or self.c_token or self.c_row):  # every step runs >= 1 row of >= 1 token
            raise ValueError("c_step, c_token and c_row are all 0, so a step could take 0 s and simulated time "
                             "would not advance (every rate divides by it); at least one must be > 0")
        if len(self.token_factors) > MAX_FACTOR_TOKENS or not all(
                _is_number(f) and 0.1 <= f <= 10 for f in self.token_factors):
            raise ValueError(f"LinearCostModel.token_factors must be at most {MAX_FACTOR_TOKENS} numbers in "
                             f"[0.1, 10], got {shown(self.token_factors)}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"LinearCostModel.attention_kernel must be one of {ATTENTION_KERNELS}, "
                             f"got {shown(self.attention_kernel)}")

    # ---- the CostModel protocol ----
    def step_time_s(self, shape: StepShape) -> float:
        has_rows, tokens, decode_ctx, prefill_attn, rows, swap, decode_pad = step_features(shape)
        if not has_rows:
            return self.c_swap_block * swap
        if shape.padding is None:  # a ragged step's decodes pay the named kernel's term only
            decode_ctx, decode_pad = _kernel_terms(self.attention_kernel, decode_ctx, decode_pad)
        return self._time(tokens, decode_ctx, prefill_attn, rows, swap, decode_pad)

    def decode_step_times_s(self, num_decodes: int, context_sums: np.ndarray,
                            context_maxes: np.ndarray | None = None) -> np.ndarray:
        sums = np.asarray(context_sums, dtype=np.float64)
        pads = num_decodes * np.asarray(context_maxes, dtype=np.float64) if context_maxes is not None else 0
        sums, pads = _kernel_terms(self.attention_kernel, sums, pads)
        return self._time(num_decodes, sums, 0, num_decodes, 0, pads)

    def swap_time_s(self, num_blocks: int) -> float:
        return self.c_swap_block * num_blocks

    def kv_transfer_time_s(self, num_tokens: int, link: LinkSpec) -> float:
        if not self.kv_bytes_per_token:
            raise ValueError("this LinearCostModel does not know kv_bytes_per_token; load it for an instance")
        return link.transfer_time_s(num_tokens * self.kv_bytes_per_token)

    def _factor(self, tokens: int) -> float:
        return self.token_factors[tokens - 1] if 0 < tokens <= len(self.token_factors) else 1.0

    def _time(self, tokens, decode_ctx, prefill_attn, rows, swap, decode_pad=0):
        """The one formula, for scalars or decode arrays (same operations, same order). The
        small-token factor scales the per-step, per-token and per-row part only: the BLAS
        regime it stands for is the GEMMs', not the attention's or the swaps'."""
        base = (self.c_step + self.c_token * tokens + self.c_row * rows) * self._factor(tokens)
        return (base + self.c_decode_ctx * decode_ctx + self.c_prefill_attn * prefill_attn
                + self.c_swap_block * swap + self.c_decode_pad * decode_pad)

    # ---- persistence ----
    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "coefficients": {name: getattr(self, name) for name in COEFFICIENTS},
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "token_factors": list(self.token_factors),
            "attention_kernel": self.attention_kernel,
            "fit": asdict(self.fit) if self.fit is not None else None,
            "meta": dict(self.meta),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def from_json(cls, data: object, where: str = "<json>") -> LinearCostModel:
        def fail(problem: str) -> CostModelFileError:
            return CostModelFileError(f"{where}: {problem}")

        if not isinstance(data, dict):
            raise fail("top level must be a JSON object")
        if data.get("schema") != SCHEMA:
            raise fail(f"schema must be {SCHEMA!r}, got {shown(data.get('schema'))}")
        version = data.get("version")
        if type(version) is not int or version not in READABLE_VERSIONS:
            raise fail(f"unsupported version {shown(version)} (this servelab reads {READABLE_VERSIONS})")
        coefficients = data.get("coefficients")
        if not isinstance(coefficients, dict):
            raise fail("'coefficients' must be an object")
        unknown = coefficients.keys() - set(COEFFICIENTS)
        missing = [c for c in REQUIRED_COEFFICIENTS if c not in coefficients]
        if unknown or missing:
            raise fail(f"coefficients: missing {missing}, unknown {shown(sorted(unknown), 80)}")
        for name, value in coefficients.items():
            if not _is_number(value):
                raise fail(f"coefficient {name} must be a finite number, got {shown(value)}")
        kv_bytes = data.get("kv_bytes_per_token", 0)
        if type(kv_bytes) is not int or kv_bytes < 0:
            raise fail(f"'kv_bytes_per_token' must be an integer >= 0, got {shown(kv_bytes)}")
        meta = data.get("meta", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise fail("'meta' must be an object of strings")
        fit = _fit_from_json(data.get("fit"), fail)
        factors = data.get("token_factors", [])
        if not isinstance(factors, list):
            raise fail(f"'token_factors' must be a list of numbers, got {shown(factors)}")
        kernel = data.get("attention_kernel", "auto")
        if version < 4 and not coefficients.get("c_decode_pad"):  # padded steps went through the ragged terms
            coefficients = {**coefficients, "c_decode_pad": coefficients["c_decode_ctx"]}
        try:
            return cls(**coefficients, kv_bytes_per_token=kv_bytes, fit=fit, meta=meta, token_factors=tuple(factors),
                       attention_kernel=kernel)
        except ValueError as e:
            raise fail(str(e)) from None

    @classmethod
    def load(cls, path: str | Path) -> LinearCostModel:
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except OSError as e:
            raise CostModelFileError(f"{path}: cannot read ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise CostModelFileError(f"{path}: not UTF-8 text (byte {e.start}), so not a cost-model JSON") from None
        except json.JSONDecodeError as e:
            raise CostModelFileError(f"{path}: not JSON ({e})") from None
        except (ValueError, RecursionError) as e:  # a number beyond int's digit limit, deep nesting
            raise CostModelFileError(f"{path}: unreadable JSON ({type(e).__name__}: {shown(str(e), 80)})") from None
        return cls.from_json(data, where=str(path))


def _fit_from_json(fit: object, fail) -> FitError | None:
    """The optional ``fit`` block: a sample count and three finite relative errors >= 0."""
    if fit is None:
        return None
    fields = ("num_samples", "median_rel_error", "p90_rel_error", "max_rel_error")
    if not isinstance(fit, dict) or set(fit) != set(fields):
        raise fail(f"'fit' must be null or an object with exactly {list(fields)}")
    if type(fit["num_samples"]) is not int or fit["num_samples"] < 0:
        raise fail(f"fit.num_samples must be an integer >= 0, got {shown(fit['num_samples'])}")
    for name in fields[1:]:
        if not (_is_number(fit[name]) and fit[name] >= 0):
            raise fail(f"fit.{name} must be a finite number >= 0, got {shown(fit[name])}")
    return FitError(**fit)


_CTX, _PAD = COEFFICIENTS.index("c_decode_ctx"), COEFFICIENTS.index("c_decode_pad")


def _kernel_terms(kernel: str, decode_ctx, decode_pad):
    """A ragged step's (context sum, rows x longest) as the named decode kernel pays them:
    ``split-kv`` the sum only, ``padded`` rows x longest only, ``auto`` both."""
    if kernel == "split-kv":
        return decode_ctx, 0 * decode_pad
    if kernel == "padded":
        return 0 * decode_ctx, decode_pad
    return decode_ctx, decode_pad


def _masked(features: np.ndarray, kernel: str) -> np.ndarray:
    """Feature rows as the named kernel's model sees them (``_kernel_terms`` on the ragged
    rows; a padded row, context sum 0 and dense pairs > 0, keeps its pairs under any kernel)."""
    x = np.array(features, dtype=float)
    if kernel == "split-kv":
        x[x[:, _CTX] > 0, _PAD] = 0.0
    elif kernel == "padded":
        x[:, _CTX] = 0.0
    return x


_BASE_COLUMNS = [COEFFICIENTS.index(c) for c in ("c_step", "c_token", "c_row")]


def _fit_arrays(features: np.ndarray, tokens: np.ndarray, measured: np.ndarray, attention_kernel: str,
                factors: bool) -> tuple[np.ndarray, tuple[float, ...]]:
    """Coefficients (the kernel's unused attention column at 0) and small-token factors: fit the
    line, then take each small token count's median ratio of (measured - the line's attention
    and swaps) to the line's per-step, per-token and per-row part (one pass: the line stays
    the fit to every step, so it and the factors cannot trade scale)."""
    x = _masked(features, attention_kernel)
    coef = nonneg_relative_lstsq(x, measured)
    table: tuple[float, ...] = ()
    if factors:
        base = x[:, _BASE_COLUMNS] @ coef[_BASE_COLUMNS]
        rest = x @ coef - base
        per_row = float(coef[COEFFICIENTS.index("c_token")] + coef[COEFFICIENTS.index("c_row")])
        table = small_token_factors(tokens, (measured - rest) / np.maximum(base, 1e-12),
                               float(coef[COEFFICIENTS.index("c_step")]), per_row)
    return coef, table


def _predict(features: np.ndarray, coef: np.ndarray, table: tuple[float, ...], kernel: str = "auto") -> np.ndarray:
    """``LinearCostModel._time`` over feature rows (as ``kernel``'s model sees them)."""
    features = _masked(features, kernel)
    scale = np.array([table[int(t) - 1] if 0 < t <= len(table) else 1.0 for t in features[:, 1]])
    base = features[:, _BASE_COLUMNS] @ coef[_BASE_COLUMNS]
    return base * scale + (features @ coef - base)


def fit_linear_cost_model(samples: list[tuple[StepShape, float]], *, kv_bytes_per_token: int = 0,
                          meta: dict[str, str] | None = None, attention_kernel: str = "auto",
                          token_factors: bool = True) -> tuple[LinearCostModel, FitError]:
    """Least-squares fit of the coefficients (all >= 0) to (shape, measured seconds) pairs,
    minimising relative error, with the small-token factors (``token_factors``) when they
    lower the leave-one-out median error (on a few noisy steps they would fit the noise).
    Features no sample exercises get 0. Empty steps are skipped."""
    if attention_kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention_kernel must be one of {ATTENTION_KERNELS}, got {attention_kernel!r}")
    rows = [(step_features(shape), t) for shape, t in samples if step_features(shape)[0]]
    if not rows:
        raise ValueError("fit_linear_cost_model needs samples of steps that run at least one row")
    features = np.array([f for f, _ in rows], dtype=float)
    measured = np.array([t for _, t in rows], dtype=float)
    num_used = int(np.count_nonzero(np.abs(features).max(axis=0)))
    if len(rows) < num_used:
        raise ValueError(f"{len(rows)} samples cannot determine {num_used} coefficients; measure more steps")
    if token_factors and len(rows) >= 3:  # keep the factors only where they predict left-out steps better
        with_factors, without = (_loo_errors(features, measured, attention_kernel, f).mean() for f in (True, False))
        token_factors = bool(with_factors < without)
    coef, table = _fit_arrays(features, features[:, 1], measured, attention_kernel, token_factors)
    model = LinearCostModel(**{name: float(c) for name, c in zip(COEFFICIENTS, coef)},
                            kv_bytes_per_token=kv_bytes_per_token, meta=dict(meta or {}), token_factors=table,
                            attention_kernel=attention_kernel)
    error = fit_error([model.step_time_s(shape) for shape, t in samples if step_features(shape)[0]], measured)
    return replace(model, fit=error), error


HELD_OUT_WARN_MEDIAN = 0.15  # ``servelab calibrate`` warns above this held-out median error


def held_out_error(samples: list[tuple[StepShape, float]], attention_kernel: str = "auto",
                   token_factors: bool = True, groups: list | None = None) -> FitError | None:
    """Leave-one-out error of the fit: each sample predicted by the coefficients fitted to all
    the others. The in-sample error flatters a fit with as many free coefficients as there
    are kinds of step; this is the number that says whether the model predicts steps it has
    not seen (None when too few samples remain to refit). ``groups`` (one key per sample):
    leave a whole group out at a time, so the repeats of a held-out step's shape are not in
    its fit either (with them in, the held-out error is that of a shape the fit has seen)."""
    kept = [(step_features(shape), t, g) for (shape, t), g in zip(samples, groups or range(len(samples)))
            if step_features(shape)[0]]
    if len(kept) < 3 or len({g for *_, g in kept}) < 3:
        return None
    features = np.array([f for f, _, _ in kept], dtype=float)
    measured = np.array([t for _, t, _ in kept], dtype=float)
    errors = _loo_errors(features, measured, attention_kernel, token_factors, [g for *_, g in kept])
    return FitError(int(errors.size), float(np.median(errors)), float(np.percentile(errors, 90)), float(errors.max()))


def _loo_errors(features: np.ndarray, measured: np.ndarray, attention_kernel: str, factors: bool,
                groups: list | None = None) -> np.ndarray:
    """|predicted / measured - 1| of each step predicted by a fit to all the others (all but
    its group's, with ``groups``)."""
    tokens = features[:, 1]
    ids: dict = {}
    keys = np.arange(len(measured)) if groups is None else np.array([ids.setdefault(g, len(ids)) for g in groups])
    predicted = np.empty_like(measured)
    for key in dict.fromkeys(keys.tolist()):
        out = keys == key
        coef, table = _fit_arrays(features[~out], tokens[~out], measured[~out], attention_kernel, factors)
        predicted[out] = _predict(features[out], coef, table, attention_kernel)
    return np.abs(np.maximum(predicted, 1e-12) / measured - 1.0)


@register_cost_model("linear")
def linear_for_instance(instance: InstanceSpec, path: str | Path) -> LinearCostModel:
    """Load a fitted model; the instance supplies KV bytes per token if the file lacks them."""
    model = LinearCostModel.load(path)
    if not model.kv_bytes_per_token:
        model = replace(model, kv_bytes_per_token=kv_bytes_per_token(instance))
    return model

