"""Policy names from the CLI become whole clusters; each preset runs end to end."""

import collections

import pytest
from simkit import ToyCostModel, random_workload

from servelab.cluster.presets import cluster_for
from servelab.core.registry import RegistryError
from servelab.simulator import simulate

NUM_REQUESTS = 122  # not a multiple of the batch size 4


@pytest.mark.parametrize("spec,num_instances", [("vllm", 2), ("sarathi:token_budget=256", 3), ("distserve", 2),
                                                ("multibin:batch_size=4", 1), ("multibin:batch_size=4", 2),
                                                ("bucketserve-pd", 2), ("static:batch_size=4", 2)])
def test_preset_runs_and_conserves(spec, num_instances):
    """122 requests do not divide into batches of 4, so some multibin bin is left partly filled
    when the arrivals end: it must still be served (flushed), not stranded or aborted."""
    cluster = cluster_for(spec, num_instances=num_instances, gpu="A100-80GB", model="Llama-2-7B")
    assert cluster.num_instances == num_instances
    res = simulate(random_workload(NUM_REQUESTS, seed=9, rate=30), cluster, cost_model=ToyCostModel())
    assert res.conserved and len(res.requests) == NUM_REQUESTS
    ended = collections.Counter((r.status.value, r.finish_reason) for r in res.requests)
    assert ended == {("finished", "length"): NUM_REQUESTS}, ended


def test_bad_presets_say_why():
    with pytest.raises(RegistryError, match="at least 2"):
        cluster_for("distserve", num_instances=1)
    with pytest.raises(RegistryError, match="unknown policy"):
        cluster_for("fastest", num_instances=1)


def test_router_statistics_reach_the_run_summary():
    """A router's own report() is part of every run's output (summary.json's policy_reports),
    not only of reproduction scripts; a router without statistics adds nothing."""
    from servelab.api import HardwareChoice, load_workload, run_simulation

    wl = load_workload("burst:n=40,prompt=uniform(100,2000),output=uniform(20,400)")
    out = run_simulation(wl, "llumnix", HardwareChoice(num_instances=2, gpu_memory_utilization=0.3))
    reports = out.to_dict()["policy_reports"]
    assert reports["router"] == out.result.router_report and "num_migrations" in reports["router"]
    plain = run_simulation(wl, "vllm", HardwareChoice(num_instances=2)).to_dict()["policy_reports"]
    assert "router" not in plain
