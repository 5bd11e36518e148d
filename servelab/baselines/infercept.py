"""InferCept (ICML'24) as the KunServe paper runs it: vLLM-style chunked prefill whose
throttling is handled by swapping running requests' KV to host memory, the copy overlapped
with compute (InferCept's point: no idle GPU while KV moves), and swapped requests brought
back when memory frees.

- Dispatch: Llumnix's, the most remaining steps (``llumnix.least_loaded``, as every system in this comparison).
- Swap out, checked after every step of an instance: when its running requests cannot keep
  growing (fewer free blocks than running decodes, each of which may open a block on its
  next token), its most recently arrived running requests (vLLM's preemption order) are
  sent to host memory until their blocks cover the shortfall, within the host pool's room
  (``host_gb`` per instance): vLLM's swap preemption, taken before the scheduler has to
  recompute. The copy is a transfer over the instance's PCIe link (``Move`` to the pool):
  it takes the link's time while the instance keeps computing, and the GPU blocks are freed
  only when it lands (charged, not free). Queued requests are not a reason to swap: they
  wait for memory, as the paper's Fig. 3b shows InferCept's queue does.
- Swap in, checked every ``poll_s`` and after every step: a parked request returns to its
  instance over PCIe as soon as that instance has room for it plus the watermark new
  requests keep (and ``headroom`` of its capacity, 0 by default) and its running decodes'
  growth, before queued requests are admitted (vLLM
  serves swapped requests first; this router used to bring them back only when the queue
  was empty, which let new requests overtake them), or when it runs nothing and has room.
  The oldest running request is never swapped out and one swapped back in decodes a token
  before it may leave again, so swapping never undoes itself. The instance's own scheduler
  (Sarathi, as vLLM 0.6's chunked prefill) still admits a queued request whenever its blocks
  fit, so new requests may take memory a parked one waits for.
- ``swapped_first`` (on by default): vLLM v0's rule, that of InferCept's base (v0.2.0, which
  the KunServe paper's InferCept keeps, with its scheduler and attention backend put in,
  section 5): while requests an instance swapped out wait in host memory, no new request is
  placed on it; arrivals are held by the router and placed on the least loaded instance with
  none away (those already queued on an instance stay there). This is the behaviour the paper
  measures (section 2.3, Fig. 3b: "the queued requests are still waiting for ongoing requests
  to finish") and issue 24 asks for ("InferCept serves swapped requests first, as vLLM
  does"). ``swapped_first=false`` (the default before issue 24, kept as a named variant for
  the KunServe reproduction's gap test) lets new requests take the memory swapping freed, so
  the swapped requests, not the queue, wait.
- Why a run ends: a request swapped back in waits in its instance's queue with its KV, and
  Sarathi runs such KV holders whenever its step would otherwise be empty. It used to do so
  only when nothing ran: with a recompute-preempted request at the queue's head (it cannot
  fit) and the one running request's next chunk short of blocks, no step was ever planned
  while this router's swap-in poll re-armed every ``poll_s``, for ever (issue 22). Any
  other stall is ended by the cluster's progress watchdog (``cluster/watchdog.py``).

Stand-in: InferCept swaps at layer granularity inside the forward pass; here a swap is a
request-sized PCIe transfer beside the steps, the same overlap at coarser grain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.baselines.llumnix import least_loaded, router_preset
from servelab.cluster.config import ClusterConfig
from servelab.cluster.presets import register_preset
from servelab.core.registry import RegistryError, coerce_param
from servelab.core.policy import POOL, ROUTERS, ClusterState, Move, Placement, Router
from servelab.core.request import Request, RequestStatus
from servelab.costmodel.links import LinkSpec


def _decodes(view) -> int:
    return sum(1 for r in view.running if r.status is RequestStatus.DECODING)


def growth_shortfall(view) -> int:
    """Blocks the running decodes may need on their next token beyond the free ones (> 0:
    they cannot all grow, and vLLM would preempt)."""
    b = view.blocks
    return _decodes(view) + b.watermark_blocks - b.num_free_gpu_blocks


@dataclass(frozen=True)
class InferCeptConfig:
    host_gb: float = 256.0  # host memory for swapped KV per instance
    headroom: float = 0.0  # of capacity kept free when swapping in, beyond the watermark new requests keep
    poll_s: float = 0.05
    # vLLM v0's rule (InferCept's base, v0.2.0): no new request goes to an instance while requests
    # it swapped out wait in host memory (held by the router; placed once one has none away);
    # False: new requests take the memory swapping freed (a variant, the default before issue 24)
    swapped_first: bool = True

    def __post_init__(self) -> None:
        if not self.host_gb > 0 or not 0 <= self.headroom < 1 or not self.poll_s > 0:
            raise ValueError("host_gb > 0, headroom in [0, 1), poll_s > 0")


@ROUTERS.register("infercept")
class InferCeptRouter(Router):
    Config = InferCeptConfig

    def __init__(self, config: InferCeptConfig = InferCeptConfig()) -> None:
        self.config = config
        self._home: dict[int, int] = {}  # request id -> instance it was swapped out of
        self._parked: dict[int, Request] = {}  # landed in host memory, by request id
        self._in_flight: set[int] = set()
        self._back_at: dict[int, int] = {}  # request id -> tokens it had when swapped back in
        self._outbound: set[int] = set()  # swap-outs under way
        self._held: list[Request] = []  # swapped_first: arrivals waiting for an instance with none away
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_held = 0

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        if not self.config.swapped_first:
            return [Placement(request, least_loaded(cluster.instances).instance_id)]
        self._held.append(request)
        out = self._release(cluster)
        self.num_held += any(r is request for r in self._held)
        return out

    def _release(self, cluster: ClusterState) -> list[Placement]:
        """Held arrivals (FIFO) to the least loaded instance with no swapped-out request away."""
        if not self._held:
            return []
        away = {self._home[r] for r in list(self._parked) + list(self._outbound)}
        free = [v for v in cluster.instances if v.instance_id not in away]
        if not free:
            return []
        out = [Placement(r, least_loaded(free).instance_id) for r in self._held]
        self._held.clear()
        return out

    def on_moved(self, now_s, request, destination, cluster) -> list:
        self._in_flight.discard(request.request_id)
        self._outbound.discard(request.request_id)
        if destination == POOL:
            self._parked[request.request_id] = request
        return []

    def next_wakeup_s(self, now_s: float) -> float | None:
        return now_s + self.config.poll_s if self._parked or self._held else None

    def on_timer(self, now_s: float, cluster: ClusterState) -> list:
        return self._swap_in(cluster)

    def on_instance_idle(self, now_s, instance_id, cluster) -> list:
        return self._swap_in(cluster)

    def on_step_done(self, now_s, instance_id, shape, finished, cluster: ClusterState) -> list:
        view = cluster.instance(instance_id)
        excess = growth_shortfall(view)
        if excess <= 0 or cluster.pool is None:
            return self._swap_in(cluster) if self._parked or self._held else []
        actions, freed, room = [], 0, cluster.pool.free_bytes
        per_block = view.kv_bytes_per_token * view.blocks.block_size
        running = sorted(view.running, key=lambda r: (-r.arrival_time_s, -r.request_id))
        for req in running[:-1]:  # the oldest keeps running, so the instance always progresses
            if freed >= excess:
                break
            if req.status is not RequestStatus.DECODING or req.num_computed_tokens == 0 \
                    or req.request_id in self._in_flight \
                    or req.num_generated_tokens <= self._back_at.get(req.request_id, -1):
                continue  # one swapped back in decodes a token before it may leave again
            blocks = view.blocks.blocks_for(req.num_computed_tokens)
            if blocks * per_block > room:
                break
            room -= blocks * per_block
            freed += blocks
            self._home[req.request_id] = instance_id
            self._in_flight.add(req.request_id)
            self._outbound.add(req.request_id)
            self.num_swap_outs += 1
            actions.append(Move(req, POOL, reason="infercept swap-out"))
        return actions

    def _swap_in(self, cluster: ClusterState) -> list:
        actions = []
        active = {v.instance_id: v for v in cluster.instances}
        budget: dict[int, int] = {}
        for rid in sorted(self._parked, key=lambda r: self._parked[r].arrival_time_s):
            req = self._parked[rid]
            if req.status.is_terminal:
                del self._parked[rid]
                continue
            home = self._home.get(rid)
            view = active.get(home) if home in active else least_loaded(cluster.instances)
            iid = view.instance_id
            if iid not in budget:  # swapped first: the queue does not hold them back
                b = view.blocks
                budget[iid] = (b.num_free_gpu_blocks - b.watermark_blocks - int(self.config.headroom * b.num_gpu_blocks)
                               - _decodes(view))
            if getattr(view, "swapped", None):
                continue  # the instance's own swapped requests (swap preemption) go back first
            need = view.blocks.blocks_for(req.num_computed_tokens + 1)
            if need > budget[iid] and (view.num_running or need > view.blocks.num_free_gpu_blocks):
                continue  # an instance with nothing running takes it back if it fits at all
            budget[iid] -= need
            del self._parked[rid]
            self._in_flight.add(rid)
            self._back_at[rid] = req.num_generated_tokens
            self.num_swap_ins += 1
            actions.append(Move(req, iid, reason="infercept swap-in"))
        return actions + self._release(cluster)

    def on_arrivals_done(self, now_s: float, cluster: ClusterState) -> list:
        return self._release(cluster)

    def report(self) -> dict:
        return {"num_swap_outs": self.num_swap_outs, "num_swap_ins": self.num_swap_ins, "num_held": self.num_held}


@register_preset("infercept")
def _infercept(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """Sarathi instances behind the ``infercept`` router, with ``host_gb`` of host KV per instance."""
    host = coerce_param(params.get("host_gb", InferCeptConfig.host_gb), float, "preset 'infercept' parameter 'host_gb'")
    if not host > 0:  # checked here: the cluster's pool (host_gb x instances) would be refused under its own name
        raise RegistryError(f"preset 'infercept' parameter 'host_gb': host memory for swapped KV per instance, in "
                            f"GiB, must be > 0, got {host:g}")
    return router_preset("infercept", "infercept", InferCeptConfig, "sarathi", params, group, link, num_instances,
                         kv_pool_gb=host * num_instances)
