"""Carrying out reconfiguration actions (``servelab.cluster.reconfig``) on a running cluster.

Layer changes rebuild what depends on the layers an instance holds: its ``InstanceSpec``,
KV capacity (weights freed become KV blocks, weights loaded take them back), cost model and
KV bytes per token; a decode run in flight is cut at the step in flight first. Restored
layers cross the network (or PCIe from host memory) as parameter traffic, behind
activations and KV on the same link; the capacity they need is taken when the copy starts
and the cost model switches when it ends.

A failed instance leaves the schedulable set; its requests are re-queued through the router
(recomputed from scratch) or aborted with the action's reason; a failed member of a group
takes the group down and the others restore their layers from host memory.

The ``factory`` (given by whoever built the cluster) supplies hardware models, policies and
executors for rebuilt instances; where it also has ``group_executor`` (the engine's, built with
``layer_ranges=True``) a group's executor is its own, and the executors' ``exchange_kv`` /
``split_kv`` and the factory's ``layers_changed`` move the real bytes (KV, weights).

Pipeline groups (``FormPipeline``, ``SplitPipeline``) are carried out by the base class,
``cluster.pipeline_groups.PipelineGroups``, which also holds the state and helpers shared here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from servelab.cluster.links import LinkJob, Priority
from servelab.cluster.pipeline_groups import PipelineGroups, chunk_sizes, fresh_runtime
from servelab.cluster.reconfig import FailInstance, FormPipeline, ResizeKV, SetLayers, SplitPipeline
from servelab.core.driver import InstanceDriver
from servelab.core.policy import POOL
from servelab.core.request import Request, RequestStatus


class Reconfigurer(PipelineGroups):
    """Dispatches a router's reconfiguration actions; layer changes, KV resizes and faults here,
    pipeline groups in the base class."""

    def after_step(self) -> None:
        """A step ended somewhere: forms and splits that waited for it may go now."""
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for action in waiting:
                self.apply(action)

    def apply(self, action: Any) -> None:
        handler = {SetLayers: self._set_layers, FailInstance: self._fail, ResizeKV: self._resize,
                   FormPipeline: self._form, SplitPipeline: self._split}.get(type(action))
        if handler is None:
            raise ValueError(f"router {self.cluster.router.name!r} returned an unknown action {action!r}")
        handler(action)

    # ---- layers ----
    def _set_layers(self, a: SetLayers) -> None:
        factory = self._need_factory("SetLayers")
        c = self.cluster
        d = self._physical(a.instance_id)
        old = d.spec
        new = replace(old, layers=None if a.layers == (0, old.model_spec.num_layers) else a.layers)
        hw = factory.hardware(new)
        grow = new.num_layers_held > old.num_layers_held
        self._log("restore" if grow else "drop", instance=a.instance_id, layers=list(new.layer_range))
        notify = getattr(factory, "layers_changed", None)  # the engine moves weights; the simulator has none
        if not grow:
            if notify is not None:
                notify(a.instance_id, new, None)
            self._rebuild(d, new, hw)
            return
        # restore: take the memory now, switch the cost model when the weights have arrived
        from servelab.catalog.instance import held_param_bytes

        if a.instance_id not in self.member_of:
            self._quiesce(d)
            d.runtime.resize(hw.kv_config.num_gpu_blocks)
        nbytes = held_param_bytes(new) - held_param_bytes(old)
        source = a.restore_from if a.restore_from is not None else POOL
        lk = c.mover.link(source, a.instance_id) if source != POOL else c.mover.link(POOL, a.instance_id)

        def landed(now_s: float) -> None:
            if notify is not None:
                notify(a.instance_id, new, source)
            self._rebuild(d, new, hw)
            self._log("restored", instance=a.instance_id, layers=list(new.layer_range))

        sizes = chunk_sizes(nbytes, a.chunk_bytes)
        left = [len(sizes)]

        def chunk_landed(now_s: float) -> None:
            left[0] -= 1
            if left[0] == 0:
                landed(now_s)

        for size in sizes:
            self._submit(lk, LinkJob(size, Priority.PARAMS, chunk_landed, label=f"params i{a.instance_id}"))

    def can_change_layers(self) -> bool:
        """Whether this cluster's instances can be rebuilt for a layer range (a router asks
        before dropping: a calibrated whole-model cost model or the engine cannot)."""
        return bool(getattr(self.factory, "supports_layer_ranges", False))

    def _rebuild(self, d: InstanceDriver, spec, hw) -> None:
        factory = self.factory
        d.spec = spec
        d.cost_model = hw.cost
        d.kv_bytes_per_token = hw.kv_bytes_per_token
        d.flops_per_token = hw.flops_per_token
        gid = self.member_of.get(d.instance_id)
        if gid is not None:
            self._refresh_group(self.groups[gid])
            return
        self._quiesce(d)
        d.runtime.resize(hw.kv_config.num_gpu_blocks)
        d.runtime.cost_model = hw.cost
        d.runtime.spec = spec
        d.executor = factory.executor(hw.cost)
        self.cluster.mover.after_resize(d)
        self.cluster.kick(d.instance_id)

    def _resize(self, a: ResizeKV) -> None:
        d = self.cluster.drivers[a.instance_id]
        self._quiesce(d)
        d.runtime.resize(a.num_gpu_blocks)
        self._log("resize", instance=a.instance_id, blocks=a.num_gpu_blocks)
        self.cluster.mover.after_resize(d)
        self.cluster.kick(a.instance_id)

    # ---- faults ----
    def _fail(self, a: FailInstance) -> None:
        c = self.cluster
        iid = a.instance_id
        gid = self.member_of.get(iid, iid if iid in self.groups else None)
        if gid is not None:
            self._log("fail", instance=iid, group=gid)
            group = self.groups.pop(gid)
            d = c.drivers[gid]
            orphans = self._evict_all(d)
            for m in group.members:
                self.member_of.pop(m.instance_id, None)
                c.drivers[m.instance_id] = m
                c.active.add(m.instance_id)
            c.active.discard(iid)
            self._record_group(group)
            for m in group.members:  # the survivors load the whole model back from host memory
                if m.instance_id != iid and m.spec is not None and m.spec.layers is not None:
                    m.runtime = fresh_runtime(m, self.factory, m.spec)
                    self._set_layers(SetLayers(m.instance_id, (0, m.spec.model_spec.num_layers)))
                elif m.instance_id != iid:
                    m.runtime = fresh_runtime(m, self.factory, m.spec)
        else:
            self._log("fail", instance=iid)
            d = c.drivers[iid]
            orphans = self._evict_all(d)
            c.active.discard(iid)
        c.view.rebuild()
        orphans += c.mover.on_instance_gone(iid)
        self._requeue(orphans, a.requeue, a.reason)

    def _evict_all(self, d: InstanceDriver) -> list[Request]:
        """Take every request off a driver that stops (its KV is lost)."""
        rt = d.runtime
        moving = self.cluster.mover.moving_ids()  # the mover sends those back to where they came from
        reqs = list(rt.waiting) + list(rt.running) + list(rt.swapped) + \
            [r for r in rt.reserved.values() if r.request_id not in moving]
        d.busy, d.run, d.plan, d.applied, d.result = False, None, None, None, None
        d.version += 1
        for req in reqs:
            rt.blocks.free(req.request_id)
            d.policy.on_finish(self.cluster.now_s, req)
            d.executor.release(req.request_id, False)
        return reqs

    def _requeue(self, reqs: list[Request], requeue: bool, reason: str) -> None:
        c = self.cluster
        seen: set[int] = set()
        for req in reqs:
            if req.request_id in seen or req.status.is_terminal:
                continue
            seen.add(req.request_id)
            home = req.instance_id
            if home is not None and home in c.active and c.drivers[home].runtime.has(req.request_id):
                continue  # it still runs elsewhere (only a stream toward the failed instance was lost)
            if requeue and c.active:
                req.num_computed_tokens = 0
                req.num_preemptions += 1
                req.status = RequestStatus.QUEUED
                req.instance_id = None
                req.handoff_at_tokens = req.handoff_target = req.stream_kv_tokens = None
                c.apply(c.router.on_arrival(c.now_s, req, c.view))
            else:
                c.end_request(req, RequestStatus.ABORTED, reason)
