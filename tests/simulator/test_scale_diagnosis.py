"""scripts/scale_diagnosis.py's per-function table: the growth of a token's CPU between two sizes
is split exactly into more calls and slower calls, and its verdict names a function whose calls
per token grow faster than the steps (an O(instances) term) instead of calling it locality."""

from __future__ import annotations

import pytest
from simkit import load_script


@pytest.fixture(scope="module")
def diag():
    return load_script("scale_diagnosis")


def _profile(instances: int, funcs: dict[str, tuple[int, float]], tokens: int = 1_000_000) -> dict:
    return {"instances": instances, "repeats": 1, "output_tokens": tokens, "funcs": funcs}


def _plain(instances: int, speed: float, records: float) -> dict:
    return {"instances": instances, "tokens_per_cpu_s": speed, "records_per_ktok": records, "load": [1.0, 1.0]}


def test_growth_split_is_exact(diag):
    a = {"f": (10.0, 100.0, 1.0), "gone": (2.0, 50.0, 0.1)}
    b = {"f": (12.0, 150.0, 1.8), "new": (5.0, 40.0, 0.2)}
    count, time = diag.split_growth(a, b)
    total_a = sum(c * t for c, t, _ in a.values()) / 1e3
    total_b = sum(c * t for c, t, _ in b.values()) / 1e3
    assert sum(count.values()) + sum(time.values()) == pytest.approx(total_b - total_a)
    assert count["f"] == pytest.approx(2 * 100 / 1e3) and time["f"] == pytest.approx(12 * 50 / 1e3)
    assert count["new"] == pytest.approx(5 * 40 / 1e3) and time["new"] == 0
    assert count["gone"] == pytest.approx(-2 * 50 / 1e3) and time["gone"] == 0


STEP = "cluster/driver.py:342(_on_step_done)"


def test_verdict_names_calls_that_outgrow_the_steps(diag):
    # steps +10% per token; `scan` runs 4x as often per token from 32 to 256 instances: algorithmic
    one = _profile(1, {STEP: (10_000, 0.01), "scan": (1_000, 0.001)})
    small = _profile(32, {STEP: (11_000, 0.011), "scan": (2_000, 0.002)})
    big = _profile(256, {STEP: (11_000, 0.011), "scan": (8_000, 0.008)})
    plain = [_plain(n, s, r) for n, s, r in ((1, 2e6, 10.0), (32, 1.6e6, 11.0), (256, 1.2e6, 11.0))]
    text = "\n".join(diag.profile_section([one, small, big], plain))
    assert "`scan` 2.00 -> 8.00" in text
    assert "an algorithmic term to remove" in text
    assert "bring the speed to 0.91 of one instance's" in text


def test_verdict_calls_it_locality_when_only_time_per_call_grows(diag):
    one = _profile(1, {STEP: (10_000, 0.01), "g": (1_000, 0.001)})
    small = _profile(32, {STEP: (10_000, 0.012), "g": (1_000, 0.0012)})
    big = _profile(256, {STEP: (10_000, 0.02), "g": (1_000, 0.002)})
    plain = [_plain(n, s, 10.0) for n, s in ((1, 2e6), (32, 1.7e6), (256, 1.0e6))]
    text = "\n".join(diag.profile_section([one, small, big], plain))
    assert "grow more than 5% beyond that (and cost over 5 ns per token): none" in text
    assert "no O(instances) term per event" in text
