"""docs/fidelity.md's drift probe and per-system goal line (issue 23): the drift is measured /
predicted - 1 of the probe steps, and the doc's lines are computed from the runs' numbers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import servelab.engine.calibrate as calibrate_mod
from servelab.costmodel.linear import LinearCostModel
from servelab.validate.calibration import DRIFT_PROBES, level_drift
from servelab.validate.fidelity_doc import System, drift_probe_text, per_system_text

COST = LinearCostModel(c_step=5e-3, c_token=2e-4, c_decode_ctx=1e-7, c_prefill_attn=1e-9, c_row=1e-5)


def test_level_drift_is_measured_over_predicted_of_the_probe_steps(monkeypatch):
    def fake_time_steps(loaded, points, repeats, **kwargs):
        assert repeats == 3 and len(points) == len(DRIFT_PROBES)
        return [COST.step_time_s(p.shape) * f for p, f in zip(points, (1.30, 1.20, 0.90))], None

    monkeypatch.setattr(calibrate_mod, "time_steps", fake_time_steps)
    assert level_drift(None, COST, "cpu") == pytest.approx(0.20)  # the median of +30%, +20%, -10%


def _run(step: float, start: float, end: float):
    return SimpleNamespace(metrics={"step": {"median": step}, "drift": {"start": start, "end": end}})


def test_the_doc_lines_follow_the_runs():
    done = [(System("vllm"), SimpleNamespace(name="a"), _run(0.04, 0.01, -0.02)),
            (System("vllm"), SimpleNamespace(name="b"), _run(0.06, 0.02, 0.03)),
            (System("multibin"), SimpleNamespace(name="a"), _run(0.20, 0.01, 0.25)),
            (System("multibin"), SimpleNamespace(name="b"), _run(0.30, -0.30, 0.02))]
    goal = " ".join(per_system_text(done))
    assert "vllm x1 5.0%" in goal and "multibin x1 25.0%" in goal
    assert "1 of 2 systems meet it" in goal and "over: multibin x1 25.0%" in goal
    drift = " ".join(drift_probe_text(done))
    assert "(2 runs): median step error 5.0%" in drift  # the two calm runs
    assert "(2): 25.0%" in drift  # the two that moved
    assert "multibin x1 on b -30.0% -> 2.0% (step error 30.0%)" in drift


@pytest.mark.parametrize("drifts,kept,tries", [((0.20, -0.08, 0.12), -0.08, 3), ((0.20, 0.03, 0.5), 0.03, 2),
                                               ((0.01,), 0.01, 1)])
def test_a_calibration_the_machine_left_at_once_is_redone(monkeypatch, tmp_path, drifts, kept, tries):
    """The calibration kept is the one the drift probe right after it agreed with best; it stops at
    the first within DRIFT_CALM, and the file left on disk is the kept one."""
    import servelab.validate.stable_runs as doc

    made = []
    monkeypatch.setattr(doc, "calibrate_compact",
                        lambda loaded, path, clock: (made.append(len(made)), path.write_text(str(len(made)))))
    probes = iter(drifts)
    monkeypatch.setattr(doc, "_drift_probe", lambda loaded, cost, clock: next(probes))
    cost = tmp_path / "c.json"
    assert doc.stable_calibration(object(), cost, "cpu") == (kept, tries)
    assert len(made) == tries and cost.read_text() == str(drifts.index(kept) + 1)


def test_a_calibration_is_level_matched_to_the_probe_steps(monkeypatch, tmp_path):
    """Regression (issue 23): the compact grid's level sat ~5% above what the probe steps (and a
    run's steps) cost on the quiet machine, in 55 of 57 runs. ``match_level`` scales every step
    coefficient by measured / predicted of the probes, so the saved model predicts the probes'
    level and keeps the grid's shape; swap time (a copy) stays as timed."""
    import dataclasses

    import servelab.validate.calibration as calibration_mod
    from servelab.core.plan import StepShape

    cost = dataclasses.replace(COST, c_swap_block=4e-5, c_decode_pad=2e-8, token_factors=(0.9, 1.1),
                               meta={"model": "m"})
    path = tmp_path / "c.json"
    cost.save(path)
    monkeypatch.setattr(calibration_mod, "level_drift", lambda loaded, model, clock: -0.05)
    assert calibration_mod.match_level(object(), path, "cpu") == -0.05
    matched = LinearCostModel.load(path)
    for shape in (StepShape(num_decodes=1, decode_context_sum=128, decode_context_max=128),
                  StepShape(prefill_tokens=(64,), prefill_context=(64,), num_decodes=3, decode_context_sum=900,
                            decode_context_max=400)):
        assert matched.step_time_s(shape) == pytest.approx(0.95 * cost.step_time_s(shape), rel=1e-12)
    assert matched.c_swap_block == cost.c_swap_block and matched.token_factors == cost.token_factors
    assert matched.meta["level_scale"] == "0.9500" and matched.meta["model"] == "m"
    assert calibration_mod.match_level(None, path, "cpu") is None  # nothing measured: the file is left alone
    assert LinearCostModel.load(path) == matched


@pytest.mark.parametrize("ends,kept_run,runs", [((0.03,), 1, 1), ((0.15, 0.04), 2, 2),
                                                ((0.30, 0.12, 0.20), 2, 3)])
def test_a_run_the_machine_moved_away_from_is_redone(monkeypatch, ends, kept_run, runs):
    """Regression (2026-11-27, two reports on one tree): a run whose drift probes say the machine
    moved more than DRIFT_RERUN from its calibration is redone after a fresh calibration, up to
    RUN_TRIES runs; the run kept is the one whose probes moved least, whatever its error."""
    import servelab.validate.stable_runs as stable

    made = []

    def fake_run(options, loaded):
        made.append(len(made) + 1)
        return SimpleNamespace(metrics={"step": {"median": 0.01 * len(made)}, "run": len(made)},
                               real=SimpleNamespace(), sim=SimpleNamespace())

    probes = iter(ends)
    monkeypatch.setattr(stable, "run_validation", fake_run)
    monkeypatch.setattr(stable, "_drift_probe", lambda loaded, cost, clock: next(probes))
    monkeypatch.setattr(stable, "stable_calibration", lambda loaded, cost, clock: (0.01, 2))
    v, tries = stable.validated_run(None, object(), None, "cpu", drift=0.01, tries=1, redo=True)
    assert len(made) == runs and v.metrics["run"] == kept_run
    assert v.metrics["drift"]["runs"] == runs and tries == 1 + 2 * (runs - 1)
    assert v.metrics["drift"]["calibration_tries"] == tries


def test_without_a_calibration_per_system_a_run_is_not_redone(monkeypatch):
    import servelab.validate.stable_runs as stable

    monkeypatch.setattr(stable, "run_validation", lambda options, loaded: SimpleNamespace(
        metrics={}, real=SimpleNamespace(), sim=SimpleNamespace()))
    monkeypatch.setattr(stable, "_drift_probe", lambda loaded, cost, clock: 0.5)
    v, tries = stable.validated_run(None, object(), None, "cpu", drift=0.4, tries=0, redo=False)
    assert v.metrics["drift"] == {"start": 0.4, "end": 0.5, "runs": 1, "calibration_tries": 0}
