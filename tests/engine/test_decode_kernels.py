"""The split-kv decode kernel against the padded one, on every mix of contexts hypothesis finds.

Both read the same paged cache; the padded kernel is the reference (one masked SDPA over
every row padded to the longest context). The CUDA code path (plain matmuls for the
log-sum-exp) is checked on CPU by swapping it in.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from servelab.engine import attention
from servelab.engine.runner import SeqChunk, build_ragged

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def _decode_step(contexts, block_size, split_tokens, kernel, dtype=torch.float32, seed=0, kv_heads=None,
                 token_bytes=None):
    gen = torch.Generator().manual_seed(seed)
    tables, used = [], 1
    for ctx in contexts:
        n = -(-ctx // block_size)
        tables.append(list(range(used, used + n)))
        used += n
    perm = torch.randperm(used, generator=gen).tolist()  # scattered blocks
    tables = [[perm[b] for b in t] for t in tables]
    kv = torch.randn(2, used, block_size, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    chunks = [SeqChunk(i, [3], ctx - 1, t) for i, (ctx, t) in enumerate(zip(contexts, tables))]
    _, _, meta, sampled = build_ragged(chunks, block_size, torch.device("cpu"), decode_kernel=kernel,
                                       split_tokens=split_tokens, dtype=dtype, kv_heads=kv_heads,
                                       token_bytes=token_bytes)
    q = torch.randn(len(contexts), HEADS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(len(contexts), KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(len(contexts), KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    rows = {c.request_id: i for i, c in enumerate(sampled)}
    order = torch.tensor([rows[i] for i in range(len(contexts))])
    out = meta.attend(kv, q[order], k[order], v[order], HEAD_DIM ** -0.5)  # rows in the step's order
    return out[torch.argsort(order)], meta


@settings(max_examples=40, deadline=None)
@given(contexts=st.lists(st.integers(1, 90), min_size=1, max_size=9), block_size=st.sampled_from([1, 4, 16]),
       split_tokens=st.integers(1, 64))
def test_split_kv_equals_padded(contexts, block_size, split_tokens):
    split, meta = _decode_step(contexts, block_size, split_tokens, "split-kv")
    padded, _ = _decode_step(contexts, block_size, split_tokens, "padded")
    assert torch.allclose(split, padded, atol=1e-5, rtol=1e-4)
    # no split holds a row that has no key in it, and no tensor is rows x longest
    for s in meta.decode_splits:
        assert s.block_table.shape[0] == s.num_rows
    assert meta.decode_block_tables is None and meta.decode_mask is None


def test_split_rows_follow_the_contexts():
    """One long row among short ones: later splits carry only the long row (no bubble); units of
    ``split_tokens`` that the same rows reach merge, up to ``SPLIT_MERGE`` a split."""
    _, meta = _decode_step([8] * 7 + [200], 4, 16, "split-kv")
    assert [s.num_rows for s in meta.decode_splits] == [8] + [1] * 3  # 12 units of the long row, 4 a split
    assert [s.block_table.shape[1] for s in meta.decode_splits] == [4, 16, 16, 14]
    _, meta = _decode_step([40, 40, 24], 4, 8, "split-kv")  # units of 2 blocks: the 24-token row ends in unit 3
    assert [(s.num_rows, s.block_table.shape[1]) for s in meta.decode_splits] == [(3, 6), (2, 4)]


def test_merged_splits_stay_within_the_byte_cap():
    """With the cache's bytes per token, a merge stops where the split's gather would pass the
    byte cap (``SPLIT_MERGE_BYTES``: a float32 split of 32 rows x 512 tokens overflowed this
    machine's L3); the attention is unchanged."""
    from servelab.engine.runner import decode_splits

    tables = torch.arange(4 * 16).view(4, 16)  # 4 rows x 16 blocks of 4 tokens
    ends = [64] * 4
    token_bytes = 2 * KV_HEADS * HEAD_DIM * 4
    free = decode_splits(tables, ends, 4, 8, torch.float32)  # units of 2 blocks, merged four at a time
    assert [s.block_table.shape[1] for s in free] == [8, 8]
    capped = decode_splits(tables, ends, 4, 8, torch.float32, token_bytes=token_bytes,
                           merge_bytes=4 * 16 * token_bytes)  # 4 rows x 16 tokens: two units a split
    assert [s.block_table.shape[1] for s in capped] == [4, 4, 4, 4]
    assert len(decode_splits(tables, ends, 4, 8, torch.float32, token_bytes=token_bytes,
                             merge_bytes=1)) == 8  # a cap below one unit leaves the units unmerged
    out, meta = _decode_step([64, 64, 40], 4, 8, "split-kv", token_bytes=token_bytes)
    padded, _ = _decode_step([64, 64, 40], 4, 8, "padded")
    assert torch.allclose(out, padded, atol=1e-5, rtol=1e-4)


def test_cuda_code_path_on_cpu(monkeypatch):
    """The non-CPU log-sum-exp path gives the same attention (it is what CUDA runs)."""
    contexts = [5, 33, 70, 1, 18]
    monkeypatch.setattr(attention, "CPU_SPLIT_BMM", True)  # the batched-matmul kernel in float32 too
    cpu, _ = _decode_step(contexts, 4, 8, "split-kv")
    monkeypatch.setattr(attention, "CPU_SPLIT_BMM", False)  # the block-major gather per split, as on CUDA
    flash, _ = _decode_step(contexts, 4, 8, "split-kv")
    monkeypatch.setattr(attention, "attention_with_lse", attention.attention_with_lse_matmul)
    generic, _ = _decode_step(contexts, 4, 8, "split-kv")
    assert torch.allclose(cpu, generic, atol=1e-5, rtol=1e-4)
    assert torch.allclose(cpu, flash, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("precomputed", [False, True])
def test_cpu_split_kernel_gathers_each_rows_own_blocks_head_major(precomputed, monkeypatch):
    """The CPU kernel's gather index (built once per step by the runner, or per layer when absent)
    picks exactly a row's tokens, head by head; the attention equals the padded reference."""
    monkeypatch.setattr(attention, "CPU_SPLIT_BMM", True)  # the batched-matmul kernel in float32 too
    table = torch.tensor([[5, 2], [0, 7]])
    index = attention.head_index(table, 4, KV_HEADS)
    assert index.shape == (2 * KV_HEADS * 8,)
    slots = index.view(2, KV_HEADS, 8) // KV_HEADS
    heads = index.view(2, KV_HEADS, 8) % KV_HEADS
    assert slots[0, 1].tolist() == [20, 21, 22, 23, 8, 9, 10, 11] and heads[0, 1].eq(1).all()
    contexts = [30, 3, 17, 9]
    ref, _ = _decode_step(contexts, 4, 8, "padded")
    got, meta = _decode_step(contexts, 4, 8, "split-kv", kv_heads=KV_HEADS if precomputed else None)
    assert all((s.head_index is not None) == precomputed for s in meta.decode_splits)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4)


def test_bf16_split_kv_close_to_fp32():
    contexts = [40, 7, 65]
    ref, _ = _decode_step(contexts, 4, 8, "padded")
    bf16, _ = _decode_step(contexts, 4, 8, "split-kv", dtype=torch.bfloat16)
    assert (bf16.float() - ref).abs().max() < 0.05


def test_runner_rejects_unknown_kernel():
    from servelab.engine.runner import ModelRunner

    with pytest.raises(ValueError, match="decode_kernel"):
        ModelRunner(None, None, decode_kernel="flash")  # checked before anything else


def test_cpu_split_kernel_per_dtype(monkeypatch):
    """Batched matmuls in bf16, the flash kernel per split in float32 (where the matmuls measured
    slower); the runner builds the head-major index only for the former; both equal the padded
    reference."""
    assert attention.CPU_SPLIT_BMM is None
    assert attention.cpu_split_bmm(torch.bfloat16) and not attention.cpu_split_bmm(torch.float32)
    contexts = [30, 3, 17, 9]
    ref32, _ = _decode_step(contexts, 4, 8, "padded")
    got32, meta32 = _decode_step(contexts, 4, 8, "split-kv", kv_heads=KV_HEADS)
    assert all(s.head_index is None for s in meta32.decode_splits)
    assert torch.allclose(got32, ref32, atol=1e-5, rtol=1e-4)
    got16, meta16 = _decode_step(contexts, 4, 8, "split-kv", dtype=torch.bfloat16, kv_heads=KV_HEADS)
    assert all(s.head_index is not None for s in meta16.decode_splits)
    assert (got16.float() - ref32).abs().max() < 0.05
