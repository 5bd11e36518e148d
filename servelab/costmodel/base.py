"""The cost-model contract and a registry of cost models by name.

A cost model times what an executor would run: one step of a given ``StepShape``, a run of
pure-decode steps (vectorised, for the simulator's fast-forward), KV swaps over PCIe, and
KV transfers over a link. ``decode_step_times_s(n, sums)[i]`` must equal
``step_time_s(StepShape(num_decodes=n, decode_context_sum=sums[i]))`` exactly, so a
fast-forwarded run and a stepped run produce the same timeline.

Registry: ``register_cost_model(name)`` decorates a factory ``(instance, **options) ->
CostModel``; ``make_cost_model(name, instance, **options)`` builds one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from servelab.core.plan import StepShape

if TYPE_CHECKING:
    from servelab.catalog.instance import InstanceSpec
    from servelab.costmodel.links import LinkSpec


@runtime_checkable
class CostModel(Protocol):
    def step_time_s(self, shape: StepShape) -> float:
        """Seconds one step takes, including the KV swaps in ``shape.swap_blocks``."""
        ...

    def decode_step_times_s(self, num_decodes: int, context_sums: np.ndarray) -> np.ndarray:
        """Times of pure-decode steps of ``num_decodes`` rows, one per context sum."""
        ...

    def swap_time_s(self, num_blocks: int) -> float:
        """Seconds to move ``num_blocks`` KV blocks between GPU and host."""
        ...

    def kv_transfer_time_s(self, num_tokens: int, link: LinkSpec) -> float:
        """Seconds to send ``num_tokens`` tokens of this instance's KV over ``link``."""
        ...


CostModelFactory = Callable[..., CostModel]
COST_MODELS: dict[str, CostModelFactory] = {}


def register_cost_model(name: str) -> Callable[[CostModelFactory], CostModelFactory]:
    def register(factory: CostModelFactory) -> CostModelFactory:
        if name in COST_MODELS:
            raise ValueError(f"cost model {name!r} is already registered")
        COST_MODELS[name] = factory
        return factory

    return register


def make_cost_model(name: str, instance: InstanceSpec, **options) -> CostModel:
    factory = COST_MODELS.get(name)
    if factory is None:
        raise KeyError(f"unknown cost model {name!r}; known: {', '.join(sorted(COST_MODELS))}")
    return factory(instance, **options)


class StepArraysMixin:
    """The protocol methods every analytical model implements the same way: the vectorised
    decode run through the model's own ``_decode_s`` (which takes scalars or arrays), swaps
    over ``_swap_link`` and KV hand-offs over the given link. Needs ``_decode_s``,
    ``_swap_link``, ``_block_bytes`` and ``_kv_bytes_per_token``."""

    def decode_step_times_s(self, num_decodes: int, context_sums: np.ndarray,
                            context_maxes: np.ndarray | None = None) -> np.ndarray:
        sums = np.asarray(context_sums, dtype=np.float64)
        maxes = np.asarray(context_maxes, dtype=np.float64) if context_maxes is not None else np.zeros_like(sums)
        return self._decode_s(num_decodes, sums, maxes)

    def swap_time_s(self, num_blocks: int) -> float:
        return self._swap_link.transfer_time_s(num_blocks * self._block_bytes)

    def kv_transfer_time_s(self, num_tokens: int, link: LinkSpec) -> float:
        return link.transfer_time_s(num_tokens * self._kv_bytes_per_token)
