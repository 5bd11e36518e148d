"""Multi-Bin Batching across servers: the bins and the central queue live at the cluster level.

Arrivals are held in bins (``servelab.designs.multibin.binning``, the same rule as the replica-level
``multibin`` policy and the queue simulator); formed batches wait in one central queue and
the first formed batch goes to the first idle instance, first-completed-first-served over
any number of servers (paper Section 3, Figure 6 with 8 servers). Instances should run the
``multibin_replica`` policy, which serves each placed batch as one padded batch until its
longest member finishes. Max-wait releases come through ``next_wakeup_s`` / ``on_timer``.

Routers see no completions, so ``online`` boundaries learn from the requests this router
dispatched that have since finished (it keeps references to them until then).

Invariants: a batch is placed whole on one idle instance; no instance gets a second batch
while it still holds requests; every arrival is placed exactly once.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import register_preset
from servelab.costmodel.links import LinkSpec

from servelab.designs.multibin.binning import FormedBatch, OnlineQuantileEdges
from servelab.core.policy import ROUTERS, ClusterState, Placement, Router
from servelab.core.request import Request, RequestStatus
from servelab.designs.multibin.policy import MultiBinConfig, current_edges, make_edges


@ROUTERS.register("multibin")
class MultiBinRouter(Router):
    Config = MultiBinConfig

    def __init__(self, config: MultiBinConfig = MultiBinConfig()) -> None:
        self.config = config
        self.edges = make_edges(config)
        self._batcher = config.batcher()
        self._queue: deque[FormedBatch] = deque()
        self._held: dict[int, Request] = {}
        self._in_flight: list[Request] = []
        self.dispatched: list[tuple[int, FormedBatch]] = []  # (instance id, batch), for tests and reports

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        self._learn()
        self._held[request.request_id] = request
        bin_index = current_edges(self.edges).bin_of(request.spec.expected_output_tokens)
        self._queue.extend(self._batcher.add(request.request_id, bin_index, now_s))
        return self._dispatch(cluster)

    def on_instance_idle(self, now_s: float, instance_id: int, cluster: ClusterState) -> list[Placement]:
        self._learn()
        self._queue.extend(self._batcher.release_due(now_s))
        return self._dispatch(cluster)

    def on_timer(self, now_s: float, cluster: ClusterState) -> list[Placement]:
        self._queue.extend(self._batcher.release_due(now_s))
        return self._dispatch(cluster)

    def next_wakeup_s(self, now_s: float) -> float | None:
        return self._batcher.next_deadline_s()

    def on_arrivals_done(self, now_s: float, cluster: ClusterState) -> list[Placement]:
        """No more arrivals: partial bins become batches now (none is left in a bin)."""
        self._queue.extend(self._batcher.flush(now_s))
        # batches ready at the same instant go bin by bin, as the central queue orders them
        self._queue = deque(sorted(self._queue, key=lambda b: (b.ready_s, b.bin_index, b.member_ids[0])))
        return self._dispatch(cluster)

    @property
    def num_queued_batches(self) -> int:
        return len(self._queue)

    def _dispatch(self, cluster: ClusterState) -> list[Placement]:
        placements: list[Placement] = []
        idle = [inst.instance_id for inst in cluster.instances if inst.is_idle]
        for instance_id in idle:
            if not self._queue:
                break
            batch = self._queue.popleft()
            self.dispatched.append((instance_id, batch))
            for rid in batch.member_ids:
                request = self._held.pop(rid)
                self._in_flight.append(request)
                placements.append(Placement(request, instance_id))
        return placements

    def _learn(self) -> None:
        if not isinstance(self.edges, OnlineQuantileEdges):
            self._in_flight.clear()
            return
        still = []
        for req in self._in_flight:
            if req.status is RequestStatus.FINISHED:
                self.edges.observe(req.num_generated_tokens)
            elif not req.status.is_terminal:
                still.append(req)
        self._in_flight = still


@register_preset("multibin")
def _multibin(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """One instance: the ``multibin`` policy does it all. Several: bins and the central batch
    queue move into the ``multibin`` router, and every instance runs whole batches it is given."""
    if num_instances == 1:
        return ClusterConfig(groups=(InstanceGroup(policy="multibin", policy_params=params, **group),), link=link)
    replica = {k: v for k, v in params.items() if k == "settle_s"}
    router = {k: v for k, v in params.items() if k != "settle_s"}
    return ClusterConfig(groups=(InstanceGroup(count=num_instances, policy="multibin_replica", policy_params=replica,
                                               **group),), router="multibin", router_params=router, link=link)
