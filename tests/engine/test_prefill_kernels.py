"""The CPU prefill kernels against a reference attention (float32 matmuls, explicit mask).

A chunk of ``n`` queries at positions ``start ..`` attends to every key up to its own position
(bottom-right causal), with GQA. Shapes cover one tile and several tiles with a ragged last one,
chunks from position 0 and after a cached prefix. The engine-level test runs a chunked prefill
through ``RaggedMetadata`` with each kernel and compares with attention over the whole prompt.
"""

from __future__ import annotations

import pytest
import torch

from servelab.engine import prefill_kernels
from servelab.engine.prefill_kernels import cpu_prefill_kernel, flash_causal_attention, tiled_causal_attention

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 16
SHAPES = [(1, 0), (5, 0), (37, 0), (37, 11), (1, 40), (64, 70), (130, 3)]


def _reference(q, k, v, start, scale):
    n, c = q.shape[0], k.shape[1]
    group = HEADS // KV_HEADS
    kk, vv = k.float().repeat_interleave(group, 0), v.float().repeat_interleave(group, 0)  # [Hq, c, D]
    scores = q.float().transpose(0, 1) @ kk.transpose(1, 2) * scale  # [Hq, n, c]
    future = torch.arange(c).unsqueeze(0) > (start + torch.arange(n)).unsqueeze(1)
    out = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ vv
    return out.transpose(0, 1)  # [n, Hq, D]


def _inputs(n, start, dtype, strided):
    gen = torch.Generator().manual_seed(n * 1000 + start)
    q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(start + n, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(start + n, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    if strided:  # [Hkv, tokens, D] views of [tokens, Hkv, D], as the engine passes them
        return q, k.transpose(0, 1), v.transpose(0, 1)
    return q, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()


@pytest.mark.parametrize("n,start", SHAPES)
@pytest.mark.parametrize("kernel", ["tiles", "flash"])
def test_float32_kernels_equal_reference(n, start, kernel):
    q, k, v = _inputs(n, start, torch.float32, strided=start % 2 == 0)
    scale = HEAD_DIM ** -0.5
    if kernel == "tiles":
        got = tiled_causal_attention(q, k, v, start, scale, tile=16)
    else:
        got = flash_causal_attention(q, k, v, start, scale)
    assert got.shape == (n, HEADS, HEAD_DIM) and got.dtype == torch.float32
    assert torch.allclose(got, _reference(q, k, v, start, scale), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("n,start", SHAPES)
def test_bf16_tiles_match_reference_to_bf16_rounding(n, start):
    """Scores rounded to bf16 (HF eager's numerics): within 0.05 of float32 attention over the
    same bf16 inputs, as the flash kernel (float32 scores) is within its bf16 output rounding."""
    q, k, v = _inputs(n, start, torch.bfloat16, strided=True)
    scale = HEAD_DIM ** -0.5
    ref = _reference(q, k, v, start, scale)
    got = tiled_causal_attention(q, k, v, start, scale, tile=32)
    assert got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max() < 0.05
    flash = flash_causal_attention(q, k, v, start, scale)
    assert (flash.float() - ref).abs().max() < 0.02


def test_kernel_choice_per_dtype():
    assert cpu_prefill_kernel(torch.bfloat16) == cpu_prefill_kernel(torch.float32) == "matmul-tiles"
    assert cpu_prefill_kernel(torch.float16) == "flash"
    assert set(prefill_kernels.CPU_PREFILL_KERNELS.values()) <= set(prefill_kernels.PREFILL_KERNEL_NAMES)


@pytest.mark.parametrize("kernel", ["matmul-tiles", "flash", "sdpa"])
def test_chunked_prefill_through_the_engine_equals_one_pass(kernel, monkeypatch):
    """A prompt prefilled in three chunks (the later two over cached blocks) gives, row for row,
    the attention of one causal pass over the whole prompt, under either CPU kernel and under
    the SDPA path that CUDA takes (swapped in on the CPU)."""
    from servelab.engine import attention
    from servelab.engine.runner import SeqChunk, build_ragged

    monkeypatch.setattr(attention, "cpu_prefill_kernel", lambda dtype: kernel)
    monkeypatch.setitem(prefill_kernels.PREFILL_TILES, torch.float32, 8)  # several tiles a chunk
    block, length = 4, 45
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(length, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(length, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(length, KV_HEADS, HEAD_DIM, generator=gen)
    table = torch.randperm(16, generator=gen)[:12].tolist()  # scattered blocks
    kv = torch.zeros(2, 16, block, KV_HEADS, HEAD_DIM)
    scale = HEAD_DIM ** -0.5
    outs = []
    for lo, hi in ((0, 13), (13, 30), (30, 45)):
        _, _, meta, _ = build_ragged([SeqChunk(0, list(range(hi - lo)), lo, table)], block, torch.device("cpu"))
        outs.append(meta.attend(kv, q[lo:hi], k[lo:hi], v[lo:hi], scale))
    ref = _reference(q, k.transpose(0, 1), v.transpose(0, 1), 0, scale)
    assert torch.allclose(torch.cat(outs), ref, atol=1e-5, rtol=1e-4)
