"""Output-length estimators, separate from the policies that use their predictions.

``make_estimator(name, **params)`` builds one by name: ``oracle``, ``noisy`` (mode, scale,
seed) or ``ridge`` (num_hash_features, alpha, log_target; call ``fit`` on a training split).
"""

from __future__ import annotations

from servelab.estimators.base import EstimatorReport, LengthEstimator, evaluate, split, with_predictions
from servelab.estimators.learned import PromptRidgeEstimator, RidgeConfig
from servelab.estimators.oracle import NoisyOracleConfig, NoisyOracleEstimator, OracleEstimator

ESTIMATORS = {"oracle": (OracleEstimator, None), "noisy": (NoisyOracleEstimator, NoisyOracleConfig),
              "ridge": (PromptRidgeEstimator, RidgeConfig)}


def make_estimator(name: str, **params) -> LengthEstimator:
    try:
        cls, config_cls = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown length estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}") from None
    if config_cls is None:
        if params:
            raise ValueError(f"estimator {name!r} takes no parameters, got {sorted(params)}")
        return cls()
    try:
        return cls(config_cls(**params))
    except TypeError as exc:
        raise ValueError(f"estimator {name!r}: {exc}") from None


__all__ = ["ESTIMATORS", "EstimatorReport", "LengthEstimator", "NoisyOracleConfig", "NoisyOracleEstimator",
           "OracleEstimator", "PromptRidgeEstimator", "RidgeConfig", "evaluate", "make_estimator", "split",
           "with_predictions"]
