"""PagedKVCache sizing and block moves."""

from __future__ import annotations

import pytest
import torch

from servelab.engine.kv_cache import PagedKVCache, bytes_per_block, num_blocks_for_budget


def test_budget_sizing():
    per_block = bytes_per_block(2, 16, 2, 8, torch.float32)
    assert per_block == 2 * 2 * 16 * 2 * 8 * 4
    assert num_blocks_for_budget(10 * per_block + per_block - 1, 2, 16, 2, 8) == 10
    assert num_blocks_for_budget(10 * per_block, 2, 16, 2, 8, torch.bfloat16) == 20
    cache = PagedKVCache.from_budget(10 * per_block, 2, 16, 2, 8)
    assert cache.num_blocks == 10 and cache.num_bytes == 10 * per_block
    with pytest.raises(ValueError, match="no whole block"):
        PagedKVCache.from_budget(per_block - 1, 2, 16, 2, 8)
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(2, 0, 16, 2, 8)


def test_copy_and_swap_move_whole_blocks():
    cache = PagedKVCache(2, 6, 4, 2, 8, num_host_blocks=3)
    cache.kv.copy_(torch.randn_like(cache.kv))
    original = cache.kv.clone()
    cache.copy_blocks([(0, 5), (1, 4)])
    assert torch.equal(cache.kv[:, :, 5], original[:, :, 0]) and torch.equal(cache.kv[:, :, 4], original[:, :, 1])
    cache.swap_out([(2, 0), (3, 2)])
    assert torch.equal(cache.host[:, :, 0], original[:, :, 2]) and torch.equal(cache.host[:, :, 2], original[:, :, 3])
    cache.kv.zero_()
    cache.swap_in([(2, 1), (0, 0)])
    assert torch.equal(cache.kv[:, :, 1], original[:, :, 3]) and torch.equal(cache.kv[:, :, 0], original[:, :, 2])
    with pytest.raises(RuntimeError, match="host pool"):
        PagedKVCache(1, 2, 4, 1, 8).swap_out([(0, 0)])
