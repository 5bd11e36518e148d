"""The driver's side of one instance actor: ``core.executor.StepExecutor`` over Ray calls.

``launch`` builds the step's chunks from the driver's ``RequestStates`` (prompt ids, outputs
so far), sends them with the batch's sampling parameters and returns a ``RemoteStep`` at
once; the polling clock finishes it when the actor answers. Stop checks and detokenizing run
here on the returned token ids, exactly as the in-process ``Executor`` does (this class
reuses its ``_chunk`` and ``_stops``), so both backends give the same tokens and texts.

KV payloads are ``RemoteKV`` handles with the blocks' ``shape`` (the mover counts blocks from
it). ``export_kv`` waits for nothing: with the object store it submits the read and the
destination's write takes the read's result directly (one round trip from the driver); with
gloo the read is the matching ``import_kv``'s send/recv between the two actors. A handle not
imported at once (a copy into the driver's KV pool) is read into the store from the next
event, and in any case before this actor runs another step or takes more KV, the only
things that could overwrite its blocks.

An actor that died surfaces as ``RayActorError`` on any call: ``on_dead(instance_id, reason)``
then turns it into ``FailInstance`` (requests recomputed elsewhere, or aborted with the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from servelab.core.plan import StepResult
from servelab.engine.executor import Executor, RequestStates


@dataclass(eq=False, slots=True)
class RemoteKV:
    shape: tuple[int, ...]  # [L, 2, n, block_size, kv_heads, head_dim]
    source: RayExecutor
    block_ids: list[int]
    ref: Any = None  # ObjectRef of the bytes in the object store; None: still on the source (gloo)


@dataclass(eq=False, slots=True)
class RemoteStep:
    """A step in flight on an actor (a ``core.executor.PendingStep``)."""

    executor: RayExecutor
    ref: Any
    batch: list
    launched_at: float  # perf_counter at launch: the step's time includes the actor boundary
    shape: Any = None  # the step's StepShape (kept with its times, for comparisons with a cost model)
    done_at: float | None = None
    _result: StepResult | None = field(default=None)

    def done(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0, fetch_local=False)[0])

    def collect(self) -> str | None:
        """Fetch the actor's answer (once): None when the step ran, else why it did not."""
        if self._result is not None:
            return None
        if self.done_at is None:
            self.done_at = time.perf_counter()
        try:
            sampled, worker_s = ray.get(self.ref)
        except RayActorError as e:
            return f"instance actor died ({type(e).__name__})"
        self.executor.step_times.append((self.done_at - self.launched_at, worker_s, self.shape))
        stopped = self.executor._stops(self.batch, sampled)
        self._result = StepResult(duration_s=self.done_at - self.launched_at, sampled_token_ids=sampled,
                                  stopped_ids=stopped)
        return None

    def result(self) -> StepResult:
        why = self.collect()
        if why is not None:
            raise RuntimeError(why)
        return self._result


class RayExecutor(Executor):
    """One instance actor seen from the driver; ``instance_id`` for ``on_dead``."""

    def __init__(self, worker: Any, states: RequestStates, instance_id: int, *, transport: str,
                 rank: int, kv_shape: tuple[int, ...], block_bytes: int, on_dead: Callable[[int, str], None],
                 defer: Callable[[Callable[[], None]], None], gloo_max_bytes: int = 0,
                 carried: dict | None = None) -> None:
        self.runner = None  # the model runs in the actor
        self.states = states
        self.eos_token_ids = states.eos_token_ids
        self.worker = worker
        self.instance_id = instance_id
        self.transport = transport  # auto | object_store | gloo
        self.block_bytes = block_bytes
        self.gloo_max_bytes = gloo_max_bytes  # auto: gloo below this many bytes, the store above
        self.rank = rank  # in the gloo group
        self.on_dead = on_dead
        self.defer = defer  # runs a function from the event loop right after the current event
        self.step_times: list[tuple] = []  # (round trip s, compute in the actor s, StepShape) per step
        self.dead = False
        self.carried = carried if carried is not None else {}  # request id -> sampler state in transit (shared)
        self.kv_shape = kv_shape  # the cache's [L, 2, num_blocks, block_size, kv_heads, head_dim]
        self._open: list[RemoteKV] = []  # exported, not imported yet: their blocks must not change

    def _died(self, why: str) -> None:
        if not self.dead:
            self.dead = True
            self.on_dead(self.instance_id, why)

    # ---- steps ----
    def launch(self, applied, blocks) -> RemoteStep:
        self._settle_open()
        batch = list(applied.batch)
        chunks = [self._chunk(req, n, blocks) for req, n in zip(batch, applied.plan.num_tokens)]
        sampling = {c.request_id: self.states.sampling[c.request_id] for c in chunks if c.sample}
        pad = applied.plan.padding
        padding = None if pad is None else (pad.num_rows, pad.row_tokens, pad.context_tokens)
        t0 = time.perf_counter()
        ref = self.worker.step.remote(chunks, sampling, list(applied.swap_copies), padding)
        return RemoteStep(self, ref, batch, t0, applied.shape)

    def admit(self, request) -> None:
        super().admit(request)
        state = self.carried.pop(request.request_id, None)
        if state is not None and not self.dead:  # runs before the request's next step (same actor queue)
            self.worker.put_generator.remote(request.request_id, state)

    def release(self, request_id: int, ended: bool = True) -> str:
        if not ended:
            self._carry_generator(request_id)
            return ""
        if not self.dead:
            self.worker.release.remote(request_id)  # forgets a seeded generator; nothing to wait for
        return self.states.end(request_id)

    def _carry_generator(self, request_id: int) -> None:
        """A seeded sampled request leaves with its generator's state, so its next token on the
        new instance is drawn as it would be here (in process, all instances share one sampler)."""
        params = self.states.sampling.get(request_id)
        if params is None or params.seed is None or params.is_greedy or self.dead:
            return
        try:
            state = ray.get(self.worker.take_generator.remote(request_id))
        except RayActorError:
            return  # its KV is gone with the actor too: it is recomputed from the seed
        if state is not None:
            self.carried[request_id] = state

    # ---- KV ----
    def export_kv(self, block_ids: list[int]) -> RemoteKV | None:
        """A handle at once, nothing waited for: the object store's read is submitted (gloo's is
        left to the import); the handle stays open until its blocks have been read."""
        if self.dead:
            return None
        shape = (*self.kv_shape[:2], len(block_ids), *self.kv_shape[3:])
        handle = RemoteKV(shape, self, list(block_ids))
        if not self._via_gloo(len(block_ids) * self.block_bytes):
            handle.ref = self.worker.read_blocks.remote(handle.block_ids)
        self._open.append(handle)
        self.defer(self._settle_open)  # not imported by then (it went to the pool): read it now
        return handle

    def import_kv(self, block_ids: list[int], payload: Any) -> None:
        if self.dead:
            return
        self._settle_open()
        if isinstance(payload, RemoteKV):
            payload.source._close(payload)
            if payload.ref is None:
                self._receive(block_ids, payload)
                return
        data = payload.ref if isinstance(payload, RemoteKV) else payload
        try:
            ray.get(self.worker.write_blocks.remote(list(block_ids), data))  # runs after the source's read
        except RayError as e:  # this actor died, or the source did before its read
            _blame((self, payload.source if isinstance(payload, RemoteKV) else None), e, "a KV copy")

    def _via_gloo(self, num_bytes: int) -> bool:
        if self.transport == "auto":
            return num_bytes < self.gloo_max_bytes
        return self.transport == "gloo"

    def alive(self) -> bool:
        if self.dead:
            return False
        try:
            ray.get(self.worker.address.remote(), timeout=30)
        except RayActorError:
            return False
        return True

    def _close(self, handle: RemoteKV) -> None:
        if handle in self._open:
            self._open.remove(handle)

    def _settle_open(self) -> None:
        """Every exported handle not imported yet gets its bytes into the object store, read
        before this actor's cache can change (a step, an import)."""
        handles, self._open = self._open, []
        if self.dead or not handles:
            return
        for h in handles:
            if h.ref is None:
                h.ref = self.worker.read_blocks.remote(h.block_ids)
        ray.wait([h.ref for h in handles], num_returns=len(handles), fetch_local=False)  # read, or failed

    def _receive(self, block_ids: list[int], handle: RemoteKV) -> None:
        src = handle.source
        if src.dead:
            return
        send = src.worker.send_blocks.remote(handle.block_ids, self.rank)
        recv = self.worker.recv_blocks.remote(list(block_ids), src.rank)
        for ref in (send, recv):
            try:
                ray.get(ref)
            except RayError as e:  # an actor died (its peer's gloo call then times out)
                _blame((src, self), e, "a KV transfer")
                return


def _blame(parties, error: Exception, during: str) -> None:
    """A KV call failed: fail the actors that are gone; with none gone it is a bug, raised."""
    gone = [p for p in parties if p is not None and not p.alive()]
    if not gone:
        raise error
    for p in gone:
        p._died(f"instance actor died during {during} ({type(error).__name__})")
