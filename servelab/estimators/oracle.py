"""Oracle and noisy-oracle length estimators.

``OracleEstimator`` returns the true output length (the paper's oracle bins).
``NoisyOracleEstimator`` perturbs it to measure how Multi-Bin degrades with prediction error:
``multiplicative`` draws true * exp(N(0, scale)) (log-normal relative error, so scale 0.3
is roughly +-30 %), ``additive`` draws true + N(0, scale) tokens. Noise for a request is
seeded by (seed, request_id), so predictions do not depend on workload order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.core.request import RequestSpec
from servelab.estimators.base import LengthEstimator

_MODES = ("multiplicative", "additive")


class OracleEstimator(LengthEstimator):
    name = "oracle"

    def predict(self, spec: RequestSpec) -> int:
        return spec.num_output_tokens


@dataclass(frozen=True, slots=True)
class NoisyOracleConfig:
    mode: str = "multiplicative"
    scale: float = 0.3  # sigma of log-error (multiplicative) or tokens (additive)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"noisy oracle mode must be one of {_MODES}, got {self.mode!r}")
        if self.scale < 0:
            raise ValueError(f"noisy oracle scale must be >= 0, got {self.scale}")


class NoisyOracleEstimator(LengthEstimator):
    name = "noisy"

    def __init__(self, config: NoisyOracleConfig = NoisyOracleConfig()) -> None:
        self.config = config

    def predict(self, spec: RequestSpec) -> int:
        z = np.random.default_rng((self.config.seed, spec.request_id)).standard_normal()
        true = spec.num_output_tokens
        if self.config.mode == "multiplicative":
            value = true * np.exp(self.config.scale * z)
        else:
            value = true + self.config.scale * z
        return max(1, int(round(value)))
