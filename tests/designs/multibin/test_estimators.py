"""Length estimators: oracle, seeded noisy oracle, ridge from prompt features, and the workload helper."""

import numpy as np
import pytest

from servelab.designs.multibin.binning import quantile_edges
from servelab.core.request import RequestSpec
from servelab.estimators import evaluate, make_estimator, split, with_predictions


def _specs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    words = ["apples", "cost", "total", "each", "how", "many", "minutes", "dollars"]
    out = []
    for i in range(n):
        long = rng.random() < 0.5
        text = " ".join(rng.choice(words, 12)) + (" explain every step in detail" if long else "")
        out.append(RequestSpec(i, 0.0, len(text.split()), int(rng.integers(150, 200) if long else rng.integers(20, 40)),
                               prompt_text=text))
    return out


def test_oracle_and_helper_fill_predictions():
    specs = _specs(20)
    filled = with_predictions(specs, make_estimator("oracle"))
    assert [s.predicted_output_tokens for s in filled] == [s.num_output_tokens for s in specs]
    assert specs[0].predicted_output_tokens is None  # originals untouched


def test_noisy_oracle_is_seeded_per_request_and_order_free():
    specs = _specs(50)
    est = make_estimator("noisy", mode="additive", scale=5.0, seed=3)
    a = est.predict_many(specs)
    b = est.predict_many(specs[::-1])[::-1]
    assert np.array_equal(a, b) and np.all(a >= 1)
    assert not np.array_equal(a, make_estimator("noisy", mode="additive", scale=5.0, seed=4).predict_many(specs))
    zero = make_estimator("noisy", mode="multiplicative", scale=0.0)
    assert np.array_equal(zero.predict_many(specs), [s.num_output_tokens for s in specs])


def test_ridge_learns_prompt_signal_on_held_out_split():
    train, test = split(_specs(), 0.25, np.random.default_rng(0))
    edges = quantile_edges([s.num_output_tokens for s in train], 2)
    ridge = evaluate(make_estimator("ridge", num_hash_features=64).fit(train), test, edges)
    assert ridge.bin_accuracy > 0.95 and ridge.mae_tokens < 20


def test_estimator_errors_are_clear():
    with pytest.raises(ValueError, match="unknown length estimator"):
        make_estimator("crystal-ball")
    with pytest.raises(ValueError, match="mode"):
        make_estimator("noisy", mode="sideways")
    with pytest.raises(RuntimeError, match="before fit"):
        make_estimator("ridge").predict(_specs(1)[0])
