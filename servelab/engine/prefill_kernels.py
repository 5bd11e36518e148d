"""CPU kernels for a prefill chunk's attention: bottom-right causal, GQA, one sequence.

A chunk of ``n`` new tokens at positions ``start .. start + n - 1`` attends to the ``start``
cached tokens before it (no mask) and causally to itself: query ``i`` sees keys ``0 .. start + i``.

torch's fused CPU flash kernel ran at 56-75 GFLOP/s on the bench-200m shapes in bfloat16 and in
float32 alike (docs/benchmarks/prefill_kernels.md), a fraction of the 400+ GFLOP/s of a bf16
matmul on this CPU, and with a mask (a chunk after a cached prefix) it also computes the masked
half. The kernel chosen per dtype (``cpu_prefill_kernel``):

- ``matmul-tiles`` (bfloat16, float32): query tiles of ``PREFILL_TILES[dtype]`` rows, one KV
  head at a time; a tile's scores against the keys up to its last position are one matmul in
  the cache's dtype, the diagonal block is masked, a softmax computed in float32 writes the
  weights in the cache's dtype, and a second matmul applies them. In bf16 the numerics of HF's
  eager attention (scores rounded to bf16, softmax in float32; the fused kernel keeps float32
  scores), measured 1.9-3.5x faster than the fused kernel; in float32 1.05-1.3x.
- ``flash`` (any other dtype): the fused kernel with ``is_causal``; after a cached prefix, the
  prefix (no mask) and the chunk's own causal block run as two calls merged by log-sum-exp, so
  the masked half is never computed (1.0-1.25x faster than one masked call).
"""

from __future__ import annotations

import torch

# query rows per tile, of 64/128/256 measured the best geometric mean over the shapes (bf16: 64 within 2%)
PREFILL_TILES = {torch.bfloat16: 128, torch.float32: 64}
CPU_PREFILL_KERNELS = {torch.bfloat16: "matmul-tiles", torch.float32: "matmul-tiles"}  # any other dtype: "flash"
PREFILL_KERNEL_NAMES = ("matmul-tiles", "flash", "sdpa")  # sdpa: off the CPU (attention._prefill_attention)


def cpu_prefill_kernel(dtype: torch.dtype) -> str:
    return CPU_PREFILL_KERNELS.get(dtype, "flash")


def tiled_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                           tile: int | None = None) -> torch.Tensor:
    """``matmul-tiles``. q: [n, Hq, D]; k, v: [Hkv, start + n, D] (strided views are fine: each
    head's [tokens, D] rows must have unit inner stride). Returns [n, Hq, D] in q's dtype."""
    n, num_heads, head_dim = q.shape
    kv_heads = k.shape[0]
    tile = tile or PREFILL_TILES.get(q.dtype, 64)
    group = num_heads // kv_heads
    # [Hkv, n, G, D] contiguous: a tile of one head is [tile * G, D] rows (token, query head)
    qs = (q.view(n, kv_heads, group, head_dim).permute(1, 0, 2, 3) * scale).contiguous()
    out = q.new_empty(n, kv_heads, group, head_dim)
    future = torch.ones(tile, tile, dtype=torch.bool, device=q.device).triu_(1)  # [i, j]: key j after query i
    for s in range(0, n, tile):
        e = min(n, s + tile)
        m, keys = e - s, start + e
        mask = future[:m, :m].unsqueeze(1)  # [m, 1, m], broadcast over the group
        for h in range(kv_heads):
            scores = torch.mm(qs[h, s:e].view(m * group, head_dim), k[h, :keys].t()).view(m, group, keys)
            scores[:, :, start + s:].masked_fill_(mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1)  # float32 inside, the input's dtype out
            out[s:e, h] = torch.mm(weights.view(m * group, keys), v[h, :keys]).view(m, group, head_dim)
    return out.view(n, num_heads, head_dim)


def flash_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                           scale: float) -> torch.Tensor:
    """``flash``. q: [n, Hq, D]; k, v: [Hkv, start + n, D]. Returns [n, Hq, D]. K/V heads are
    repeated to the query heads and the inputs are 4-D: the fused kernel takes no GQA or 3-D
    inputs (SDPA falls back to its math kernel for them, measured 1.2-2.8x slower)."""
    group = q.shape[1] // k.shape[0]
    q4 = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
    k4 = k.repeat_interleave(group, 0).unsqueeze(0)  # [1, Hq, start + n, D]
    v4 = v.repeat_interleave(group, 0).unsqueeze(0)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # SDPA's CPU kernel, with the lse
    out, lse = flash(q4, k4[:, :, start:], v4[:, :, start:], is_causal=True, scale=scale)
    if start == 0:
        return out[0].transpose(0, 1)
    prefix, prefix_lse = flash(q4, k4[:, :, :start], v4[:, :, :start], scale=scale)
    total = torch.logaddexp(lse, prefix_lse).unsqueeze(-1)  # [1, Hq, n, 1]
    merged = out.float().mul_(torch.exp(lse.unsqueeze(-1) - total)).add_(
        prefix.float().mul_(torch.exp(prefix_lse.unsqueeze(-1) - total)))
    return merged.to(q.dtype)[0].transpose(0, 1)
