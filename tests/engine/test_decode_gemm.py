"""The CPU's decode-row projection kernel (``decode_gemm``) and ``model.Linear``'s use of it.

The reference is ``x @ W^T + b`` in float64; the kernel sums in float32 in another order, so
results agree within a tolerance that grows with K (sqrt(K) rounding steps of ~6e-8 relative).
Where the kernel cannot be built here (no C compiler, not an AVX2 CPU), the tests say so in the
skip reason.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from servelab.core.native_build import NativeLibrary
from servelab.engine import decode_gemm, model as model_mod
from servelab.engine.model import Linear

needs_kernel = pytest.mark.skipif(decode_gemm.kernel() is None,
                                  reason=f"decode GEMM kernel not built here: {decode_gemm.LIBRARY.why_not}")


def _reference(x, w, b):
    out = x.double() @ w.double().T
    return (out if b is None else out + b.double()).float()


def _close(got, want, k):
    assert got.shape == want.shape
    scale = (want.abs().max().item() if want.numel() else 0.0) + 1.0
    assert torch.allclose(got, want, rtol=0, atol=1e-6 * scale * max(k, 16) ** 0.5 * 4), \
        f"max error {(got - want).abs().max().item():.3g}"


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 70), k=st.one_of(st.integers(1, 600), st.integers(900, 2600)), panels=st.integers(1, 6),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_kernel_matches_reference_at_any_row_count_and_depth(m, k, panels, bias, seed):
    """Row counts cover none (a step that samples no row), every row-group split (groups of 6, 8
    as 4 + 4, tails 1-5) and depths cover partial k-blocks (KC = 256), depths below a vector, and the packed weight's chunks of
    ``CHUNK`` k's (one, two, three, the last one partial)."""
    gen = torch.Generator().manual_seed(seed)
    n = panels * decode_gemm.PANEL
    w, x = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    _close(decode_gemm.linear(x, decode_gemm.pack(w), b), _reference(x, w, b), k)


@needs_kernel
def test_kernel_at_bench_200m_shapes_and_a_non_contiguous_input():
    torch.manual_seed(0)
    for n, k in ((1536, 1024), (1024, 2816)):
        w = torch.randn(n, k)
        x = torch.randn(32, 2 * k)[:, ::2]  # a strided view: the wrapper must make it contiguous
        _close(decode_gemm.linear(x, decode_gemm.pack(w), None), _reference(x, w, None), k)


@needs_kernel
def test_linear_uses_panels_and_falls_back_where_they_do_not_apply(monkeypatch):
    torch.manual_seed(0)
    layer = Linear(40, 48, bias=True).requires_grad_(False)
    assert layer.pack() and layer.panels is not None and layer.packed is None
    calls = []
    real = decode_gemm.linear
    monkeypatch.setattr(decode_gemm, "linear", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(32, 40)
    _close(layer(x), _reference(x, layer.weight, layer.bias), 40)
    assert calls == [1]
    big = torch.randn(model_mod.PACKED_MAX_ROWS + 1, 40) if model_mod.PACKED_MAX_ROWS else None
    if big is not None:  # above the row limit: F.linear
        _close(layer(big), _reference(big, layer.weight, layer.bias), 40)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # more than one torch thread: F.linear (MKL's threads), not the one-thread kernel
        _close(layer(x), _reference(x, layer.weight, layer.bias), 40)
    finally:
        torch.set_num_threads(previous)
    assert calls == [1]
    with torch.no_grad():
        layer.weight.mul_(2)  # a changed weight is never served from stale panels
    _close(layer(x), _reference(x, layer.weight, layer.bias), 40)
    assert calls == [1]
    clone = copy.deepcopy(layer)  # KunServe's layer moves: the copy computes from its weight
    assert clone.panels is None


@needs_kernel
def test_a_row_width_other_than_the_weight_depth_is_refused():
    """The C loop reads raw memory: x must have the packed weight's K columns."""
    panels = decode_gemm.pack(torch.randn(32, 64))
    assert panels.shape == (32, 64)
    with pytest.raises(ValueError, match="does not match the packed weight"):
        decode_gemm.linear(torch.randn(4, 65), panels, None)


def test_weights_the_panels_cannot_hold_keep_the_other_paths():
    """Rows not a multiple of 16, or bf16: no panels (oneDNN's packing or F.linear instead)."""
    odd = Linear(32, 40, bias=False).requires_grad_(False)
    odd.pack()
    assert odd.panels is None
    half = Linear(32, 48, bias=False).to(torch.bfloat16).requires_grad_(False)
    half.pack()
    assert half.panels is None
    x = torch.randn(3, 32)
    torch.testing.assert_close(odd(x), torch.nn.functional.linear(x, odd.weight), atol=1e-5, rtol=1e-5)


def test_disabled_by_environment_says_why(monkeypatch):
    monkeypatch.setattr(decode_gemm, "LIBRARY", NativeLibrary(
        decode_gemm.SOURCE, decode_gemm.FLAGS, switch="SERVELAB_DECODE_GEMM", unsupported=lambda: None,
        bind=lambda lib: None))  # a fresh loader: the module's own has loaded already
    monkeypatch.setenv("SERVELAB_DECODE_GEMM", "0")
    assert decode_gemm.kernel() is None and decode_gemm.LIBRARY.why_not == "SERVELAB_DECODE_GEMM=0"
    assert not decode_gemm.can_pack(torch.zeros(16, 8))
    with pytest.raises(RuntimeError, match="SERVELAB_DECODE_GEMM=0"):
        decode_gemm.linear(torch.zeros(1, 8), torch.zeros(1, 8, 16), None)
