"""scripts/scale_stretches.py: counting what ends each stretch of steps changes nothing the
simulation does, every step record is counted once under exactly one kind, every fast-forward run
ends exactly one way, the wrappers are removed afterwards, and the reading claims the router's
placement as the cause only when the counts show it."""

from __future__ import annotations

import pytest
from simkit import load_script

from servelab.simulator import scale_bench


@pytest.fixture(scope="module")
def st():
    return load_script("scale_stretches")


@pytest.fixture(scope="module")
def cost():
    return scale_bench._cost()


def test_counting_changes_nothing_and_adds_up(st, cost, tmp_path):
    from servelab.core.driver import InstanceDriver

    names = ("_record", "_try_jump", "add", "interrupt", "settle", "_finish_run")
    before = {n: InstanceDriver.__dict__[n] for n in names}
    point = st.run_size(2, 1, 150, "least_loaded", cost)
    assert {n: InstanceDriver.__dict__[n] for n in before} == before  # the originals are back
    assert point["fingerprint"] == scale_bench.run_point(2, 150, 5.5, 1, tmp_path)["fingerprints"][0]
    row = point["runs"][0]
    kinds = ("prefill", "single decode", "run end", "settled when cut", "settled by a read")
    assert row["records"] == pytest.approx(sum(row.get(f"records: {k}", 0.0) for k in kinds))
    assert row.get("records: run end", 0.0) > 0  # the workload has fast-forward runs to check
    ends = sum(row.get(k, 0.0) for k in ("runs that reached their horizon", "runs cut by an arrival placed here",
                                          "runs cut by a move or transfer"))
    assert row["runs launched"] == pytest.approx(row["records: run end"]) == pytest.approx(ends)
    assert row["steps"] == pytest.approx(row["prefill steps"] + row["decode steps"])
    assert row["records: prefill"] == pytest.approx(row["prefill steps"])


def test_random_control_routes_everywhere(st, cost):
    point = st.run_size(4, 1, 40, "random", cost)
    assert point["runs"][0]["arrivals placed"] > 0


def _point(instances, router, records, cut=1.0, read=0.0):
    run = {"records": records, "steps": 16.0, "prefill steps": 4.0, "decode steps": 12.0,
           "prompts per prefill step": 1.3, "rows per decode step": 75.0, "runs cut by an arrival placed here": cut,
           "records: settled by a read": read}
    return {"instances": instances, "router": router, "seeds": 1, "runs": [run], "fingerprint": "x"}


def test_reading_names_the_router_only_when_the_counts_show_it(st):
    one, many = _point(1, "least_loaded", 13.0), _point(32, "least_loaded", 14.2, cut=1.2)
    shown = st.verdict([one, many, _point(32, "random", 13.1)])
    assert any(line.startswith("- So the extra records come with the least-loaded router") for line in shown)
    for control, read in ((_point(32, "random", 14.0), 0.0), (_point(32, "random", 13.1), 0.5)):
        lines = st.verdict([one, _point(32, "least_loaded", 14.2, read=read), control])
        assert not any(line.startswith("- So") for line in lines)
        assert lines[-1].startswith("- These counts do not single out")
