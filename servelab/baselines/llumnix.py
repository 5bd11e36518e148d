"""Llumnix (OSDI'24), the parts that act on memory throttling: dispatch by KV load, and
migration of running requests with their KV between instances to balance load and to make
room for a queue's head (de-fragmentation).

- Load of an instance: ``(used KV blocks + blocks its queue needs) / capacity`` (Llumnix's
  virtual usage, with the queued demand counted as its head-of-line term; its
  ``kv_blocks_ratio``), read by migration.
- Dispatch: the most remaining steps, ``(free blocks - blocks the queue needs) / (running +
  queued requests)`` (``remaining_steps``, the default ``dispatch_load_metric`` of Llumnix
  v0.1.0, the release the KunServe paper compares with: the Llumnix paper's freeness
  ``(M - sum V) / B``, decode steps the instance can still run). It used to be the lowest KV
  load (``kv_blocks_ratio``), which ignores how many requests share the free memory.
- Migration, checked after every step of an instance: when it is throttled (running plus
  queued KV beyond its capacity) or its load exceeds the lightest instance's by
  ``imbalance``, its running request with the fewest tokens (cheapest to move) migrates to
  the lightest instance if that one has room for it, one migration per source at a time.

Stand-in: Llumnix migrates live (decoding continues while earlier KV blocks are copied,
then a short stop for the last ones). Here a migration stops the request at a step
boundary and copies its KV in ``chunk_tokens`` chunks over the link between the two
instances, so a migrated request stalls for the whole copy; with 200 Gb/s links a 6K-token
Qwen-2.5-14B request takes about 50 ms, much shorter than the queueing it relieves.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import register_preset
from servelab.core.policy import ROUTERS, ClusterState, Move, Placement, Router
from servelab.core.registry import RegistryError
from servelab.core.request import Request, RequestStatus
from servelab.costmodel.links import LinkSpec


def queued_blocks(view) -> int:
    bs = view.blocks.block_size
    return sum(-(-r.num_tokens // bs) for r in view.waiting)


def excess_blocks(view) -> int:
    """Throttling: running KV plus what the queue needs, beyond the capacity (> 0: throttled)."""
    b = view.blocks
    return b.num_used_gpu_blocks + queued_blocks(view) - b.num_gpu_blocks


def kv_load(view, queued: int | None = None) -> float:
    """``queued``: ``queued_blocks(view)`` when the caller has it already."""
    b = view.blocks
    queued = queued_blocks(view) if queued is None else queued
    return (b.num_used_gpu_blocks + queued) / max(1, b.num_gpu_blocks)


def remaining_steps(view, queued: int | None = None) -> float:
    """Llumnix's dispatch metric (``remaining_steps``, the default ``dispatch_load_metric`` of its
    v0.1.0 release; the paper's freeness ``(M - sum V) / B``): KV blocks left once the queue's
    demand is counted, per running or queued request; an idle instance has infinitely many."""
    b = view.blocks
    n = view.num_running + len(view.waiting)
    if n == 0:
        return math.inf
    queued = queued_blocks(view) if queued is None else queued
    return (b.num_gpu_blocks - b.num_used_gpu_blocks - queued) / n


def least_loaded(instances) -> Any:
    """The dispatch target: the most remaining steps (Llumnix's dispatch; ties by the lowest
    KV load, then id). Each queue is walked once for both readings: this runs on every arrival."""
    def key(v):
        queued = queued_blocks(v)
        return -remaining_steps(v, queued), kv_load(v, queued), v.instance_id

    return min(instances, key=key)


@dataclass(frozen=True)
class LlumnixConfig:
    migrate: bool = True
    imbalance: float = 0.5  # migrate when a load exceeds the lightest by this much
    chunk_tokens: int = 512  # KV copied in chunks of this many tokens

    def __post_init__(self) -> None:
        if self.imbalance <= 0 or self.chunk_tokens < 1:
            raise ValueError("imbalance must be > 0 and chunk_tokens >= 1")


@ROUTERS.register("llumnix")
class LlumnixRouter(Router):
    Config = LlumnixConfig

    def __init__(self, config: LlumnixConfig = LlumnixConfig()) -> None:
        self.config = config
        self._moving: dict[int, int] = {}  # request id -> source instance
        self.num_migrations = 0

    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        return [Placement(request, least_loaded(cluster.instances).instance_id)]

    def on_moved(self, now_s, request, destination, cluster) -> list:
        self._moving.pop(request.request_id, None)
        return []

    def on_step_done(self, now_s, instance_id, shape, finished, cluster: ClusterState) -> list:
        if not self.config.migrate or len(cluster.instances) < 2 or instance_id in self._moving.values():
            return []
        src = cluster.instance(instance_id)
        dst = min((v for v in cluster.instances if v.instance_id != instance_id),
                  key=lambda v: (kv_load(v), v.instance_id))  # the lightest by KV load (migration's reading)
        throttled = excess_blocks(src) > 0
        if not throttled and kv_load(src) - kv_load(dst) < self.config.imbalance:
            return []
        candidates = [r for r in src.running if r.status is RequestStatus.DECODING and r.num_computed_tokens > 0
                      and r.request_id not in self._moving]
        if not candidates:
            return []
        req = min(candidates, key=lambda r: (r.num_computed_tokens, r.request_id))
        need = dst.blocks.blocks_for(req.num_tokens + 1) + queued_blocks(dst)
        if need > dst.blocks.num_free_gpu_blocks or kv_load(dst) >= kv_load(src):
            return []
        self._moving[req.request_id] = instance_id
        self.num_migrations += 1
        return [Move(req, dst.instance_id, chunk_tokens=self.config.chunk_tokens, reason="llumnix migration")]

    def report(self) -> dict:
        return {"num_migrations": self.num_migrations}


def router_preset(name: str, router: str, config_cls: type, policy: str, params: dict[str, Any],
                  group: dict[str, Any], link: LinkSpec, num_instances: int, **cluster: Any) -> ClusterConfig:
    """Instances running ``policy`` (its ``token_budget`` and ``preemption`` taken from ``params``)
    behind ``router`` (the rest of ``params``, checked against ``config_cls``)."""
    router_keys = {f.name for f in dataclasses.fields(config_cls)}
    policy_keys = {"token_budget", "preemption"}
    unknown = sorted(set(params) - router_keys - policy_keys)
    if unknown:
        raise RegistryError(f"preset {name!r} has no parameter {unknown[0]!r}; valid: "
                            f"{', '.join(sorted(router_keys | policy_keys))}")
    pol = {k: v for k, v in params.items() if k in policy_keys}
    rtr = {k: v for k, v in params.items() if k in router_keys}
    return ClusterConfig(groups=(InstanceGroup(count=num_instances, policy=policy, policy_params=pol, **group),),
                         router=router, router_params=rtr, link=link, **cluster)


@register_preset("llumnix")
def _llumnix(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """Sarathi (chunked prefill) instances behind the ``llumnix`` router."""
    return router_preset("llumnix", "llumnix", LlumnixConfig, "sarathi", params, group, link, num_instances)
