"""One engine instance inside a Ray actor: a model replica, its paged KV cache, its sampler.

The worker computes and samples; it keeps no scheduling state and no sampling parameters
between steps (the driver sends those with each step), so a request can move between
workers with its KV blocks alone. Methods in the ``kv`` concurrency group (block reads and
writes, gloo send/recv) run on their own thread, next to a step in flight: the driver only
touches blocks that no step in flight writes (a hand-off's blocks are detached, a streamed
chunk's are complete), and waits for each copy before it frees or reuses those blocks.

KV crosses the object store as a numpy byte array (Ray stores numpy without a pickle copy and
readers map it from shared memory); ``dtype`` comes back with it.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import ray
import torch

from servelab.engine.ray_backend.stage_worker import StageMethods

KV_GROUP = "kv"


def _to_bytes(t: torch.Tensor) -> np.ndarray:
    # t: [L, 2, n, block_size, kv_heads, head_dim] -> the same bytes, last dim * itemsize
    return t.contiguous().view(torch.uint8).cpu().numpy()


class InstanceWorker(StageMethods):
    def __init__(self, path: str, dtype: str, device: str, num_blocks: int, block_size: int,
                 num_host_blocks: int, seed: int, num_threads: int) -> None:
        from servelab.engine.sampling import Sampler

        torch.set_num_threads(num_threads)
        self.num_threads = num_threads
        self.device = torch.device(device)
        self._ckpt = (path, dtype, device)
        self._cache_args = (num_blocks, block_size, num_host_blocks)
        self._sampler_cls = Sampler
        self._load_whole(Sampler(seed, device=self.device))
        self._group_ready = False

    def _load_whole(self, sampler=None) -> None:
        """The whole model from the checkpoint on a fresh whole cache (at start, and after a
        run that ended with this actor a pipeline stage)."""
        from servelab.engine.kv_cache import PagedKVCache
        from servelab.engine.loader import load_checkpoint
        from servelab.engine.runner import ModelRunner

        path, dtype, device = self._ckpt
        num_blocks, block_size, num_host_blocks = self._cache_args
        loaded = load_checkpoint(path, dtype=dtype, device=device)
        c = loaded.config
        cache = PagedKVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim,
                             dtype=loaded.model.embed_tokens.weight.dtype, device=self.device,
                             num_host_blocks=num_host_blocks)
        self.runner = ModelRunner(loaded.model, cache, sampler or self._sampler())

    @property
    def cache(self):
        return self.runner.kv_cache

    def ready(self) -> dict:
        return {"pid": os.getpid(), "device": str(self.device), "threads": self.num_threads,
                "node": ray.util.get_node_ip_address()}

    def reset(self, seed: int) -> None:
        """A fresh run: a fresh sampler (seeded as in-process); cache contents need no clearing."""
        sampler = self._sampler_cls(seed, device=self.device)
        for runner in (self.runner, self.stage):
            if runner is not None:
                runner.sampler = sampler

    # ---- steps ----
    def step(self, chunks: Sequence, sampling: Mapping, swap_copies: Sequence, padding: tuple | None
             ) -> tuple[dict[int, int], float]:
        """Swap copies in order, then one forward pass and sampling; returns (tokens, seconds)."""
        t0 = time.perf_counter()
        cache = self.cache
        for direction, pairs in swap_copies:
            (cache.swap_out if direction == "out" else cache.swap_in)(pairs)
        if not chunks:
            return {}, time.perf_counter() - t0
        if padding is None:
            sampled = self.runner.run(chunks, sampling)
        else:
            sampled = self.runner.run_padded(chunks, *padding, sampling)
        return sampled, time.perf_counter() - t0

    def release(self, request_id: int) -> None:
        (self.runner or self.stage).release(request_id)

    def take_generator(self, request_id: int):
        """The seeded generator's state of a request leaving this instance (None if it has none)."""
        gen = self._sampler()._generators.pop(request_id, None)  # noqa: SLF001 (the sampler's per-request RNGs)
        return None if gen is None else gen.get_state()

    def put_generator(self, request_id: int, state) -> None:
        gen = torch.Generator(device=self.device)
        gen.set_state(state)
        self._sampler()._generators[request_id] = gen  # noqa: SLF001

    # ---- KV through the object store ----
    @ray.method(concurrency_group=KV_GROUP)
    def read_blocks(self, block_ids: list[int]) -> np.ndarray:
        return _to_bytes(self.cache.read_blocks(block_ids))

    @ray.method(concurrency_group=KV_GROUP)
    def write_blocks(self, block_ids: list[int], data) -> None:
        if isinstance(data, np.ndarray):
            with warnings.catch_warnings():  # the store's arrays are read-only; we only read them
                warnings.simplefilter("ignore", UserWarning)
                data = torch.from_numpy(data).view(self.cache.dtype)
        self.cache.write_blocks(block_ids, data)

    # ---- KV through torch.distributed (gloo) ----
    @ray.method(concurrency_group=KV_GROUP)
    def address(self) -> str:
        return ray.util.get_node_ip_address()

    @ray.method(concurrency_group=KV_GROUP)
    def free_port(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    @ray.method(concurrency_group=KV_GROUP)
    def init_gloo(self, master: str, port: int, rank: int, world_size: int) -> None:
        import datetime

        import torch.distributed as dist

        if not self._group_ready:
            dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                                    world_size=world_size, timeout=datetime.timedelta(seconds=20))
            self._group_ready = True

    @ray.method(concurrency_group=KV_GROUP)
    def leave_gloo(self) -> None:
        import torch.distributed as dist

        if self._group_ready:
            dist.destroy_process_group()
            self._group_ready = False

    @ray.method(concurrency_group=KV_GROUP)
    def send_blocks(self, block_ids: list[int], dst_rank: int) -> None:
        import torch.distributed as dist

        dist.send(self.cache.read_blocks(block_ids).contiguous().view(torch.uint8).cpu(), dst_rank)

    @ray.method(concurrency_group=KV_GROUP)
    def recv_blocks(self, block_ids: list[int], src_rank: int) -> None:
        import torch.distributed as dist

        kv = self.cache.kv
        shape = (*kv.shape[:2], len(block_ids), *kv.shape[3:])
        buf = torch.empty(shape, dtype=kv.dtype).view(torch.uint8)
        dist.recv(buf, src_rank)
        self.cache.write_blocks(block_ids, buf.view(kv.dtype))
