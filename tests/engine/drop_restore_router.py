"""The router of the engine KunServe tests (in process and on Ray): round-robin placement,
then one drop into a two-stage group, a restore from the peer and a split, at step counts."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.cluster.reconfig import FormPipeline, SetLayers, SplitPipeline
from servelab.core.policy import ROUTERS, Placement, Router

NUM_LAYERS = 4  # the tests' tiny model


@dataclass(frozen=True)
class DropAt:
    drop_step: int = 4  # steps (over both instances) before the drop
    group_steps: int = 12  # the group's steps before the restore
    microbatches: int = 1  # the group's step cut into this many microbatches (chains overlapping in the actors)


@ROUTERS.register("test_engine_drop_restore")
class DropRestoreRouter(Router):
    """Round-robin; halves both instances into one group after ``drop_step`` steps, restores
    from the peer after ``group_steps`` more, splits once both hold every layer again."""

    Config = DropAt

    def __init__(self, config: DropAt = DropAt()) -> None:
        self.config = config
        self.phase = self.steps = self.next = 0
        self.in_flight_at_drop: list[int] = []

    def on_arrival(self, now_s, request, cluster):
        ids = [v.instance_id for v in cluster.instances]
        self.next += 1
        return [Placement(request, ids[self.next % len(ids)])]

    def on_step_done(self, now_s, instance_id, shape, finished, cluster):
        self.steps += 1
        if self.phase == 0 and self.steps >= self.config.drop_step and cluster.can_change_layers:
            if len(cluster.instances) < 2 or any(not v.running for v in cluster.instances):
                return []
            self.phase, self.steps = 1, 0
            self.in_flight_at_drop = [v.num_running for v in cluster.instances]
            half = NUM_LAYERS // 2
            return [SetLayers(0, (0, half)), SetLayers(1, (half, NUM_LAYERS)),
                    FormPipeline((0, 1), self.config.microbatches)]
        if self.phase == 1 and self.steps >= self.config.group_steps:
            self.phase = 2
            return [SetLayers(0, (0, NUM_LAYERS), restore_from=1), SetLayers(1, (0, NUM_LAYERS), restore_from=0)]
        if self.phase == 2 and all(spec.layers is None for _, spec in cluster.instance(0).members):
            self.phase = 3
            return [SplitPipeline(0)]
        return []
