"""Output-length estimators: the interface, the workload helper and the accuracy report.

An estimator is fit on a training split of ``RequestSpec`` (true ``num_output_tokens``
known) and then predicts an output length from what is known at arrival (prompt length,
prompt text, request id). Policies never call estimators: ``with_predictions`` writes the
prediction into ``RequestSpec.predicted_output_tokens`` up front, and a policy reads
``spec.expected_output_tokens``, so every length-aware policy can reuse any estimator.

Invariant: ``predict`` is a pure function of the fitted state and the spec (noise is
seeded per request id), so the same workload always gets the same predictions.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.core.request import RequestSpec


class LengthEstimator(ABC):
    name = "?"

    def fit(self, train: Sequence[RequestSpec]) -> LengthEstimator:
        """Learn from specs whose true output length is known; oracle-style estimators ignore it."""
        return self

    @abstractmethod
    def predict(self, spec: RequestSpec) -> int:
        """Predicted output tokens (>= 1) from what is known when ``spec`` arrives."""

    def predict_many(self, specs: Sequence[RequestSpec]) -> np.ndarray:
        return np.fromiter((self.predict(s) for s in specs), dtype=np.int64, count=len(specs))


def with_predictions(workload: Sequence[RequestSpec], estimator: LengthEstimator) -> list[RequestSpec]:
    """Copies of ``workload`` with ``predicted_output_tokens`` filled in by ``estimator``."""
    predicted = estimator.predict_many(workload)
    return [dataclasses.replace(spec, predicted_output_tokens=int(p)) for spec, p in zip(workload, predicted)]


@dataclass(frozen=True, slots=True)
class EstimatorReport:
    num_requests: int
    mae_tokens: float
    rmse_tokens: float
    mean_true_tokens: float
    bin_accuracy: float | None  # share predicted into the same bin as the truth
    num_bins: int | None


def evaluate(estimator: LengthEstimator, specs: Sequence[RequestSpec], edges=None) -> EstimatorReport:
    """Error of ``estimator`` on held-out ``specs``; bin accuracy when ``edges`` (a BinEdges) is given."""
    if not specs:
        raise ValueError("evaluate needs at least one held-out request")
    truth = np.fromiter((s.num_output_tokens for s in specs), dtype=np.float64, count=len(specs))
    pred = estimator.predict_many(specs).astype(np.float64)
    err = pred - truth
    acc = None if edges is None else float(np.mean(edges.bins_of(pred) == edges.bins_of(truth)))
    return EstimatorReport(len(specs), float(np.mean(np.abs(err))), float(np.sqrt(np.mean(err**2))),
                           float(truth.mean()), acc, None if edges is None else edges.num_bins)


def split(specs: Sequence[RequestSpec], test_fraction: float, rng: np.random.Generator
          ) -> tuple[list[RequestSpec], list[RequestSpec]]:
    """Seeded random train / held-out split."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    order = rng.permutation(len(specs))
    num_test = max(1, int(round(test_fraction * len(specs))))
    return [specs[i] for i in order[num_test:]], [specs[i] for i in order[:num_test]]
