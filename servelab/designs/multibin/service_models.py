"""Linear tokens-to-time service model (paper Figure 5) and the matching step cost model.

The paper fits ``time = intercept_s + per_token_s * output_tokens`` to measured generations
(Phi-3.5-mini, A100) and serves a batch for ``time(max output in the batch)``. The fitted
numbers are not in the text we have, so ``DEFAULT_LINEAR`` is a placeholder (25 ms per
token, 50 ms fixed) until ``fit_linear_service_model`` is run on our own engine's
measurements. Relative gains between k values depend only on intercept / per-token.

``LinearStepCost`` is the same model for the token-level simulator: a padded prefill step
costs ``intercept_s + per_token_s`` (it emits the first token) and every padded decode step
costs ``per_token_s``, whatever its width or context, so a batch whose longest member emits
m tokens takes exactly ``intercept_s + per_token_s * m``, as in the queue simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.core.plan import StepShape


@dataclass(frozen=True, slots=True)
class LinearServiceModel:
    intercept_s: float
    per_token_s: float

    def __post_init__(self) -> None:
        if self.intercept_s < 0 or not self.per_token_s > 0:
            raise ValueError(f"linear service model needs intercept_s >= 0 and per_token_s > 0, got {self}")

    def request_time_s(self, output_tokens: np.ndarray | float) -> np.ndarray | float:
        return self.intercept_s + self.per_token_s * np.asarray(output_tokens, dtype=np.float64)


DEFAULT_LINEAR = LinearServiceModel(intercept_s=0.05, per_token_s=0.025)


@dataclass(frozen=True, slots=True)
class LinearFit:
    model: LinearServiceModel
    r2: float
    num_points: int


def fit_linear_service_model(output_tokens: np.ndarray, times_s: np.ndarray) -> LinearFit:
    """Least-squares line through measured (tokens, seconds) pairs, as in Figure 5."""
    x = np.asarray(output_tokens, dtype=np.float64)
    y = np.asarray(times_s, dtype=np.float64)
    if x.size != y.size or x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fitting a line needs >= 2 points with distinct token counts and matching lengths")
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / total if total > 0 else 1.0
    return LinearFit(LinearServiceModel(max(float(intercept), 0.0), float(slope)), r2, int(x.size))


@dataclass(frozen=True, slots=True)
class LinearStepCost:
    """Cost model for ``servelab.simulator``: constant-time prefill and decode steps."""

    prefill_step_s: float
    decode_step_s: float

    @classmethod
    def from_linear(cls, model: LinearServiceModel) -> LinearStepCost:
        return cls(model.intercept_s + model.per_token_s, model.per_token_s)

    def step_time_s(self, shape: StepShape) -> float:
        prefill = shape.prefill_tokens or (shape.padding is not None and shape.padding.row_tokens > 1)
        return self.prefill_step_s if prefill else self.decode_step_s

    def decode_step_times_s(self, num_decodes: int, context_sums: np.ndarray, context_maxes=None) -> np.ndarray:
        return np.full(len(context_sums), self.decode_step_s, dtype=np.float64)
