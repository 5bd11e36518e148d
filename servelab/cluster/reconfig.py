"""Run-time reconfiguration actions a router may return (KunServe's drops and restores,
faults, KV resizes, pipeline groups). The cluster driver carries them out.

Each is a frozen record; ``ClusterDriver`` owns their effect:
- ``SetLayers``: instance keeps only ``layers`` ([start, end) of the model); its weights for
  the other layers are freed (or loaded back when the range grows) and KV capacity and cost
  model are rebuilt from the new ``InstanceSpec``. Layers pulled back cross the network
  (``restore_from``: the instance they are copied from; None: from host memory).
- ``FailInstance``: the instance stops; its requests are re-queued through the router (their
  KV lost: recompute) or aborted with a reason.
- ``ResizeKV``: set an instance's KV capacity in blocks (memory given back or taken).
- ``FormPipeline`` / ``SplitPipeline``: run several instances, each holding a layer range,
  as one pipeline group scheduled as one unit (its id is its first member's), and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SetLayers:
    instance_id: int
    layers: tuple[int, int]
    restore_from: int | None = None
    chunk_bytes: float | None = None  # restored weights cross in chunks this size (None: one job)


@dataclass(frozen=True, slots=True)
class FailInstance:
    instance_id: int
    requeue: bool = True
    reason: str = "instance failed"


@dataclass(frozen=True, slots=True)
class ResizeKV:
    instance_id: int
    num_gpu_blocks: int


@dataclass(frozen=True, slots=True)
class FormPipeline:
    """``instance_ids`` in stage order; each must already hold its layer range (SetLayers)
    and be empty of requests (move them first: KunServe's KV exchange)."""

    instance_ids: tuple[int, ...]
    num_microbatches: int = 2
    # KV exchange: None sends each request's KV as one job per stage; a size concatenates
    # every request's KV per link and cuts it into chunks that large (inf: one bulk job)
    exchange_chunk_bytes: float | None = None
    former: Any = None  # shape -> row groups or sub-StepShapes (None: the factory's, or token balancing)
    # the group's step limits (None: the first member's); a pipeline of S stages runs S
    # virtual engines' worth of rows in vLLM, so a caller may pass S x the member's
    max_num_seqs: int | None = None
    max_batch_tokens: int | None = None
    # consecutive steps overlap while the group stays busy (vLLM's virtual engines); False:
    # every step fills and drains the pipeline (servelab.cluster.pipeline)
    overlap: bool = True


@dataclass(frozen=True, slots=True)
class SplitPipeline:
    group_id: int
