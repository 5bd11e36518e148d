"""ModelConfig: validation, HF round trip (legacy and transformers-5 rope fields), parameter count."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from servelab.engine.config import ModelConfig, RopeScaling
from servelab.engine.loader import load_checkpoint, load_config


def test_validation():
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="arch"):
        ModelConfig(arch="gpt2")
    with pytest.raises(ValueError, match="rope_scaling"):
        RopeScaling(rope_type="yarn")


def test_hf_round_trip():
    config = ModelConfig(arch="qwen2", attention_bias=True, tie_embeddings=True, eos_token_ids=(1, 2),
                         rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 1024))
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_transformers5_rope_parameters_are_read(make_checkpoint, tmp_path):
    hf_config = AutoConfig.from_pretrained(make_checkpoint(arch="llama"))
    hf_config.rope_parameters = {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0}
    hf_config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in saved
    config = load_config(tmp_path)
    assert config.rope_theta == 50000.0 and config.rope_scaling == RopeScaling("linear", 2.0)


@pytest.mark.parametrize("kwargs", [dict(arch="llama"), dict(arch="qwen2", tie_embeddings=True)])
def test_num_params_matches_the_module(make_checkpoint, kwargs):
    loaded = load_checkpoint(make_checkpoint(**kwargs))
    assert loaded.config.num_params == sum(p.numel() for p in loaded.model.parameters())
