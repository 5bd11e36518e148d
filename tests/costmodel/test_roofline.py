import timeit
from dataclasses import replace

import numpy as np
import pytest

from servelab.catalog.gpus import get_gpu
from servelab.catalog.instance import InstanceSpec
from servelab.catalog.models import get_model
from servelab.core.plan import StepShape
from servelab.costmodel.ops import OpEfficiency, RooflineParams, layer_op_shapes, op_times_s
from servelab.costmodel.profile_fit import params_for_gpu
from servelab.costmodel.roofline import RooflineCostModel, roofline_for

A100 = get_gpu("A100-80GB")
LLAMA7 = get_model("llama-2-7b")
DECODE_1 = StepShape(num_decodes=1, decode_context_sum=1000)
DECODE_64 = StepShape(num_decodes=64, decode_context_sum=64 * 1000)
PREFILL_2048 = StepShape(prefill_tokens=(2048,), prefill_context=(2048,))


@pytest.fixture(scope="module")
def llama7_a100():
    return roofline_for("A100-80GB", "llama-2-7b")


def test_sanity_numbers_llama2_7b_a100(llama7_a100):
    m = llama7_a100
    weights_s = LLAMA7.param_bytes() / A100.hbm_bandwidth_bytes_per_s  # 6.6 ms at full bandwidth
    kv_s = 64 * 1000 * LLAMA7.kv_bytes_per_token() / A100.hbm_bandwidth_bytes_per_s
    flops_s = LLAMA7.flops_per_token * 2048 / A100.peak_flops  # 85 ms at full efficiency
    d1, d64, p = (m.step_time_s(s) for s in (DECODE_1, DECODE_64, PREFILL_2048))
    print(f"\nLlama-2-7B A100-80GB tp=1 ({m.params.source}):\n"
          f"  decode 1 x 1000 ctx   {d1 * 1e3:7.2f} ms  (weights at peak bandwidth {weights_s * 1e3:.2f} ms)\n"
          f"  decode 64 x 1000 ctx  {d64 * 1e3:7.2f} ms  (weights + KV at peak {1e3 * (weights_s + kv_s):.2f} ms)\n"
          f"  prefill 1 x 2048      {p * 1e3:7.2f} ms  (linear FLOPs at peak {flops_s * 1e3:.2f} ms)")
    assert weights_s < d1 < 2 * weights_s
    assert weights_s + kv_s < d64 < 2 * (weights_s + kv_s)
    assert flops_s < p < 2 * flops_s


def test_step_time_is_cheap(llama7_a100):
    mixed = StepShape(prefill_tokens=(512,), prefill_context=(1024,), num_decodes=32, decode_context_sum=32000)
    for shape in (DECODE_64, mixed):
        n = 20_000
        per_call_us = timeit.timeit(lambda: llama7_a100.step_time_s(shape), number=n) / n * 1e6
        print(f"\nstep_time_s: {per_call_us:.2f} us per call ({'decode' if shape is DECODE_64 else 'mixed'})")
        assert per_call_us < 50  # a few us on a laptop; generous for a loaded CI machine


def test_linear_layers_match_the_op_level_roofline(llama7_a100):
    """The precomputed coefficients reproduce ops.op_times_s, which profile_fit fits."""
    m, p = llama7_a100, llama7_a100.params
    tokens = np.array([1, 37, 256, 4096])
    shapes = layer_op_shapes(4096, 32, 32, 128, 11008, True, 1, 2)
    expected = sum(s.count * op_times_s(s, p.op(s.name), tokens, A100.peak_flops, A100.hbm_bandwidth_bytes_per_s)
                   for s in shapes) + p.attention.floor_s + p.layer_overhead_s
    assert [m._layer_s(int(t)) for t in tokens] == pytest.approx(expected.tolist(), rel=1e-12)


def test_attention_grows_with_context_and_prefill_is_causal():
    m = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b"))
    short = m.step_time_s(StepShape(prefill_tokens=(512,), prefill_context=(512,)))
    late_chunk = m.step_time_s(StepShape(prefill_tokens=(512,), prefill_context=(8192,)))
    assert late_chunk > short
    # decode attention is memory-bound: KV bytes / (bandwidth * attention memory efficiency) per layer
    extra = m.step_time_s(StepShape(num_decodes=1, decode_context_sum=101_000)) - m.step_time_s(
        StepShape(num_decodes=1, decode_context_sum=1000))
    expected = 100_000 * LLAMA7.kv_bytes_per_token() / (A100.hbm_bandwidth_bytes_per_s * m.params.attention.memory)
    assert extra == pytest.approx(expected, rel=1e-9)


def test_tensor_parallel_speeds_up_and_pays_all_reduce():
    params = RooflineParams()
    one = RooflineCostModel(InstanceSpec("H100-80GB", "llama-2-70b", tp=2), params)
    four = RooflineCostModel(InstanceSpec("H100-80GB", "llama-2-70b", tp=4), params)
    assert four.step_time_s(PREFILL_2048) < one.step_time_s(PREFILL_2048) / 1.5
    free_comm = RooflineCostModel(InstanceSpec("H100-80GB", "llama-2-70b", tp=4),
                                  replace(params, comm_latency_s=0.0, comm_efficiency=1e9))
    assert free_comm.step_time_s(PREFILL_2048) < four.step_time_s(PREFILL_2048)


def test_pipeline_step_time_is_the_sum_of_stages_plus_sends():
    params = RooflineParams(comm_latency_s=7e-6)
    flat = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-13b"), params)
    piped = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-13b", pp=4), params)
    send_s = 3 * (7e-6 + 2048 * 5120 * 2 / (A100.nvlink_bandwidth_bytes_per_s * params.comm_efficiency))
    assert piped.step_time_s(PREFILL_2048) - flat.step_time_s(PREFILL_2048) == pytest.approx(send_s, rel=1e-9)


def test_partial_instance_costs_its_layers():
    full = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b"))
    middle = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b", layers=(8, 24)))
    ratio = (middle.step_time_s(PREFILL_2048) - middle.params.step_overhead_s) / (
        full.step_time_s(PREFILL_2048) - full.params.step_overhead_s)
    assert 0.45 < ratio < 0.5  # half the layers, no LM head or embedding


def test_faster_memory_means_faster_decode():
    t = {g: roofline_for(g, "llama-3.1-8b").step_time_s(DECODE_64) for g in ("A100-80GB", "H100-80GB", "H200")}
    assert t["H200"] < t["H100-80GB"] < t["A100-80GB"]


def test_roofline_for_uses_profile_fits_only_where_profiles_exist(tmp_path):
    assert "fitted" in roofline_for("H800-80GB", "llama-2-7b").params.source
    assert params_for_gpu("A100-80GB", data_dir=tmp_path) == RooflineParams()


def test_swap_time_uses_pcie_of_every_gpu():
    params = RooflineParams(swap_efficiency=1.0, comm_latency_s=0.0)
    m = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b"), params)
    assert m.swap_time_s(100) == pytest.approx(100 * 16 * LLAMA7.kv_bytes_per_token() / 32e9)
    m2 = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b", tp=2), params)
    assert m2.swap_time_s(100) == pytest.approx(m.swap_time_s(100) / 2)


def test_per_op_overrides_take_precedence():
    slow_qkv = OpEfficiency(compute=0.1, memory=0.1, floor_s=0.0)
    p = RooflineParams(per_op=(("qkv_proj", slow_qkv),))
    assert p.op("qkv_proj") == slow_qkv and p.op("o_proj") == p.gemm and p.op("norm") == p.memory_op
    base = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b"))
    slow = RooflineCostModel(InstanceSpec("A100-80GB", "llama-2-7b"), p)
    assert slow.step_time_s(DECODE_1) > base.step_time_s(DECODE_1)
