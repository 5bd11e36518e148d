"""KunServe's global dispatcher, monitor and memory manager (the paper's Figure 4).

- Dispatch (as Llumnix): a new request goes to the unit (instance or pipeline group) with
  the most remaining steps, ``(free blocks - blocks the queue needs) / (running + queued
  requests)`` (``dispatch="freeness"``, the default). The paper, section 3: "Requests are
  routed through a global dispatcher, which enqueues them to the local executor of each
  instance for execution. Our dispatcher incorporates the load-balancing design from Llumnix
  [41]. The global monitor collects usage information and calculates the load metric for
  each instance." Llumnix's load metric for dispatch is its freeness (``remaining_steps``,
  the default of the v0.1.0 release the paper compares with), so that is the rule here;
  after a drop the enlarged group's freed memory is shared by its members' requests, so it
  draws new requests only while it has more free blocks per request than a single instance.
  ``kv``: the lowest KV load, ``(used blocks + blocks the queue needs) / capacity`` (Llumnix's
  ``kv_blocks_ratio``; the default before issue 24, a variant); ``kv+compute``: a gap test.
- Monitor (``monitor``): after every step of a unit (an instance or a group: a throttled
  group triggers too), throttling is checked: the KV of its running requests plus its
  head-of-line queued request, plus the watermark vLLM's scheduler keeps free when admitting,
  exceeds its capacity (the head cannot be admitted). The need ``R`` is the sum over all
  units of their head-of-line excess (KV bytes of the whole model per token); each drop
  records every unit's reading. A unit planned into a group stays out of further plans for
  ``cooldown_s`` (its form waits for running steps); every other throttled unit may drop at
  once, and among units of one size the plan pairs throttled ones first: a throttled unit's
  queue is not moved, so the memory is freed where its head waits.
- Drop: ``drop_plan`` (Figure 6) merges the smallest groups until ``R`` is freed. Each new
  group's members keep contiguous layer ranges (``SetLayers``) and run as one pipeline
  (``FormPipeline``) whose running requests exchange KV with the other stages, in chunks
  sized to one stage's step time (coordinated: activations pass between chunks) or as one
  bulk job per link (uncoordinated). Microbatches are formed by the lookahead former over
  Eq. 1 fitted to the instance's cost model, planned over the whole queue (each step takes
  its share of the queue's cost; ``lookahead_scope="step"``: one step's budget), or by
  token-count chunking.
- Restore: when a group's head-of-line KV demand (used + head) falls below ``restore_threshold`` of what its
  members hold without the drop (the paper: 50% of the GPUs' memory without drop), its
  members pull their missing layers from each other, chunked the same way, and the group
  splits once every member holds the whole model (its requests then fit in half of the
  members' memory; while the copy runs the group keeps its enlarged KV). A group idle with the
  copy in flight (no step to check after) asks for a wake-up every ``restore_poll_s`` instead.
- Failure: a failed member takes its group down; the cluster layer restores the others
  from host memory (``Reconfigurer._fail``); they rejoin the plan once whole again.
- Autoscaling hook: throttling that no plan can relieve for ``autoscale_after_s`` calls
  ``on_autoscale(now_s, need_bytes)`` (recorded; this cluster cannot add instances).

The monitor keeps a memory timeline (KV used, demanded and available, parameter bytes)
for the report; drops and restores are in the cluster's reconfiguration log.
A cluster whose instances cannot change layers (a calibrated whole-model cost model, the
engine) runs the dispatcher alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

# KunServe's dispatcher balances by KV-use load as Llumnix does: one definition of load
from servelab.baselines.llumnix import kv_load as _load
from servelab.baselines.llumnix import least_loaded
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.presets import register_preset
from servelab.cluster.reconfig import FormPipeline, SetLayers, SplitPipeline
from servelab.core.plan import StepShape
from servelab.core.policy import ROUTERS, ClusterState, Placement, Router
from servelab.core.registry import RegistryError
from servelab.core.request import Request
from servelab.costmodel.links import LinkSpec
from servelab.designs.kunserve.config import KunServeConfig
from servelab.designs.kunserve.drop_plan import drop_plan, merge_layers, stage_layers
from servelab.designs.kunserve.microbatch import MicrobatchFormer
from servelab.designs.kunserve.monitor import GroupStats, block_bytes, hol_demand_blocks, reading


@dataclass(frozen=True)
class _Single:
    cost_model: Any
    max_num_seqs: int
    max_batch_tokens: int


@ROUTERS.register("kunserve")
class KunServeRouter(Router):
    Config = KunServeConfig

    def __init__(self, config: KunServeConfig = KunServeConfig()) -> None:
        self.config = config
        self._full_blocks: dict[int, int] = {}  # instance id -> KV blocks with the whole model
        self._copy_bytes = 0.0
        self._single = None  # the view of a whole single instance, as last seen
        self._kv_per_token = 0.0  # the whole model's KV bytes per token
        self.stats = GroupStats()
        self._now_s = 0.0
        self._eq1 = None
        self._last_drop_s = -math.inf  # the last drop attempt that formed nothing
        self._planned_s: dict[int, float] = {}  # instance id -> when a plan last put it in a group
        self._restoring: dict[int, tuple[int, ...]] = {}  # group id -> members
        self._idle_restoring: set[int] = set()  # restoring groups with no step to check on: polled
        self._idle_restore = [0, 0]  # times a restoring group went idle; splits on a wake-up
        self._chunk_for: dict[int, float] = {}  # group id -> exchange / restore chunk bytes
        self._pressure_since: float | None = None
        self._util: dict[int, float] = {}  # unit id -> moving average of its steps' tokens / budget
        self._group_steps = [0, 0]  # groups' steps; those with more than a step's worth of prompts queued
        self._last_sample_s = -math.inf
        self.timeline: list[tuple[float, float, float, float, float]] = []  # t, used, demand, capacity, params
        self.drops: list[dict] = []  # each plan: time, need, freed, groups, plan time
        self.autoscale_requests: list[tuple[float, float]] = []
        # for the report's trigger timeline: where each request was dispatched, and when each unit
        # first read throttled (its head could not be admitted)
        self.placed: dict[int, int] = {}
        self.first_throttled_s: dict[int, float] = {}
        self.on_autoscale: Callable[[float, float], None] | None = None

    # ---- dispatch ----
    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        self._learn(cluster)
        units = [v for v in cluster.instances if v.instance_id not in self._restoring] or list(cluster.instances)
        if self.config.dispatch == "kv+compute" and any(len(v.members) > 1 for v in units):
            # after a drop: units with compute and KV to spare first, then KV load
            full = self.config.merge_utilization
            spare = [v for v in units if self._util.get(v.instance_id, 0.0) < full and _load(v) < 1.0]
            target = min(spare or units, key=lambda v: (_load(v), v.instance_id))
        elif self.config.dispatch == "kv":
            target = min(units, key=lambda v: (_load(v), v.instance_id))
        else:
            target = least_loaded(units)
        self.placed[request.request_id] = target.instance_id
        return [Placement(request, target.instance_id)]

    # ---- monitor ----
    def on_step_done(self, now_s: float, instance_id: int, shape: StepShape, finished, cluster: ClusterState
                     ) -> list:
        self._learn(cluster)
        self._now_s = now_s
        if now_s - self._last_sample_s >= self.config.sample_s:
            self._last_sample_s = now_s
            self._sample(now_s, cluster)
        if not self.config.drop or not getattr(cluster, "can_change_layers", False):
            return []
        view = cluster.instance(instance_id)
        if shape is not None:
            budget = self.config.token_budget * len(view.members)
            self._util[instance_id] = 0.8 * self._util.get(instance_id, 0.0) + 0.2 * min(1.0, shape.num_tokens / budget)
            if len(view.members) > 1:  # lookahead's premise: more queued prompt work than one step holds
                self._group_steps[0] += 1
                queued = sum(r.num_pending_tokens for r in view.waiting if r.num_pending_tokens > 1)
                self._group_steps[1] += queued > budget - view.num_running
        actions: list = []
        throttled = self._excess(view) > 0
        if throttled:
            self.first_throttled_s.setdefault(instance_id, now_s)
        if len(view.members) > 1 and not throttled:
            actions += self._maybe_restore(now_s, view, cluster)
        elif len(view.members) > 1 and view.instance_id in self._restoring:
            actions += self._maybe_restore(now_s, view, cluster)  # a copy under way finishes first
        elif throttled and now_s - self._last_drop_s >= self.config.cooldown_s and not self._planned(view, now_s):
            actions += self._drop(now_s, cluster)  # a single instance or a group (escalation)
        elif not throttled:
            self._pressure_since = None
        return actions

    def _learn(self, cluster: ClusterState) -> None:
        for v in cluster.instances:
            for iid, spec in v.members:
                if iid not in self._full_blocks and spec is not None and spec.layers is None and len(v.members) == 1:
                    self._full_blocks[iid] = v.blocks.num_gpu_blocks
                    # a whole instance's cost model and step limits (a merge's members may not be whole)
                    self._single = _Single(v.cost_model, v.max_num_seqs, v.max_batch_tokens)
                    if not self._copy_bytes:
                        from servelab.catalog.instance import held_param_bytes

                        self._copy_bytes = float(held_param_bytes(spec))
                        self._kv_per_token = float(v.kv_bytes_per_token)

    def _sample(self, now_s: float, cluster: ClusterState) -> None:
        """KV used, head-of-line demand and capacity in bytes (each block at the whole model's
        KV per token: a group's ``kv_bytes_per_token`` overcounts while members restore)."""
        used = demand = cap = params = 0.0
        from servelab.catalog.instance import held_param_bytes

        for v in cluster.instances:
            per_block = block_bytes(v, self._kv_per_token)
            used += v.blocks.num_used_gpu_blocks * per_block
            demand += hol_demand_blocks(v) * per_block
            cap += v.blocks.num_gpu_blocks * per_block
            params += sum(held_param_bytes(spec) for _, spec in v.members if spec is not None)
        self.timeline.append((now_s, used, demand, cap, params))

    # ---- drop ----
    def _planned(self, view, now_s: float) -> bool:
        """Whether a member of the unit was put in a group less than ``cooldown_s`` ago (its
        form may still wait for steps to end: it is in no second plan meanwhile)."""
        return any(now_s - self._planned_s.get(i, -math.inf) < self.config.cooldown_s for i, _ in view.members)

    def _drop(self, now_s: float, cluster: ClusterState) -> list:
        units = [v for v in cluster.instances if not self._planned(v, now_s)]
        readings = [reading(v) | {"step_utilization": self._util.get(v.instance_id, 0.0)} for v in units
                    if self._excess(v) > 0]
        declined = self._no_merge(units)
        units = [v for v in units if v.instance_id not in declined]
        need = self.config.headroom * sum(max(0, self._excess(v)) * block_bytes(v, self._kv_per_token)
                                          for v in units)
        singles = [v for v in units if len(v.members) == 1]
        groups = [tuple(i for i, _ in v.members) for v in units]
        # among groups of one size, throttled units first (their queue is not moved: the memory
        # must be freed where the head waits), then the most loaded
        load = {i: -_load(v) - (1e6 if self._excess(v) > 0 else 0.0) for v in units for i, _ in v.members}
        model = cluster.instances[0].members[0][1].model_spec
        cap = self.config.max_group_size or model.num_layers
        t0 = time.perf_counter()
        plan = drop_plan(groups, need, self._copy_bytes, tie=load,
                         max_group_size=cap)
        plan_s = time.perf_counter() - t0
        whole = {v.instance_id for v in singles if v.members[0][1].layers is None}
        held = {i: spec.layer_range for v in units for i, spec in v.members}
        actions: list = []
        formed, blocked, copies_freed = [], [], 0
        for members in plan.merged:
            parts = [g for g in groups if set(g) <= set(members)]  # the units merged
            layout = None if set(members) <= whole else merge_layers([(i, held[i]) for i in members], model.num_layers)
            busy = any(g[0] in self._restoring or cluster.instance(g[0]).reserved for g in parts if len(g) > 1)
            if (layout is None and not set(members) <= whole) or busy:
                blocked.append(list(members))
                continue  # a member would have to load layers, or a group restores or still exchanges KV
            if layout is not None:
                members = tuple(i for i, _ in layout)
                for g in parts:
                    if len(g) > 1:
                        self.stats.merged(now_s, g[0], members[0])
            actions += self._form(members, cluster, model, [r for _, r in layout] if layout else None)
            formed.append(list(members))
            self._planned_s.update(dict.fromkeys(members, now_s))
            copies_freed += len(parts) - 1
            self.stats.formed(now_s, members[0], len(members))
        freed = self._copy_bytes * copies_freed
        self.drops.append({"t": now_s, "need_bytes": need, "freed_bytes": freed, "plan_freed_bytes": plan.freed_bytes,
                           "satisfied": freed >= need, "groups": formed,
                           "microbatches": [self._microbatches(len(m)) for m in formed], "merges_not_carried": blocked,
                           "plan_ms": 1e3 * plan_s, "num_units": len(units) + len(declined), "trigger": readings,
                           "merges_declined": sorted(declined)})
        if not formed:
            self._last_drop_s = now_s
            if self._pressure_since is None:
                self._pressure_since = now_s
            elif now_s - self._pressure_since >= self.config.autoscale_after_s:
                self.autoscale_requests.append((now_s, need))
                if self.on_autoscale is not None:
                    self.on_autoscale(now_s, need)
                self._pressure_since = now_s
        return actions

    def _excess(self, view) -> float:
        """Head-of-line demand beyond ``trigger_share`` of the unit's KV (> 0: throttled). With
        ``trigger_watermark`` a head is charged the watermark the scheduler keeps free when
        admitting a new request (vLLM's rule), so the trigger reads the admission it stands for."""
        b = view.blocks
        demand = hol_demand_blocks(view)
        if self.config.trigger_watermark and demand > b.num_used_gpu_blocks:
            demand += b.watermark_blocks
        return demand - self.config.trigger_share * b.num_gpu_blocks

    def _no_merge(self, units) -> set[int]:
        """Formed groups that may not merge again (``merge="spare"``): those whose steps fill
        their token budget (moving average at or over ``merge_utilization``). Their head waits
        for compute as much as for memory: more KV would not run it sooner, while a larger
        group pays more stages (bubbles, weight reads per step). They neither merge nor count
        in the need; the trigger's reading records every unit's utilization."""
        if self.config.merge == "always":
            return set()
        return {v.instance_id for v in units
                if len(v.members) > 1 and self._util.get(v.instance_id, 0.0) >= self.config.merge_utilization}

    def _form(self, members: tuple[int, ...], cluster: ClusterState, model, ranges=None) -> list:
        """Set each member's layers and form the group (``ranges``: a merge's layout; None:
        single instances, equal contiguous ranges)."""
        cfg = self.config
        first = self._single
        ranges = ranges or stage_layers(model.num_layers, len(members))
        chunk = self._chunk_bytes(first, members, cluster) if cfg.coordinated else math.inf
        self._chunk_for[members[0]] = chunk
        former = None
        if cfg.former != "rows":
            if cfg.former == "lookahead" and self._eq1 is None:
                from servelab.designs.kunserve.eq1 import fit_eq1

                self._eq1 = fit_eq1(first.cost_model)
            former = MicrobatchFormer(cfg.former, self._microbatches(len(members)), self._eq1,
                                      scope=cfg.lookahead_scope if cfg.former == "lookahead" else "step",
                                      min_tokens=cfg.lookahead_min_tokens, stage_floor=cfg.stage_floor)
        self._util.pop(members[0], None)  # the group's own steps, from its formation on
        actions: list = [SetLayers(iid, rng) for iid, rng in zip(members, ranges)]
        n = len(members)  # one virtual engine per stage, as vLLM's pipeline runs
        actions.append(FormPipeline(tuple(members), self._microbatches(n), exchange_chunk_bytes=chunk, former=former,
                                    max_num_seqs=n * first.max_num_seqs, max_batch_tokens=n * first.max_batch_tokens,
                                    overlap=cfg.overlap))
        return actions

    def _microbatches(self, stages: int) -> int:
        return self.config.num_microbatches or stages

    def _chunk_bytes(self, view, members, cluster: ClusterState) -> float:
        """A chunk crosses in about one stage's share of a full-budget step."""
        budget = self.config.token_budget * len(members)
        step_s = view.cost_model.step_time_s(StepShape((budget,), (budget,)))
        stage_s = step_s / len(members) / self._microbatches(len(members))
        bw = cluster.link(members[0], members[1]).spec.bandwidth_bytes_per_s
        return max(1.0, stage_s * bw)

    # ---- restore ----
    def on_instance_idle(self, now_s: float, instance_id: int, cluster: ClusterState) -> list:
        """A restoring group whose last request ended takes no further step, so the split
        checked after each step would never come: poll it until its copy lands."""
        if instance_id in self._restoring and instance_id not in self._idle_restoring:
            self._idle_restoring.add(instance_id)
            self._idle_restore[0] += 1
        return []

    def next_wakeup_s(self, now_s: float) -> float | None:
        return now_s + self.config.restore_poll_s if self._idle_restoring else None

    def on_timer(self, now_s: float, cluster: ClusterState) -> list:
        """Split every idle restoring group whose members are whole again."""
        self._now_s = now_s
        units = {v.instance_id: v for v in cluster.instances}
        actions: list = []
        for gid in sorted(self._idle_restoring):
            view = units.get(gid)
            if view is None or len(view.members) < 2 or gid not in self._restoring or not view.is_idle \
                    or view.is_busy:  # gone (a failed member), or stepping again: its steps check
                self._idle_restoring.discard(gid)
                continue
            split = self._maybe_restore(now_s, view, cluster)
            if split:
                self._idle_restoring.discard(gid)
                self._idle_restore[1] += 1
                actions += split
        return actions

    def _maybe_restore(self, now_s: float, view, cluster: ClusterState) -> list:
        gid = view.instance_id
        members = tuple(i for i, _ in view.members)
        if gid in self._restoring:
            if all(spec.layers is None for _, spec in view.members):
                del self._restoring[gid]
                self.stats.split(now_s, gid)
                return [SplitPipeline(gid)]
            return []
        if any(i not in self._full_blocks for i in members):
            return []
        tokens = hol_demand_blocks(view) * view.blocks.block_size
        full_tokens = sum(self._full_blocks[i] for i in members) * view.blocks.block_size
        self.stats.checked(now_s, gid, tokens / max(full_tokens, 1))  # read with restore off too
        if not self.config.restore or tokens > self.config.restore_threshold * full_tokens:
            return []
        self._restoring[gid] = members
        self.stats.restoring(now_s, gid, tokens / max(full_tokens, 1))
        layers = view.members[0][1].model_spec.num_layers
        chunk = self._chunk_for.get(gid) if self.config.coordinated else None
        return [SetLayers(iid, (0, layers), restore_from=members[(k + 1) % len(members)], chunk_bytes=chunk)
                for k, iid in enumerate(members)]

    def report(self) -> dict:
        """What the design did, for every run's summary.json (``policy_reports["router"]``):
        drops with the trigger's reading, groups formed and split, time pipelined, KV freed."""
        drops = [d for d in self.drops if d["groups"]]
        return {"num_drops": len(drops), "kv_freed_gb": sum(d["freed_bytes"] for d in drops) / 1e9,
                **self.stats.report(self._now_s), "num_drop_attempts": len(self.drops),
                "num_merges_declined": sum(1 for d in self.drops if d.get("merges_declined")),
                "groups_idle_while_restoring": self._idle_restore[0], "splits_after_idle_restore": self._idle_restore[1],
                "group_steps": self._group_steps[0], "group_steps_queue_over_a_step": self._group_steps[1],
                "drops": drops, "autoscale_requests": self.autoscale_requests,
                "eq1": dataclasses.asdict(self._eq1) if self._eq1 is not None else None}


@register_preset("kunserve")
def _kunserve(num_instances: int, params: dict[str, Any], group: dict[str, Any], link: LinkSpec) -> ClusterConfig:
    """KunServe instances (chunked prefill, ``token_budget``) behind the ``kunserve`` router."""
    router_keys = {f.name for f in dataclasses.fields(KunServeConfig)}
    policy_keys = {"token_budget", "preemption"}
    unknown = sorted(set(params) - router_keys - policy_keys)
    if unknown:
        raise RegistryError(f"preset 'kunserve' has no parameter {unknown[0]!r}; valid: "
                            f"{', '.join(sorted(router_keys | policy_keys))}")
    policy = {k: v for k, v in params.items() if k in policy_keys}
    router = {k: v for k, v in params.items() if k in router_keys}
    return ClusterConfig(groups=(InstanceGroup(count=num_instances, policy="kunserve", policy_params=policy,
                                               **group),), router="kunserve", router_params=router, link=link)
