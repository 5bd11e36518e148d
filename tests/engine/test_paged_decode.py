"""The CPU's in-place decode kernel (``paged_decode``) against a reference attention.

The reference gathers each row's first ``len`` cache slots and runs plain softmax(q K^T) V per
query head with its KV head (GQA), in float64. Where the kernel cannot be built here (no C
compiler, no AVX2), the tests say so in the skip reason.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from servelab.engine import attention, paged_decode
from servelab.engine.runner import SeqChunk, build_ragged

needs_kernel = pytest.mark.skipif(paged_decode.kernel() is None,
                                  reason=f"in-place decode kernel not built here: {paged_decode.LIBRARY.why_not}")


def _reference(kv, q, tables, lens, scale):
    _, _, block_size, kv_heads, _ = kv.shape
    group = q.shape[1] // kv_heads
    outs = []
    for r in range(q.shape[0]):
        n = int(lens[r])
        slots = torch.arange(n)
        blocks = tables[r][slots // block_size]
        k = kv[0, blocks, slots % block_size].double()  # [n, Hkv, D]
        v = kv[1, blocks, slots % block_size].double()
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [n, Hq, D]
        scores = torch.einsum("hd,nhd->hn", q[r].double(), k) * scale
        outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
    return torch.stack(outs).float()


def _case(lens, block_size, heads, kv_heads, head_dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    per = [-(-n // block_size) for n in lens]
    num_blocks = sum(per) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(per)
    tables, used = torch.zeros(len(lens), width, dtype=torch.long), 0
    for r, n in enumerate(per):
        tables[r, :n] = perm[used:used + n]
        used += n
    kv = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen) * 2
    q = torch.randn(len(lens), heads, head_dim, generator=gen) * 2
    return kv, q, tables, torch.tensor(lens)


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=6), block_size=st.sampled_from([1, 5, 16, 32, 40]),
       shape=st.sampled_from([(4, 1, 32), (16, 4, 64), (8, 8, 64), (6, 2, 128), (16, 2, 64), (4, 2, 32)]))
def test_kernel_equals_reference(lens, block_size, shape):
    """Any lengths, block sizes below, at and above the kernel's 16-token unit (40: units of 16, 16
    and 8 in a block), and GQA groups of 1, 2, 3, 4 and 8 query heads per KV head (8: two passes of
    the four heads the P V step holds in registers)."""
    heads, kv_heads, head_dim = shape
    kv, q, tables, lens_t = _case(lens, block_size, heads, kv_heads, head_dim)
    scale = head_dim ** -0.5
    out = paged_decode.decode(kv, q, tables, lens_t, scale)
    assert torch.allclose(out, _reference(kv, q, tables, lens_t, scale), atol=2e-5, rtol=1e-4)


@needs_kernel
def test_large_scores_stay_finite():
    """Scores far from zero (a running max that jumps between blocks) neither overflow nor lose the row."""
    kv, q, tables, lens = _case([200, 33, 1], 16, 8, 2, 64, seed=3)
    q = q * 40
    out = paged_decode.decode(kv, q, tables, lens, 1.0)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, _reference(kv, q, tables, lens, 1.0), atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("block_size", [16, 40])
def test_max_jumping_between_units_of_a_block(block_size):
    """A score far above the rest late in a block (its second or third 16-token unit) rescales
    what the earlier units of the same block accumulated."""
    kv, q, tables, lens = _case([block_size * 2, block_size - 3], block_size, 8, 2, 64, seed=5)
    kv[0, tables[0, 0], block_size - 2, 0] = q[0, :4].mean(0) * 6  # row 0, KV head 0: a key aligned with its queries
    kv[0, tables[0, 1], block_size - 1, 1] = q[0, 4:].mean(0) * 6  # KV head 1, in the row's second block
    out = paged_decode.decode(kv, q, tables, lens, 0.125)
    assert torch.allclose(out, _reference(kv, q, tables, lens, 0.125), atol=2e-5, rtol=1e-4)


@needs_kernel
def test_engine_step_uses_it_and_matches_split_kv():
    """build_ragged with head_dim picks the in-place path (no splits built) and the step's
    attention equals the torch split-kv path's on the same cache."""
    lens = [70, 300, 1, 129]
    kv, q, tables, _ = _case(lens, 16, 16, 4, 64, seed=1)
    chunks = [SeqChunk(i, [3], n - 1, tables[i, :-(-n // 16)].tolist()) for i, n in enumerate(lens)]
    k_new, v_new = torch.randn(len(lens), 4, 64), torch.randn(len(lens), 4, 64)
    outs = {}
    for inplace in (True, False):
        attention.CPU_INPLACE_DECODE = inplace
        try:
            _, _, meta, sampled = build_ragged(chunks, 16, torch.device("cpu"), head_dim=64)
        finally:
            attention.CPU_INPLACE_DECODE = True
        assert (meta.decode_lens is not None) == inplace and bool(meta.decode_splits) != inplace
        order = torch.tensor([c.request_id for c in sampled])
        cache = kv.clone()
        outs[inplace] = meta.attend(cache, q[order], k_new[order], v_new[order], 0.125)[torch.argsort(order)]
    assert torch.allclose(outs[True], outs[False], atol=2e-5, rtol=1e-4)


@needs_kernel
def test_bad_input_is_one_clear_error():
    kv, q, tables, lens = _case([10], 4, 4, 1, 32)
    with pytest.raises(ValueError, match="int64"):
        paged_decode.decode(kv, q, tables.int(), lens, 1.0)
    with pytest.raises(ValueError, match="contiguous float32"):
        paged_decode.decode(kv.transpose(3, 4), q, tables, lens, 1.0)
    with pytest.raises(ValueError, match="block ids"):  # an id past the cache: refused, never read
        paged_decode.decode(kv, q, tables + kv.shape[1], lens, 1.0)
    with pytest.raises(ValueError, match="lens"):  # a length past the row's table
        paged_decode.decode(kv, q, tables, lens + tables.shape[1] * kv.shape[2], 1.0)


def test_not_chosen_where_it_cannot_run():
    """bf16, several torch threads or a head_dim the kernel does not tile keep the torch path."""
    cpu = torch.device("cpu")
    assert not attention.cpu_inplace_decode(cpu, torch.bfloat16, 64)
    assert not attention.cpu_inplace_decode(cpu, torch.float32, 48)
    assert not attention.cpu_inplace_decode(cpu, torch.float32, None)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not attention.cpu_inplace_decode(cpu, torch.float32, 64)
    finally:
        torch.set_num_threads(previous)
