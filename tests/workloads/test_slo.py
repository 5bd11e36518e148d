"""The SLO string rule: names, units (s / ms; a bare number is the option's unit), e2el, warnings."""

import warnings

import pytest

from servelab.core.errors import UserError
from servelab.core.request import SLO
from servelab.workloads.slo import SLOWarning, parse_slo


@pytest.mark.parametrize("text, expected", [
    ("ttft:2,tpot:0.1", SLO(ttft_s=2, tpot_s=0.1)),
    ("ttft:2s,tpot:100ms", SLO(ttft_s=2, tpot_s=0.1)),
    ("TTFT: 500ms , e2el:30s", SLO(ttft_s=0.5, e2el_s=30)),
    ("tbt:2e2ms", SLO(tbt_s=0.2)),
    ("e2el:12", SLO(e2el_s=12)),
])
def test_units_and_names(text, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plausible values do not warn
        assert parse_slo(text) == expected


def test_bare_number_takes_the_default_unit():
    assert parse_slo("ttft:500,tpot:50", default_unit="ms") == SLO(ttft_s=0.5, tpot_s=0.05)
    assert parse_slo("ttft:2s", default_unit="ms") == SLO(ttft_s=2)


@pytest.mark.parametrize("text, message", [
    ("ttft:2min", "is not a duration"), ("ttft:2 ms ms", "is not a duration"), ("ttft:ms", "is not a duration"),
    ("ttft:0ms", "finite duration > 0"), ("ttft:-1s", "finite duration > 0"), ("ttft:inf", "is not a duration"),
    ("ttft:1,ttft:2s", "given twice"), ("latency:2", "expected ttft:V"), ("", "empty"),
])
def test_bad_values_name_the_input(text, message):
    with pytest.raises(UserError, match=message) as err:
        parse_slo(text, "--slo")
    assert "--slo" in str(err.value)


def test_milliseconds_written_as_seconds_warn_with_the_fix():
    with pytest.warns(SLOWarning, match=r"ttft 2000 \(a bare number is seconds\).*write ttft:2000ms"):
        slo = parse_slo("ttft:2000,tpot:0.1", "--slo")
    assert slo == SLO(ttft_s=2000, tpot_s=0.1)  # accepted as written: a warning, not a guess


def test_seconds_written_as_milliseconds_warn_with_the_fix():
    with pytest.warns(SLOWarning, match=r"write tpot:0.05s"):
        parse_slo("tpot:0.05", "--goodput", default_unit="ms")


def test_implausible_explicit_unit_warns_without_a_guess():
    with pytest.warns(SLOWarning, match="outside the plausible") as record:
        parse_slo("tpot:0.01ms")
    assert "if you meant" not in str(record[0].message)
