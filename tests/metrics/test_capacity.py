import math

import pytest

from servelab.metrics.capacity import capacity_search


def _attainment_curve(threshold: float):
    """Monotone attainment: 1.0 far below the threshold, exactly 0.9 at it, falling after."""
    return lambda rate: max(0.0, min(1.0, 0.9 - (rate - threshold) / threshold))


@pytest.mark.parametrize("threshold", [0.37, 3.0, 12.5, 480.0])
def test_finds_threshold_within_tolerance(threshold):
    res = capacity_search(_attainment_curve(threshold), lo=threshold / 10, hi=threshold * 10, rel_tol=0.02)
    assert res.status == "found"
    assert res.capacity_rate <= threshold <= res.lowest_failing_rate
    assert res.lowest_failing_rate / res.capacity_rate <= 1.02
    assert res.num_probes <= 2 + math.ceil(math.log2(math.log(100) / math.log(1.02))) + 1
    rates = [p.rate for p in res.probes]
    assert rates[:2] == [threshold / 10, threshold * 10] and len(set(rates)) == len(rates)
    assert all(p.passed == (p.attainment >= 0.9) for p in res.probes)


def test_lo_fails_reports_without_searching():
    calls = []
    res = capacity_search(lambda r: calls.append(r) or 0.2, lo=1.0, hi=10.0)
    assert res.status == "lo_fails" and res.capacity_rate is None and res.lowest_failing_rate == 1.0
    assert calls == [1.0]


def test_hi_passes_reports_lower_bound():
    res = capacity_search(lambda r: 1.0, lo=1.0, hi=10.0)
    assert res.status == "hi_passes" and res.capacity_rate == 10.0 and res.lowest_failing_rate is None
    assert [p.rate for p in res.probes] == [1.0, 10.0]


def test_max_iters_bounds_the_work():
    res = capacity_search(_attainment_curve(5.0), lo=1.0, hi=1000.0, rel_tol=1e-9, max_iters=4)
    assert res.status == "found" and res.num_probes == 6
    assert res.capacity_rate <= 5.0 <= res.lowest_failing_rate


def test_target_attainment_is_respected():
    res = capacity_search(lambda r: 1.0 - r / 100, lo=1.0, hi=90.0, target_attainment=0.5, rel_tol=0.001)
    assert res.capacity_rate == pytest.approx(50.0, rel=0.002)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lo=0.0, hi=1.0), "lo must be"),
    (dict(lo=2.0, hi=1.0), "hi must be"),
    (dict(lo=1.0, hi=2.0, target_attainment=1.5), "target_attainment"),
    (dict(lo=1.0, hi=2.0, rel_tol=0.0), "rel_tol"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capacity_search(lambda r: 1.0, **kwargs)


def test_bad_attainment_names_the_rate():
    with pytest.raises(ValueError, match=r"run_at_rate\(2.0\) returned nan"):
        capacity_search(lambda r: math.nan, lo=2.0, hi=4.0)


def test_brackets_down_when_lo_fails_and_says_so():
    res = capacity_search(_attainment_curve(0.2), lo=1.0, hi=10.0, rel_tol=0.02, max_expansions=4)
    assert res.status == "found" and 0.2 / 1.02 <= res.capacity_rate <= 0.2
    assert res.expansions[0] == "1 req/s missed the target: tried 0.25" and len(res.expansions) == 2


def test_brackets_up_when_hi_passes():
    res = capacity_search(_attainment_curve(300.0), lo=1.0, hi=10.0, rel_tol=0.02, max_expansions=4)
    assert res.status == "found" and 300 / 1.02 <= res.capacity_rate <= 300
    assert [p.rate for p in res.probes[:5]] == [1.0, 10.0, 40.0, 160.0, 640.0]


def test_bracketing_is_bounded_and_stops_on_a_plateau():
    bounded = capacity_search(_attainment_curve(1e-9), lo=1.0, hi=10.0, max_expansions=2)
    assert bounded.status == "lo_fails" and bounded.lowest_failing_rate == 1.0 / 16 and bounded.num_probes == 3
    flat = capacity_search(lambda r: 0.8 if r < 0.5 else 0.5, lo=1.0, hi=10.0, max_expansions=6)
    assert flat.status == "lo_fails" and flat.num_probes == 4  # 1, 0.25, 0.0625: no rise, stop
    assert flat.expansions[-1].startswith("attainment stopped rising")


def test_aborted_requests_are_kept_per_probe():
    res = capacity_search(lambda r: (1.0, 3) if r < 5 else (0.0, 0), lo=1.0, hi=10.0)
    assert res.num_aborted == sum(p.num_aborted for p in res.probes) > 0 and res.probes[0].num_aborted == 3
