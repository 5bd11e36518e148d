"""Attention over the paged KV cache, for a flat ragged batch or a dense padded batch.

Each metadata object is built once per step (by the runner) and shared by every layer; its
``attend`` writes the step's new K/V into the cache slots, then attends over each
sequence's context gathered from its blocks.

Ragged layout (``RaggedMetadata``): the first ``num_decodes`` rows are single-token decodes;
prefill chunks follow, one contiguous row range each, attended per sequence with a causal mask
inside the chunk. A chunk that starts at position 0 attends to its own fresh K/V and skips the
gather; on the CPU a chunk runs the kernel of its dtype (``prefill_kernels``: query tiles of
matmuls in bf16 and float32). Decodes run one of two kernels (``DECODE_KERNELS``, the cost model's names):

- ``split-kv`` (default): the KV of every row is cut into splits of ``SPLIT_TOKENS`` tokens;
  split ``j`` gathers its blocks for only the rows that reach it (rows are ordered longest
  first, so they are a prefix), attends with the fused kernel, which also returns the
  log-sum-exp, and the splits merge by it (FlashDecoding's reduction). Work and memory follow
  the sum of the contexts (plus a fixed cost per split), and each split's gather stays in cache.
  On the CPU in float32 with one torch thread (``cpu_inplace_decode``) no split is gathered: the
  C kernel of ``paged_decode`` reads each row's blocks in place, one split per block, merged
  by online softmax.
- ``padded``: one gather of every row padded to the longest context and one masked SDPA, so a
  long row among short ones costs rows x longest (the iteration bubble).

Padded layout (``PaddedMetadata``): ``[B, S]`` rows, each computed in full and attending over
``context_tokens`` padded keys, so static and bucketed batching pay their padding cost.
Padding tokens never write to the cache.

Masks are boolean (True = may attend) for the padded paths and additive biases (0 / -inf) for
the fused kernel's paths; neither ever leaves a query row without a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch
import torch.nn.functional as F

from servelab.engine import paged_decode
from servelab.engine.prefill_kernels import cpu_prefill_kernel, flash_causal_attention, tiled_causal_attention

DECODE_KERNELS = ("split-kv", "padded")
# split-kv on the CPU: True head-major gather + batched matmuls, False the fused flash kernel per split,
# None the dtype's choice: batched matmuls in bf16 (decode step at batch 32, context 1,152: 181 vs 199 ms),
# flash in float32, where the matmuls were 4-9% slower (docs/benchmarks/decode_kernels.md)
CPU_SPLIT_BMM: bool | None = None
CPU_SPLIT_BMM_DTYPES = (torch.bfloat16,)
SPLIT_MERGE = 4  # consecutive splits that the same rows reach merge into one, up to this many
# ... and while a merged split's gathered K+V stays within this many bytes (when the runner passes
# the cache's bytes per token): so a split's gather stays in cache for its two matmuls. On an AVX2
# EPYC (Zen 3, 32 MiB L3 shared by 2 cores and other sessions) in float32, batch 32, one layer,
# flash per split: 128-token splits (8 MiB) took 15.1 ms at context 1,152 against 20.6 ms merged
# two (16 MiB) and 23.1 ms merged four (32 MiB); 7.8 against 10.6 ms at 576
SPLIT_MERGE_BYTES = 8 << 20
SPLIT_TOKENS = 128  # KV tokens per split: the best of 64-512 measured on CPU (docs/benchmarks/decode_kernels.md)
# split-kv on the CPU in float32 with one torch thread: read each row's blocks in place with the C kernel
# (``paged_decode``: one split per block, merged by online softmax) instead of gathering splits; on the
# AVX2 EPYC, one layer at batch 32, context 1,152: 10-12 ms against 25-34 for gather + flash (1-minute load
# average 8-12; docs/benchmarks/decode_kernels.md)
CPU_INPLACE_DECODE = True


def cpu_inplace_decode(device: torch.device, dtype: torch.dtype, head_dim: int | None) -> bool:
    """Whether split-kv decodes run ``paged_decode``'s in-place kernel here (``CPU_INPLACE_DECODE``)."""
    return (CPU_INPLACE_DECODE and head_dim is not None and head_dim % 32 == 0 and device.type == "cpu"
            and dtype == torch.float32 and torch.get_num_threads() == 1 and paged_decode.kernel() is not None)


def cpu_split_bmm(dtype: torch.dtype) -> bool:
    """Whether split-kv on the CPU runs the batched-matmul kernel for this dtype (``CPU_SPLIT_BMM``)."""
    return dtype in CPU_SPLIT_BMM_DTYPES if CPU_SPLIT_BMM is None else CPU_SPLIT_BMM


def write_kv(kv_layer: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    # kv_layer: [2, num_blocks, block_size, kv_heads, head_dim]; k, v: [T, kv_heads, head_dim]
    flat = kv_layer.flatten(1, 2)  # [2, num_blocks * block_size, kv_heads, head_dim] (a view)
    flat[0].index_copy_(0, slots, k)
    flat[1].index_copy_(0, slots, v)


class GatherWorkspace:
    """A reusable buffer for gathered K/V: layers run one after another and each consumes its
    gather before the next, so one buffer serves a whole step and every later step.

    Why: a fresh tensor of tens of MB per layer costs more in page faults than the copy itself
    (measured on CPU: 51 ms vs 8 ms for a batch-32, 1,152-token gather of one layer).
    """

    def __init__(self) -> None:
        self._flat: torch.Tensor | None = None

    def buffer(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        numel = math.prod(shape)
        flat = self._flat
        if flat is None or flat.numel() < numel or flat.dtype != like.dtype or flat.device != like.device:
            flat = self._flat = torch.empty(numel, dtype=like.dtype, device=like.device)
        return flat[:numel].view(shape)


def gather_kv(kv_layer: torch.Tensor, block_tables: torch.Tensor, workspace: GatherWorkspace | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of every row's blocks, as ``[B, kv_heads, num_blocks_per_row * block_size, head_dim]``.

    One ``index_select`` over the layer viewed as ``[2 * num_blocks, block bytes]`` (K blocks,
    then V blocks): whole contiguous blocks per index, measured 1.3-1.5x faster on CPU than
    selecting along the block dimension of ``[2, num_blocks, ...]``."""
    num_rows, blocks_per_row = block_tables.shape
    _, num_blocks, block_size, kv_heads, head_dim = kv_layer.shape
    index = block_tables.flatten()
    index = torch.cat((index, index + num_blocks))  # K blocks, then the same blocks' V
    flat = kv_layer.view(2 * num_blocks, block_size * kv_heads * head_dim)
    if workspace is None:
        kv = flat.index_select(0, index)
    else:
        kv = torch.index_select(flat, 0, index, out=workspace.buffer((index.numel(), flat.shape[1]), kv_layer))
    kv = kv.view(2, num_rows, blocks_per_row * block_size, kv_heads, head_dim).transpose(2, 3)
    return kv[0], kv[1]  # [B, kv_heads, C, head_dim] each


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """GQA without repeating K/V: the query heads of a group become extra query rows.

    q: [B, S, Hq, D]; k, v: [B, Hkv, C, D]; mask: [B, 1, S, C] bool. Returns [B, S, Hq, D].
    """
    num_rows, seq, num_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = num_heads // kv_heads
    # q: [B, Hkv, G * S, D] with row g * S + s
    q = q.view(num_rows, seq, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4).reshape(
        num_rows, kv_heads, group * seq, head_dim)
    if seq > 1:
        mask = mask.unsqueeze(2).expand(-1, -1, group, -1, -1).reshape(num_rows, 1, group * seq, -1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, Hkv, G * S, D]
    return out.view(num_rows, kv_heads, group, seq, head_dim).permute(0, 3, 1, 2, 4).reshape(
        num_rows, seq, num_heads, head_dim)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its log-sum-exp per query row, so partial results over disjoint key sets
    can merge. q: [B, H, S, D]; k, v: [B, H, C, D]; bias: additive, broadcast to [B, H, S, C]
    (0 or -inf; every query row keeps a finite key). Returns ([B, H, S, D], [B, H, S] float32).
    On CPU the fused flash kernel returns both; elsewhere (CUDA) ``attention_with_lse_matmul``."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)
    return attention_with_lse_matmul(q, k, v, bias, scale)


def attention_with_lse_matmul(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_with_lse`` from plain matmuls in float32, on any device."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [B, H, S, C]
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.float())
    return out.to(q.dtype), lse


@dataclass(frozen=True, slots=True, eq=False)
class DecodeSplit:
    """One split of the decode rows' KV: the same range of block-table columns for the first
    ``num_rows`` rows (those whose context reaches it)."""

    num_rows: int  # rows are ordered longest context first, so the rows reaching this split are a prefix
    block_table: torch.Tensor  # [num_rows, num_blocks] long (block 0 past a row's last block)
    bias: torch.Tensor | None  # [num_rows, 1, 1, num_blocks * block_size]: -inf past a row's context, or None
    head_index: torch.Tensor | None = None  # CPU kernel: ``head_index(block_table, ...)``, built once per step


def head_index(block_table: torch.Tensor, block_size: int, kv_heads: int) -> torch.Tensor:
    """Rows of a layer's K (or V) viewed as ``[num_blocks * block_size * kv_heads, head_dim]``
    that hold ``block_table``'s tokens, ordered (row, head, token): one ``index_select`` with it
    gathers ``[rows, kv_heads, tokens, head_dim]`` contiguous, the layout a batched matmul over
    (row, head) takes without another copy."""
    rows, blocks = block_table.shape
    offsets = torch.arange(block_size, device=block_table.device)
    slots = (block_table.unsqueeze(-1) * block_size + offsets).view(rows, 1, blocks * block_size)
    heads = torch.arange(kv_heads, device=block_table.device).view(1, kv_heads, 1)
    return (slots * kv_heads + heads).flatten()


def split_kv_decode(kv_layer: torch.Tensor, q: torch.Tensor, splits: tuple[DecodeSplit, ...], scale: float,
                    workspace: GatherWorkspace | None) -> torch.Tensor:
    """Decode attention over each row's own blocks, split by split, merged by log-sum-exp.
    q: [B, Hq, D] (rows ordered longest first); returns [B, Hq, D].

    On the CPU in bf16 (``cpu_split_bmm``) each split gathers its K and V head-major
    (``head_index``) and attends with two batched matmuls over (row, KV head), the group's query
    heads as the rows of each: the fused flash kernel, built for many query rows, spent 3-4x the
    time of the bytes it reads on the 4 query rows of a decode (docs/benchmarks/decode_kernels.md).
    Otherwise (float32 on the CPU, CUDA) each split runs ``attention_with_lse`` on the
    block-major gather."""
    num_rows, num_heads, head_dim = q.shape
    kv_heads = kv_layer.shape[3]
    q = q.view(num_rows, kv_heads, num_heads // kv_heads, head_dim)  # GQA: a group's heads are query rows
    out = lse = None
    for split in splits:
        rows = split.num_rows
        if q.device.type == "cpu" and cpu_split_bmm(q.dtype):
            part, part_lse = _split_bmm(kv_layer, q[:rows], split, scale, workspace)
        else:
            k, v = gather_kv(kv_layer, split.block_table, workspace)  # [rows, Hkv, num_blocks * block_size, D]
            part, part_lse = attention_with_lse(q[:rows], k, v, split.bias, scale)
            part, part_lse = part.float(), part_lse.unsqueeze(-1)
        if out is None:  # the first split holds every row
            out, lse = part, part_lse  # [B, Hkv, G, D] float32, [B, Hkv, G, 1]
            continue
        total = torch.logaddexp(lse[:rows], part_lse)
        out[:rows].mul_(torch.exp(lse[:rows] - total)).add_(part.mul_(torch.exp(part_lse - total)))
        lse[:rows] = total
    return out.to(q.dtype).view(num_rows, num_heads, head_dim)


def _split_bmm(kv_layer: torch.Tensor, q: torch.Tensor, split: DecodeSplit, scale: float,
               workspace: GatherWorkspace | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One split on the CPU: (attention [rows, Hkv, G, D] float32, its log-sum-exp [rows, Hkv, G, 1]).
    Scores come out of the matmul in the cache's dtype and the softmax runs in float32 (as HF's
    eager attention does)."""
    rows, kv_heads, _, head_dim = q.shape
    block_size = kv_layer.shape[2]
    index = split.head_index
    if index is None:
        index = head_index(split.block_table, block_size, kv_heads)
    shape = (2, index.numel(), head_dim)
    buf = workspace.buffer(shape, kv_layer) if workspace is not None else kv_layer.new_empty(shape)
    k = torch.index_select(kv_layer[0].view(-1, head_dim), 0, index, out=buf[0]).view(rows, kv_heads, -1, head_dim)
    v = torch.index_select(kv_layer[1].view(-1, head_dim), 0, index, out=buf[1]).view(rows, kv_heads, -1, head_dim)
    scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)  # [rows, Hkv, G, tokens]
    if split.bias is not None:
        scores.add_(split.bias)  # [rows, 1, 1, tokens]: -inf past each row's context
    peak = scores.amax(-1, keepdim=True)
    weights = scores.sub_(peak).exp_()
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights.to(v.dtype), v).float().div_(total)  # [rows, Hkv, G, D]
    return out, peak.add_(total.log_())


@dataclass(frozen=True, slots=True, eq=False)
class PrefillChunk:
    query_start: int  # first row of this chunk in the flat batch
    query_len: int
    context_len: int  # KV length after the chunk: start position + query_len
    block_table: torch.Tensor  # [cdiv(context_len, block_size)] long
    bias: torch.Tensor | None  # [query_len, context_len] additive 0 / -inf (causal); None when the chunk starts at 0


@dataclass(frozen=True, slots=True, eq=False)
class RaggedMetadata:
    slot_mapping: torch.Tensor  # [T] long: cache slot of each new token
    logits_indices: torch.Tensor  # [R] long: rows whose logits the model returns
    num_decodes: int  # rows [0, num_decodes) are single-token decodes, longest context first
    decode_block_tables: torch.Tensor | None  # padded kernel: [num_decodes, max_blocks] long, padded with block 0
    decode_mask: torch.Tensor | None  # padded kernel: [num_decodes, 1, 1, max_blocks * block_size] bool
    prefills: tuple[PrefillChunk, ...]
    decode_splits: tuple[DecodeSplit, ...] = ()  # split-kv kernel (then the two fields above are None)
    workspace: GatherWorkspace | None = None
    # split-kv read in place on the CPU (``cpu_inplace_decode``): each decode row's context length
    # [num_decodes] long, with its blocks in ``decode_block_tables`` (no splits, no mask)
    decode_lens: torch.Tensor | None = None

    def attend(self, kv_layer: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]; returns [T, Hq, D]
        write_kv(kv_layer, self.slot_mapping, k, v)
        outs = []
        nd = self.num_decodes
        if nd and self.decode_lens is not None:
            outs.append(paged_decode.decode(kv_layer, q[:nd], self.decode_block_tables, self.decode_lens, scale))
        elif nd and self.decode_splits:
            outs.append(split_kv_decode(kv_layer, q[:nd], self.decode_splits, scale, self.workspace))
        elif nd:
            k_ctx, v_ctx = gather_kv(kv_layer, self.decode_block_tables, self.workspace)
            outs.append(dense_attention(q[:nd].unsqueeze(1), k_ctx, v_ctx, self.decode_mask, scale).squeeze(1))
        for chunk in self.prefills:
            outs.append(_prefill_attention(kv_layer, q, k, v, chunk, scale, self.workspace))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def _prefill_attention(kv_layer: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       chunk: PrefillChunk, scale: float, workspace: GatherWorkspace | None) -> torch.Tensor:
    """One prefill chunk, bottom-right causal over its context. On the CPU the kernel of the
    dtype (``prefill_kernels.cpu_prefill_kernel``); elsewhere (CUDA) SDPA with K/V heads
    repeated to the query heads and 4-D inputs, ``is_causal`` from position 0, the chunk's
    additive mask after a cached prefix."""
    rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
    start = chunk.context_len - chunk.query_len
    if chunk.bias is None:
        k_c, v_c = k[rows].transpose(0, 1), v[rows].transpose(0, 1)  # [Hkv, n, D]
    else:
        k_c, v_c = gather_kv(kv_layer, chunk.block_table.unsqueeze(0), workspace)  # [1, Hkv, nb * bs, D]
        k_c, v_c = k_c[0, :, :chunk.context_len], v_c[0, :, :chunk.context_len]  # [Hkv, ctx, D]
    kernel = cpu_prefill_kernel(q.dtype) if q.device.type == "cpu" else "sdpa"
    if kernel == "matmul-tiles":
        return tiled_causal_attention(q[rows], k_c, v_c, start, scale)
    if kernel == "flash":
        return flash_causal_attention(q[rows], k_c, v_c, start, scale)
    group = q.shape[1] // k.shape[1]
    q_c = q[rows].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]: the fused kernels take 4-D inputs only
    k_c, v_c = k_c.repeat_interleave(group, 0).unsqueeze(0), v_c.repeat_interleave(group, 0).unsqueeze(0)
    if chunk.bias is None:
        out = F.scaled_dot_product_attention(q_c, k_c, v_c, is_causal=True, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=chunk.bias, scale=scale)
    return out[0].transpose(0, 1)  # [n, Hq, D]


@dataclass(frozen=True, slots=True, eq=False)
class PaddedMetadata:
    block_tables: torch.Tensor  # [B, max_blocks] long, padded with block 0
    mask: torch.Tensor  # [B, 1, S, C] bool with C = max_blocks * block_size
    write_rows: torch.Tensor  # [W] long: flat indices (b * S + s) of the real tokens
    write_slots: torch.Tensor  # [W] long: their cache slots
    logits_indices: torch.Tensor  # [R] long: flat indices of the rows to sample
    workspace: GatherWorkspace | None = None

    def attend(self, kv_layer: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        # q: [B * S, Hq, D]; k, v: [B * S, Hkv, D]; returns [B * S, Hq, D]
        write_kv(kv_layer, self.write_slots, k.index_select(0, self.write_rows), v.index_select(0, self.write_rows))
        num_rows, _, seq, _ = self.mask.shape
        k_ctx, v_ctx = gather_kv(kv_layer, self.block_tables, self.workspace)
        out = dense_attention(q.view(num_rows, seq, *q.shape[1:]), k_ctx, v_ctx, self.mask, scale)
        return out.flatten(0, 1)
