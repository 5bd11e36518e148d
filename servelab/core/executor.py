"""The driver-to-executor contract: a step goes in, a result comes out; KV blocks go out and in.

An executor runs the steps of one instance. The simulator's executor asks a cost model how
long a step takes; the engine's runs the PyTorch model; a Ray executor (later) forwards the
same calls to an actor in another process. The contract is kept narrow so that the driver
above it never knows which one it talks to:

- ``launch(applied, blocks)``: run one applied step. Returns its ``StepResult`` when the
  step ran synchronously (simulator, in-process engine) or a ``PendingStep`` that completes
  later (an executor in another process); the driver treats both alike.
- ``admit(request)`` / ``release(request_id, ended)``: a request arrived on this instance or
  left it (``ended``: for good; otherwise it moves elsewhere with its KV and keeps its
  sampling state).
- ``export_kv(block_ids)`` / ``import_kv(block_ids, payload)``: the bytes of some KV blocks,
  for hand-offs, migration, the cluster pool and swaps. The simulator moves no bytes and
  returns ``None``; time is charged by the cluster's links, not here.

An executor that declares ``reads_requests = False`` times steps from their shape alone, so the
runtime may keep steady decoders in a ``DecodeGroup`` (their counters advance in O(1)).
An executor may also offer ``decode_run_ends(shape, num_steps, now_s)`` (the simulator's does):
the end times of ``num_steps`` identical decode steps, which lets the driver fast-forward
steady decode stretches in one jump. Executors without it are stepped one step at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from servelab.core.plan import StepResult

if TYPE_CHECKING:
    from servelab.core.instance import AppliedStep
    from servelab.core.kv_blocks import BlockManager
    from servelab.core.request import Request


@runtime_checkable
class PendingStep(Protocol):
    """A step running elsewhere: ``done()`` polls, ``result()`` waits for it."""

    def done(self) -> bool: ...

    def result(self) -> StepResult: ...


class StepExecutor(Protocol):
    def launch(self, applied: AppliedStep, blocks: BlockManager) -> StepResult | PendingStep:
        """Run one step whose plan the instance runtime has already applied."""
        ...

    def admit(self, request: Request) -> None:
        """``request`` is now on this instance (new, or moved here with its KV)."""
        ...

    def release(self, request_id: int, ended: bool) -> None:
        """``request_id`` left this instance: ended for good, or moved away (``ended=False``)."""
        ...

    def export_kv(self, block_ids: list[int]) -> Any:
        """The contents of ``block_ids`` (every layer), or None when no bytes are kept."""
        ...

    def import_kv(self, block_ids: list[int], payload: Any) -> None:
        """Write ``payload`` (from ``export_kv`` of the same block count) into ``block_ids``."""
        ...


class CostModelExecutor:
    """The simulator's executor: a step takes as long as the cost model says; no bytes move."""

    __slots__ = ("cost", "step_time_s")
    reads_requests = False  # needs no per-request state: the runtime may advance decoders as a group

    def __init__(self, cost_model: Any) -> None:
        self.cost = cost_model
        self.step_time_s = cost_model.step_time_s  # bound once: the hot path calls it every step

    def launch(self, applied: AppliedStep, blocks: BlockManager) -> StepResult:
        return StepResult(self.step_time_s(applied.shape))

    def decode_run_ends(self, shape, num_steps: int, now_s: float):
        from servelab.core.fast_forward import plan_jump

        return plan_jump(self.cost, shape, num_steps, now_s)

    def admit(self, request: Request) -> None:
        pass

    def release(self, request_id: int, ended: bool) -> None:
        pass

    def export_kv(self, block_ids: list[int]) -> None:
        return None

    def import_kv(self, block_ids: list[int], payload: Any) -> None:
        pass
