"""A learned output-length predictor from prompt features: ridge regression, numpy only.

Features of a prompt: a bias, its token count and log token count, and a hashed bag of
words of ``prompt_text`` (lower-cased ``\\w+`` words, crc32 into ``num_hash_features``
buckets, counts scaled by 1/sqrt(words)). The target is log(output tokens) by default,
which keeps long answers from dominating the squares; predictions are exp'd back and
clipped to the training range. Words are hashed with crc32 (not Python's salted ``hash``)
so a fit is reproducible across processes.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.core.request import RequestSpec
from servelab.estimators.base import LengthEstimator

_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class RidgeConfig:
    num_hash_features: int = 512
    alpha: float = 10.0  # ridge strength
    log_target: bool = True

    def __post_init__(self) -> None:
        if self.num_hash_features < 0 or self.alpha < 0:
            raise ValueError(f"num_hash_features and alpha must be >= 0, got {self}")


class PromptRidgeEstimator(LengthEstimator):
    name = "ridge"

    def __init__(self, config: RidgeConfig = RidgeConfig()) -> None:
        self.config = config
        self._weights: np.ndarray | None = None
        self._scale: np.ndarray | None = None
        self._clip = (1.0, math.inf)

    def features(self, spec: RequestSpec) -> np.ndarray:
        row = np.zeros(3 + self.config.num_hash_features)
        row[0] = 1.0
        row[1] = spec.num_prompt_tokens
        row[2] = math.log(spec.num_prompt_tokens)
        if self.config.num_hash_features and spec.prompt_text:
            words = _WORD.findall(spec.prompt_text.lower())
            for w in words:
                row[3 + zlib.crc32(w.encode()) % self.config.num_hash_features] += 1.0
            if words:
                row[3:] /= math.sqrt(len(words))
        return row

    def fit(self, train: Sequence[RequestSpec]) -> PromptRidgeEstimator:
        if len(train) < 2:
            raise ValueError(f"the ridge estimator needs >= 2 training requests, got {len(train)}")
        X = np.stack([self.features(s) for s in train])
        y = np.fromiter((s.num_output_tokens for s in train), dtype=np.float64, count=len(train))
        self._scale = np.maximum(X.std(axis=0), 1e-9)
        self._scale[0] = 1.0
        Xs = X / self._scale
        target = np.log(y) if self.config.log_target else y
        penalty = self.config.alpha * np.eye(X.shape[1])
        penalty[0, 0] = 0.0  # never shrink the bias
        self._weights = np.linalg.solve(Xs.T @ Xs + penalty, Xs.T @ target)
        self._clip = (float(y.min()), float(y.max()))
        return self

    def predict(self, spec: RequestSpec) -> int:
        if self._weights is None:
            raise RuntimeError("PromptRidgeEstimator.predict called before fit")
        value = float(self.features(spec) / self._scale @ self._weights)
        if self.config.log_target:
            value = math.exp(min(value, 50.0))
        return int(round(min(max(value, self._clip[0]), self._clip[1])))
