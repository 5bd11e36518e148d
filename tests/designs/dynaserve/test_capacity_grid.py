"""The capacity grid (reproduce/capacity.py) on a stand-in system whose pass/fail is known:
the walk, both delay rules from the same probes, censoring at the grid's edges, and the
per-seed ratio with its interval."""

import pytest

from servelab.designs.dynaserve.reproduce import capacity as cp
from servelab.designs.dynaserve.reproduce import experiments as ex
from servelab.designs.dynaserve.reproduce import setting as st

SIZES = ex.Sizes(num_requests=10, min_duration_s=1.0, max_requests=10, grid=(0.5, 0.75, 1.0, 1.25, 1.5))


@pytest.fixture
def fake(monkeypatch):
    """A system whose median rule passes up to ``limits[seed][0]`` and P99 rule up to
    ``limits[seed][1]`` req/s; records the rates it ran."""
    calls = []
    limits = {0: (3.0, 2.0), 1: (3.5, 2.5), 2: (10.0, 0.1)}

    def workload(name, rate, n, seed, setting, **kw):
        return (rate, seed)

    def run(system, specs, model, setting, **kw):
        rate, seed = specs
        calls.append((seed, rate))
        med, p99 = limits[seed]
        return {"attainment": 1.0, "delay_p50_s": 0.0, "delay_p99_s": 0.0, "goodput_tokens_per_s": rate,
                "cpu_s": 0.0, "passes_median": rate <= med, "passes_p99": rate <= p99, "passes_capacity": rate <= med}

    monkeypatch.setattr(st, "workload", workload)
    monkeypatch.setattr(st, "run", run)
    return calls


def test_one_walk_gives_both_rules_and_stops_at_the_first_failure(fake):
    rates = cp.grid_rates(2.0, SIZES)  # 1.0, 1.5, 2.0, 2.5, 3.0
    out = cp.walk("coloc", "w", "14B", rates, st.Setting(), SIZES, 0)
    assert out["median"] == {"rps": 3.0, "censored": "top"}  # every grid rate passed: a lower bound
    assert out["p99"] == {"rps": 2.0, "censored": None}
    assert sorted(r for _, r in fake) == [2.0, 2.5, 3.0]  # up from the anchor only; no probe below it


def test_below_the_grid_is_censored_and_has_no_value(fake):
    rates = cp.grid_rates(2.0, SIZES)
    out = cp.walk("coloc", "w", "14B", rates, st.Setting(), SIZES, 2)
    assert out["p99"] == {"rps": None, "censored": "bottom"}
    assert out["median"]["rps"] == 3.0


def test_ratio_over_seeds_has_an_interval(fake):
    rates = cp.grid_rates(2.0, SIZES)
    a = cp.grid_capacity("coloc", "w", "14B", rates, st.Setting(), SIZES, [0, 1])
    assert a["p99"]["per_seed"] == [2.0, 2.5]
    assert a["p99"]["interval"]["mean"] == pytest.approx(2.25)
    assert a["p99"]["interval"]["low"] < 2.25 < a["p99"]["interval"]["high"]
    r = cp.ratio_interval(a, a, "p99")
    assert r["per_seed"] == [1.0, 1.0] and r["mean"] == 1.0
