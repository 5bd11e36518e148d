"""Fanned-out sweeps and capacity searches (simulator/fanout.py) give the serial results."""

from __future__ import annotations

import math

import pytest

from servelab import api
from servelab.core.errors import UserError
from servelab.core.request import SLO
from servelab.metrics.capacity import capacity_search, capacity_search_ahead
from servelab.simulator.fanout import Fanout
from simkit import fanout_probe, fanout_setup, random_workload

SLO_ = SLO(ttft_s=0.5, tpot_s=0.05)


def _rows(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # wall time is not a result


def test_sweep_jobs_2_same_rows_and_requests_as_serial():
    workload = random_workload(120, seed=1, rate=4.0)
    heard: dict[str, list] = {"serial": [], "jobs": []}
    points: dict[str, list] = {"serial": [], "jobs": []}

    def sweep(key, fanout):
        return api.sweep(workload, ["vllm", "sarathi"], [2.0, 8.0], slo=SLO_, fanout=fanout,
                         on_point=points[key].append,
                         on_requests=lambda row, reqs: heard[key].append(
                             (row["policy"], row["rate"], [(r.request_id, r.status, r.finish_time_s,
                                                            tuple(r.token_times_s)) for r in reqs])))

    serial = sweep("serial", None)
    fanned = sweep("jobs", Fanout(jobs=2))
    assert _rows(fanned) == _rows(serial)
    assert [(r["policy"], r["rate"]) for r in serial] == [("vllm", 2.0), ("sarathi", 2.0), ("vllm", 8.0),
                                                          ("sarathi", 8.0)]
    assert len(points["jobs"]) == 4  # the progress callback heard every point
    assert sorted(heard["jobs"], key=lambda h: (h[0], h[1])) == sorted(heard["serial"], key=lambda h: (h[0], h[1]))


def test_capacity_jobs_2_same_result_as_serial():
    workload = random_workload(80, seed=2, rate=4.0)
    kw = dict(lo=1.0, hi=64.0, max_expansions=2)
    serial = api.capacity(workload, "vllm", slo=SLO_, **kw)
    heard = []
    fanned = api.capacity(workload, "vllm", slo=SLO_, fanout=Fanout(jobs=2), on_probe=lambda r, a: heard.append(r), **kw)
    assert fanned == serial
    assert {p.rate for p in serial.probes} <= set(heard)


@pytest.mark.parametrize("threshold", [0.01, 0.3, 3.7, 63.9, 100.0, 5000.0])
@pytest.mark.parametrize("width", [1, 2, 3, 7, 8])
def test_search_ahead_equals_serial_search(threshold, width):
    def attainment(rate):
        return 1.0 if rate <= threshold else max(0.0, 0.9 - 0.1 * math.log(rate / threshold))

    kw = dict(lo=0.5, hi=64.0, target_attainment=0.9, rel_tol=0.05, max_expansions=6)
    rounds = []

    def run_rates(rates):
        assert len(rates) <= width
        rounds.append(rates)
        return [attainment(r) for r in rates]

    ahead = capacity_search_ahead(run_rates, width, **kw)
    serial = capacity_search(attainment, **kw)
    assert ahead == serial
    if width >= 3:
        assert len(rounds) < serial.num_probes  # probing ahead saved rounds


def test_plateau_stop_kept_when_probing_ahead():
    """Attainment stuck low: the serial search stops on a plateau; probing ahead must too."""
    kw = dict(lo=8.0, hi=64.0, target_attainment=0.9, max_expansions=6)
    serial = capacity_search(lambda r: 0.5, **kw)
    ahead = capacity_search_ahead(lambda rates: [0.5] * len(rates), 7, **kw)
    assert ahead == serial and serial.status == "lo_fails" and any("stopped rising" in n for n in serial.expansions)


@pytest.mark.parametrize("kwargs,words", [
    (dict(jobs=0), "--jobs"), (dict(backend="spark"), "--backend"),
    (dict(backend="local", ray_address="ray://x:1"), "--ray-address"),
])
def test_bad_fanout_is_one_line(kwargs, words):
    with pytest.raises(UserError, match=words):
        Fanout(**kwargs)


@pytest.mark.parametrize("jobs", [1, 2])
def test_setup_runs_once_in_each_simulating_process_before_its_items(jobs):
    out = Fanout(jobs=jobs, setup=fanout_setup).map(fanout_probe, [1, 2, 3, 4])
    assert [item for item, _, _ in out] == [1, 2, 3, 4]
    assert all(ran for _, ran, _ in out)
    if jobs > 1:  # a worker runs several items and its setup once (a fresh spawned process)
        assert {count for _, _, count in out} == {1}


def test_no_setup_runs_none():
    out = Fanout(jobs=2).map(fanout_probe, [1, 2])
    assert out == [(1, False, 0), (2, False, 0)]


def test_cli_fanout_installs_the_hugepage_arenas_in_its_workers():
    from servelab.cli.main import _fanout
    from servelab.simulator import hugepage_arenas

    for jobs, backend in ((1, "local"), (4, "local"), (2, "ray")):
        assert _fanout(jobs, backend, None).setup is hugepage_arenas.install
