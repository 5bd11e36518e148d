"""Device and dtype choice (CUDA + bf16 when torch sees a GPU), and the CPU's packed projections."""

from __future__ import annotations

import copy

import pytest
import torch

from servelab.core.errors import UserError
from servelab.engine.device import resolve_device, resolve_dtype
from servelab.engine.loader import load_checkpoint
from servelab.engine.model import Linear


def test_auto_picks_cuda_only_when_torch_sees_a_gpu():
    assert resolve_device("auto", cuda_available=True) == torch.device("cuda")
    assert resolve_device("auto", cuda_available=False) == torch.device("cpu")
    assert resolve_device("cpu", cuda_available=True) == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda", cuda_available=False)


def test_fp32_checkpoints_run_in_bf16_on_cuda_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_dtype(None, "float32", cuda) == "bfloat16"
    assert resolve_dtype(None, "float16", cuda) == "float16"  # a half checkpoint keeps its dtype
    assert resolve_dtype(None, "float32", cpu) == "float32"
    assert resolve_dtype("float32", "float32", cuda) == "float32"  # explicit wins


def test_load_on_auto_device_here(make_checkpoint):
    loaded = load_checkpoint(make_checkpoint(), device="auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert loaded.model.embed_tokens.weight.device.type == expected
    if expected == "cpu":
        assert loaded.model.embed_tokens.weight.dtype == torch.float32


def test_cuda_asked_without_a_gpu_is_one_clear_error(make_checkpoint, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a machine with a GPU
    with pytest.raises(UserError, match="no CUDA GPU"):
        load_checkpoint(make_checkpoint(), device="cuda")


def test_packed_linear_matches_and_falls_back_when_it_cannot_be_trusted():
    torch.manual_seed(0)
    layer = Linear(32, 48, bias=True).requires_grad_(False)
    x = torch.randn(5, 32)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    if not layer.pack():  # no oneDNN and no decode GEMM here: the layer must fall back to F.linear, unpacked
        assert layer.packed is None and layer.panels is None and torch.allclose(layer(x), expected, atol=1e-5)
        return
    assert (layer.packed is None) != (layer.panels is None)  # one packed copy, of one kind
    assert torch.allclose(layer(x), expected, atol=1e-5)
    clone = copy.deepcopy(layer)  # KunServe moves layers by deep copy: the copy computes from its weight
    assert clone.packed is None and clone.panels is None and torch.allclose(clone(x), expected, atol=1e-5)
    with torch.no_grad():
        layer.weight.mul_(2)  # a changed weight must not be served from the stale packed copy
    assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)


def test_bf16_model_loads_and_runs_where_onednn_has_no_bf16_path(make_checkpoint, monkeypatch):
    """On an AVX2-only CPU (AMD Zen 3) oneDNN refuses to pack bf16 weights; loading a bf16
    model raised a RuntimeError there. The projections must fall back to ``F.linear``."""
    from servelab.engine import model as model_mod

    monkeypatch.setattr(model_mod, "cpu_has_bf16", lambda: False)
    loaded = load_checkpoint(make_checkpoint(), dtype="bfloat16")
    layers = [m for m in loaded.model.modules() if isinstance(m, Linear)]
    assert layers and all(m.packed is None for m in layers)
    x = torch.randn(3, layers[0].in_features, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x, layers[0].weight, layers[0].bias)
    assert torch.equal(layers[0](x), expected)


def test_pack_reports_false_when_onednn_refuses(monkeypatch):
    layer = Linear(16, 8, bias=False).requires_grad_(False)

    def refuse(*a, **k):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse, raising=False)
    assert layer.pack() is False and layer.packed is None
    x = torch.randn(2, 16)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))


def test_cpu_description_names_the_vector_isa():
    from servelab.engine.device import cpu_description

    zen3 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma\n"
    genoa = "model name\t: AMD EPYC\nflags\t\t: avx2 avx512f avx512bw avx512_bf16\n"
    assert cpu_description(zen3).startswith("AMD EPYC (AVX2, no AVX512), ")
    assert cpu_description(genoa).startswith("AMD EPYC (AVX512-BF16), ")
    assert cpu_description("").startswith("unknown CPU (no AVX2), ")


def test_cpu_serving_dtype_follows_the_bf16_path(monkeypatch):
    from servelab.engine import device

    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    assert device.cpu_serving_dtype() == "float32"
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: True)
    assert device.cpu_serving_dtype() == "bfloat16"


def test_packed_linear_hands_large_inputs_to_f_linear(monkeypatch):
    """Above ``PACKED_MAX_ROWS`` rows a packed projection multiplies with F.linear (on an AVX2-only
    CPU MKL beat oneDNN's packed weights on a 2,048-token prefill); at or below it, packed."""
    from servelab.engine import model as model_mod

    torch.manual_seed(0)
    layer = Linear(16, 8, bias=False).requires_grad_(False)
    if not layer.pack():  # no oneDNN here: every size computes with F.linear, unpacked
        x = torch.randn(9, 16)
        assert layer.packed is None and torch.allclose(layer(x), x @ layer.weight.T, atol=1e-5)
        return
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    def counting(*a, **k):
        calls.append(a[0].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counting, raising=False)
    monkeypatch.setattr(model_mod, "PACKED_MAX_ROWS", 4)
    small, large = torch.randn(4, 16), torch.randn(9, 16)
    assert torch.allclose(layer(small), small @ layer.weight.T, atol=1e-5)
    assert torch.allclose(layer(large), large @ layer.weight.T, atol=1e-5)
    assert calls == [4]
    monkeypatch.setattr(model_mod, "PACKED_MAX_ROWS", None)
    layer(large)
    assert calls == [4, 9]


def test_default_packed_max_rows_follows_the_isa(monkeypatch):
    from servelab.engine import model as model_mod

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert model_mod.default_packed_max_rows() is None
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert model_mod.default_packed_max_rows() == 512
