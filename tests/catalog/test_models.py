import pytest

from servelab.catalog.models import MODELS, get_model

# Published parameter counts (model cards / safetensors totals).
PUBLISHED = {
    "Llama-2-7B": 6.74e9, "Llama-2-13B": 13.0e9, "Llama-2-70B": 6.90e10, "Llama-3.1-8B": 8.03e9,
    "Qwen-2.5-14B": 14.7e9, "Qwen-2.5-32B": 32.5e9, "Qwen-2.5-72B": 72.7e9,
    "OPT-2.7B": 2.65e9, "OPT-6.7B": 6.66e9, "OPT-13B": 12.85e9, "OPT-30B": 29.97e9, "Phi-3.5-mini": 3.82e9,
}


def test_catalog_covers_the_published_list():
    assert set(MODELS) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_num_params_matches_published_size(name):
    model = get_model(name)
    assert model.num_params == pytest.approx(PUBLISHED[name], rel=0.02)
    assert model.source.startswith("https://huggingface.co/") and model.source.endswith("config.json")


@pytest.mark.parametrize("alias, name", [
    ("llama-2-7b", "Llama-2-7B"), ("meta-llama/Llama-2-7b-hf", "Llama-2-7B"), ("LLAMA-2-70B", "Llama-2-70B"),
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"), ("qwen2.5-14b", "Qwen-2.5-14B"),
    ("Qwen/Qwen2.5-72B-Instruct", "Qwen-2.5-72B"), ("facebook/opt-6.7b", "OPT-6.7B"), ("opt-30b", "OPT-30B"),
    ("phi-3.5-mini-instruct", "Phi-3.5-mini"),
])
def test_aliases(alias, name):
    assert get_model(alias).name == name


def test_unknown_model_lists_known_names():
    with pytest.raises(KeyError, match="Llama-2-7B"):
        get_model("gpt-5")


def test_llama2_7b_derived_quantities():
    m = get_model("llama-2-7b")
    assert m.kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2 == 512 * 1024  # 0.5 MiB
    assert m.kv_bytes_per_token_per_layer(dtype_bytes=1) * m.num_layers == m.kv_bytes_per_token(dtype_bytes=1)
    assert m.param_bytes() == 2 * m.num_params
    # 2 FLOPs per weight of every layer matrix: ~2 * 6.5e9 (embedding and head excluded)
    assert m.flops_per_token == pytest.approx(2 * (m.num_params - 2 * 32000 * 4096), rel=0.001)


def test_gqa_shrinks_kv():
    assert get_model("llama-2-70b").kv_bytes_per_token() == 80 * 2 * 8 * 128 * 2
    assert get_model("llama-3.1-8b").kv_bytes_per_token() * 4 == get_model("llama-2-7b").kv_bytes_per_token()
