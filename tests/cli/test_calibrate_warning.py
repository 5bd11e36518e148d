"""``servelab calibrate`` warns when its held-out (leave-one-out) median error is over 15%."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from servelab.cli.main import app
from servelab.core.plan import StepShape
from servelab.costmodel.linear import HELD_OUT_WARN_MEDIAN, fit_linear_cost_model, held_out_error


def _samples(noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = [StepShape(num_decodes=n, decode_context_sum=n * c, decode_context_max=c)
              for n in (1, 2, 4, 8, 16) for c in (64, 256, 1024)]
    shapes += [StepShape(prefill_tokens=(t,), prefill_context=(t,)) for t in (16, 64, 256, 1024)]
    truth = lambda s: 2e-3 + 1e-5 * s.num_tokens + 2e-8 * s.decode_context_sum + 1e-9 * sum(  # noqa: E731
        c * c for c in s.prefill_context) + 5e-5 * (len(s.prefill_tokens) + s.num_decodes)
    return [(s, truth(s) * float(np.exp(rng.normal(0, noise)))) for s in shapes]


def test_held_out_error_is_small_for_a_linear_truth_and_large_for_noise():
    assert held_out_error(_samples(0.0)).median_rel_error < 0.01
    assert held_out_error(_samples(0.6)).median_rel_error > HELD_OUT_WARN_MEDIAN


def _run(monkeypatch, tmp_path, noise):
    import servelab.engine.calibrate as calibrate_mod
    import servelab.engine.loader as loader_mod

    samples = _samples(noise)
    model, error = fit_linear_cost_model(samples)
    monkeypatch.setattr(calibrate_mod, "calibrate", lambda *a, **k: (model, error, samples))
    monkeypatch.setattr(loader_mod, "load_checkpoint", lambda *a, **k: None)
    return CliRunner().invoke(app, ["calibrate", "--model", str(tmp_path), "--out", str(tmp_path / "c.json"),
                                    "--grid", "reduced", "--json"])


def test_calibrate_warns_on_a_noisy_fit_and_not_on_a_clean_one(monkeypatch, tmp_path):
    noisy = _run(monkeypatch, tmp_path, 0.6)
    assert noisy.exit_code == 0, noisy.output
    assert "warning: held-out median error" in noisy.stderr
    assert json.loads(noisy.stdout)["held_out"]["median_rel_error"] > HELD_OUT_WARN_MEDIAN
    clean = _run(monkeypatch, tmp_path, 0.0)
    assert clean.exit_code == 0 and "warning" not in clean.stderr
