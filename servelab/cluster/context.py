"""What the cluster driver hands its helpers: the narrow interface of the driver that the mover
(``cluster.moves``), the transfers below it and the reconfigurer (``cluster.reconfigure``) use.

The driver owns them and passes itself; they see it only through ``ClusterContext``, so none
of them imports the driver (the import graph points one way: driver -> helpers -> context).
Reading the protocol is also the quickest way to see what a helper may touch: the instances
and which are schedulable, the clock and the event heap, the router and the view it is
handed, and the four calls that queue, start, end or reroute work.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from servelab.cluster.kv_pool import ClusterKVPool
from servelab.cluster.links import Topology
from servelab.core.driver import InstanceDriver
from servelab.core.events import EventQueue
from servelab.core.policy import ClusterState, InstanceState, Router
from servelab.core.request import Request, RequestStatus
from servelab.metrics.collector import MetricsCollector


class RouterView(ClusterState, Protocol):
    """The view routers are handed (``cluster.views.ClusterView``), as the helpers use it."""

    def instance(self, instance_id: int) -> InstanceState: ...

    def rebuild(self) -> None:
        """Re-read the schedulable set (after a group forms or splits, or an instance fails)."""
        ...


class ClusterContext(Protocol):
    drivers: list[InstanceDriver]  # by instance id; a pipeline group's driver sits at its first member's id
    active: set[int]  # ids of the schedulable instances
    now_s: float
    events: EventQueue
    topology: Topology | None
    pool: ClusterKVPool | None
    router: Router
    view: RouterView
    collector: MetricsCollector
    requests: list[Request]  # every request that arrived, in arrival order

    def apply(self, actions: Sequence) -> None:
        """Carry out router actions (placements, moves, reconfigurations)."""
        ...

    def add_to(self, d: InstanceDriver, req: Request) -> None:
        """Queue a request on an instance."""
        ...

    def kick(self, instance_id: int) -> None:
        """Let an active instance plan a step if it is free."""
        ...

    def push_step_done(self, d: InstanceDriver, t: float) -> None: ...

    def end_request(self, req: Request, status: RequestStatus, reason: str) -> None:
        """End a request that is on no instance's queue, freeing whatever KV it holds."""
        ...
