"""``StepRecorder``: every step an instance ran, with its shape and its requests.

It is an ``InstanceDriver`` listener (``driver.listener``), so nothing in the drivers
changes: the driver calls ``on_step`` once per finished step (once per fast-forwarded
decode run in the simulator). A step's duration is the growth of the driver's ``busy_s``
since the last call, which is the executor's own time for the step (measured on the engine,
predicted in the simulator), not the clock gap, which on the in-process engine cluster
also holds other instances' steps.

Invariant: records of one instance are in start-time order. A driver that already has a
listener (the server's) is refused rather than silently displaced. A pipeline group's driver,
made at run time, inherits its first member's listener (servelab/cluster/reconfigure.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from servelab.core.plan import StepShape


@dataclass(frozen=True, slots=True)
class StepRecord:
    instance_id: int
    start_s: float
    duration_s: float
    shape: StepShape
    request_ids: tuple[int, ...]  # the batch, in plan order
    num_swap_out_blocks: int
    num_swap_in_blocks: int
    finished_ids: tuple[int, ...]
    handed_off_ids: tuple[int, ...]

    @property
    def kind(self) -> str:
        """prefill, decode, mixed, or swap (a step that only copied KV)."""
        s = self.shape
        if s.prefill_tokens and s.num_decodes:
            return "mixed"
        if s.prefill_tokens:
            return "prefill"
        return "decode" if s.num_decodes else "swap"


class StepRecorder:
    """Collects ``StepRecord``s from the drivers it is attached to."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self._busy: dict[int, float] = {}
        self.cluster: Any = None  # the ClusterDriver, for its transfers, preemptions and reconfiguration log

    def attach_cluster(self, cluster: Any) -> "StepRecorder":
        self.cluster = cluster
        return self.attach(cluster.drivers)

    def attach(self, drivers: Iterable[Any]) -> "StepRecorder":
        for d in drivers:
            if d.listener is not None and d.listener is not self:
                raise ValueError(f"instance {d.instance_id} already has a step listener")
            d.listener = self
            self._busy[id(d)] = d.busy_s
        return self

    def on_step(self, driver: Any, applied: Any, outcome: Any, now_s: float) -> None:
        iid = driver.instance_id
        duration = driver.busy_s - self._busy.get(id(driver), 0.0)  # a pipeline group's driver starts at 0
        self._busy[id(driver)] = driver.busy_s
        out_blocks = in_blocks = 0
        for direction, pairs in applied.swap_copies:
            if direction == "out":
                out_blocks += len(pairs)
            else:
                in_blocks += len(pairs)
        self.steps.append(StepRecord(iid, driver.step_start_s, max(duration, 0.0), applied.shape,
                                     tuple(r.request_id for r in applied.batch), out_blocks, in_blocks,
                                     tuple(r.request_id for r in outcome.finished),
                                     tuple(r.request_id for r in outcome.handed_off)))
