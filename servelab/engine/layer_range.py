"""Layer ranges on the real engine: what the cluster's reconfiguration asks of an engine instance.

``EngineFactory`` is the engine's side of the rebuild seam that ``SimFactory`` fills in the
simulator (``hardware(spec)``, ``policy(iid)``, ``executor(cost)``, ``supports_layer_ranges``,
``microbatch_former``), plus ``group_executor`` (a pipeline group runs stage by stage on the
members' own weights and caches, ``servelab.engine.pipeline``) and ``layers_changed`` (weights
dropped or restored).

Weights. Instances start on the one shared copy of the checkpoint. A drop takes effect when
the instance's pipeline group forms (until then it keeps serving as a whole instance: its
requests' KV for every layer is still on it, and the exchange reads it from there): its model
becomes a stage model that holds only its decoder layers; the others are gone (the embedding,
final norm and LM head stay on every stage: small, and only the first / last stage runs them).
A restore copies each missing layer's tensors from the peer named by ``SetLayers.restore_from``
(or from the host checkpoint when it names none): real copies, counted in ``restored_bytes``.

KV. A stage's cache spends the instance's KV budget (``EngineConfig.kv_budget_bytes``) on its
layers only, so a group of two half-model stages holds twice the tokens of one instance (the
group keeps them until it splits, as in the simulator). The weights freed are not added to the
KV budget (the engine's budget is a fixed number of bytes): KunServe's memory gain from freed
weights is the simulator's to measure; this version shows the mechanics with real bytes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import nn

from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.policy import POLICIES, POOL


@dataclass(frozen=True, slots=True)
class EngineModelSpec:
    """The few model facts reconfiguration reads (``InstanceSpec.model_spec`` in the simulator)."""

    name: str
    num_layers: int
    hidden_size: int
    params_per_layer: int
    embedding_params: int
    lm_head_params: int


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine instance and the layers it holds (``None``: all), shaped like ``InstanceSpec``."""

    instance_id: int
    model_spec: EngineModelSpec
    dtype_bytes: int
    layers: tuple[int, int] | None = None

    @property
    def layer_range(self) -> tuple[int, int]:
        return self.layers if self.layers is not None else (0, self.model_spec.num_layers)

    @property
    def num_layers_held(self) -> int:
        lo, hi = self.layer_range
        return hi - lo

    @property
    def holds_first_layer(self) -> bool:
        return self.layer_range[0] == 0

    @property
    def holds_last_layer(self) -> bool:
        return self.layer_range[1] == self.model_spec.num_layers


@dataclass(frozen=True, slots=True)
class EngineStage:
    """An engine instance's "cost model" handle: which instance, which layers. The engine times
    steps by running them, so it has no ``step_time_s``; the factory builds executors from it."""

    instance_id: int
    layers: tuple[int, int]


@dataclass(frozen=True, slots=True)
class EngineHardware:
    kv_config: KVCacheConfig
    cost: EngineStage
    kv_bytes_per_token: float
    flops_per_token: float


class _Dropped(nn.Module):
    """Where a dropped decoder layer was: no parameters; running it is a bug."""

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("this stage dropped the layer it was asked to run")


def layer_bytes(layer: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def stage_model(model: nn.Module, layers: tuple[int, int]) -> nn.Module:
    """A copy of ``model`` that holds only decoder layers ``[lo, hi)`` (the others never copied)."""
    lo, hi = layers
    memo = {id(layer): _Dropped() for i, layer in enumerate(model.layers) if not lo <= i < hi}
    return copy.deepcopy(model, memo)


def held_layers(model: nn.Module) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if not isinstance(layer, _Dropped)]


class EngineFactory:
    """Builds engine instances' executors for the cluster's reconfiguration (in-process backend)."""

    supports_layer_ranges = True

    def __init__(self, engine: Any, states: Any, sampler: Any) -> None:
        self.engine = engine
        self.states = states
        self.sampler = sampler
        self.models: dict[int, nn.Module] = {}  # instance -> its own weights (absent: the shared checkpoint)
        self.executors: dict[int, Any] = {}  # instance -> its whole-instance executor (absent while grouped)
        self.restored_bytes = 0  # weight bytes copied back by restores
        self.dropped_bytes = 0  # weight bytes freed at group formation
        self.group_executors: list[Any] = []  # every group's, in formation order (their byte counts)
        m = engine.loaded.model
        c = engine.loaded.config
        per_layer = sum(p.numel() for p in m.layers[0].parameters())
        self.model_spec = EngineModelSpec("engine", c.num_layers, c.hidden_size, per_layer,
                                          m.embed_tokens.weight.numel(), m.lm_head.weight.numel())
        self.dtype_bytes = m.embed_tokens.weight.element_size()

    # ---- the rebuild seam (as SimFactory) ----
    def spec(self, instance_id: int) -> EngineSpec:
        return EngineSpec(instance_id, self.model_spec, self.dtype_bytes)

    def hardware(self, spec: EngineSpec) -> EngineHardware:
        e = self.engine
        share = spec.num_layers_held / self.model_spec.num_layers
        return EngineHardware(e.kv_config, EngineStage(spec.instance_id, spec.layer_range),
                              e.kv_bytes_per_token * share, e.flops_per_token * share)

    def policy(self, instance_id: int):
        group = self.engine.groups[instance_id]
        return POLICIES.create(group.policy, dict(group.policy_params))

    def microbatch_former(self, group_id: int) -> None:
        return None  # the engine's group runs each step as one microbatch

    def executor(self, cost: EngineStage):
        """The instance's whole-model executor: the one it has (its cache keeps its requests'
        KV across a drop that has not formed a group yet), or a new one on a fresh cache."""
        from servelab.engine.executor import Executor
        from servelab.engine.runner import ModelRunner

        iid = cost.instance_id
        if iid not in self.executors:
            self.executors[iid] = Executor(ModelRunner(self.model_of(iid), self.new_cache(None), self.sampler),
                                           self.states)
        return self.executors[iid]

    def group_executor(self, members: list, links: list, action: Any, group_id: int):
        """The pipeline group's executor: each member becomes a stage holding its layer range
        (its other layers' weights freed) on a new cache of those layers only."""
        from servelab.engine.pipeline import EnginePipelineExecutor, Stage
        from servelab.engine.runner import ModelRunner

        from servelab.engine.kv_cache import num_blocks_for_budget

        e, c = self.engine, self.engine.loaded.config
        stages = []
        # each member's KV budget now holds only its layers' KV: more tokens (every stage the same count)
        num_blocks = min(num_blocks_for_budget(e.config.kv_budget_bytes, m.spec.num_layers_held, e.config.block_size,
                                               c.num_kv_heads, c.head_dim, e.kv_dtype) for m in members)
        for m in members:
            layers = m.spec.layer_range
            before = self.model_of(m.instance_id)
            model = stage_model(before, layers)
            self.dropped_bytes += sum(layer_bytes(before.layers[i]) for i in held_layers(before)
                                      if not layers[0] <= i < layers[1])
            self.models[m.instance_id] = model
            runner = ModelRunner(model, self.new_cache(layers, num_blocks), self.sampler, layers=layers)
            stages.append(Stage(m.instance_id, layers, runner))
        executor = EnginePipelineExecutor(stages, self.states, members, self)
        self.group_executors.append(executor)
        return executor

    def layers_changed(self, instance_id: int, spec: EngineSpec, source: Any) -> None:
        """A restore landed: copy every layer the instance lacks from ``source`` (a peer's
        weights, or the host checkpoint for ``POOL``). A drop waits for its group to form."""
        model = self.models.get(instance_id)
        if model is None:
            return  # still on the shared checkpoint: it holds every layer
        lo, hi = spec.layer_range
        for i in range(lo, hi):
            if not isinstance(model.layers[i], _Dropped):
                continue
            donor = self.engine.loaded.model if source == POOL or source is None else self.model_of(source)
            if isinstance(donor.layers[i], _Dropped):  # the named peer lacks it too: any holder
                donor = next((m for m in [*self.models.values(), self.engine.loaded.model]
                              if not isinstance(m.layers[i], _Dropped)))
            model.layers[i] = copy.deepcopy(donor.layers[i])  # the restore's bytes
            self.restored_bytes += layer_bytes(model.layers[i])

    def retire(self, instance_id: int) -> None:
        """The instance joined a group: its whole-model executor (and cache) goes."""
        self.executors.pop(instance_id, None)

    # ---- helpers ----
    def model_of(self, instance_id: int) -> nn.Module:
        return self.models.get(instance_id, self.engine.loaded.model)

    def new_cache(self, layers: tuple[int, int] | None, num_blocks: int | None = None):
        from servelab.engine.kv_cache import PagedKVCache

        e = self.engine
        c = e.loaded.config
        num_layers = c.num_layers if layers is None else layers[1] - layers[0]
        device = e.loaded.model.embed_tokens.weight.device
        return PagedKVCache(num_layers, num_blocks or e.kv_config.num_gpu_blocks, e.config.block_size,
                            c.num_kv_heads, c.head_dim, dtype=e.kv_dtype, device=device,
                            num_host_blocks=e.config.num_host_blocks if layers is None else 0)
