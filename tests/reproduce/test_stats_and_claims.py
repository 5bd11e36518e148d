"""Intervals over seeds (t and bootstrap) and claims tables with premises: written, then read
back by ``reproduce all``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.reproduce.claims import Claim, Premise, claims_lines, claims_of, markdown_table
from servelab.reproduce.stats import bootstrap_interval, interval, over_seeds, t_interval


def test_t_interval_is_students():
    iv = t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(0.975, 2) = 4.3027
    assert iv.mean == 2.0 and iv.high - 2.0 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert iv.format("{:.2f}") == "2.00 (95% CI -0.48-4.48, 3 seeds)"
    assert iv.excludes(5.0) and not iv.excludes(1.0)


def test_one_seed_has_no_interval_and_non_finite_values_are_counted():
    one = t_interval([0.92])
    assert math.isnan(one.low) and one.format("{:.2f}") == "0.92 (1 seed)" and not one.excludes(0.0)
    dropped = t_interval([1.0, float("nan"), None, 3.0])
    assert dropped.num_values == 2 and dropped.num_dropped == 2 and "2 without a value" in str(dropped)
    assert math.isnan(t_interval([]).mean)
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=1.5)
    with pytest.raises(ValueError, match="unknown interval method"):
        interval([1.0], method="jackknife")


def test_the_bootstrap_is_seeded():
    values = [0.92, 1.20, 2.06, 1.5, 1.1]
    assert bootstrap_interval(values) == bootstrap_interval(values)
    assert bootstrap_interval(values).method == "bootstrap"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=30),
       st.sampled_from(["t", "bootstrap"]), st.floats(0.5, 0.99))
def test_an_interval_holds_its_mean(values, method, confidence):
    iv = interval(values, method, confidence)
    tol = 1e-9 * max(1.0, max(abs(v) for v in values))
    assert iv.low - tol <= iv.mean <= iv.high + tol
    if method == "bootstrap":  # a mean of resamples never leaves the data's range
        assert min(values) - tol <= iv.low and iv.high <= max(values) + tol


def test_over_seeds_runs_every_seed_in_order():
    runs = over_seeds(lambda seed: {"x": seed * 2.0}, range(5, 8))
    assert runs.seeds == (5, 6, 7) and runs.values("x") == [10.0, 12.0, 14.0]
    assert runs.interval(lambda row: row["x"] / 2).mean == 6.0
    with pytest.raises(ValueError):
        over_seeds(lambda seed: seed, [])


def test_claims_with_premises_print_a_premise_column_and_read_back():
    claims = [Claim("P99 TTFT, vLLM / KunServe", "12.7-72.2x", "10.4x", "longbench 14B, burst", "not reached",
                    (Premise("KV demand / capacity in the burst", "1.31", "> 1", True),
                     Premise("compute headroom", "0.2", "> 0.5", False))),
              Claim("drop plan at 1,024 instances", "< 1 ms", "0.8 ms")]
    lines = claims_lines(claims)
    assert lines[0] == "| claim | paper | ours | operating point | verdict | premise |"
    assert "KV demand / capacity in the burst = 1.31 (needs > 1): holds; compute headroom = 0.2 (needs > 0.5): " \
           "DOES NOT HOLD" in lines[2]
    assert lines[3].endswith("| - | - | - |")
    assert claims[0].premise_holds is False and claims[1].premise_holds is None
    back = claims_of("\n".join(lines))
    assert [c.verdict for c in back] == ["not reached", "-"] and back[0].ours == "10.4x"
    assert claims_lines(claims[1:])[0] == "| claim | paper | ours | operating point | verdict |"


def test_markdown_table_escapes_nothing_but_draws_the_rule():
    assert markdown_table(["a", "b"], [[1, "x"]]) == ["| a | b |", "|---|---|", "| 1 | x |"]
