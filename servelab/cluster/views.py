"""What a router sees of the cluster: one ``InstanceView`` per schedulable instance (a pipeline
group counts as one) inside a ``ClusterView``.

An instance view brings a fast-forwarded decode run up to date only when the router reads
something that it changes; the load a router asks for on every arrival
(``num_outstanding_tokens``) is computed without settling. The cluster driver builds the
views and rebuilds them when the schedulable set changes (a group forms or splits, an
instance fails). They read the driver through ``ViewSource``, so this module does not import it.
"""

from __future__ import annotations

from typing import Any, Protocol

from servelab.cluster.kv_pool import ClusterKVPool
from servelab.cluster.links import Link, Topology
from servelab.cluster.load_index import LoadIndex
from servelab.core.driver import InstanceDriver


class _Links(Protocol):
    def link(self, source: int, destination: int) -> Link: ...


class _Groups(Protocol):
    groups: dict[int, Any]  # group id -> its PipelineGroup (``members``: the stages' drivers, in order)

    def can_change_layers(self) -> bool: ...


class ViewSource(Protocol):
    """What the views read of the cluster driver (which builds them): instances, time, links,
    the pool and the pipeline groups."""

    drivers: list[InstanceDriver]
    active: set[int]
    now_s: float
    topology: Topology | None
    pool: ClusterKVPool | None
    mover: _Links
    reconfig: _Groups


class InstanceView:
    """What a router sees of one instance; reading queue or block state settles a decode run."""

    __slots__ = ("_driver", "_cluster", "instance_id", "role")

    def __init__(self, driver: InstanceDriver, cluster: ViewSource) -> None:
        self._driver = driver
        self._cluster = cluster
        self.instance_id = driver.runtime.instance_id
        self.role = driver.runtime.role

    def _state(self):
        d = self._driver
        if d.run is not None:
            d.settle(self._cluster.now_s)
        return d.runtime

    @property
    def num_outstanding_tokens(self) -> int:
        return self._driver.outstanding_tokens_at(self._cluster.now_s)

    @property
    def is_idle(self) -> bool:
        return self._driver.runtime.is_idle  # a run never empties an instance before it ends

    @property
    def num_running(self) -> int:
        return self._driver.runtime.num_running

    @property
    def is_busy(self) -> bool:
        return self._driver.busy

    @property
    def waiting(self):
        return self._state().waiting

    @property
    def running(self):
        return self._state().running

    @property
    def swapped(self):
        return self._state().swapped

    @property
    def reserved(self):
        return self._state().reserved

    @property
    def blocks(self):
        return self._state().blocks

    @property
    def max_batch_tokens(self) -> int:
        return self._driver.runtime.max_batch_tokens

    @property
    def max_num_seqs(self) -> int:
        return self._driver.runtime.max_num_seqs

    @property
    def cost_model(self):
        return self._driver.cost_model

    @property
    def spec(self):
        return self._driver.spec

    @property
    def policy(self):
        return self._driver.policy

    @property
    def members(self) -> list[tuple[int, Any]]:
        """(instance id, InstanceSpec) of each physical instance behind this one: its stages, in
        order, for a pipeline group; itself otherwise."""
        group = self._cluster.reconfig.groups.get(self.instance_id)
        if group is None:
            return [(self.instance_id, self._driver.spec)]
        return [(m.instance_id, m.spec) for m in group.members]

    @property
    def kv_bytes_per_token(self) -> float:
        return self._driver.kv_bytes_per_token


class ClusterView:
    def __init__(self, cluster: ViewSource) -> None:
        self._cluster = cluster
        self.instances: list[InstanceView] = []
        self._by_id: dict[int, InstanceView] = {}
        self._loads: LoadIndex | None = None

    def rebuild(self) -> None:
        c = self._cluster
        self.instances = [InstanceView(c.drivers[i], c) for i in sorted(c.active)]
        self._by_id = {v.instance_id: v for v in self.instances}
        if self._loads is not None:
            self._loads.detach()
            self._loads = None

    def instance(self, instance_id: int) -> InstanceView:
        return self._by_id[instance_id]

    def instances_with_role(self, role: str) -> list[InstanceView]:
        return [v for v in self.instances if v.role == role]

    def outstanding_tokens(self) -> list[int]:
        """``num_outstanding_tokens`` of every instance, in ``instances`` order, in one pass: a
        least-loaded choice reads every instance on every arrival, so at 32 instances the four
        property layers per instance were the simulator's largest cost."""
        now = self._cluster.now_s
        return [v._driver.runtime.num_outstanding_tokens if v._driver.run is None
                else v._driver.outstanding_tokens_at(now) for v in self.instances]

    def least_loaded(self) -> InstanceView:
        """The instance with the fewest ``num_outstanding_tokens``, ties to the lowest id: the
        minimum of ``outstanding_tokens()`` from an index (``cluster.load_index``) in
        O(log instances) instead of a scan, so routing cost stays flat as the cluster grows."""
        if self._loads is None:
            self._loads = LoadIndex([v._driver for v in self.instances])
        return self._by_id[self._loads.least_loaded(self._cluster.now_s)[1]]

    @property
    def now_s(self) -> float:
        return self._cluster.now_s

    @property
    def topology(self) -> Topology:
        return self._cluster.topology

    @property
    def pool(self) -> ClusterKVPool | None:
        return self._cluster.pool

    def link(self, source: int, destination: int) -> Link:
        return self._cluster.mover.link(source, destination)

    @property
    def can_change_layers(self) -> bool:
        """Whether SetLayers / FormPipeline can rebuild instances here (simulator with the roofline)."""
        return self._cluster.reconfig.can_change_layers()
