"""Loading checkpoints: shards, dtypes, and clear errors on broken folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from servelab.engine.loader import CheckpointError, load_checkpoint

from engine_helpers import chunk, make_runner


@pytest.fixture
def folder(make_checkpoint, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(make_checkpoint(arch="llama"), dst)
    return dst


def _logits(loaded, prompt):
    runner, blocks = make_runner(loaded)
    return runner.compute_logits([chunk(blocks, 0, prompt, 0)])[1][0]


def test_loads_config_tokenizer_and_generation_defaults(folder):
    loaded = load_checkpoint(folder)
    assert loaded.config.arch == "llama" and loaded.config.num_layers == 2
    assert loaded.generation.eos_token_ids == (1,)
    assert loaded.tokenizer.encode("hi").ids[0] == 0  # <s> prepended
    assert loaded.model.embed_tokens.weight.dtype == torch.float32


def test_sharded_checkpoint_equals_single_file(folder, prompts):
    reference = _logits(load_checkpoint(folder), prompts[3])
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, folder / shard)
    (folder / "model.safetensors").unlink()
    index = {"weight_map": {k: shard for shard, keys in halves.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(_logits(load_checkpoint(folder), prompts[3]), reference)


def test_bfloat16_load_is_close_to_float32(folder, prompts):
    ref = _logits(load_checkpoint(folder), prompts[3])
    loaded = load_checkpoint(folder, dtype="bfloat16")
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert (_logits(loaded, prompts[3]) - ref).abs().max() < 0.25


def test_missing_config_names_the_file(folder):
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing file: .*config\.json"):
        load_checkpoint(folder)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")


def test_unsupported_architecture(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["MixtralForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json.*MixtralForCausalLM"):
        load_checkpoint(folder)


def test_unsupported_rope_type(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="yarn"):
        load_checkpoint(folder)


def test_missing_tensor_and_missing_weights(folder):
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_checkpoint(folder)


def test_missing_shard_and_tokenizer(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(CheckpointError, match="gone.safetensors"):
        load_checkpoint(folder)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        load_checkpoint(folder)


def test_wrong_shape_names_the_tensor(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="gate_up_proj"):
        load_checkpoint(folder)


@pytest.mark.parametrize("file, key, value, match", [
    ("config.json", "num_hidden_layers", True, r"config\.json: num_hidden_layers must be an integer"),
    ("config.json", "hidden_size", "64", r"config\.json: hidden_size must be an integer"),
    ("config.json", "rms_norm_eps", float("nan"), r"config\.json: rms_norm_eps must be a finite number"),
    ("generation_config.json", "eos_token_id", [True], r"generation_config\.json: eos_token_id must be"),
    ("generation_config.json", "top_k", 2.5, r"generation_config\.json: top_k must be int"),
])
def test_config_values_are_typed_strictly(folder, file, key, value, match):
    """A JSON boolean or string where a number belongs names the file and key, never becomes 1."""
    path = folder / file
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg[key] = value
    path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(folder)


def test_undecodable_config_names_the_file(folder):
    (folder / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match=r"config\.json: not UTF-8 text"):
        load_checkpoint(folder)


def test_without_weights_the_front_end_gets_what_it_needs_and_no_model(folder):
    """`servelab serve` with the engine in its own process loaded the whole checkpoint in the
    HTTP process too (for the tokenizer and the swap-space sizing), doubling the server's memory:
    ``weights=False`` gives config, tokenizer, generation defaults and the dtype, and no model."""
    from servelab.engine.cluster import host_blocks_for

    for dtype in (None, "bfloat16"):
        full, meta = load_checkpoint(folder, dtype=dtype), load_checkpoint(folder, dtype=dtype, weights=False)
        assert meta.model is None and meta.dtype == full.model.embed_tokens.weight.dtype == full.dtype
        assert meta.config == full.config and meta.generation == full.generation
        assert meta.tokenizer.encode("hi").ids == full.tokenizer.encode("hi").ids
        assert host_blocks_for(meta, 0.01, 4) == host_blocks_for(full, 0.01, 4) > 0
