"""Runs of the fidelity report measured against a calibration the machine still follows.

The fidelity report (``fidelity_doc``) compares engine steps timed in CPU seconds with a cost
model calibrated minutes before. On the shared 2-core machine the CPU's speed itself moves: in
two reports on the same tree (2026-11-27 23:05 and 23:22 UTC, load ~1) one system each time ran
while the drift probes said the machine was 12-23% faster than its calibration, through two and
three calibrations (uellm x1, then alignedserve x2), and exactly those systems missed the 10%
step goal (16.1%, 19.3%) while the same systems met it in the other report (7.8%, 4.5%). That
error is the machine's, not the cost model's: such a run is redone after a fresh calibration.

- ``stable_calibration``: a calibration the drift probe right after it agrees with.
- ``validated_run``: one run, redone while its bracketing probes moved more than
  ``DRIFT_RERUN``; the run whose machine moved least is kept. The choice reads the probes
  only, never the run's error, so it cannot select a run for fitting the model.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from servelab.validate.compare import ValidateOptions, Validation, run_validation

DRIFT_CALM = 0.05  # a run whose probes stayed within 5% of its calibration
DRIFT_RERUN = 0.10  # a run whose probes moved more than this from its calibration is redone
CALIBRATION_TRIES = 3
RUN_TRIES = 3


def max_drift(v: Validation) -> float | None:
    """The larger of a run's two probe drifts (before and after it), in absolute value."""
    d = v.metrics.get("drift") or {}
    values = [abs(x) for x in (d.get("start"), d.get("end")) if x is not None]
    return max(values) if values else None


def release_clusters(v: Validation) -> None:
    """Drop what only a trace needs (the engine cluster with its KV caches, the simulator's
    driver): the report keeps 57 validations, and with their caches a run held 4.6 GB and was
    killed by the shared machine's OOM killer."""
    for side in (v.real, v.sim):
        side.cluster = None
        side.result = None
    gc.collect()


def validated_run(options: ValidateOptions, loaded: Any, cost: Path, clock: str, *, drift: float | None,
                  tries: int, redo: bool) -> tuple[Validation, int]:
    """One run bracketed by drift probes (``metrics["drift"]``: start, end, calibrations made for
    the system so far, runs made). With ``redo`` (a calibration per system), a run whose probes
    moved more than ``DRIFT_RERUN`` is redone after ``stable_calibration``, up to ``RUN_TRIES``
    runs, and the run with the least drift is kept. Returns (the run, calibrations made)."""
    best: Validation | None = None
    for attempt in range(1, (RUN_TRIES if redo else 1) + 1):
        if attempt > 1:
            drift, more = stable_calibration(loaded, cost, clock)
            tries += more
        start = _drift_probe(loaded, cost, clock) if drift is None else drift
        v = run_validation(options, loaded)
        v.metrics["drift"] = {"start": start, "end": _drift_probe(loaded, cost, clock), "runs": attempt}
        release_clusters(v)
        if best is None or (max_drift(v) or 0.0) < (max_drift(best) or 0.0):
            best = v
        if (max_drift(v) or 0.0) <= DRIFT_RERUN:
            break
        drift = None
    best.metrics["drift"].update(calibration_tries=tries, runs=attempt)
    return best, tries


def stable_calibration(loaded: Any, cost: Path, clock: str) -> tuple[float | None, int]:
    """A compact calibration, its level matched to the drift probes (``match_level``), whose
    prediction the machine still follows right after it: a second drift probe within
    ``DRIFT_CALM``, else another calibration, up to ``CALIBRATION_TRIES``, keeping the one the
    probe agreed with best. Why: a calibration timed during a burst of load from other
    processes (or a lull) is off by its whole level for every run compared with it (measured:
    the same calibration put vllm x1 and multibin x1 both 32% off); that measures the
    machine's load, not the cost model. Returns (the kept calibration's drift, calibrations
    made)."""
    best: tuple[float, bytes] | None = None
    tries = 0
    for tries in range(1, CALIBRATION_TRIES + 1):
        calibrate_compact(loaded, cost, clock)
        drift = _drift_probe(loaded, cost, clock)
        if drift is None:
            return None, tries
        if best is None or abs(drift) < abs(best[0]):
            best = (drift, cost.read_bytes())
        if abs(drift) < DRIFT_CALM:
            break
    cost.write_bytes(best[1])
    return best[0], tries


def calibrate_compact(loaded: Any, cost: Path, clock: str) -> None:
    """A compact calibration saved at ``cost``, its level matched to the drift probes."""
    from servelab.validate.calibration import COMPACT_GRID, calibrate_to, match_level

    calibrate_to(loaded, cost, clock, grid=COMPACT_GRID)
    match_level(loaded, cost, clock)


def _drift_probe(loaded: Any, cost: Path, clock: str) -> float | None:
    """``level_drift`` of the machine against the calibration a run is compared with."""
    if loaded is None:
        return None
    from servelab.costmodel.linear import LinearCostModel
    from servelab.validate.calibration import level_drift

    return level_drift(loaded, LinearCostModel.load(cost), clock)
