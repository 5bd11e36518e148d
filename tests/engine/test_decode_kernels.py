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


def _decode_step(contexts, block_size, split_tokens, kernel, dtype=torch.float32, seed=0):
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
                                       split_tokens=split_tokens, dtype=dtype)
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
    """One long row among short ones: later splits carry only the long row (no bubble)."""
    _, meta = _decode_step([8] * 7 + [200], 4, 16, "split-kv")
    assert [s.num_rows for s in meta.decode_splits] == [8] + [1] * 12


def test_cuda_code_path_on_cpu(monkeypatch):
    """The non-CPU log-sum-exp path gives the same attention (it is what CUDA runs)."""
    contexts = [5, 33, 70, 1, 18]
    cpu, _ = _decode_step(contexts, 4, 8, "split-kv")
    monkeypatch.setattr(attention, "attention_with_lse", attention.attention_with_lse_matmul)
    generic, _ = _decode_step(contexts, 4, 8, "split-kv")
    assert torch.allclose(cpu, generic, atol=1e-5, rtol=1e-4)


def test_bf16_split_kv_close_to_fp32():
    contexts = [40, 7, 65]
    ref, _ = _decode_step(contexts, 4, 8, "padded")
    bf16, _ = _decode_step(contexts, 4, 8, "split-kv", dtype=torch.bfloat16)
    assert (bf16.float() - ref).abs().max() < 0.05


def test_runner_rejects_unknown_kernel():
    from servelab.engine.runner import ModelRunner

    with pytest.raises(ValueError, match="decode_kernel"):
        ModelRunner(None, None, decode_kernel="flash")  # checked before anything else
