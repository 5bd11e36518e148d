"""Test helpers: a runner over a fresh paged cache, and an HF reference forward."""

from __future__ import annotations

import torch

from servelab.core.kv_blocks import BlockManager, KVCacheConfig
from servelab.engine.kv_cache import PagedKVCache
from servelab.engine.runner import ModelRunner, SeqChunk


def make_runner(loaded, num_blocks: int = 256, block_size: int = 4, num_host_blocks: int = 0, **runner_kwargs):
    c = loaded.config
    cache = PagedKVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim,
                         dtype=loaded.model.embed_tokens.weight.dtype, num_host_blocks=num_host_blocks)
    blocks = BlockManager(KVCacheConfig(block_size=block_size, num_gpu_blocks=num_blocks,
                                        num_cpu_blocks=num_host_blocks, watermark=0.0))
    return ModelRunner(loaded.model, cache, **runner_kwargs), blocks


def chunk(blocks: BlockManager, request_id: int, tokens, start: int, sample: bool = True) -> SeqChunk:
    """Reserve KV slots for ``tokens`` and describe them as one chunk."""
    blocks.allocate(request_id, len(tokens))
    return SeqChunk(request_id, list(tokens), start, blocks.block_table(request_id), sample)


def hf_last_logits(hf_model, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([list(ids)])).logits[0, -1].float()
