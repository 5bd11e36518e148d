"""The actor's side of KunServe's layer drops: a pipeline stage inside an instance actor.

``InstanceWorker`` inherits these methods. An actor is in one of two modes: whole (``runner``
holds every layer and the instance's whole-model cache) or a stage (``stage`` holds layers
``[lo, hi)`` on a cache of those layers only). The modes meet at the seams the cluster's
reconfiguration crosses: at formation the stage is built while the whole cache still holds
the members' requests' KV (the exchange reads it from there), then the whole runner goes
(``retire_whole``: its weights and cache freed); at the split the whole runner comes back on
a fresh cache while the stage cache still holds the KV (the split reads it from there).

A stage step takes the previous stage's hidden state as an argument: the driver passes the
previous call's ``ObjectRef`` straight on, so Ray hands the activations from actor to actor
(small ones are inlined through the driver, the owner; larger ones go through the object
store); only the seconds come back to the driver.

All of these run in the actor's default (serial) queue, ordered with its steps.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import ray
import torch


def _tensor(data, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(data, np.ndarray):
        with warnings.catch_warnings():  # the store's arrays are read-only; we only read them
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(data).view(dtype)
    return data


class StageMethods:
    """Mixed into ``InstanceWorker`` (which sets ``runner``, ``device`` and ``_ckpt``)."""

    runner = None
    stage = None

    def _sampler(self):
        return (self.runner or self.stage).sampler

    # ---- modes ----
    def become_stage(self, layers: tuple[int, int], num_blocks: int) -> int:
        """A stage of ``layers`` on a new cache of ``num_blocks``; the whole runner (and its
        cache) stays until ``retire_whole``. Returns the weight bytes dropped."""
        from servelab.engine.kv_cache import PagedKVCache
        from servelab.engine.layer_range import held_layers, layer_bytes, stage_model
        from servelab.engine.runner import ModelRunner

        whole = self.runner
        lo, hi = layers
        model = stage_model(whole.model, layers)
        dropped = sum(layer_bytes(whole.model.layers[i]) for i in held_layers(whole.model) if not lo <= i < hi)
        c, kv = whole.model.config, whole.kv_cache
        cache = PagedKVCache(hi - lo, num_blocks, kv.block_size, c.num_kv_heads, c.head_dim, dtype=kv.dtype,
                             device=self.device)
        self.stage = ModelRunner(model, cache, whole.sampler, layers=tuple(layers))
        return dropped

    def retire_whole(self) -> None:
        """Grouped: the whole-model weights and cache go (the stage holds what it runs)."""
        self.runner = None

    def become_whole(self, num_blocks: int, num_host_blocks: int) -> None:
        """Split: a whole runner on the stage's model (every layer restored) and a fresh cache;
        the stage's cache stays until the next formation or reset (the split reads it)."""
        from servelab.engine.kv_cache import PagedKVCache
        from servelab.engine.layer_range import held_layers
        from servelab.engine.runner import ModelRunner

        model, kv = self.stage.model, self.stage.kv_cache
        c = model.config
        if held_layers(model) != list(range(c.num_layers)):
            raise RuntimeError(f"a whole instance needs every layer; this one holds {held_layers(model)}")
        cache = PagedKVCache(c.num_layers, num_blocks, kv.block_size, c.num_kv_heads, c.head_dim, dtype=kv.dtype,
                             device=self.device, num_host_blocks=num_host_blocks)
        self.runner = ModelRunner(model, cache, self.stage.sampler)

    def reset_layers(self) -> None:
        """A new cluster build: no stage; a whole runner (reloaded if the last run ended grouped)."""
        from servelab.engine.layer_range import held_layers

        if self.runner is None or held_layers(self.runner.model) != list(range(self.runner.model.config.num_layers)):
            self._load_whole()
        self.stage = None

    def held(self) -> list[int]:
        from servelab.engine.layer_range import held_layers

        return held_layers((self.runner or self.stage).model)

    # ---- a group's step ----
    @ray.method(num_returns=2)
    def run_stage(self, chunks: Sequence, hidden: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """A stage that is not the last: its hidden state [T, hidden] (for the next stage) and seconds."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            _, out = self.stage.run_stage(chunks, hidden)
        return out.cpu(), time.perf_counter() - t0

    def run_last_stage(self, chunks: Sequence, hidden: torch.Tensor, sampling: Mapping
                       ) -> tuple[dict[int, int], float]:
        """The last stage: its layers, the logits, sampling; the tokens and seconds."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            request_ids, logits = self.stage.run_stage(chunks, hidden)
            sampled = self.stage._sample(request_ids, logits, sampling)  # noqa: SLF001 (the runner's sampling)
        return sampled, time.perf_counter() - t0

    # ---- KV of a layer range ----
    def read_kv(self, block_ids: list[int], layers: tuple[int, int] | None, whole: bool) -> np.ndarray:
        """Blocks of the whole cache (layers ``[lo, hi)`` of it, or all) or of the stage cache (all of it)."""
        cache = (self.runner if whole else self.stage).kv_cache
        return cache.read_blocks(block_ids, layers if whole else None).contiguous().view(torch.uint8).cpu().numpy()

    def write_kv(self, block_ids: list[int], data, layers: tuple[int, int] | None, whole: bool) -> None:
        cache = (self.runner if whole else self.stage).kv_cache
        cache.write_blocks(block_ids, _tensor(data, cache.dtype), layers if whole else None)

    # ---- weights: the restore ----
    def layer_state(self, index: int) -> dict[str, np.ndarray]:
        model = (self.runner or self.stage).model
        return {k: v.detach().cpu().numpy() for k, v in model.layers[index].state_dict().items()}

    def set_layer(self, index: int, state: dict[str, np.ndarray] | None) -> int:
        """Layer ``index`` from a peer's tensors (``None``: from the checkpoint on this host);
        returns its bytes."""
        from servelab.engine.layer_range import held_layers, layer_bytes

        model = self.stage.model
        if state is None:
            state = self._checkpoint_layer(index)
        layer = copy.deepcopy(model.layers[held_layers(model)[0]])  # every decoder layer has one shape
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            layer.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        model.layers[index] = layer
        return layer_bytes(layer)

    def _checkpoint_layer(self, index: int) -> dict[str, np.ndarray]:
        from servelab.engine.loader import load_checkpoint

        path, dtype, device = self._ckpt
        layer = load_checkpoint(path, dtype=dtype, device=device).model.layers[index]
        return {k: v.detach().cpu().numpy() for k, v in layer.state_dict().items()}
