import pytest

from servelab.catalog.instance import (
    InstanceSpec,
    held_param_bytes,
    kv_bytes_per_block,
    kv_cache_config,
    num_host_kv_blocks,
    num_kv_blocks,
)
from servelab.catalog.models import get_model


def test_llama2_7b_on_a100_80gb_holds_about_120k_tokens():
    spec = InstanceSpec("A100-80GB", "llama-2-7b")
    usable = 80 * 2**30 * 0.9 - get_model("llama-2-7b").param_bytes()
    assert num_kv_blocks(spec) == int(usable // (16 * 512 * 1024)) == 7609
    assert 100_000 < num_kv_blocks(spec) * spec.block_size < 130_000


def test_weights_that_do_not_fit_raise_a_clear_error():
    with pytest.raises(ValueError, match="do not fit.*raise tp or pp"):
        num_kv_blocks(InstanceSpec("A100-40GB", "llama-2-70b"))
    assert num_kv_blocks(InstanceSpec("A100-40GB", "llama-2-70b", tp=4)) > 0


def test_tp_and_pp_pool_memory():
    one = num_kv_blocks(InstanceSpec("A100-80GB", "llama-2-13b"))
    assert num_kv_blocks(InstanceSpec("A100-80GB", "llama-2-13b", tp=2)) > 2 * one
    assert num_kv_blocks(InstanceSpec("A100-80GB", "llama-2-13b", pp=2)) == num_kv_blocks(
        InstanceSpec("A100-80GB", "llama-2-13b", tp=2))


def test_kv_heads_replicate_when_tp_exceeds_them():
    # Llama-2-70B has 8 KV heads: tp=8 stores each once, so per-token KV is the model's own
    spec = InstanceSpec("H100-80GB", "llama-2-70b", tp=8)
    assert kv_bytes_per_block(spec) == 16 * get_model("llama-2-70b").kv_bytes_per_token()


def test_partial_layers_hold_less_weight_and_more_kv_per_byte():
    full = InstanceSpec("A100-80GB", "llama-2-7b")
    half = InstanceSpec("A100-80GB", "llama-2-7b", layers=(0, 16))
    assert held_param_bytes(half) < held_param_bytes(full) / 2 + get_model("llama-2-7b").embedding_params * 2
    assert kv_bytes_per_block(half) * 2 == kv_bytes_per_block(full)
    assert num_kv_blocks(half) > 2 * num_kv_blocks(full)


def test_host_pool_and_kv_cache_config():
    spec = InstanceSpec("A100-80GB", "llama-2-7b", host_kv_bytes=64 * 2**30)
    assert num_host_kv_blocks(spec) == 64 * 2**30 // (16 * 512 * 1024)
    config = kv_cache_config(spec, watermark=0.02)
    assert (config.num_gpu_blocks, config.num_cpu_blocks, config.watermark) == (
        num_kv_blocks(spec), num_host_kv_blocks(spec), 0.02)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=3), "heads do not split"), (dict(pp=0), "tp and pp"), (dict(layers=(10, 5)), "layers"),
    (dict(layers=(0, 40)), "layers"), (dict(memory_reserve_fraction=1.0), "reserve"),
    (dict(block_size=0), "block_size"), (dict(host_kv_bytes=-1), "host_kv_bytes"), (dict(pp=33), "pp=33"),
])
def test_invalid_specs_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InstanceSpec("A100-80GB", "llama-2-7b", **kwargs)


def test_unknown_names_are_rejected_at_construction():
    with pytest.raises(KeyError):
        InstanceSpec("TPU-v5", "llama-2-7b")
