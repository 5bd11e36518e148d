"""The cyclic collector's young-generation threshold during a simulation scales with the
instances (docs/benchmarks/scale_attribution.md, section 3) and is restored afterwards."""

from __future__ import annotations

import gc

from servelab.simulator import run as sim_run


def test_young_threshold_scales_per_32_instances():
    assert [sim_run.young_threshold(n) for n in (1, 32, 33, 256, 1024)] == [
        100_000, 100_000, 200_000, 800_000, 3_200_000]


def test_fewer_collections_sets_and_restores_thresholds():
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with sim_run.fewer_collections(instances=256):
            assert gc.get_threshold() == (800_000, 50, 100)
        assert gc.get_threshold() == (700, 10, 10)
        with sim_run.fewer_collections(gen0=5_000):
            assert gc.get_threshold()[0] == 5_000
    finally:
        gc.set_threshold(*old)


def test_simulation_runs_with_the_threshold_of_its_instances(monkeypatch):
    from servelab.api import load_workload
    from servelab.cluster.driver import ClusterDriver
    from servelab.cluster.presets import cluster_for
    from servelab.simulator import Simulation

    seen = []
    run = ClusterDriver.run

    def spy(self, specs):
        seen.append(gc.get_threshold()[0])
        return run(self, specs)

    monkeypatch.setattr(ClusterDriver, "run", spy)
    wl = load_workload("poisson:rate=20,n=10,prompt=uniform(16,64),output=uniform(1,8)", seed=0)
    result = Simulation(wl, cluster_for("vllm", num_instances=40, gpu="A100-80GB", model="Llama-2-7B")).run()
    assert result.conserved and seen == [200_000]
