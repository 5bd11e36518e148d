"""Baseline routers: round robin and least outstanding work, over mixed-role instances."""

from __future__ import annotations

from servelab.core.policy import ROUTERS, ClusterState, Placement, Router
from servelab.core.request import Request


@ROUTERS.register("round_robin")
class RoundRobinRouter(Router):
    def __init__(self) -> None:
        self._next = 0

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        target = self._next % len(cluster.instances)
        self._next += 1
        return [Placement(request, cluster.instances[target].instance_id)]


@ROUTERS.register("least_loaded")
class LeastLoadedRouter(Router):
    """Fewest outstanding tokens (pending prompt + expected remaining output); ties to the lowest id."""

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        indexed = getattr(cluster, "least_loaded", None)  # the cluster's view keeps an index (O(log n))
        if indexed is not None:
            return [Placement(request, indexed().instance_id)]
        insts = cluster.instances
        loads = cluster.outstanding_tokens()
        least = min(loads)
        target = min(inst.instance_id for inst, load in zip(insts, loads) if load == least)
        return [Placement(request, target)]
