"""The simulator: a ``ClusterDriver`` on a simulated clock whose executors are cost models.

``Simulation`` builds one ``InstanceDriver`` per instance of a ``ClusterConfig`` (runtime,
policy, a ``CostModelExecutor`` over the roofline or a given cost model), the router, the
topology and the KV pool, and runs a workload through them. The loop never looks at a
wall clock, so a run is a pure function of (workload, cluster config, cost models, seed).

``SimFactory`` is what the cluster driver asks when it rebuilds an instance at run time
(layers dropped or restored, a pipeline group formed or split).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Callable, Sequence

from servelab.cluster.clocks import SimClock
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.driver import ClusterDriver, ClusterResult
from servelab.cluster.kv_pool import ClusterKVPool
from servelab.cluster.links import Topology
from servelab.cluster.watchdog import WatchdogConfig
from servelab.core.admission import AdmissionConfig
from servelab.core.driver import InstanceDriver
from servelab.core.executor import CostModelExecutor
from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.policy import POLICIES, ROUTERS, SchedulingPolicy
from servelab.core.request import RequestSpec
from servelab.metrics.collector import MetricsCollector
from servelab.simulator.hardware import SimInstanceModel, instance_spec, is_cost_options, model_for_spec

SimResult = ClusterResult


class SimFactory:
    """Builds simulated instances from a cluster config, at start and when reconfigured."""

    def __init__(self, cluster: ClusterConfig, cost_override: Any = None) -> None:
        self.cluster = cluster
        self.groups: list[InstanceGroup] = cluster.instance_groups()
        self.cost_override = cost_override

    @property
    def supports_layer_ranges(self) -> bool:
        """Models built per instance time any layer range; a calibrated whole-model cost model cannot."""
        return self.cost_override is None or is_cost_options(self.cost_override)

    def spec(self, instance_id: int):
        return instance_spec(self.groups[instance_id])

    def hardware(self, spec) -> SimInstanceModel:
        if not self.supports_layer_ranges and spec.layers is not None:
            raise NotImplementedError("a calibrated cost model times the whole model; layer ranges need the roofline")
        return model_for_spec(spec, self.cost_override)

    def policy(self, instance_id: int) -> SchedulingPolicy:
        group = self.groups[instance_id]
        return POLICIES.create(group.policy, dict(group.policy_params))

    def executor(self, cost: Any) -> CostModelExecutor:
        return CostModelExecutor(cost)

    def limits(self, instance_id: int) -> InstanceLimits:
        group = self.groups[instance_id]
        return InstanceLimits(group.max_batch_tokens, group.max_num_seqs)


def admission_for(cluster: ClusterConfig) -> AdmissionConfig:
    """The cluster's context rule: ``max_model_len`` or else the smallest model context."""
    from servelab.catalog.models import get_model

    limit = cluster.max_model_len
    if limit is None:
        limit = min(get_model(g.model).max_context for g in cluster.groups)
    return AdmissionConfig(limit, cluster.on_overflow)


class Simulation:
    def __init__(self, workload: Sequence[RequestSpec], cluster: ClusterConfig, *, cost_model=None,
                 collector=None, fast_forward: bool = True, progress: Callable[[float], None] | None = None,
                 watchdog: WatchdogConfig | None = None) -> None:
        self.specs = list(workload)
        self.cluster = cluster
        self.collector = collector if collector is not None else MetricsCollector()
        self.factory = SimFactory(cluster, cost_model)
        drivers = []
        for iid in range(len(self.factory.groups)):
            spec = self.factory.spec(iid)
            hw = self.factory.hardware(spec)
            group = self.factory.groups[iid]
            runtime = InstanceRuntime(iid, hw.kv_config, self.factory.limits(iid), group.role, cost_model=hw.cost,
                                      spec=spec)
            drivers.append(InstanceDriver(runtime, self.factory.policy(iid), CostModelExecutor(hw.cost),
                                          self.collector, flops_per_token=hw.flops_per_token,
                                          fast_forward=fast_forward, spec=spec, cost_model=hw.cost,
                                          kv_bytes_per_token=hw.kv_bytes_per_token))
        groups = self.factory.groups
        topology = Topology([g.gpu for g in groups], [g.tp * g.pp for g in groups], cluster.topology, cluster.link)
        pool = ClusterKVPool(cluster.kv_pool_gb * 2**30) if cluster.kv_pool_gb > 0 else None
        self.router = ROUTERS.create(cluster.router, dict(cluster.router_params))
        self.driver = ClusterDriver(drivers, self.router, clock=SimClock(), topology=topology,
                                    collector=self.collector, admission=admission_for(cluster), pool=pool,
                                    rebuild=self.factory)
        self.driver.progress = progress
        if watchdog is not None:
            self.driver.watchdog = watchdog

    @property
    def instances(self) -> list[InstanceDriver]:
        """The instance drivers (policy, runtime, executor), in instance-id order."""
        return self.driver.drivers

    @property
    def peak_flops(self) -> list[float]:
        from servelab.catalog.gpus import get_gpu

        return [get_gpu(g.gpu).peak_flops * g.tp * g.pp for g in self.factory.groups]

    def run(self) -> SimResult:
        with fewer_collections(instances=len(self.driver.drivers)):
            return self.driver.run(self.specs)


YOUNG_PER_32_INSTANCES = 100_000


def young_threshold(instances: int) -> int:
    """The young generation's collection threshold for a run on ``instances`` instances:
    100,000 allocations per 32 instances (at least 100,000). At equal load per instance a
    cluster allocates in proportion to its instances, so a fixed threshold spans less simulated
    time the larger the cluster (the likely reason it cost more there: more of the objects that
    live for a step or a request are still alive when a collection scans them). Measured at
    128 instances (docs/benchmarks/scale_attribution.md): 100,000 spent 1.4 CPU-s in collections,
    400,000 0.8 CPU-s, same results and peak RSS."""
    return YOUNG_PER_32_INSTANCES * max(1, -(-instances // 32))


@contextmanager
def fewer_collections(gen0: int | None = None, instances: int = 1):
    """Python's cyclic collector less often while a simulation runs: a run allocates millions of
    small objects that live long (requests, step records) and makes almost no cycles, so the
    default young-generation threshold (700) spent 10-14% of the CPU time in collections that
    free nothing (measured at 64 instances, equal load, docs/benchmarks/scale.md). ``gen0``
    (default: ``young_threshold(instances)``) is the young generation's threshold. Results are
    unchanged; the old thresholds come back afterwards."""
    if gen0 is None:
        gen0 = young_threshold(instances)
    old = gc.get_threshold()
    gc.set_threshold(max(gen0, old[0]), max(old[1], 50), max(old[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def simulate(workload: Sequence[RequestSpec], cluster: ClusterConfig, *, cost_model=None, fast_forward: bool = True,
             progress: Callable[[float], None] | None = None) -> SimResult:
    """Run ``workload`` on ``cluster``; ``cost_model`` (optional) replaces every instance's, or is a
    ``CostOptions`` each instance builds its own model from."""
    return Simulation(workload, cluster, cost_model=cost_model, fast_forward=fast_forward, progress=progress).run()
