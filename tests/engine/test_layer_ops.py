"""The fused RMSNorm, RoPE and silu x up (``layer_ops``) against the model's torch code they replace.

The torch paths (``RMSNorm`` with the library switched off, ``model.apply_rope``) are the
reference; float32 results agree within a few ulps (FMA and summation order differ). Where the
library cannot be built here, the tests say so in the skip reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from servelab.engine import layer_ops
from servelab.engine.config import ModelConfig
from servelab.engine.model import MLP, RMSNorm, apply_rope

needs_library = pytest.mark.skipif(layer_ops.library() is None,
                                   reason=f"layer ops library not built here: {layer_ops.LIBRARY.why_not}")


@needs_library
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), dim=st.integers(1, 300), pad=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_rms_norm_matches_the_torch_norm(rows, dim, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim + pad, generator=gen)[:, :dim] * 3  # rows pad floats apart when pad > 0
    norm = RMSNorm(dim, 1e-6).requires_grad_(False)
    norm.weight.copy_(torch.randn(dim, generator=gen))
    fused = norm(x)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(layer_ops, "applies", lambda _: False)
        reference = norm(x)
    torch.testing.assert_close(fused, reference, rtol=2e-6, atol=2e-6)


@needs_library
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), heads=st.integers(1, 6), half=st.integers(1, 40), extra=st.integers(0, 70),
       seed=st.integers(0, 2**16))
def test_rope_in_place_matches_apply_rope_and_leaves_other_columns(rows, heads, half, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    d = 2 * half
    x = torch.randn(rows, heads * d + extra, generator=gen)
    angles = torch.rand(rows, 1, d, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    expected = apply_rope(x[:, :heads * d].view(rows, heads, d), cos, sin)
    tail = x[:, heads * d:].clone()
    layer_ops.rope_(x, heads, d, cos, sin)
    torch.testing.assert_close(x[:, :heads * d].view(rows, heads, d), expected, rtol=2e-6, atol=2e-6)
    assert torch.equal(x[:, heads * d:], tail)  # v's columns after q and k are never touched


@needs_library
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 40), inter=st.integers(1, 300), pad=st.integers(0, 9), scale=st.sampled_from([1.0, 30.0]),
       seed=st.integers(0, 2**16))
def test_silu_mul_matches_torch(rows, inter, pad, scale, seed):
    """Vector body and scalar tail (any width), rows padded apart, and gates far out on both
    sides (scale 30: e^-g near its clamp, silu near 0 and near g)."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * inter + pad, generator=gen) * scale)[:, :2 * inter]
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(layer_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=2e-6)


@needs_library
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 20), dim=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_add_rms_norm_matches_an_add_then_the_torch_norm(rows, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    x, a = torch.randn(rows, dim, generator=gen) * 3, torch.randn(rows, dim, generator=gen)
    norm = RMSNorm(dim, 1e-6).requires_grad_(False)
    norm.weight.copy_(torch.randn(dim, generator=gen))
    h, out = layer_ops.add_rms_norm(x, a, norm.weight, norm.eps)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(layer_ops, "applies", lambda _: False)
        reference = norm(x + a)
    assert torch.equal(h, x + a)
    torch.testing.assert_close(out, reference, rtol=2e-6, atol=2e-6)


@needs_library
def test_decoder_layer_with_the_fused_add_and_norm_matches_its_torch_path():
    from servelab.engine.model import DecoderLayer  # noqa: PLC0415
    config = ModelConfig(hidden_size=32, intermediate_size=44)
    torch.manual_seed(0)
    layer = DecoderLayer(config).requires_grad_(False)
    x = torch.randn(5, 32)

    class Meta:  # attention stand-in: the layer's own arithmetic around it is what is compared
        @staticmethod
        def attend(kv, q, k, v, scale):
            return q * 0.5

    cos, sin = torch.ones(5, 1, config.head_dim), torch.zeros(5, 1, config.head_dim)
    fused = layer(x, cos, sin, None, Meta())
    with pytest.MonkeyPatch.context() as m:
        m.setattr(layer_ops, "applies", lambda _: False)
        reference = layer(x, cos, sin, None, Meta())
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)


@needs_library
def test_mlp_with_the_fused_activation_matches_its_torch_path():
    config = ModelConfig(hidden_size=32, intermediate_size=44)  # 44: a vector body and a scalar tail
    torch.manual_seed(0)
    mlp = MLP(config).requires_grad_(False)
    x = torch.randn(5, config.hidden_size)
    fused = mlp(x)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(layer_ops, "applies", lambda _: False)
        reference = mlp(x)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)


def test_applies_only_to_float32_rows_on_one_thread():
    assert not layer_ops.applies(torch.zeros(2, 8, dtype=torch.bfloat16))
    assert not layer_ops.applies(torch.zeros(8, 2).t())  # columns not contiguous
    assert not layer_ops.applies(torch.zeros(2, 2, 8))
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not layer_ops.applies(torch.zeros(2, 8))
    finally:
        torch.set_num_threads(previous)


@needs_library
def test_bad_shapes_are_one_clear_error():
    with pytest.raises(ValueError, match="weight must be float32"):
        layer_ops.rms_norm(torch.zeros(2, 8), torch.zeros(7), 1e-6)
    with pytest.raises(ValueError, match="cos and sin"):
        layer_ops.rope_(torch.zeros(2, 8), 1, 8, torch.zeros(2, 1, 4), torch.zeros(2, 1, 8))
    with pytest.raises(ValueError, match="no two equal halves"):
        layer_ops.silu_mul(torch.zeros(2, 7))
    with pytest.raises(ValueError, match="holds no 2 heads"):
        layer_ops.rope_(torch.zeros(2, 8), 2, 8, torch.zeros(2, 1, 8), torch.zeros(2, 1, 8))
