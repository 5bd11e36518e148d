"""The engine cluster on Ray: each engine instance in an actor, the cluster driver here.

Chosen with ``EngineCluster(..., backend="ray")`` (``--backend ray`` on ``generate`` and
``serve``); nothing here imports Ray until then. The pieces:

- ``worker.InstanceWorker``: lives in an actor; one model replica and its paged KV cache; runs
  a step's chunks and samples; reads, writes, sends and receives KV blocks.
- ``executor.RayExecutor``: the driver's side of ``core.executor.StepExecutor`` for one actor;
  ``launch`` returns a ``RemoteStep`` (a ``PendingStep``), so instances compute concurrently.
  Sampling parameters, stop checks and detokenizers (``RequestStates``) stay in the driver; a
  seeded request that moves carries its generator's state. KV moves by gloo send/recv (small
  transfers) or Ray's object store (large ones, and the driver's host KV pool, which holds
  object refs).
- ``clock.PollingWallClock``: the cluster driver's wall clock, which also waits on the steps in
  flight and turns an actor's death into ``FailInstance`` (its requests recomputed elsewhere).
- ``launch``: starts or joins Ray, places the actors (a GPU each where Ray sees GPUs), and
  replaces dead actors when the next cluster is built.
- ``bench``: KV transfer time vs size, per-step overhead, end-to-end runs -> docs/ray.md.

- ``layers`` / ``stage_worker``: KunServe's layer drops with ``layer_ranges=True``: a pipeline
  group's stages run in the members' actors (hidden states handed on as object refs), KV
  exchanged and split and restored weights copied actor to actor.
"""

from servelab.engine.ray_backend.config import KV_TRANSPORTS, RayConfig

__all__ = ["KV_TRANSPORTS", "RayConfig"]
