"""The profile-driven cost model: where each term comes from, the kernels, the overhead."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.catalog.instance import InstanceSpec
from servelab.core.errors import UserError
from servelab.core.plan import StepShape
from servelab.costmodel.attention import KERNELS, default_kernel
from servelab.costmodel.cpu_overhead import default_mode
from servelab.costmodel import CostOptions, build_cost_model
from servelab.costmodel.roofline import roofline_for_instance

A100_7B = InstanceSpec("A100-80GB", "Llama-2-7B")


def model(spec=A100_7B, **options):
    return build_cost_model(spec, CostOptions(**options))


def decode(n, ctx, longest=None):
    return StepShape(num_decodes=n, decode_context_sum=n * ctx if longest is None else (n - 1) * ctx + longest,
                     decode_context_max=ctx if longest is None else longest)


def test_a_profiled_model_uses_its_own_tables_and_says_so():
    sources = model().describe()
    for op in ("qkv_proj", "o_proj", "up_proj", "down_proj", "act"):
        assert sources[f"op {op}"].startswith("measured: a100 profile of Llama-2-7b-hf tp=1")
    assert sources["lm_head"].startswith("roofline")
    assert sources["attention"].startswith("per-seq (default for A100-80GB)")
    assert "measured a100 host" in sources["cpu_overhead"]


def test_catalog_models_borrow_same_shapes_and_scale_the_rest():
    llama13 = model(InstanceSpec("A100-80GB", "Llama-2-13B")).describe()
    assert llama13["op up_proj"].startswith("same-shape: a100 profile of internlm/internlm-20b tp=1")
    qwen = model(InstanceSpec("A100-80GB", "Qwen-2.5-14B")).describe()
    assert qwen["op qkv_proj"].startswith("scaled:") and "(5120, 7168)" in qwen["op qkv_proj"]
    h200 = model(InstanceSpec("H200", "Llama-2-7B")).describe()
    assert "H100-80GB -> H200" in h200["op up_proj"]


def test_layer_time_follows_the_measured_profile(data_dir):
    """Llama-2-7B's measured per-layer GEMM medians at 1 and 2048 tokens, against the model's layer table."""
    import csv

    rows = {int(r["num_tokens"]): r for r in csv.DictReader(open(data_dir / "profiling/a100/Llama-2-7b-hf_mlp.csv"))
            if r["num_tensor_parallel_workers"] == "1"}
    m = model(cpu_overhead="off")
    for tokens in (1, 2048):
        columns = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "attn_rope", "mlp_act")
        measured = sum(float(rows[tokens][f"time_stats.{c}.median"]) for c in columns)
        measured += 2 * float(rows[tokens]["time_stats.add.median"])
        measured += float(rows[tokens]["time_stats.input_layernorm.median"])
        measured += float(rows[tokens]["time_stats.post_attention_layernorm.median"])
        assert m._layer_at(tokens) * 1e3 == pytest.approx(measured, rel=0.05)


def test_cpu_overhead_by_batch_matches_the_measured_medians():
    on, off = model(), model(cpu_overhead="off")
    for rows, ms in ((8, 1.17), (64, 3.5), (128, 6.22)):
        extra = on.step_time_s(decode(rows, 500)) - off.step_time_s(decode(rows, 500))
        assert extra * 1e3 == pytest.approx(ms, rel=0.03)
    flat = model(cpu_overhead="flat")
    assert flat.step_time_s(decode(8, 500)) - off.step_time_s(decode(8, 500)) == pytest.approx(1e-3)


def test_cpu_overhead_defaults_and_ray_at_tp2():
    assert default_mode("A100-80GB") == "measured" and default_mode("H100-80GB") == "flat"
    tp2 = build_cost_model(InstanceSpec("A100-80GB", "Llama-2-13B", tp=2), CostOptions())
    assert "Ray" in tp2.describe()["cpu_overhead"] and tp2.overhead.at(8) > 5e-3


def test_a_small_chunk_costs_more_per_token_once_the_step_overhead_is_counted():
    """DynaServe's premise: per token, a 256-token chunk costs clearly more than a 2,048-token one."""
    def per_token(m, chunk):
        return m.step_time_s(StepShape(prefill_tokens=(chunk,), prefill_context=(chunk,))) / chunk

    ratio = per_token(model(), 256) / per_token(model(), 2048)
    roofline = roofline_for_instance(A100_7B)
    assert ratio > per_token(roofline, 256) / per_token(roofline, 2048)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_kernel_vectorises_exactly(kernel):
    m = model(attention_kernel=kernel)
    sums = np.arange(100, 150_000, 1499)
    maxes = np.minimum(sums, 900 + np.arange(len(sums)) * 97)
    fast = m.decode_step_times_s(33, sums, maxes)
    slow = [m.step_time_s(StepShape(num_decodes=33, decode_context_sum=int(s), decode_context_max=int(x)))
            for s, x in zip(sums, maxes)]
    assert fast.tolist() == slow


def test_kernels_order_on_one_long_among_short_and_agree_on_uniform():
    t = {k: model(attention_kernel=k).step_time_s(decode(8, 128, longest=8192)) for k in KERNELS}
    assert t["split-kv"] < t["per-seq"] < t["padded"]
    uniform = {k: model(attention_kernel=k).step_time_s(decode(64, 1024)) for k in ("split-kv", "padded")}
    assert uniform["split-kv"] == pytest.approx(uniform["padded"])


def test_default_kernels_per_gpu():
    assert default_kernel("A100-80GB") == "per-seq" and default_kernel("H100-80GB") == "split-kv"


def test_tp_pays_measured_all_reduces_and_pp_measured_sends():
    tp2 = build_cost_model(InstanceSpec("A100-80GB", "Llama-2-13B", tp=2), CostOptions(cpu_overhead="off"))
    assert tp2.describe()["all_reduce"].startswith("measured all-reduce on a100_dgx, 2 GPUs")
    pp2 = build_cost_model(InstanceSpec("A100-80GB", "Llama-2-13B", pp=2), CostOptions(cpu_overhead="off"))
    assert pp2.describe()["pp_send"].startswith("measured send/recv over nvlink")
    assert pp2._tail_at(512) > build_cost_model(InstanceSpec("A100-80GB", "Llama-2-13B"),
                                                 CostOptions(cpu_overhead="off"))._tail_at(512)


def test_steps_beyond_the_dense_tables_still_grow():
    m = model()
    big = [m.step_time_s(StepShape(prefill_tokens=(n,), prefill_context=(n,))) for n in (16_000, 16_385, 40_000)]
    assert big[0] < big[1] < big[2]
    assert m.step_time_s(decode(3000, 100)) > m.step_time_s(decode(2000, 100))


@pytest.mark.parametrize("bad", [dict(op_times="magic"), dict(attention_kernel="flash"), dict(cpu_overhead="some"),
                                 dict(op_times="roofline", attention_kernel="padded")])
def test_bad_options_are_user_errors(bad):
    with pytest.raises(UserError):
        CostOptions(**bad)


def test_roofline_option_gives_the_former_model():
    assert model(op_times="roofline").step_time_s(decode(8, 100)) == roofline_for_instance(A100_7B).step_time_s(
        decode(8, 100))


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB"])
def test_a_longer_chunk_never_costs_less(gpu):
    """Measured GEMMs dip at tile boundaries; the step's running maximum hides the dips."""
    m = model(InstanceSpec(gpu, "Llama-2-7B"))
    times = [m.step_time_s(StepShape(prefill_tokens=(n,), prefill_context=(n,))) for n in range(1, 4200, 7)]
    assert all(b >= a for a, b in zip(times, times[1:]))


@settings(max_examples=60, deadline=None)
@given(kernel=st.text(max_size=12), overhead=st.text(max_size=12))
def test_any_option_text_is_accepted_or_a_user_error(kernel, overhead):
    try:
        CostOptions(attention_kernel=kernel or None, cpu_overhead=overhead or None)
    except UserError as err:
        assert "--attention-kernel" in str(err) or "--cpu-overhead" in str(err)
    else:
        assert (kernel or "split-kv") in KERNELS and (overhead or "off") in ("measured", "flat", "off")
