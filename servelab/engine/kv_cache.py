"""Paged KV cache tensors, indexed by the block ids of ``servelab.core.kv_blocks.BlockManager``.

One device tensor holds every layer's K and V; one optional host tensor of the same block
shape is the swap pool. The cache does no bookkeeping: which block belongs to whom is the
block manager's business; this module only moves bytes for the (src, dst) pairs it returns.

Layout: ``kv: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``; token slot
``s`` of a layer is ``kv[layer, :, s // block_size, s % block_size]``, so a layer's K viewed
as ``[num_blocks * block_size, num_kv_heads, head_dim]`` is written with one ``index_copy_``.
"""

from __future__ import annotations

from collections.abc import Sequence
import torch

from servelab.engine import hugepages


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def num_blocks_for_budget(budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
                          head_dim: int, dtype: torch.dtype = torch.float32) -> int:
    """How many whole blocks (K and V of every layer) fit in ``budget_bytes`` of KV memory."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    return budget_bytes // bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", *,
                 num_host_blocks: int = 0, huge_pages: bool = True) -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"PagedKVCache: {name} must be >= 1, got {value}")
        if num_host_blocks < 0:
            raise ValueError(f"PagedKVCache: num_host_blocks must be >= 0, got {num_host_blocks}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        # kv: [L, 2, num_blocks, block_size, kv_heads, head_dim]; on the CPU on huge pages (``hugepages``:
        # a decode step reads its blocks scattered over the whole cache, too many 4 KiB pages for the TLB)
        # (``huge_pages=False``: 4 KiB pages, to measure what the huge pages bring)
        self.kv = (hugepages.empty(shape, dtype, self.device) if huge_pages
                   else torch.empty(shape, dtype=dtype, device=self.device)).zero_()
        self.host: torch.Tensor | None = None
        if num_host_blocks:
            pin = self.device.type == "cuda"
            self.host = torch.zeros((*shape[:2], num_host_blocks, *shape[3:]), dtype=dtype, pin_memory=pin)

    @classmethod
    def from_budget(cls, budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", *,
                    num_host_blocks: int = 0) -> PagedKVCache:
        num_blocks = num_blocks_for_budget(budget_bytes, num_layers, block_size, num_kv_heads, head_dim, dtype)
        if num_blocks < 1:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds no whole block")
        return cls(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device,
                   num_host_blocks=num_host_blocks)

    @property
    def num_host_blocks(self) -> int:
        return 0 if self.host is None else self.host.shape[2]

    @property
    def num_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def read_blocks(self, block_ids: Sequence[int], layers: tuple[int, int] | None = None) -> torch.Tensor:
        """A copy of some blocks, every layer (or this cache's layers ``[lo, hi)``):
        [L, 2, n, block_size, kv_heads, head_dim]."""
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        kv = self.kv if layers is None else self.kv[self._layer_slice(layers)]
        return kv.index_select(2, idx)

    def write_blocks(self, block_ids: Sequence[int], data: torch.Tensor,
                     layers: tuple[int, int] | None = None) -> None:
        """Write ``data`` (as ``read_blocks`` returns it, possibly from another cache of the same
        shape, on any device) into ``block_ids`` (of this cache's layers ``[lo, hi)`` when given:
        a pipeline stage's KV moving between caches that hold different layer ranges)."""
        kv = self.kv if layers is None else self.kv[self._layer_slice(layers)]
        if data.shape[2] != len(block_ids) or data.shape[:2] != kv.shape[:2] or data.shape[3:] != kv.shape[3:]:
            raise ValueError(f"KV blocks of shape {tuple(data.shape)} do not fit {len(block_ids)} blocks of this cache")
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        kv.index_copy_(2, idx, data.to(self.device, self.dtype))  # kv is a view: writes land in self.kv

    def _layer_slice(self, layers: tuple[int, int]) -> slice:
        lo, hi = layers
        if not 0 <= lo < hi <= self.num_layers:
            raise ValueError(f"layers {layers} is not a non-empty range of this cache's {self.num_layers}")
        return slice(lo, hi)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Device-to-device copy of (src, dst) block pairs (copy-on-write, defragmentation)."""
        if not pairs:
            return
        src, dst = self._index(pairs, self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (device_block, host_block) pairs, as ``BlockManager.swap_out`` returns them."""
        host = self._require_host()
        if not pairs:
            return
        src, dst = self._index(pairs, self.device)
        host[:, :, dst.cpu()] = self.kv[:, :, src].to("cpu", non_blocking=True)

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (host_block, device_block) pairs, as ``BlockManager.swap_in`` returns them."""
        host = self._require_host()
        if not pairs:
            return
        src, dst = self._index(pairs, self.device)
        self.kv[:, :, dst] = host[:, :, src.cpu()].to(self.device, non_blocking=True)

    def _require_host(self) -> torch.Tensor:
        if self.host is None:
            raise RuntimeError("this PagedKVCache has no host pool (num_host_blocks=0)")
        return self.host

    @staticmethod
    def _index(pairs: Sequence[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor(pairs, dtype=torch.long, device=device)  # [P, 2]
        return idx[:, 0], idx[:, 1]
